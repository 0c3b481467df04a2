"""The bases of DAC-KL's "rest" variant with a written-out backward: each base's terms and derivatives on
one block of rows (a :data:`~mgsr_lightning.losses.dac_kl_backward.RestTerms`, which ``RestKL`` takes
through the band to the bounds), and ``written_terms``, which base gets which.

With the clipped vectors ``t_k = w_k p_k``, ``s_k = w_k q_k`` (k = 1..V, the teacher's order) and the
rest entry ``t_rest = Σ (1 − w_k) p_k``, ``s_rest = Σ (1 − w_k) q_k``, the loss is
``L = Σ_k f(t_k, s_k) + f(t_rest, s_rest)`` for the base's per-entry term f, and (f_t, f_s its partial
derivatives, ``R`` the rest entry)

    q_k ∂L/∂q_k = s_k f_s(t_k, s_k) + (1 − w_k) q_k f_s(R)
    ∂L/∂z_k     = (q_k ∂L/∂q_k − q_k Σ_j q_j ∂L/∂q_j) / τ                   (the softmax's backward)
    w_k ∂L/∂w_k = t_k f_t(t_k, s_k) + s_k f_s(t_k, s_k) − t_k f_t(R) − s_k f_s(R)

Each term reads the products ``t f_t`` and ``s f_s`` whole, never ``f_s`` alone at an entry k, so that
nothing is divided by an ``s`` or a ``w`` that may be 0. A derivative at the rest entry is 0 where that
entry's own mass is 0, as on the taped path (whose rest entry is then a constant -inf log-probability).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

from mgsr_lightning.losses.dac_kl_backward import RestBlock, RestTerms, row_dot
from mgsr_lightning.losses.divergences import DIVERGENCES, alpha_beta_divergence, forward_kl


def written_terms(base: str, base_params: dict[str, float]) -> RestTerms | None:
    """The written terms of ``base`` (a name of ``DIVERGENCES``) with its parameters, or None where the
    base runs taped: forward KL, and the α-β divergence with α > 0 and β > 0 (its limits β = 0, α = 0,
    α = −β and negative powers stay taped)."""
    if DIVERGENCES[base] is forward_kl:
        return forward_kl_rest
    if DIVERGENCES[base] is alpha_beta_divergence:
        bound = inspect.signature(alpha_beta_divergence.terms).bind(None, None, **base_params)
        bound.apply_defaults()
        alpha, beta = bound.arguments["alpha"], bound.arguments["beta"]
        if alpha > 0 and beta > 0:
            return functools.partial(alpha_beta_rest, alpha=float(alpha), beta=float(beta))
    return None


def forward_kl_rest(block: RestBlock, want_student: bool, want_bounds: bool):
    """f(t, s) = t log(t / s), the paper's KL. With ``r = t_rest / s_rest``, Σ q ∂L/∂q = −1 and

        ∂L/∂z_k · τ = q_k (1 − (1 − w_k) r) − w_k p_k                  (zero where student = teacher)
        w_k ∂L/∂w_k = w_k (p_k log(p_k / q_k) − p_k (log r + 1) + r q_k)

    block -> (L [b], ∂L/∂z·τ [b, V] | None, w ∂L/∂w [b, V] | None), the teacher's order."""
    teacher_probs, student_probs = block.teacher_probs, block.student_probs
    tiny = torch.finfo(teacher_probs.dtype).tiny
    # log(p / q) at p > 0, in the block's own log q (−log q + log p is log p − log q to the bit)
    log_ratio = block.student_log.neg_().add_(block.teacher_log).masked_fill_(teacher_probs == 0, 0.0)
    teacher_rest, student_rest = block.teacher_rest, block.student_rest
    rest_active = (teacher_rest > 0) & (student_rest > 0)
    rest = torch.where(teacher_rest > 0, teacher_rest * (teacher_rest.log() - student_rest.log()), 0.0)
    ratio = torch.where(rest_active, teacher_rest / student_rest.clamp_min(tiny), 0.0)
    value = row_dot(block.weighted_teacher, log_ratio) + rest
    grad = through = None
    if want_student:
        grad = torch.mul(block.out_of_band, -ratio[:, None]).add_(1).mul_(student_probs).sub_(block.weighted_teacher)
    if want_bounds:
        rest_scale = torch.where(rest_active, ratio.clamp_min(tiny).log() + 1, 0.0)
        through = log_ratio.mul_(teacher_probs)
        through.addcmul_(teacher_probs, -rest_scale[:, None]).addcmul_(student_probs, ratio[:, None])
        through.mul_(block.weight)
    return value, grad, through


