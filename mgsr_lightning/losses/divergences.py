"""Token-level divergences between the teacher ``p`` and the student ``q`` (the KD baselines).

Each divergence is written once, as its per-entry terms ``terms(student_log_probs [n, V],
teacher_log_probs [n, V], *, **params) -> [n, V]``, whose sum over V is the divergence at a position;
``@divergence`` turns them into the loss, with the signature every loss shares:

    fn(student_logits [B, T, V], teacher_logits [B, T, V], mask [B, T] bool | None = None, *,
       temperature=1.0, reduction="mean", chunk_size=None, **params) -> Tensor

and keeps the terms as ``fn.terms``, so that DAC-KL can apply the same divergence to its clipped
vectors (:mod:`mgsr_lightning.losses.dac_kl`).

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

import functools
import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

from mgsr_lightning.losses._common import PADDED_LOG_PROB, check_inputs, kl_terms, log_softmax_pair, reduce_positions

# (student_log_probs [n, V], teacher_log_probs [n, V], *, **params) -> per-entry terms [n, V]
EntryTerms = Callable[..., Tensor]


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


def check_terms_params(terms: EntryTerms, params: dict) -> None:
    """Refuse ``params`` for ``terms`` before any work: a misspelt name is a TypeError, a value out of
    range the terms' own ValueError (they are run once on a 1 × 1 block)."""
    inspect.signature(terms).bind(None, None, **params)
    zeros = torch.zeros(1, 1)
    terms(zeros, zeros, **params)


