"""DAC-KL's "rest" variant over forward KL with its gradient written out (``dac_kl(..., written_backward=True)``,
the default): the same values and gradients as the taped formulas of :func:`mgsr_lightning.losses.dac_kl.dac_kl`,
in a fraction of the memory and time (docs/dac_kl.md, "Cost")."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from mgsr_lightning.losses._common import log_softmax
from mgsr_lightning.losses.dac_kl_band import block_rows, coordinate_of


class RestKL(torch.autograd.Function):
    """L_DAC ("rest" variant) and ``kept`` per row, with the gradient written out instead of taped.

    Inputs: the student's logits [n, V] and the bounds ``lower``, ``upper`` [n] (differentiable);
    the teacher's side, constant: its sorted log-probabilities and the sort ``order`` [n, V], and
    ``real`` [n] for ``band="value_quantile"``. With ``q`` the student's probabilities gathered in the
    teacher's order, ``c`` the band coordinate, ``a = (c − l)/β``, ``b = (u − c)/β``, the band
    ``m = σ(a)σ(b)``, the weight ``w`` (``m`` with ``w_1 = 1`` for the target class) and
    ``r = t_rest / s_rest``:

        ∂L/∂z_k  = (q_k (1 − (1 − w_k) r) − w_k p_k) / τ        (zero where student = teacher)
        ∂L/∂w_k  = p_k log(p_k / q_k) − p_k (log r + 1) + r q_k  (k ≥ 2 with the target class)
        ∂w_k/∂l = −w_k σ(−a_k) / β,   ∂w_k/∂u = w_k σ(−b_k) / β

    and ``kept``'s own gradient to the bounds through ``m``. ``1 − w`` is summed as
    ``σ(−a) + σ(a)σ(−b)`` (two positive terms), exact where the band keeps almost everything. With
    ``guard_floor`` set, rows whose ``kept`` is below it pass no KL gradient to the bounds (the
    anti-collapse guard); the student's gradient is unchanged.

    The forward runs in blocks of ``block_rows(V)`` rows and differentiates each block at once: it
    keeps, for backward, the student's gradient per unit of ``L`` in vocabulary order (one float32
    [n, V] block) and four numbers per row, ∂L/∂l, ∂L/∂u, ∂kept/∂l, ∂kept/∂u. Every other [n, V]
    intermediate lives one block at a time, small enough to be reused from the allocator's heap.
    """

    @staticmethod
    def forward(ctx, student_rows, lower, upper, teacher_sorted, order, real, band, temperature, beta, target_class,
                guard_floor):
        rows = student_rows.size(0)
        want_student, want_bounds = ctx.needs_input_grad[0], ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        kl, kept = teacher_sorted.new_empty(rows), teacher_sorted.new_empty(rows)
        grad_student = torch.empty_like(teacher_sorted) if want_student else None
        partials = teacher_sorted.new_zeros(4, rows)  # ∂L/∂l, ∂L/∂u, ∂kept/∂l, ∂kept/∂u
        step = block_rows(student_rows.size(-1))
        for start in range(0, rows, step):
            block = slice(start, min(start + step, rows))
            kl[block], kept[block] = _block(
                student_rows[block], lower[block], upper[block], teacher_sorted[block], order[block],
                None if real is None else real[block], band, temperature, beta, 1 if target_class else 0,
                None if grad_student is None else grad_student[block], partials[:, block] if want_bounds else None,
            )
        ctx.save_for_backward(*(t for t in (grad_student,) if t is not None), partials, kept)
        ctx.settings = (temperature, guard_floor, want_student, student_rows.dtype)
        return kl, kept

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_kl, grad_kept):
        temperature, guard_floor, want_student, student_dtype = ctx.settings
        saved = list(ctx.saved_tensors)
        grad_student = saved.pop(0) if want_student else None
        partials, kept = saved
        if grad_student is not None:  # saved blocks stay unchanged (gradcheck re-runs backward)
            grad_student = torch.mul(grad_student, (grad_kl / temperature)[:, None]).to(student_dtype)
        grad_lower = grad_upper = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            kl_scale = grad_kl if guard_floor is None else torch.where(kept < guard_floor, 0.0, grad_kl)
            grad_lower = kl_scale * partials[0] + grad_kept * partials[2]
            grad_upper = kl_scale * partials[1] + grad_kept * partials[3]
        return grad_student, grad_lower, grad_upper, None, None, None, None, None, None, None, None


def _block(student_rows, lower, upper, teacher_sorted, order, real, band, temperature, beta, first, grad_student,
           partials) -> tuple[Tensor, Tensor]:
    """One block of rows: (L, kept) [b] each; writes ∂L/∂z per unit of L (times τ) into
    ``grad_student`` [b, V] and the four bound partials into ``partials`` [4, b] when they are given."""
    # Every [b, V] block is allocated once and then updated in place.
    teacher_probs = teacher_sorted.exp()
    coordinate = coordinate_of(band, teacher_probs, real)  # c_k
    student_sorted = log_softmax(student_rows, temperature).gather(-1, order)  # log q
    student_probs = student_sorted.exp()
    sig_neg_b = torch.sub(upper[:, None], coordinate).div_(beta)  # b = (u − c)/β, then σ(−b) in place
    sig_neg_a = coordinate.sub_(lower[:, None]).div_(beta)  # a = (c − l)/β, then σ(−a) in place
    sig_a = torch.sigmoid(sig_neg_a)
    sig_neg_a.neg_().sigmoid_()
    weight = torch.sigmoid(sig_neg_b).mul_(sig_a)  # m = σ(a)σ(b), then w
    sig_neg_b.neg_().sigmoid_()
    out_of_band = sig_a.mul_(sig_neg_b).add_(sig_neg_a)  # 1 − m = σ(−a) + σ(a)σ(−b), two positive terms
    tiny = torch.finfo(teacher_probs.dtype).tiny
    kept_in_band = _row_dot(weight[:, first:], teacher_probs[:, first:])
    clippable = teacher_probs[:, first:].sum(-1)
    kept = torch.where(clippable > 0, kept_in_band / clippable.clamp_min(tiny), 1.0)
    if first:  # the target class: w_1 = 1, so m becomes w (kept above read m at k ≥ 2 only)
        weight[:, 0] = 1
        out_of_band[:, 0] = 0
    log_ratio = torch.sub(teacher_sorted, student_sorted).masked_fill_(teacher_probs == 0, 0.0)  # log(p / q) at p > 0
    del student_sorted
    weighted_teacher = weight * teacher_probs  # t_k = w_k p_k
    in_band = _row_dot(weighted_teacher, log_ratio)
    teacher_rest = _row_dot(out_of_band, teacher_probs)
    student_rest = _row_dot(out_of_band, student_probs)
    rest_active = (teacher_rest > 0) & (student_rest > 0)
    rest = torch.where(teacher_rest > 0, teacher_rest * (teacher_rest.log() - student_rest.log()), 0.0)
    ratio = torch.where(rest_active, teacher_rest / student_rest.clamp_min(tiny), 0.0)
    if grad_student is not None:  # q (1 − (1 − w) r) − w p, back in vocabulary order
        grad_sorted = torch.mul(out_of_band, -ratio[:, None]).add_(1).mul_(student_probs).sub_(weighted_teacher)
        grad_student.scatter_(-1, order, grad_sorted)
        del grad_sorted
    if partials is not None:
        # ∂L/∂w = p log(p/q) − [rest] (p (log r + 1) − r q), through w to the bounds at k ≥ first
        rest_scale = torch.where(rest_active, ratio.clamp_min(tiny).log() + 1, 0.0)
        through = log_ratio.mul_(teacher_probs)
        through.addcmul_(teacher_probs, -rest_scale[:, None]).addcmul_(student_probs, ratio[:, None]).mul_(weight)
        through[:, :first] = 0
        weighted_teacher[:, :first] = 0  # kept reads m p at k ≥ first, which is w p there
        kept_scale = torch.where(clippable > 0, 1 / clippable.clamp_min(tiny), 0.0)
        partials[0] = -_row_dot(through, sig_neg_a) / beta  # ∂w/∂l = −w σ(−a)/β
        partials[1] = _row_dot(through, sig_neg_b) / beta  # ∂w/∂u = w σ(−b)/β
        partials[2] = -_row_dot(weighted_teacher, sig_neg_a) * kept_scale / beta
        partials[3] = _row_dot(weighted_teacher, sig_neg_b) * kept_scale / beta
    return in_band + rest, kept


def _row_dot(x: Tensor, y: Tensor) -> Tensor:
    """Σ_v x[i, v] y[i, v] per row, [n, V] × [n, V] -> [n]."""
    return torch.linalg.vecdot(x, y, dim=-1)
