"""Span-level correlation consistency, MGSR's span loss (paper.md §4).

Inside a span, the relation between the distributions at adjacent positions t and t + 1 is built
from their Hadamard product, and the student's relation should match the teacher's:

    p = softmax(z_teacher / τ),  q = softmax(z_student / τ)     [V] at each position
    r^p_t = p_t ⊙ p_{t+1},       r^q_t = q_t ⊙ q_{t+1}          [V] each

and per pair, by ``relation``:

    "product"     ‖r^p_t − r^q_t‖²₂ = Σ_v (p_{t,v} p_{t+1,v} − q_{t,v} q_{t+1,v})²   (the paper's reading)
    "normalized"  KL(ρ^p_t ‖ ρ^q_t),  ρ_t = r_t / Σ_v r_{t,v}                          (default)
    "cosine"      1 − cos(r^p_t, r^q_t)

    L_span = mean over the pairs of the per-pair term

ρ_t is the distribution of "the token both positions predict": log ρ = log p_t + log p_{t+1} −
logsumexp(log p_t + log p_{t+1}), computed in log space, so it never underflows.

Why "normalized" is the default. The product's entries are products of two probabilities, so its
squared distance and its gradient are tiny: on the tiny pair after 150 SFT steps the term was 0.004
and its gradient 3.5% of the cross-entropy's, and on the tiny GPT-2 pair of
``experiments/probes/span_gradient_ratio.py`` ‖∇span‖/‖∇FKL‖ on the student's parameters is 1e-7 at random
init and 2e-5 after SFT: at weight 1 the term does not change training. "normalized" is a KL in
nats like the distillation term, zero with zero gradient iff the student's ρ equals the teacher's;
its gradient ratio to forward KL's is 4.1 at init and 2.7 after SFT (1.8–3.6 on random logits,
``test_normalized_relation_gradient_is_comparable_to_forward_kl_and_the_product_is_not``). "cosine"
is scale-free and bounded by 1; its ratio is 3.9 at init and 0.8 after SFT.

A pair (t, t + 1) of row b counts iff ``spans[b, t] == spans[b, t + 1] != -1`` and both positions
are in ``mask`` (``span_pair_mask``). Gradients reach the student only. Each pair needs
two [V] rows of each model; with ``chunk_size`` (pairs per chunk) the relations are built for one
chunk of pairs at a time, so the extra memory is O(chunk_size·V) instead of O(pairs·V).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from mgsr_lightning.losses._common import check_inputs, kl_terms, log_softmax_pair, reduce_rows

RELATIONS = ("normalized", "product", "cosine")


def span_pair_mask(spans: Tensor, mask: Tensor | None = None) -> Tensor:
    """[B, T − 1] bool: True at t where (t, t + 1) is a compared pair (same span, both positions in ``mask``).

    spans: [B, T] long span ids, -1 outside any span; mask: [B, T] bool or None (all positions).
    ``.sum()`` is the number of pairs the span loss averages over.
    """
    pairs = (spans[:, :-1] == spans[:, 1:]) & (spans[:, :-1] != -1)
    if mask is not None:
        pairs &= mask[:, :-1] & mask[:, 1:]
    return pairs


def span_correlation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    spans: Tensor,
    relation: str = "normalized",
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Distance between teacher and student relations of adjacent-position distributions in spans.

    Args:
        student_logits, teacher_logits: [B, T, V], aligned position by position.
        mask: [B, T] bool, the compared (response) positions; None compares all.
        spans: [B, T] long span ids aligned with the logits' positions, -1 outside any span
            (``mgsr_lightning.spans.token_prior``).
        relation: "normalized" (KL between the normalised products, default), "product" (squared
            L2 between the products, the paper's reading) or "cosine" (see module docstring).
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
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    pair_b, pair_t = span_pair_mask(spans, mask).nonzero().unbind(1)
    first = pair_b * student_logits.size(1) + pair_t  # [P] flat position of each pair's first token

    def row_fn(student_first: Tensor, teacher_first: Tensor, student_second: Tensor, teacher_second: Tensor) -> Tensor:
        # [n, V] each -> [n, 1]; the teacher rows are detached, so only the student's side has a graph
        student_log_first, teacher_log_first = log_softmax_pair(student_first, teacher_first, temperature)
        student_log_second, teacher_log_second = log_softmax_pair(student_second, teacher_second, temperature)
        teacher_log_relation = teacher_log_first + teacher_log_second  # log r^p, [n, V]
        student_log_relation = student_log_first + student_log_second  # log r^q, [n, V]
        return _relation_distance(relation, student_log_relation, teacher_log_relation).unsqueeze(-1)

    loss, _ = reduce_rows(
        row_fn,
        (student_logits, teacher_logits.detach()),
        (first, first + 1),
        out_shape=student_logits.shape[:2],
        reduction=reduction,
        chunk_size=chunk_size,
    )
    return loss


def _relation_distance(relation: str, student_log_relation: Tensor, teacher_log_relation: Tensor) -> Tensor:
    """Per-pair distance [n] between log r^q and log r^p, [n, V] each."""
    if relation == "product":
        return (student_log_relation.exp() - teacher_log_relation.exp()).pow(2).sum(-1)
    if relation == "normalized":
        teacher_log_rho = teacher_log_relation - teacher_log_relation.logsumexp(-1, keepdim=True)
        student_log_rho = student_log_relation - student_log_relation.logsumexp(-1, keepdim=True)
        return kl_terms(teacher_log_rho, student_log_rho).sum(-1)
    # cosine is scale-free: divide each relation by its largest entry first, so tiny products never underflow
    teacher_scaled = (teacher_log_relation - teacher_log_relation.amax(-1, keepdim=True)).exp()
    student_scaled = (student_log_relation - student_log_relation.amax(-1, keepdim=True)).exp()
    return 1 - F.cosine_similarity(student_scaled, teacher_scaled, dim=-1)
