"""DAC-KL's "rest" variant with its gradient written out (``dac_kl(..., written_backward=True)``, the default):
the same values and gradients as the taped formulas of :func:`mgsr_lightning.losses.dac_kl.dac_kl`, in a
fraction of the memory and time (docs/dac_kl.md, "Cost"). This module holds the band and the bounds, the
same for every base; :mod:`mgsr_lightning.losses.dac_kl_terms` holds each written base's terms and
derivatives (forward KL, α-β)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from mgsr_lightning.losses._common import log_softmax
from mgsr_lightning.losses.dac_kl_band import block_rows, coordinate_of


class RestBlock(NamedTuple):
    """One block of b rows as a base's terms read it, everything in the teacher's order, [b, V] unless
    said: ``teacher_log``, ``teacher_probs`` (log p, p; read only), ``student_log``, ``student_probs``
    (log q, q; ``student_log`` is the block's own, a base may overwrite it), ``weight`` (w, w_1 = 1 with
    the target class), ``out_of_band`` (1 − w), ``weighted_teacher`` (t = w p; read only) and the rest
    entry's masses ``teacher_rest``, ``student_rest`` [b] (t_rest, s_rest)."""

    teacher_log: Tensor
    teacher_probs: Tensor
    student_log: Tensor
    student_probs: Tensor
    weight: Tensor
    out_of_band: Tensor
    weighted_teacher: Tensor
    teacher_rest: Tensor
    student_rest: Tensor


# (block, want_student, want_bounds) -> (L [b], ∂L/∂z·τ [b, V] | None, w ⊙ ∂L/∂w [b, V] | None), both [b, V]
# in the teacher's order; the second only when want_student, the third only when want_bounds
RestTerms = Callable[[RestBlock, bool, bool], tuple[Tensor, Tensor | None, Tensor | None]]


class RestKL(torch.autograd.Function):
    """L_DAC ("rest" variant) and ``kept`` per row, with the gradient written out instead of taped.

    Inputs: the student's logits [n, V] and the bounds ``lower``, ``upper`` [n] (differentiable);
    the teacher's side, constant: its sorted log-probabilities and the sort ``order`` [n, V], and
    ``real`` [n] for ``band="value_quantile"``; ``terms``, the base's :data:`RestTerms`. With ``q`` the
    student's probabilities gathered in the teacher's order, ``c`` the band coordinate,
    ``a = (c − l)/β``, ``b = (u − c)/β``, the band ``m = σ(a)σ(b)`` and the weight ``w`` (``m`` with
    ``w_1 = 1`` for the target class), ``terms`` gives L, the student's gradient ∂L/∂z and
    ``w ⊙ ∂L/∂w``; this class takes the latter to the bounds,

        ∂w_k/∂l = −w_k σ(−a_k) / β,   ∂w_k/∂u = w_k σ(−b_k) / β   (k ≥ 2 with the target class)

    and ``kept``'s own gradient to the bounds through ``m``. ``1 − w`` is summed as
    ``σ(−a) + σ(a)σ(−b)`` (two positive terms), exact where the band keeps almost everything. With
    ``guard_floor`` set, rows whose ``kept`` is below it pass no L gradient to the bounds (the
    anti-collapse guard); the student's gradient is unchanged.

    The forward runs in blocks of ``block_rows(V)`` rows and differentiates each block at once: it
    keeps, for backward, the student's gradient per unit of ``L`` in vocabulary order (one float32
    [n, V] block) and four numbers per row, ∂L/∂l, ∂L/∂u, ∂kept/∂l, ∂kept/∂u. Every other [n, V]
    intermediate lives one block at a time, small enough to be reused from the allocator's heap.
    """

    @staticmethod
    def forward(ctx, student_rows, lower, upper, teacher_sorted, order, real, band, temperature, beta, target_class,
                guard_floor, terms):
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
                None if real is None else real[block], band, temperature, beta, 1 if target_class else 0, terms,
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
        return grad_student, grad_lower, grad_upper, None, None, None, None, None, None, None, None, None


def _block(student_rows, lower, upper, teacher_sorted, order, real, band, temperature, beta, first, terms,
           grad_student, partials) -> tuple[Tensor, Tensor]:
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
    kept_in_band = row_dot(weight[:, first:], teacher_probs[:, first:])
    clippable = teacher_probs[:, first:].sum(-1)
    kept = torch.where(clippable > 0, kept_in_band / clippable.clamp_min(tiny), 1.0)
    if first:  # the target class: w_1 = 1, so m becomes w (kept above read m at k ≥ 2 only)
        weight[:, 0] = 1
        out_of_band[:, 0] = 0
    weighted_teacher = weight * teacher_probs  # t_k = w_k p_k
    block = RestBlock(teacher_sorted, teacher_probs, student_sorted, student_probs, weight, out_of_band,
                      weighted_teacher, row_dot(out_of_band, teacher_probs), row_dot(out_of_band, student_probs))
    del student_sorted  # the block's own from here: the base may reuse it
    value, grad_sorted, through = terms(block, grad_student is not None, partials is not None)
    del block
    if grad_student is not None:  # back in vocabulary order
        grad_student.scatter_(-1, order, grad_sorted)
        del grad_sorted
    if partials is not None:  # w ∂L/∂w through w to the bounds at k ≥ first
        through[:, :first] = 0
        weighted_teacher[:, :first] = 0  # kept reads m p at k ≥ first, which is w p there
        kept_scale = torch.where(clippable > 0, 1 / clippable.clamp_min(tiny), 0.0)
        partials[0] = -row_dot(through, sig_neg_a) / beta  # ∂w/∂l = −w σ(−a)/β
        partials[1] = row_dot(through, sig_neg_b) / beta  # ∂w/∂u = w σ(−b)/β
        partials[2] = -row_dot(weighted_teacher, sig_neg_a) * kept_scale / beta
        partials[3] = row_dot(weighted_teacher, sig_neg_b) * kept_scale / beta
    return value, kept


def row_dot(x: Tensor, y: Tensor) -> Tensor:
    """Σ_v x[i, v] y[i, v] per row, [n, V] × [n, V] -> [n]."""
    return torch.linalg.vecdot(x, y, dim=-1)

