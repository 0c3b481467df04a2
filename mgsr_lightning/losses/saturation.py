"""A distillation term that starts at its ceiling: the skew forward KL with a student far from the teacher.

DistiLLM's skew forward KL, ``KL(p ‖ α·p + (1 − α)·q)``, is bounded by ``log(1/α)`` per token (2.30
nats at α = 0.1): the mixture never falls below ``α·p``. Its gradient on the student's logit of
token ``j`` is ``−(1 − α)·q_j·(p_j / m_j − Σ_i p_i·q_i / m_i)`` with ``m = α·p + (1 − α)·q``: where the
teacher is sure of a token the student almost never gives (``p_j ≈ 1``, ``q_j → 0``) it shrinks to
about ``−((1 − α)/α)·q_j``, where forward KL's is ``q_j − p_j ≈ −1``. A student that starts far from
the teacher (random weights, or layers cut from a bigger model) therefore gets almost no signal on the
tokens it gets most wrong: its training loss falls on the easy tokens while its cross-entropy on the
ground truth stays where it started, and its samples are poor. DistiLLM avoids this by starting from
a student fine-tuned on the task first (its ``init`` stage). ``experiments/skew_kl_gradient.py``
measures the two gradients; :func:`saturation_message` is the check the module runs on its first
training step.
"""

from __future__ import annotations

import math

#: the share of the bound above which the first step's value is reported
SATURATED_SHARE = 0.5


def skew_forward_kl_bound(alpha: float) -> float:
    """``log(1/α)``: the largest value the skew forward KL takes, per token (infinite at α = 0)."""
    return math.inf if alpha <= 0 else -math.log(alpha)


def saturation_message(name: str, params: dict, value: float, step: int = 0) -> str | None:
    """What to tell the user when a skew forward KL term starts near its bound, else None.

    Args:
        name, params: the distillation term's config (``DistillLoss.name`` and ``.params``).
        value: the term's value, in nats per response token, on the first training batch.
    """
    if name != "skew_forward_kl":
        return None
    alpha = float(params.get("alpha", 0.1))
    bound = skew_forward_kl_bound(alpha)
    if not math.isfinite(bound) or value < SATURATED_SHARE * bound:
        return None
    return (
        f"the skew forward KL is {value:.2f} nats per token at step {step}, {value / bound:.0%} of its bound "
        f"log(1/alpha) = {bound:.2f}: the student gives the teacher's likely tokens so little probability that "
        f"their gradient nearly vanishes (it scales with q/alpha, where forward KL's is q - p), and such runs "
        f"stall or collapse. DistiLLM starts from a student fine-tuned on the task: point "
        f"model.init_args.student.name_or_path at an SFT student (e.g. the export of the pair's sft.yaml), "
        f"or add a cross-entropy term (model.init_args.sft_weight > 0)"
    )


class FarFromTeacherWarning(UserWarning):
    """The distillation term starts at its ceiling, where it can barely move the student."""
