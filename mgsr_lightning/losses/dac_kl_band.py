"""DAC-KL's band coordinate: the teacher's distribution sorted per position, and the coordinate ``c_k``
of each sorted entry (:mod:`mgsr_lightning.losses.dac_kl` has the formulas, docs/dac_kl.md the costs).

The written-backward path sorts in blocks of rows (``block_rows``) into two buffers allocated once: on
CPU every fresh [n, V] block costs page faults about as large as the arithmetic on it, and blocks of
about 2**20 entries are reused from the allocator's heap instead (docs/dac_kl.md, "Cost").

Teacher logits in bf16 or fp16 are sorted on a 16-bit integer key of the logits themselves
(``descending_key``), not on the float32 log-probabilities: the map from a 16-bit logit to its
float32 log-probability at τ > 0 is monotone non-decreasing, so the key's order is a descending order
of the probabilities, with ties broken by the logit and then by index (docs/dac_kl.md, "Ties").
"""

from __future__ import annotations

import torch
from torch import Tensor

from mgsr_lightning.losses._common import PADDED_LOG_PROB, log_softmax

# entries per row block of the blocked passes (4 MiB of float32): small enough to be reused from the heap
BLOCK_ELEMENTS = 2**20
# teacher dtypes sorted on ``descending_key`` (``sixteen_bit_keys=False`` sorts them as float32, stable: the reference)
SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# keys of the entries that are -inf in the teacher's logits, after every finite logit's (at most 0x7F7F):
# the padded ones (-inf in both logits, log-probability PADDED_LOG_PROB) first, the teacher's zeros last
PADDED_KEY, TEACHER_INF_KEY = 0x7F80, 0x7F81


def block_rows(vocab_size: int) -> int:
    """Rows per block of the blocked passes at this vocabulary size."""
    return max(1, BLOCK_ELEMENTS // max(vocab_size, 1))


def sort_teacher(
    student_rows: Tensor, teacher_rows: Tensor, temperature: float, *, band: str, summary_k: int | None,
    sixteen_bit_keys: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """The teacher's log-probabilities sorted in descending order per row, without autograd.

    Returns ``(teacher_sorted [n, V], order [n, V] int64, real [n] | None, summary)``: ``real`` the
    number of non-padded entries per row (``band="value_quantile"`` only); ``summary`` what ClipNet
    reads of the sorted probabilities: the top ``summary_k`` and the tail mass beyond them as one more
    column, [n, summary_k + 1] (the same top-k and the same tail sum, so ClipNet gives the same bounds
    as on the full [n, V] block), the full sorted probabilities when ``V <= summary_k``, or None when
    ``summary_k`` is None. Entries that are -inf in both logits get ``PADDED_LOG_PROB`` (sorted last).
    ``sixteen_bit_keys``: as :func:`sort_descending`'s.
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
            sort_descending(log_probs, teacher_rows[start:stop], padded,
                            out=(teacher_sorted[start:stop], order[start:stop]), sixteen_bit_keys=sixteen_bit_keys)
            if real is not None:
                real[start:stop] = vocab - padded.sum(-1)
            if summary is not None:
                probs = teacher_sorted[start:stop].exp()
                summary[start:stop, :summary_k] = probs[:, :summary_k]
                summary[start:stop, summary_k] = probs[:, summary_k:].sum(-1)
    return teacher_sorted, order, real, teacher_sorted.exp() if full_summary else summary


def sort_descending(
    log_probs: Tensor,
    teacher_rows: Tensor,
    padded: Tensor | None = None,
    *,
    student_rows: Tensor | None = None,
    out: tuple[Tensor, Tensor] | None = None,
    sixteen_bit_keys: bool = True,
) -> tuple[Tensor, Tensor]:
    """``log_probs`` [n, V] (the teacher's, padded entries at ``PADDED_LOG_PROB``) sorted in descending
    order per row, and the order, [n, V] int64: ``log_probs.sort(dim=-1, descending=True)`` for float32
    and float64 logits; for bf16 and fp16 logits (``teacher_rows``) the stable ascending sort of
    ``descending_key`` and a gather, a descending order of ``log_probs`` with ties in index order. With
    ``out`` the two are written into it; without, the gather keeps ``log_probs``' autograd. ``padded``
    [n, V] bool, the entries -inf in both logits, is counted from ``student_rows`` when not given.
    ``sixteen_bit_keys=False`` sorts bf16 and fp16 logits' ``log_probs`` as float32 ones (stable): the same
    order, the reference the tests compare the keyed sort with."""
    if teacher_rows.dtype not in SIXTEEN_BIT or not sixteen_bit_keys:
        stable = teacher_rows.dtype in SIXTEEN_BIT  # the float32 reference: ties in index order, as the key's
        return torch.sort(log_probs, dim=-1, descending=True, stable=stable, out=out)
    if padded is None:
        padded = torch.isneginf(student_rows) & torch.isneginf(teacher_rows)
    key = descending_key(teacher_rows, padded)
    order = torch.empty(key.shape, dtype=torch.long, device=key.device) if out is None else out[1]
    if key.device.type == "cpu":  # one row at a time: a 1-D int16 sort is a radix sort on CPU (docs/dac_kl.md, "Ties")
        sorted_key = key.new_empty(key.size(-1))
        for row in range(key.size(0)):
            torch.sort(key[row], stable=True, out=(sorted_key, order[row]))
    else:
        torch.sort(key, dim=-1, stable=True, out=(torch.empty_like(key), order))
    if out is None:
        return log_probs.gather(-1, order), order
    return torch.gather(log_probs, -1, order, out=out[0]), order


def descending_key(teacher_rows: Tensor, padded: Tensor) -> Tensor:
    """An int16 key [n, V] of bf16 or fp16 logits whose ascending order is their descending order:
    ``−z``'s bits as a signed magnitude (so ±0 get the same key, 0), then ``PADDED_KEY`` for the padded
    entries (``padded`` [n, V] bool) and ``TEACHER_INF_KEY`` for the other -inf logits. Equal keys are
    equal logits; the log-probabilities keep this order (the float32 sort places the padded entries at
    PADDED_LOG_PROB, after every log-probability above it and before -inf)."""
    bits = teacher_rows.view(torch.int16)
    magnitude = bits & 0x7FFF
    key = torch.where(bits < 0, magnitude, -magnitude)  # z < 0: |z|, after every z >= 0 (key −z)
    return key.masked_fill_(torch.isneginf(teacher_rows), TEACHER_INF_KEY).masked_fill_(padded, PADDED_KEY)


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
