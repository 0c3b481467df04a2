"""A distillation term that starts at its ceiling: a bounded divergence with a student far from the teacher.

DistiLLM's skew forward KL, ``KL(p ‖ α·p + (1 − α)·q)``, is bounded by ``log(1/α)`` per token (2.30
nats at α = 0.1): the mixture never falls below ``α·p``. Its gradient on the student's logit of
token ``j`` is ``−(1 − α)·q_j·(p_j / m_j − Σ_i p_i·q_i / m_i)`` with ``m = α·p + (1 − α)·q``: where the
teacher is sure of a token the student almost never gives (``p_j ≈ 1``, ``q_j → 0``) it shrinks to
about ``−((1 − α)/α)·q_j``, where forward KL's is ``q_j − p_j ≈ −1``. A student that starts far from
the teacher (random weights, or layers cut from a bigger model) therefore gets almost no signal on the
tokens it gets most wrong: its training loss falls on the easy tokens while its cross-entropy on the
ground truth stays where it started, and its samples are poor. DistiLLM avoids this by starting from
a student fine-tuned on the task first (its ``init`` stage). ``experiments/probes/skew_kl_gradient.py``
measures the two gradients; :func:`saturation_message` is the check the module runs on its first
training step.

The other bounded divergences of :mod:`.divergences` saturate the same way, each at the value it takes
when the student gives the teacher's tokens no probability (disjoint supports), where its gradient on
those tokens vanishes with ``q``:

- skew reverse KL ``KL(q ‖ (1 − α)·p + α·q)``: ``log(1/α)`` (the mixture never falls below ``α·q``);
  gradient on a missed token ``∝ q_j·log q_j``;
- generalised JSD (0 < β < 1): ``β·log(1/β) + (1 − β)·log(1/(1 − β))`` (``log 2`` at β = 0.5);
  gradient ``∝ q_j``;
- total variation: 1; gradient ``∝ q_j``;
- the α-β divergence (ABKD) with α, β > 0: the cross term ``Σ p^α q^β`` vanishes, leaving
  ``(α·Σ p^(α+β) + β·Σ q^(α+β)) / (αβ(α+β))``, which is ``1/(αβ)`` (7.14 at ABKD's α = 0.2, β = 0.7) for a
  sure teacher and a sure student, and the ceiling whenever α + β ≥ 1 (with α + β < 1 a student spread
  over V tokens goes above it, up to about ``V^(1−α−β)`` times). With ``∂D/∂q_v = q_v^(β−1)·(q_v^α −
  p_v^α)/α``, the gradient on the logit of a token the teacher is sure of is about ``−q_j^β/α``, where
  forward KL's is ``−1``. With α ≤ 0 or β ≤ 0 (forward or reverse KL among them) it is unbounded.

Forward, reverse and symmetric KL are unbounded: a far student keeps its gradient.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

#: the share of the ceiling above which the first step's value is reported
SATURATED_SHARE = 0.5


@dataclass(frozen=True)
class Ceiling:
    """Where a bounded divergence saturates: its value (nats per token) for a student that gives the
    teacher's tokens no probability, written as a formula, and how its gradient on such a token scales."""

    label: str
    value: float
    formula: str
    gradient: str
    is_bound: bool = True  # no value above it (ABKD with alpha + beta < 1 can exceed its far value)
    unit: str = " nats"


def skew_forward_kl_bound(alpha: float) -> float:
    """``log(1/α)``: the largest value the skew forward KL takes, per token (infinite at α = 0)."""
    return math.inf if alpha <= 0 else -math.log(alpha)


def alpha_beta_far_value(alpha: float, beta: float) -> float:
    """``1/(αβ)``: the α-β divergence between a sure teacher and a sure student that disagree (its
    supremum when α + β ≥ 1); infinite unless α, β > 0 (the divergence is then unbounded)."""
    return 1.0 / (alpha * beta) if alpha > 0 and beta > 0 else math.inf


def _params(name: str, params: dict) -> dict:
    """``params`` over the divergence's own defaults."""
    from mgsr_lightning.losses.divergences import DIVERGENCES

    signature = inspect.signature(DIVERGENCES[name].terms)
    defaults = {key: p.default for key, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}
    return {**defaults, **params}


def divergence_ceiling(name: str, params: dict) -> Ceiling | None:
    """The :class:`Ceiling` of distillation term ``name`` with ``params``, or None when it is unbounded
    (forward, reverse and symmetric KL; a skew of 0; JSD's β at 0 or 1; α-β with α ≤ 0 or β ≤ 0)."""
    if name in ("skew_forward_kl", "skew_reverse_kl"):
        alpha = float(_params(name, params)["alpha"])
        if alpha <= 0:
            return None
        kind = "forward" if name == "skew_forward_kl" else "reverse"
        gradient = ("q/alpha, where forward KL's is q - p" if kind == "forward"
                    else "q*log(q) on the teacher's tokens and vanishes on the others")
        return Ceiling(f"the skew {kind} KL", skew_forward_kl_bound(alpha), "log(1/alpha)", gradient)
    if name == "generalized_jsd":
        beta = float(_params(name, params)["beta"])
        if not 0 < beta < 1:
            return None
        value = -(beta * math.log(beta) + (1 - beta) * math.log1p(-beta))
        return Ceiling("the generalised JSD", value, "beta*log(1/beta) + (1-beta)*log(1/(1-beta))",
                       "q, where forward KL's is q - p")
    if name == "total_variation":
        return Ceiling("the total variation distance", 1.0, "1", "q, where forward KL's is q - p", unit="")
    if name in ("abkd", "alpha_beta"):
        values = _params(name, params)
        alpha, beta = float(values["alpha"]), float(values["beta"])
        value = alpha_beta_far_value(alpha, beta)
        if not math.isfinite(value):
            return None
        return Ceiling("the alpha-beta divergence (ABKD)", value, "1/(alpha*beta)",
                       "q^beta/alpha, where forward KL's is q - p", is_bound=alpha + beta >= 1)
    return None


def saturation_message(name: str, params: dict, value: float, step: int = 0) -> str | None:
    """What to tell the user when a bounded distillation term starts near its ceiling, else None.

    Args:
        name, params: the distillation term's config (``DistillLoss.name`` and ``.params``).
        value: the term's value, in nats per response token, on the first training batch.
    """
    ceiling = divergence_ceiling(name, params)
    if ceiling is None or value < SATURATED_SHARE * ceiling.value:
        return None
    where = "its bound" if ceiling.is_bound else "its value for a student far from the teacher,"
    formula = ceiling.formula if ceiling.formula == f"{ceiling.value:g}" else f"{ceiling.formula} = {ceiling.value:.2f}"
    return (
        f"{ceiling.label} is {value:.2f}{ceiling.unit} per token at step {step}, "
        f"{value / ceiling.value:.0%} of {where} "
        f"{formula}: the student gives the teacher's likely tokens so little probability "
        f"that their gradient nearly vanishes (it scales with {ceiling.gradient}), and such runs stall or collapse. "
        f"Distil from a student fine-tuned on the task, as DistiLLM, MiniLLM and ABKD do: on data prepared by "
        f"`prepare`, add --config <its folder>/init_student.yaml to fit; else point the student at an SFT student "
        f"with --model.init_args.student='{{\"name_or_path\": \"<an SFT student's folder>\", \"config\": null}}' "
        f"(e.g. the export of the pair's sft.yaml); or add a cross-entropy term (model.init_args.sft_weight > 0)"
    )


class FarFromTeacherWarning(UserWarning):
    """The distillation term starts at its ceiling, where it can barely move the student."""
