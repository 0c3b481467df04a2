"""The loss terms of the fused head (:mod:`mgsr_lightning.losses.fused_head`): each adapts one pure loss of
this package to a chunk of positions, with no second copy of its math.

Each term is built once per batch from the batch's [B, T] tensors (mask, spans, labels), counts the
rows the unfused loss would average over, and on each chunk calls the unfused loss on the chunk's
logits [1, n, V] with ``reduction="sum"`` and the chunk's part of the mask, divided by that count:

    divergence_term     any name of ``DIVERGENCES`` (forward/reverse/symmetric/skew KLs, JSD, TVD, α-β)
    dac_kl_term         DAC-KL (both variants, ClipNet's parameters trained through the chunks)
    span_term           the span correlation loss: pairs of adjacent positions, one position of look-ahead
    cross_entropy_term  the cross-entropy on labels (``response_cross_entropy``'s reduction)

so that the sum over chunks is the unfused loss's "mean" (``sum / max(count, 1)``). A term's own
``chunk_size`` (positions, or pairs for the span term) is passed to its loss, which then runs each
fused chunk in smaller blocks: the head's matmuls stay large (their speed) while the loss's
intermediates stay small (about 25 float32 [chunk_size, V] blocks for DAC-KL).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mgsr_lightning.losses.dac_kl import DIAGNOSTICS, ClipNet, dac_kl
from mgsr_lightning.losses.divergences import DIVERGENCES
from mgsr_lightning.losses.span_correlation import span_correlation_loss, span_pair_mask


def _own_mask(flat_mask: Tensor, positions: Tensor, owned: int) -> Tensor:
    """[1, n] bool: ``flat_mask`` at the chunk's positions, False at its look-ahead positions."""
    mask = flat_mask[positions]
    mask[owned:] = False
    return mask[None]


def _flat_mask(mask: Tensor) -> Tensor:
    """[N] bool from a [B, T] bool mask, refusing anything else."""
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask must be a [B, T] bool tensor, got {mask.dtype} {tuple(mask.shape)}")
    return mask.reshape(-1)


class divergence_term:  # noqa: N801  (a term builder, used like the loss functions it wraps)
    """``DIVERGENCES[name](student_logits, teacher_logits, mask, temperature=…, **params)``, reduction "mean".

    mask: [B, T] bool, the compared positions."""

    lookahead = False
    parameters: tuple[Tensor, ...] = ()
    needs_teacher = True

    def __init__(self, name: str, mask: Tensor, *, temperature: float = 1.0, chunk_size: int | None = None,
                 **params: Any):
        if name not in DIVERGENCES:
            raise ValueError(f"name must be one of {', '.join(DIVERGENCES)}, got {name!r}")
        self.loss, self.temperature, self.chunk_size, self.params = DIVERGENCES[name], temperature, chunk_size, params
        self.rows = _flat_mask(mask)
        self.count = max(int(self.rows.sum()), 1)

    def __call__(self, student_logits, teacher_logits, positions, owned):
        mask = _own_mask(self.rows, positions, owned)
        value = self.loss(student_logits, teacher_logits, mask, temperature=self.temperature, reduction="sum",
                          chunk_size=self.chunk_size, **self.params)
        return value / self.count, {}


class dac_kl_term:  # noqa: N801
    """``dac_kl(student_logits, teacher_logits, mask, clip_net=…, **params)``, reduction "mean", with its
    diagnostics (means over the compared positions, as the unfused call returns them)."""

    lookahead = False
    needs_teacher = True

    def __init__(self, mask: Tensor, *, clip_net: ClipNet | None = None, chunk_size: int | None = None,
                 **params: Any):
        if "reduction" in params:
            raise ValueError("dac_kl_term sets the reduction itself (a sum per chunk, divided by the batch's count)")
        self.clip_net, self.chunk_size, self.params = clip_net, chunk_size, params
        self.parameters = tuple(clip_net.parameters()) if clip_net is not None else ()
        self.rows = _flat_mask(mask)
        self.count = max(int(self.rows.sum()), 1)

    def __call__(self, student_logits, teacher_logits, positions, owned):
        mask = _own_mask(self.rows, positions, owned)
        value, diagnostics = dac_kl(student_logits, teacher_logits, mask, clip_net=self.clip_net, reduction="sum",
                                    chunk_size=self.chunk_size, **self.params)
        compared = int(mask.sum())  # dac_kl's diagnostics are means over the chunk's compared positions
        return value / self.count, {key: diagnostics[key] * compared / self.count for key in DIAGNOSTICS}


class span_term:  # noqa: N801
    """``span_correlation_loss(student_logits, teacher_logits, mask, spans=spans, relation=…)``, reduction
    "mean" over the batch's pairs. spans: [B, T] long span ids, -1 outside any span.

    The batch's pairs (``span_pair_mask``) are fixed once; on a chunk of flat positions the loss is
    called with segment ids in which two consecutive chunk positions share an id iff they are a pair,
    and no mask, so it counts exactly the pairs whose first position is one of the chunk's own."""

    lookahead = True
    parameters: tuple[Tensor, ...] = ()
    needs_teacher = True

    def __init__(self, spans: Tensor, mask: Tensor, *, relation: str = "normalized", temperature: float = 1.0,
                 chunk_size: int | None = None):
        pairs = F.pad(span_pair_mask(spans, mask), (0, 1)).reshape(-1)  # [N]: a pair (t, t + 1) starts at t
        self.relation, self.temperature, self.chunk_size = relation, temperature, chunk_size
        self.rows = pairs | F.pad(pairs[:-1], (1, 0))  # first and second positions of the pairs
        self.count = max(int(pairs.sum()), 1)
        # a new segment starts after every position that does not start a pair
        self.segments = torch.cumsum(F.pad(~pairs[:-1], (1, 0)).long(), 0)  # [N]

    def __call__(self, student_logits, teacher_logits, positions, owned):
        spans = self.segments[positions][None]  # [1, n]; the look-ahead (last) position can only end a pair
        value = span_correlation_loss(student_logits, teacher_logits, spans=spans, relation=self.relation,
                                      temperature=self.temperature, reduction="sum", chunk_size=self.chunk_size)
        return value / self.count, {}


class cross_entropy_term:  # noqa: N801
    """Cross-entropy of the logits against ``labels`` [B, T] (position t predicts labels[:, t]) at the
    positions of ``mask`` [B, T], averaged over them: ``response_cross_entropy``'s reduction (float32,
    0 when the mask is empty)."""

    lookahead = False
    parameters: tuple[Tensor, ...] = ()
    needs_teacher = False

    def __init__(self, labels: Tensor, mask: Tensor):
        self.labels = labels.reshape(-1)
        self.rows = _flat_mask(mask)
        self.count = max(int(self.rows.sum()), 1)

    def __call__(self, student_logits, teacher_logits, positions, owned):
        mask = _own_mask(self.rows, positions, owned)[0]  # [n]
        value = F.cross_entropy(student_logits[0][mask].float(), self.labels[positions][mask], reduction="sum")
        return value / self.count, {}
