"""Token-level divergences between the teacher ``p`` and the student ``q`` (the KD baselines).

Every function has the signature

    fn(student_logits [B, T, V], teacher_logits [B, T, V], mask [B, T] bool | None = None, *,
       temperature=1.0, reduction="mean", chunk_size=None, **params) -> Tensor

with ``p = softmax(teacher_logits / τ)`` and ``q = softmax(student_logits / τ)`` at each position.
``mask`` marks the compared (response) positions; "mean" averages the per-position divergence over
them (0 when there are none), "sum" adds them, "none" returns [B, T] with zeros outside the mask.
Logits are aligned by the caller: position t of both predicts the same token. Computation is in
float32 whatever the input dtype (float64 stays float64). Vocabulary entries that are ``-inf`` in
both logits (a padded vocabulary) contribute nothing. ``chunk_size`` (positions per chunk) bounds
the extra memory to O(chunk_size·V) for "mean" and "sum", and for any reduction under no_grad;
results equal the unchunked path (see ``_common``).

Conventions: ``0·log 0 = 0``; mixtures ``m = w·a + (1 − w)·b`` are formed in log space.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from mgsr_lightning.losses._common import PADDED_LOG_PROB, check_inputs, kl_terms, log_softmax_pair, reduce_positions

# (student_log_probs [n, V], teacher_log_probs [n, V]) -> divergence per row [n]
PerRow = Callable[[Tensor, Tensor], Tensor]


def _kl(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a‖b) = Σ_v a_v (log a_v − log b_v) per row: [n, V], [n, V] -> [n]."""
    return kl_terms(log_a, log_b).sum(-1)


def _log_mixture(log_a: Tensor, log_b: Tensor, weight_a: float) -> Tensor:
    """log(w·a + (1 − w)·b), [n, V], exact at w = 0 and w = 1."""
    if weight_a == 0:
        return log_b
    if weight_a == 1:
        return log_a
    return torch.logaddexp(log_a + math.log(weight_a), log_b + math.log1p(-weight_a))