def divergence(terms: EntryTerms) -> Callable[..., Tensor]:
    """The loss of a divergence given its per-entry terms (module docstring): the shared signature, the
    position loop (masking, chunking, reduction) and ``.terms``. ``terms`` checks its own parameters."""
    own = [p for p in inspect.signature(terms).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]

    @functools.wraps(terms)
    def loss(student_logits: Tensor, teacher_logits: Tensor, mask: Tensor | None = None, *, temperature: float = 1.0,
             reduction: str = "mean", chunk_size: int | None = None, **params) -> Tensor:
        check_inputs(student_logits, teacher_logits, mask, temperature, reduction, chunk_size)
        check_terms_params(terms, params)

        def row_fn(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:  # [n, V], [n, V] -> [n, 1]
            student_log_probs, teacher_log_probs = log_softmax_pair(student_rows, teacher_rows, temperature)
            return terms(student_log_probs, teacher_log_probs, **params).sum(-1, keepdim=True)

        value, _ = reduce_positions(row_fn, student_logits, teacher_logits, mask, reduction=reduction,
                                    chunk_size=chunk_size)
        return value

    common = list(inspect.signature(loss, follow_wrapped=False).parameters.values())
    loss.__signature__ = inspect.Signature([*common[:-1], *own], return_annotation=Tensor)
    loss.terms = terms
    return loss


@divergence
def forward_kl(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Forward KL, ``KL(p‖q) = Σ_v p_v (log p_v − log q_v)``, entropy term included (so it is 0 iff p = q).

    DistiLLM's FKL drops the constant ``Σ p log p``; its gradient is the same.
    """
    return kl_terms(teacher_log_probs, student_log_probs)


@divergence
def reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Reverse KL, ``KL(q‖p) = Σ_v q_v (log q_v − log p_v)``."""
    return kl_terms(student_log_probs, teacher_log_probs)


@divergence
def symmetric_kl(student_log_probs: Tensor, teacher_log_probs: Tensor, *, lam: float = 0.9) -> Tensor:
    """Symmetric KL, ``(1 − λ)·KL(p‖q) + λ·KL(q‖p)``; λ = 0.9 as in DistiLLM's SymKL."""
    _check_weight("lam", lam)
    return ((1 - lam) * kl_terms(teacher_log_probs, student_log_probs)
            + lam * kl_terms(student_log_probs, teacher_log_probs))


@divergence
def skew_forward_kl(student_log_probs: Tensor, teacher_log_probs: Tensor, *, alpha: float = 0.1) -> Tensor:
    """Skew forward KL (DistiLLM's SKL), ``KL(p ‖ α·p + (1 − α)·q)``; α = 0 gives ``KL(p‖q)``."""
    _check_weight("alpha", alpha)
    return kl_terms(teacher_log_probs, _log_mixture(teacher_log_probs, student_log_probs, alpha))


@divergence
def skew_reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor, *, alpha: float = 0.1) -> Tensor:
    """Skew reverse KL (DistiLLM's SRKL), ``KL(q ‖ (1 − α)·p + α·q)``; α = 0 gives ``KL(q‖p)``."""
    _check_weight("alpha", alpha)
    return kl_terms(student_log_probs, _log_mixture(student_log_probs, teacher_log_probs, alpha))


@divergence
def generalized_jsd(student_log_probs: Tensor, teacher_log_probs: Tensor, *, beta: float = 0.5) -> Tensor:
    """Generalised Jensen–Shannon divergence with TRL's ``generalized_jsd_loss`` semantics (GKD, Eq. 1).

    For 0 < β < 1, with ``m = β·p + (1 − β)·q``:  ``JSD(β) = β·KL(p‖m) + (1 − β)·KL(q‖m)``.
    The end points are TRL's special cases, not the limits of that formula (which is 0 at both):
    ``β = 0`` gives ``KL(p‖q)`` and ``β = 1`` gives ``KL(q‖p)``. ``β = 0.5`` is the symmetric JSD.
    """
    _check_weight("beta", beta)
    if beta == 0:
        return kl_terms(teacher_log_probs, student_log_probs)
    if beta == 1:
        return kl_terms(student_log_probs, teacher_log_probs)
    log_mixture = _log_mixture(teacher_log_probs, student_log_probs, beta)
    return beta * kl_terms(teacher_log_probs, log_mixture) + (1 - beta) * kl_terms(student_log_probs, log_mixture)


@divergence
def total_variation(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Total variation distance, ``½·Σ_v |p_v − q_v|`` ∈ [0, 1]."""
    return 0.5 * (teacher_log_probs.exp() - student_log_probs.exp()).abs()


@divergence
def alpha_beta_divergence(
    student_log_probs: Tensor, teacher_log_probs: Tensor, *, alpha: float = 0.2, beta: float = 0.7
) -> Tensor:
    """α-β-divergence ``D_AB^(α,β)(p‖q)`` (Cichocki, Cruces & Amari, 2011), ABKD's loss (Wang et al.,
    ICML 2025, "ABKD: Pursuing a Proper Allocation of the Probability Mass in Knowledge Distillation
    via α-β-Divergence"; registry names ``abkd`` and ``alpha_beta``).

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
    # p = q = 1 at padded entries: every case of the formula is exactly 0 there, with finite gradients
    padded = (teacher_log_probs == PADDED_LOG_PROB) & (student_log_probs == PADDED_LOG_PROB)
    log_p = teacher_log_probs.masked_fill(padded, 0.0)
    log_q = student_log_probs.masked_fill(padded, 0.0)
    if alpha == 0 and beta == 0:
        return 0.5 * (log_p - log_q).pow(2)
    if beta == 0:
        return _generalized_kl_terms(log_p, log_q, alpha)
    if alpha == 0:
        return _generalized_kl_terms(log_q, log_p, beta)
    if alpha + beta == 0:
        log_ratio = alpha * (log_q - log_p)  # log(q^α / p^α)
        return (log_ratio + torch.exp(-log_ratio) - 1) / alpha**2
    total = alpha + beta
    cross = torch.exp(alpha * log_p + beta * log_q)
    return -(
        cross - alpha / total * torch.exp(total * log_p) - beta / total * torch.exp(total * log_q)
    ) / (alpha * beta)


def _generalized_kl_terms(log_a: Tensor, log_b: Tensor, power: float) -> Tensor:
    """1/λ² · (a^λ log(a^λ / b^λ) − a^λ + b^λ) per entry, λ = ``power``, with 0·log 0 = 0: [n, V] -> [n, V]."""
    a_power, b_power = power * log_a, power * log_b  # log a^λ, log b^λ
    return (kl_terms(a_power, b_power) - a_power.exp() + b_power.exp()) / power**2


DIVERGENCES: dict[str, Callable[..., Tensor]] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "symmetric_kl": symmetric_kl,
    "skew_forward_kl": skew_forward_kl,
    "skew_reverse_kl": skew_reverse_kl,
    "generalized_jsd": generalized_jsd,
    "total_variation": total_variation,
    "abkd": alpha_beta_divergence,
    "alpha_beta": alpha_beta_divergence,
}
