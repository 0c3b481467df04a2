"""DAC-KL's "rest" variant over forward KL with its gradient written out (``dac_kl(..., written_backward=True)``,
the default): the same values and gradients as the taped formulas of :func:`mgsr_lightning.losses.dac_kl.dac_kl`,
in about half the memory and time (docs/dac_kl.md, "Cost")."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from mgsr_lightning.losses._common import log_softmax


class RestKL(torch.autograd.Function):
    """L_DAC ("rest" variant) and ``kept`` per row, with the gradient written out instead of taped.

    Inputs: the student's logits [n, V] and the bounds ``lower``, ``upper`` [n] (differentiable);
    the teacher's side, constant: its sorted log-probabilities and probabilities, the sort ``order``
    and the band coordinate ``c`` [n, V]. With ``q`` the student's probabilities gathered in the
    teacher's order, ``a = (c − l)/β``, ``b = (u − c)/β``, the band ``m = σ(a)σ(b)``, the weight ``w``
    (``m`` with ``w_1 = 1`` for the target class) and ``r = t_rest / s_rest``:

        ∂L/∂z_k  = (q_k (1 − (1 − w_k) r) − w_k p_k) / τ        (zero where student = teacher)
        ∂L/∂w_k  = p_k log(p_k / q_k) − p_k (log r + 1) + r q_k  (k ≥ 2 with the target class)
        ∂w_k/∂l = −w_k σ(−a_k) / β,   ∂w_k/∂u = w_k σ(−b_k) / β

    and ``kept``'s own gradient to the bounds through ``m``. ``1 − w`` is summed as
    ``σ(−a) + σ(a)σ(−b)`` (two positive terms), exact where the band keeps almost everything. With
    ``guard_floor`` set, rows whose ``kept`` is below it pass no KL gradient to the bounds (the
    anti-collapse guard); the student's gradient is unchanged. It keeps eight float32 [n, V] blocks
    and the int64 sort order for backward; the taped version keeps about twice as many.
    """

    @staticmethod
    def forward(
        ctx, student_rows, lower, upper, teacher_sorted, teacher_probs, order, coordinate,
        temperature, beta, target_class, guard_floor,
    ):
        # Every [n, V] block is allocated once and then updated in place: on CPU a fresh block costs
        # about as much as the arithmetic on it (page faults), so fewer blocks is most of the speed.
        student_sorted = log_softmax(student_rows, temperature).gather(-1, order)  # log q, [n, V]
        student_probs = student_sorted.exp()
        sig_neg_a = torch.sub(coordinate, lower[:, None]).div_(beta)  # a = (c − l)/β, then σ(−a) in place
        sig_a = torch.sigmoid(sig_neg_a)
        sig_neg_a.neg_().sigmoid_()
        sig_neg_b = torch.sub(upper[:, None], coordinate).div_(beta)  # b = (u − c)/β, then σ(−b) in place
        band = torch.sigmoid(sig_neg_b).mul_(sig_a)  # m = σ(a)σ(b)
        sig_neg_b.neg_().sigmoid_()
        out_of_band = sig_a.mul_(sig_neg_b).add_(sig_neg_a)  # 1 − m = σ(−a) + σ(a)σ(−b), two positive terms
        first = 1 if target_class else 0
        kept_in_band = _row_dot(band[:, first:], teacher_probs[:, first:])
        clippable = teacher_probs[:, first:].sum(-1)
        kept = torch.where(clippable > 0, kept_in_band / clippable.clamp_min(torch.finfo(clippable.dtype).tiny), 1.0)
        if first:  # the target class: w_1 = 1, so m becomes w (kept above read m at k ≥ 2 only)
            band[:, 0] = 1
            out_of_band[:, 0] = 0
        weight = band
        # log(p / q) where p > 0
        log_ratio = torch.sub(teacher_sorted, student_sorted).masked_fill_(teacher_probs == 0, 0.0)
        del student_sorted
        weighted_teacher = weight * teacher_probs  # t_k = w_k p_k
        in_band = _row_dot(weighted_teacher, log_ratio)
        teacher_rest = _row_dot(out_of_band, teacher_probs)  # [n]
        student_rest = _row_dot(out_of_band, student_probs)
        rest_active = (teacher_rest > 0) & (student_rest > 0)
        rest = torch.where(teacher_rest > 0, teacher_rest * (teacher_rest.log() - student_rest.log()), 0.0)
        ratio = torch.where(
            rest_active, teacher_rest / student_rest.clamp_min(torch.finfo(student_rest.dtype).tiny), 0.0
        )
        ctx.save_for_backward(
            teacher_probs, student_probs, log_ratio, weight, weighted_teacher, out_of_band, sig_neg_a, sig_neg_b,
            order, ratio, rest_active, clippable, kept,
        )
        ctx.settings = (temperature, beta, first, guard_floor)
        ctx.student_dtype = student_rows.dtype
        return in_band + rest, kept

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_kl, grad_kept):
        (teacher_probs, student_probs, log_ratio, weight, weighted_teacher, out_of_band, sig_neg_a, sig_neg_b,
         order, ratio, rest_active, clippable, kept) = ctx.saved_tensors
        temperature, beta, first, guard_floor = ctx.settings
        grad_student = grad_lower = grad_upper = None
        if ctx.needs_input_grad[0]:  # q (1 − (1 − w) r) − w p, scaled, back in vocabulary order
            grad_sorted = torch.mul(out_of_band, -ratio[:, None]).add_(1).mul_(student_probs).sub_(weighted_teacher)
            grad_sorted.mul_((grad_kl / temperature)[:, None])
            grad_student = torch.empty_like(grad_sorted).scatter_(-1, order, grad_sorted).to(ctx.student_dtype)
            del grad_sorted
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # ∂L/∂w = p log(p/q) − [rest] (p (log r + 1) − r q); saved blocks stay unchanged
            # (gradcheck re-runs backward)
            log_rest_ratio = torch.where(rest_active, ratio.clamp_min(torch.finfo(ratio.dtype).tiny).log(), 0.0)
            rest_scale = torch.where(rest_active, log_rest_ratio + 1, 0.0)
            grad_weight = log_ratio * teacher_probs
            grad_weight.addcmul_(teacher_probs, -rest_scale[:, None]).addcmul_(student_probs, ratio[:, None])
            kl_scale = grad_kl if guard_floor is None else torch.where(kept < guard_floor, 0.0, grad_kl)
            kept_scale = torch.where(
                clippable > 0, grad_kept / clippable.clamp_min(torch.finfo(clippable.dtype).tiny), 0.0
            )
            # ∂(kl_scale·L + kept_scale·kept)/∂w at k ≥ first (kept reads m p there, which is w p)
            through = grad_weight.mul_(weight).mul_(kl_scale[:, None]).addcmul_(weighted_teacher, kept_scale[:, None])
            through[:, :first] = 0
            grad_lower = -_row_dot(through, sig_neg_a) / beta  # ∂w/∂l = −w σ(−a)/β
            grad_upper = _row_dot(through, sig_neg_b) / beta  # ∂w/∂u = w σ(−b)/β
        return grad_student, grad_lower, grad_upper, None, None, None, None, None, None, None, None


def _row_dot(x: Tensor, y: Tensor) -> Tensor:
    """Σ_v x[i, v] y[i, v] per row, [n, V] × [n, V] -> [n]."""
    return torch.linalg.vecdot(x, y, dim=-1)