def _check_weight(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _divergence(
    per_row: PerRow,
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None,
    temperature: float,
    reduction: str,
    chunk_size: int | None,
) -> Tensor:
    """The position loop shared by every divergence; ``per_row`` is the formula."""
    check_inputs(student_logits, teacher_logits, mask, temperature, reduction, chunk_size)

    def row_fn(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:  # [n, V], [n, V] -> [n, 1]
        student_log_probs, teacher_log_probs = log_softmax_pair(student_rows, teacher_rows, temperature)
        return per_row(student_log_probs, teacher_log_probs).unsqueeze(-1)

    loss, _ = reduce_positions(row_fn, student_logits, teacher_logits, mask, reduction=reduction, chunk_size=chunk_size)
    return loss


def forward_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Forward KL, ``KL(p‖q) = Σ_v p_v (log p_v − log q_v)``, entropy term included (so it is 0 iff p = q).

    DistiLLM's FKL drops the constant ``Σ p log p``; its gradient is the same.
    """

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        return _kl(teacher_log_probs, student_log_probs)

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def reverse_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Reverse KL, ``KL(q‖p) = Σ_v q_v (log q_v − log p_v)``."""

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        return _kl(student_log_probs, teacher_log_probs)

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def symmetric_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    lam: float = 0.9,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Symmetric KL, ``(1 − λ)·KL(p‖q) + λ·KL(q‖p)``; λ = 0.9 as in DistiLLM's SymKL."""
    _check_weight("lam", lam)

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        return (1 - lam) * _kl(teacher_log_probs, student_log_probs) + lam * _kl(student_log_probs, teacher_log_probs)

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def skew_forward_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    alpha: float = 0.1,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Skew forward KL (DistiLLM's SKL), ``KL(p ‖ α·p + (1 − α)·q)``; α = 0 gives ``KL(p‖q)``."""
    _check_weight("alpha", alpha)

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        return _kl(teacher_log_probs, _log_mixture(teacher_log_probs, student_log_probs, alpha))

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def skew_reverse_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    alpha: float = 0.1,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Skew reverse KL (DistiLLM's SRKL), ``KL(q ‖ (1 − α)·p + α·q)``; α = 0 gives ``KL(q‖p)``."""
    _check_weight("alpha", alpha)

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        return _kl(student_log_probs, _log_mixture(student_log_probs, teacher_log_probs, alpha))

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def generalized_jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Generalised Jensen–Shannon divergence with TRL's ``generalized_jsd_loss`` semantics (GKD, Eq. 1).

    For 0 < β < 1, with ``m = β·p + (1 − β)·q``:  ``JSD(β) = β·KL(p‖m) + (1 − β)·KL(q‖m)``.
    The end points are TRL's special cases, not the limits of that formula (which is 0 at both):
    ``β = 0`` gives ``KL(p‖q)`` and ``β = 1`` gives ``KL(q‖p)``. ``β = 0.5`` is the symmetric JSD.
    """
    _check_weight("beta", beta)

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        if beta == 0:
            return _kl(teacher_log_probs, student_log_probs)
        if beta == 1:
            return _kl(student_log_probs, teacher_log_probs)
        log_mixture = _log_mixture(teacher_log_probs, student_log_probs, beta)
        return beta * _kl(teacher_log_probs, log_mixture) + (1 - beta) * _kl(student_log_probs, log_mixture)

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def total_variation(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Total variation distance, ``½·Σ_v |p_v − q_v|`` ∈ [0, 1]."""

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        return 0.5 * (teacher_log_probs.exp() - student_log_probs.exp()).abs().sum(-1)

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def alpha_beta_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    alpha: float = 0.2,
    beta: float = 0.7,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """α-β-divergence ``D_AB^(α,β)(p‖q)`` (Cichocki, Cruces & Amari, 2011), ABKD's loss (Wang et al.,
    ICML 2025, "ABKD: Pursuing a Proper Allocation of the Probability Mass in Knowledge Distillation
    via α-β-Divergence"; registry name ``abkd``).

    For α, β, α + β ≠ 0:

        D = −1/(αβ) · Σ_v ( p_v^α q_v^β − α/(α+β) · p_v^(α+β) − β/(α+β) · q_v^(α+β) )

    and its continuous limits (the same formula's limit, so values move smoothly with α and β):

        β = 0:       1/α² · Σ_v ( p^α log(p^α / q^α) − p^α + q^α )
        α = 0:       1/β² · Σ_v ( q^β log(q^β / p^β) − q^β + p^β )
        α = −β:      1/α² · Σ_v ( log(q^α / p^α) + (q^α / p^α)^(−1) − 1 )
        α = β = 0:   ½ · Σ_v (log p_v − log q_v)²

    Special values: (α, β) = (1, 0) is ``KL(p‖q)`` (forward KL), (0, 1) is ``KL(q‖p)`` (reverse KL);
    α + β = 1 is Amari's α-divergence, e.g. (0.5, 0.5) = ``2·Σ(√p − √q)²``; (1, 1) = ``½·Σ(p − q)²``.
    In ABKD's analysis α sets the hardness-concentration (weight on the modes with large error) and β
    the confidence-concentration (weight on the student's confident modes); FKL has both weak, RKL
    both strong. The defaults (0.2, 0.7) are ABKD's setting for GPT-2 (1.5B teacher, scripts
    ``gpt2/ab/train_*_1.5B.sh``: α = 0.2, α + β = 0.9); for OpenLLaMA2 it uses (0.1, 0.8).

    ABKD's released code writes the β = 0 and α = 0 cases with 1/α and 1/β instead of 1/α², 1/β²;
    the two agree at (1, 0) and (0, 1) only. This function uses the limits of the general formula.
    Entries with p = q = 0 (a padded vocabulary) contribute 0; a zero in one distribution follows
    the formula (finite for α, β > 0; +inf where a negative power of 0 appears).
    """
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise ValueError(f"alpha and beta must be finite, got alpha={alpha}, beta={beta}")

    def per_row(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        # p = q = 1 at padded entries: every case of the formula is exactly 0 there, with finite gradients
        padded = (teacher_log_probs == PADDED_LOG_PROB) & (student_log_probs == PADDED_LOG_PROB)
        log_p = teacher_log_probs.masked_fill(padded, 0.0)
        log_q = student_log_probs.masked_fill(padded, 0.0)
        if alpha == 0 and beta == 0:
            return 0.5 * (log_p - log_q).pow(2).sum(-1)
        if beta == 0:
            return _generalized_kl(log_p, log_q, alpha)
        if alpha == 0:
            return _generalized_kl(log_q, log_p, beta)
        if alpha + beta == 0:
            log_ratio = alpha * (log_q - log_p)  # log(q^α / p^α)
            return (log_ratio + torch.exp(-log_ratio) - 1).sum(-1) / alpha**2
        total = alpha + beta
        cross = torch.exp(alpha * log_p + beta * log_q)
        terms = cross - alpha / total * torch.exp(total * log_p) - beta / total * torch.exp(total * log_q)
        return -terms.sum(-1) / (alpha * beta)

    return _divergence(per_row, student_logits, teacher_logits, mask, temperature, reduction, chunk_size)


def _generalized_kl(log_a: Tensor, log_b: Tensor, power: float) -> Tensor:
    """1/λ² · Σ_v (a^λ log(a^λ / b^λ) − a^λ + b^λ), λ = ``power``, with 0·log 0 = 0: [n, V] -> [n]."""
    a_power, b_power = power * log_a, power * log_b  # log a^λ, log b^λ
    return (kl_terms(a_power, b_power) - a_power.exp() + b_power.exp()).sum(-1) / power**2


DIVERGENCES: dict[str, Callable[..., Tensor]] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "symmetric_kl": symmetric_kl,
    "skew_forward_kl": skew_forward_kl,
    "skew_reverse_kl": skew_reverse_kl,
    "generalized_jsd": generalized_jsd,
    "total_variation": total_variation,
    "abkd": alpha_beta_divergence,
}