def alpha_beta_rest(block: RestBlock, want_student: bool, want_bounds: bool, *, alpha: float, beta: float):
    """f(t, s) = −1/(αβ) (t^α s^β − α/(α+β) t^(α+β) − β/(α+β) s^(α+β)), α > 0, β > 0 (``alpha_beta``).
    With γ = α + β, ``X = t^α s^β``, ``A = t^γ``, ``B = s^γ`` (from the log-probabilities: ``t^α s^β =
    exp(γ log w + α log p + β log q)``, 0 at a zero w, p or q; padded entries, p = q = 0, give 0):

        t f_t = −(X − A)/β,   s f_s = −(X − B)/α,   f = (t f_t + s f_s)/γ   (f is homogeneous of degree γ)

    block -> (L [b], ∂L/∂z·τ [b, V] | None, w ∂L/∂w [b, V] | None), the teacher's order."""
    gamma = alpha + beta
    log_weight = block.weight.log().mul_(gamma)  # γ log w, -inf where w = 0 (no +inf in any exponent below)
    cross = torch.add(log_weight, block.teacher_log, alpha=alpha).add_(block.student_log, alpha=beta).exp_()  # X
    student_side = torch.add(log_weight, block.student_log, alpha=gamma).exp_()  # B
    teacher_side = log_weight.add_(block.teacher_log, alpha=gamma).exp_()  # A
    torch.sub(cross, student_side, out=student_side)  # X − B = −α s f_s
    torch.sub(cross, teacher_side, out=teacher_side)  # X − A = −β t f_t
    del cross
    euler = teacher_side.mul_(-1 / beta).add_(student_side, alpha=-1 / alpha)  # t f_t + s f_s = γ f
    rest, teacher_slope, student_slope = _alpha_beta_rest_entry(block.teacher_rest, block.student_rest, alpha, beta)
    value = euler.sum(-1) / gamma + rest
    grad = through = None
    if want_student:  # q ∂L/∂q − q Σ q ∂L/∂q, with Σ_k (1 − w_k) q_k f_s(R) = s_rest f_s(R)
        total = student_slope * block.student_rest - student_side.sum(-1) / alpha  # Σ q ∂L/∂q, [b]
        spread = torch.mul(block.out_of_band, student_slope[:, None]).sub_(total[:, None])
        grad = student_side.mul_(-1 / alpha).addcmul_(block.student_probs, spread)
    if want_bounds:  # t f_t + s f_s − w (p f_t(R) + q f_s(R)); the block's log q is free by now
        rest_side = torch.mul(block.teacher_probs, teacher_slope[:, None], out=block.student_log)
        rest_side.addcmul_(block.student_probs, student_slope[:, None])
        through = euler.addcmul_(rest_side, block.weight, value=-1)
    return value, grad, through


def _alpha_beta_rest_entry(teacher_rest: Tensor, student_rest: Tensor, alpha: float,
                           beta: float) -> tuple[Tensor, Tensor, Tensor]:
    """f, f_t, f_s of the α-β term at the rest entry (t_rest, s_rest), [b] each; f_t is 0 where
    t_rest = 0 and f_s where s_rest = 0 (powers below 1 of a zero mass stay out of the sums)."""
    gamma = alpha + beta
    log_t, log_s = teacher_rest.log(), student_rest.log()  # -inf at 0; no +inf below
    value = -(torch.exp(alpha * log_t + beta * log_s) - alpha / gamma * torch.exp(gamma * log_t)
              - beta / gamma * torch.exp(gamma * log_s)) / (alpha * beta)
    safe_t = torch.where(teacher_rest > 0, log_t, 0.0)
    safe_s = torch.where(student_rest > 0, log_s, 0.0)
    teacher_slope = -(torch.exp((alpha - 1) * safe_t + beta * log_s) - torch.exp((gamma - 1) * safe_t)) / beta
    student_slope = -(torch.exp(alpha * log_t + (beta - 1) * safe_s) - torch.exp((gamma - 1) * safe_s)) / alpha
    return (value, torch.where(teacher_rest > 0, teacher_slope, 0.0),
            torch.where(student_rest > 0, student_slope, 0.0))
