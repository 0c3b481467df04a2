"""DAC-KL's band coordinate: the teacher's distribution sorted per position, and the coordinate ``c_k``
of each sorted entry (:mod:`mgsr_lightning.losses.dac_kl` has the formulas, docs/dac_kl.md the costs).

The written-backward path sorts in blocks of rows (``block_rows``) into two buffers allocated once: on
CPU every fresh [n, V] block costs page faults about as large as the arithmetic on it, and blocks of
about 2**20 entries are reused from the allocator's heap instead (docs/dac_kl.md, "Cost").
"""

from __future__ import annotations

import torch
from torch import Tensor

from mgsr_lightning.losses._common import PADDED_LOG_PROB, log_softmax

# entries per row block of the blocked passes (4 MiB of float32): small enough to be reused from the heap
BLOCK_ELEMENTS = 2**20


def block_rows(vocab_size: int) -> int:
    """Rows per block of the blocked passes at this vocabulary size."""
    return max(1, BLOCK_ELEMENTS // max(vocab_size, 1))


def sort_teacher(
    student_rows: Tensor, teacher_rows: Tensor, temperature: float, *, band: str, summary_k: int | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """The teacher's log-probabilities sorted in descending order per row, without autograd.

    Returns ``(teacher_sorted [n, V], order [n, V] int64, real [n] | None, summary)``: ``real`` the
    number of non-padded entries per row (``band="value_quantile"`` only); ``summary`` what ClipNet
    reads of the sorted probabilities: the top ``summary_k`` and the tail mass beyond them as one more
    column, [n, summary_k + 1] (the same top-k and the same tail sum, so ClipNet gives the same bounds
    as on the full [n, V] block), the full sorted probabilities when ``V <= summary_k``, or None when
    ``summary_k`` is None. Entries that are -inf in both logits get ``PADDED_LOG_PROB`` (sorted last).
    """
    rows, vocab = teacher_rows.shape
    dtype = torch.promote_types(teacher_rows.dtype, torch.float32)
    teacher_sorted = torch.empty(rows, vocab, dtype=dtype, device=teacher_rows.device)
    order = torch.empty(rows, vocab, dtype=torch.long, device=teacher_rows.device)
    full_summary = summary_k is not None and vocab <= summary_k
    summary = None if summary_k is None or full_summary else teacher_sorted.new_empty(rows, summary_k + 1)
    real = teacher_sorted.new_empty(rows) if band == "value_quantile" else None
    step = block_rows(vocab)
    with torch.no_grad():
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            padded = torch.isneginf(student_rows[start:stop]) & torch.isneginf(teacher_rows[start:stop])
            log_probs = log_softmax(teacher_rows[start:stop], temperature).masked_fill_(padded, PADDED_LOG_PROB)
            torch.sort(log_probs, dim=-1, descending=True, out=(teacher_sorted[start:stop], order[start:stop]))
            if real is not None:
                real[start:stop] = vocab - padded.sum(-1)
            if summary is not None:
                probs = teacher_sorted[start:stop].exp()
                summary[start:stop, :summary_k] = probs[:, :summary_k]
                summary[start:stop, summary_k] = probs[:, summary_k:].sum(-1)
    return teacher_sorted, order, real, teacher_sorted.exp() if full_summary else summary


def coordinate_of(band: str, teacher_sorted_probs: Tensor, real: Tensor | None) -> Tensor:
    """c_k of the sorted entries, [n, V]: the exclusive cumulative teacher mass (``band="mass"``), or
    the value-quantile level ``(V' − k)/(V' − 1)`` among the ``real`` [n] = V' non-padded entries."""
    if band == "mass":
        return teacher_sorted_probs.cumsum(-1).sub_(teacher_sorted_probs)
    real = real.to(teacher_sorted_probs.dtype)[:, None]  # V' [n, 1]
    rank = torch.arange(teacher_sorted_probs.size(-1), device=real.device, dtype=real.dtype)  # k − 1
    return (real - 1 - rank) / (real - 1).clamp_min(1)


def band_coordinate(band: str, teacher_sorted_probs: Tensor, student_rows: Tensor, teacher_rows: Tensor) -> Tensor:
    """``coordinate_of`` for the taped path, counting the padded entries (-inf in both logits) itself."""
    if band == "mass":
        return coordinate_of(band, teacher_sorted_probs, None)
    padded = torch.isneginf(student_rows) & torch.isneginf(teacher_rows)  # sorted last: their probability is 0
    return coordinate_of(band, teacher_sorted_probs, padded.size(-1) - padded.sum(-1))


def log_out_of_band(log_weight: Tensor, sorted_log_probs: Tensor) -> Tensor:
    """log Σ_k (1 − w_k)·prob_k, [n, 1]; -inf where the band keeps everything.

    Summed in probability space, with ``1 − w = −expm1(log w)`` exact near w = 1: the mass outside a
    band that keeps almost everything is a sum of small positive terms, not ``1 − Σ w·prob``.
    """
    rest = (-torch.expm1(log_weight) * sorted_log_probs.exp()).sum(-1, keepdim=True)
    return torch.where(rest > 0, rest.clamp_min(torch.finfo(rest.dtype).tiny).log(), float("-inf"))
