"""The output head and the losses fused: logits, loss and gradients computed chunk by chunk over the
positions, so that no whole ``[B, T, V]`` tensor (logits, probabilities or the logits' gradient) exists.

Shapes: ``B`` batch, ``T`` positions, ``H`` hidden size, ``V'`` the head's rows, ``V`` the shared
vocabulary (``V ≤ V'``: a head padded past the tokenizer is cut to V, as ``response_logits`` does),
``N = B·T`` flattened positions, ``n`` the positions of one chunk.

Unfused, a step holds the student's logits [B, T, V], the teacher's, and the student logits' gradient;
at V = 151,936 and T = 2,048 each is 1.2 GiB in float32. Fused (Liger's fused linear cross-entropy and
JSD), ``FusedHeadLoss.forward`` loops over chunks of the positions some term reads; for each it

    student_logits = student_hidden[chunk] @ student_head[:V].T (+ bias)       [n, V]
    teacher_logits = the teacher's [n, V] (its own head, or its cached top-k densified), no gradient
    chunk_loss     = Σ_term weight · term(student_logits, teacher_logits, chunk)   (the pure losses)

differentiates ``chunk_loss`` with autograd inside the chunk to the chunk's logits (and ClipNet's
parameters), turns the logits' gradient into the hidden states' and the head's (two matmuls, added
into gradient buffers), and frees the chunk. Backward only scales the stored gradients by the
incoming gradient. So the extra memory is the gradient buffers (the size of the hidden states, the
head and ClipNet: what autograd returns anyway) plus one chunk's intermediates, O(n·V).

The terms (:mod:`mgsr_lightning.losses.fused_terms`) call the unfused pure losses on each chunk with
``reduction="sum"`` and divide by the whole batch's count of rows, so the sum over chunks is the
unfused "mean" (same rows, same ``max(count, 1)``). A term that compares adjacent positions (the span
term) asks for one position of look-ahead: each chunk then also computes the logits of the next
position, so a pair across a chunk boundary is counted once, in the chunk of its first position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from mgsr_lightning.losses.sparse_teacher import densify


class ChunkTerm(Protocol):
    """One loss term over a chunk, built for one batch (:mod:`mgsr_lightning.losses.fused_terms`).

    ``rows`` [N] bool: the flat positions the term reads. ``lookahead``: the term also reads the
    position after each chunk. ``parameters``: tensors it uses that may need gradients (ClipNet's).
    Called as ``term(student_logits [1, n, V], teacher_logits [1, n, V] | None, positions [n], owned)``
    with ``positions`` the chunk's flat positions, of which the first ``owned`` are the chunk's own
    and the rest look-ahead; returns ``(share [], diagnostics {name: share []})``: the chunk's part of
    the term and of its diagnostics, so that summing over chunks gives the batch's values.
    """

    rows: Tensor
    lookahead: bool
    parameters: tuple[Tensor, ...]
    needs_teacher: bool

    def __call__(self, student_logits: Tensor, teacher_logits: Tensor | None, positions: Tensor,
                 owned: int) -> tuple[Tensor, dict[str, Tensor]]: ...


@dataclass(frozen=True)
class TeacherHead:
    """A live teacher's last hidden states [B, T, H_t] and output head [V_t', H_t] (bias [V_t'] or None)."""

    hidden: Tensor
    head: Tensor
    bias: Tensor | None = None

    @torch.no_grad()
    def logits(self, positions: Tensor, vocab_size: int) -> Tensor:
        """[n, V] teacher logits at the flat ``positions`` [n], cut to the shared vocabulary."""
        hidden = self.hidden.reshape(-1, self.hidden.size(-1))[positions]
        bias = self.bias[:vocab_size] if self.bias is not None else None
        return F.linear(hidden, self.head[:vocab_size], bias)


@dataclass(frozen=True)
class CachedTeacher:
    """A teacher cache's entries (:mod:`mgsr_lightning.losses.sparse_teacher`): top_ids [B, T, k],
    top_logprobs [B, T, k], rest_logprob [B, T]; densified one chunk at a time."""

    top_ids: Tensor
    top_logprobs: Tensor
    rest_logprob: Tensor

    @torch.no_grad()
    def logits(self, positions: Tensor, vocab_size: int) -> Tensor:
        """[n, V] float32 teacher log-probabilities at the flat ``positions`` [n]."""
        k = self.top_ids.size(-1)
        return densify(self.top_ids.reshape(-1, k)[positions], self.top_logprobs.reshape(-1, k)[positions],
                       self.rest_logprob.reshape(-1)[positions], vocab_size)


@dataclass(frozen=True)
class LogitsTeacher:
    """Teacher logits [B, T, V_t] some earlier step already holds (SCRG's scoring of its revised rollout):
    nothing to fuse on the teacher's side, the student's still is."""

    whole: Tensor

    @torch.no_grad()
    def logits(self, positions: Tensor, vocab_size: int) -> Tensor:
        """[n, V] the logits at the flat ``positions`` [n], cut to the shared vocabulary."""
        return self.whole.reshape(-1, self.whole.size(-1))[positions, :vocab_size]


Teacher = TeacherHead | CachedTeacher | LogitsTeacher


def fused_head_loss(
    student_hidden: Tensor,
    student_head: Tensor,
    terms: Mapping[str, tuple[float, ChunkTerm]],
    teacher: Teacher | None = None,
    *,
    student_bias: Tensor | None = None,
    vocab_size: int | None = None,
    chunk_size: int = 128,
    gradient_ratio: tuple[str, str] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``Σ weight · term`` over the batch, never holding a whole [B, T, V] tensor (module docstring).

    Args:
        student_hidden: [B, T, H], the student's last hidden states; position t's logits are compared
            as the terms' logits at t (align them as the unfused logits are aligned).
        student_head: [V', H] the student's output head weight; student_bias: [V'] or None.
        terms: {name: (weight, term)}, the terms built for this batch (``fused_terms``).
        teacher: ``TeacherHead`` or ``CachedTeacher``; None when no term reads the teacher.
        vocab_size: V, the shared vocabulary (the head's first V rows); None: all V' rows.
        chunk_size: positions per chunk (each chunk holds O(chunk_size · V) memory).
        gradient_ratio: ``(a, b)``, two term names: also measure ``‖∂a/∂logits‖₂ / ‖∂b/∂logits‖₂`` over the
            whole [B, T, V] logits (``gradient_norm_ratio``'s value and conventions), as ``values["a/b
            gradient ratio"]``; each chunk then differentiates the two terms once more.

    Returns:
        ``(loss, values)``: loss [] with gradients to ``student_hidden``, ``student_head``,
        ``student_bias`` and the terms' parameters (never to the teacher); values holds each term
        unweighted (``name``) and its diagnostics (``name/diagnostic``), detached.
    """
    if student_hidden.dim() != 3 or student_head.dim() != 2 or student_head.size(1) != student_hidden.size(-1):
        raise ValueError(
            f"student_hidden must be [B, T, H] and student_head [V, H], got {tuple(student_hidden.shape)} "
            f"and {tuple(student_head.shape)}"
        )
    vocab_size = student_head.size(0) if vocab_size is None else vocab_size
    if not 0 < vocab_size <= student_head.size(0):
        raise ValueError(f"vocab_size must be in [1, {student_head.size(0)}] (the head's rows), got {vocab_size}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of positions, got {chunk_size}")
    if teacher is None and any(term.needs_teacher for _, term in terms.values()):
        raise ValueError("a term reads the teacher: pass teacher=TeacherHead(...), CachedTeacher(...) or "
                         "LogitsTeacher(...)")
    if gradient_ratio is not None and not set(gradient_ratio) <= set(terms):
        raise ValueError(f"gradient_ratio names terms of {sorted(terms)}, got {gradient_ratio}")
    parameters = tuple(dict.fromkeys(p for _, term in terms.values() for p in term.parameters))
    values: dict[str, Tensor] = {}
    run = _Run(terms, teacher, vocab_size, chunk_size, values, gradient_ratio)
    loss = FusedHeadLoss.apply(run, student_hidden, student_head, student_bias, *parameters)
    return loss, values


@dataclass
class _Run:
    """What ``FusedHeadLoss`` needs besides the tensors it differentiates; ``values`` is filled by it."""

    terms: Mapping[str, tuple[float, ChunkTerm]]
    teacher: Teacher | None
    vocab_size: int
    chunk_size: int
    values: dict[str, Tensor]
    gradient_ratio: tuple[str, str] | None = None


class _GradientNorms:
    """The squared norm of each named term's gradient over the whole logits, summed chunk by chunk.

    A chunk's look-ahead row is the next chunk's first position: its gradient there is carried and added to
    the next chunk's first row before squaring, so every position's gradient is squared whole, once."""

    def __init__(self, names: tuple[str, ...]):
        self.squared = {name: torch.zeros((), dtype=torch.float64) for name in names}
        self.carried: dict[str, Tensor | None] = dict.fromkeys(names)

    def add(self, name: str, grad: Tensor, owned: int) -> None:
        grad = grad.double()
        carried = self.carried[name]
        if carried is not None and carried.numel():
            grad[:1] += carried
        self.squared[name] += grad[:owned].square().sum().cpu()
        self.carried[name] = grad[owned:]

    def ratio(self, a: str, b: str) -> Tensor:
        norm_a, norm_b = (torch.sqrt(self.squared[n] + (c.square().sum().cpu() if (c := self.carried[n]) is not None
                                                          else 0)) for n in (a, b))
        if norm_a == 0:
            return torch.zeros((), dtype=torch.float32)
        return (norm_a / norm_b).float() if norm_b > 0 else torch.tensor(float("inf"))


class FusedHeadLoss(torch.autograd.Function):
    """``Σ weight · term`` [] of the head's logits, differentiated chunk by chunk in the forward.

    Inputs: run, student_hidden [B, T, H], student_head [V', H], student_bias [V'] | None, *parameters.
    Gradients are accumulated in buffers (the hidden states', the bias's and each parameter's in float32,
    the head's in its dtype) and returned in each input's dtype; backward scales them in place, so the graph can
    be back-propagated once.
    """

    @staticmethod
    def forward(ctx, run: _Run, hidden: Tensor, head: Tensor, bias: Tensor | None, *parameters: Tensor) -> Tensor:
        wants = ctx.needs_input_grad[1:]
        inputs = (hidden, head, bias, *parameters)
        # the head's buffer in its own dtype (added to in place by each chunk's matmul, see
        # _add_head_gradients); the others in float32 at least
        grads = [torch.zeros(t.shape, dtype=t.dtype if k == 1 else torch.promote_types(t.dtype, torch.float32),
                             device=t.device) if w else None for k, (t, w) in enumerate(zip(inputs, wants))]
        grad_hidden, grad_head, grad_bias, *grad_parameters = grads
        trained = [(p, g) for p, g in zip(parameters, grad_parameters) if g is not None]
        flat_hidden = hidden.reshape(-1, hidden.size(-1))  # [N, H]
        head_rows = head[: run.vocab_size]  # [V, H]
        bias_rows = bias[: run.vocab_size] if bias is not None else None
        rows = torch.zeros(flat_hidden.size(0), dtype=torch.bool, device=hidden.device)
        for _, term in run.terms.values():
            rows |= term.rows
        positions = rows.nonzero().squeeze(1)  # [P] the positions some term reads
        lookahead = int(any(term.lookahead for _, term in run.terms.values()))
        wants_logits = wants[0] or wants[1] or wants[2]
        totals: dict[str, Tensor] = {}
        norms = _GradientNorms(run.gradient_ratio) if run.gradient_ratio is not None else None
        for start in range(0, positions.numel(), run.chunk_size):
            stop = min(start + run.chunk_size, positions.numel())
            chunk = positions[start : min(stop + lookahead, positions.numel())]  # [n], own + look-ahead
            chunk_hidden = flat_hidden[chunk]  # [n, H]
            with torch.no_grad():
                logits = F.linear(chunk_hidden, head_rows, bias_rows)  # [n, V]
            teacher_logits = run.teacher.logits(chunk, run.vocab_size)[None] if run.teacher is not None else None
            with torch.enable_grad():
                logits.requires_grad_(wants_logits)
                chunk_loss = logits.new_zeros((), dtype=torch.float32)
                for name, (weight, term) in run.terms.items():
                    share, diagnostics = term(logits[None], teacher_logits, chunk, stop - start)
                    chunk_loss = chunk_loss + weight * share
                    for key, value in {name: share, **{f"{name}/{k}": v for k, v in diagnostics.items()}}.items():
                        totals[key] = totals.get(key, 0) + value.detach()
                if norms is not None:  # on a detached copy: a chunked loss takes one backward only
                    for name in run.gradient_ratio:
                        probe = logits.detach().requires_grad_()
                        share = run.terms[name][1](probe[None], teacher_logits, chunk, stop - start)[0]
                        grad = torch.autograd.grad(share, probe, allow_unused=True)[0] if share.requires_grad else None
                        norms.add(name, grad if grad is not None else torch.zeros_like(logits), stop - start)
                wrt = ([logits] if wants_logits else []) + [p for p, _ in trained]
                chunk_grads = list(torch.autograd.grad(chunk_loss, wrt, allow_unused=True)) if wrt else []
            if wants_logits:
                grad_logits = chunk_grads.pop(0)  # [n, V], the logits' dtype
                if grad_logits is not None:
                    _add_head_gradients(grad_logits, chunk_hidden, head_rows, chunk, grad_hidden, grad_head, grad_bias)
            for (_, buffer), grad in zip(trained, chunk_grads):
                if grad is not None:
                    buffer += grad
            del logits, teacher_logits, chunk_loss, chunk_grads
        for name, (_, term) in run.terms.items():
            run.values[name] = totals.get(name, hidden.new_zeros((), dtype=torch.float32))
        run.values |= {key: value for key, value in totals.items() if "/" in key}
        if norms is not None:
            run.values[f"{run.gradient_ratio[0]}/{run.gradient_ratio[1]} gradient ratio"] = norms.ratio(
                *run.gradient_ratio)
        loss = sum((weight * run.values[name] for name, (weight, _) in run.terms.items()),
                   hidden.new_zeros((), dtype=torch.float32))
        ctx.dtypes = [t.dtype if t is not None else None for t in inputs]
        ctx.save_for_backward(*[g for g in grads if g is not None])
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved).mul_(grad_loss).to(dtype) if wanted else None
                 for wanted, dtype in zip(ctx.needs_input_grad[1:], ctx.dtypes)]
        return (None, *grads)


def _add_head_gradients(grad_logits: Tensor, chunk_hidden: Tensor, head_rows: Tensor, chunk: Tensor,
                        grad_hidden: Tensor | None, grad_head: Tensor | None, grad_bias: Tensor | None) -> None:
    """Back-propagate one chunk's logits' gradient [n, V] through ``logits = hidden @ head.T + bias``
    into the buffers: hidden states [B, T, H] (at the chunk's positions), head [V', H] (its first V
    rows; a padded head's other rows keep a zero gradient), bias [V'].

    The head's buffer is in the head's dtype and each chunk's product is added in place (``addmm_``,
    as Liger does): a float32 buffer for a bf16 head would need a [V, H] temporary and one more pass
    over the buffer per chunk, 12 times the matmul's own time at V = 151,936 on a CPU. So a bf16
    head's gradient is rounded once per chunk instead of once (relative error ~2⁻⁹·√chunks). Under
    autocast (bf16-mixed precision: bf16 logits of a float32 head), the product is taken in the logits'
    dtype, as the unfused head's backward takes it, and added into the float32 buffer."""
    vocab_size = grad_logits.size(-1)
    if grad_hidden is not None:
        grad_hidden.view(-1, grad_hidden.size(-1)).index_add_(0, chunk, (grad_logits @ head_rows).to(grad_hidden.dtype))
    if grad_head is not None and grad_logits.dtype == chunk_hidden.dtype == grad_head.dtype:
        grad_head[:vocab_size].addmm_(grad_logits.T, chunk_hidden)
    elif grad_head is not None:  # mixed precision (autocast: bf16 logits of a float32 head): the product in the
        grad_head[:vocab_size] += grad_logits.T @ chunk_hidden.to(grad_logits.dtype)  # logits' dtype, added up
    if grad_bias is not None:
        grad_bias[:vocab_size] += grad_logits.sum(0, dtype=grad_bias.dtype)
