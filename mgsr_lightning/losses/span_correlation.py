"""Span-level correlation consistency, MGSR's span loss (paper.md §4).

Inside a span, the relation between the distributions at adjacent positions t and t + 1 is their
Hadamard product, and the student's relation should match the teacher's:

    p = softmax(z_teacher / τ),  q = softmax(z_student / τ)     [V] at each position
    r^p_t = p_t ⊙ p_{t+1},       r^q_t = q_t ⊙ q_{t+1}          [V] each
    ‖r^p_t − r^q_t‖²₂ = Σ_v (p_{t,v} p_{t+1,v} − q_{t,v} q_{t+1,v})²      per pair
    L_span = mean over the pairs of ‖r^p_t − r^q_t‖²₂

A pair (t, t + 1) of row b counts iff ``spans[b, t] == spans[b, t + 1] != -1`` and both positions
are in ``mask``. The teacher side is computed under ``no_grad``. Each pair needs two [V] rows of each
model; with ``chunk_size`` (pairs per chunk) the products are built for one chunk of pairs at a
time, so the extra memory is O(chunk_size·V) instead of O(pairs·V).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mgsr_lightning.losses._common import check_inputs, reduce_rows, scaled


def span_correlation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    spans: Tensor,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Squared L2 between teacher and student products of adjacent-position distributions in spans.

    Args:
        student_logits, teacher_logits: [B, T, V], aligned position by position.
        mask: [B, T] bool, the compared (response) positions; None compares all.
        spans: [B, T] long span ids aligned with the logits' positions, -1 outside any span
            (``mgsr_lightning.spans``).
        temperature: τ, dividing both logits before the softmax.
        reduction: "mean" over pairs (0 when there are none), "sum", or "none" ([B, T] with each
            pair's term at its first position, zeros elsewhere).
        chunk_size: pairs per chunk.

    Returns:
        The loss, [] or [B, T]; gradients reach ``student_logits`` only.
    """
    check_inputs(student_logits, teacher_logits, mask, temperature, reduction, chunk_size)
    if spans.shape != student_logits.shape[:2]:
        raise ValueError(
            f"spans must have shape {tuple(student_logits.shape[:2])} (the logits' [B, T]), got {tuple(spans.shape)}"
        )
    same_span = (spans[:, :-1] == spans[:, 1:]) & (spans[:, :-1] != -1)  # [B, T - 1]: pair (t, t + 1)
    if mask is not None:
        same_span &= mask[:, :-1] & mask[:, 1:]
    pair_b, pair_t = same_span.nonzero().unbind(1)
    first = pair_b * student_logits.size(1) + pair_t  # [P] flat position of each pair's first token

    def row_fn(student_first: Tensor, teacher_first: Tensor, student_second: Tensor, teacher_second: Tensor) -> Tensor:
        # [n, V] each -> [n, 1]
        with torch.no_grad():
            teacher_relation = _probs(teacher_first, temperature) * _probs(teacher_second, temperature)  # r^p
        student_relation = _probs(student_first, temperature) * _probs(student_second, temperature)  # r^q
        return (student_relation - teacher_relation).pow(2).sum(-1, keepdim=True)

    loss, _ = reduce_rows(
        row_fn,
        (student_logits, teacher_logits.detach()),
        (first, first + 1),
        out_shape=student_logits.shape[:2],
        reduction=reduction,
        chunk_size=chunk_size,
    )
    return loss


def _probs(logits: Tensor, temperature: float) -> Tensor:
    """softmax(z / τ) in float32, [n, V]; -inf entries (a padded vocabulary) get probability 0."""
    return torch.softmax(scaled(logits, temperature), dim=-1)
