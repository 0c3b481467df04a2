"""What every loss in this package shares: float32 log-probabilities, `-inf`-safe terms, and the
loop over compared positions (masking, chunking, reduction).

Shapes: ``B`` batch, ``T`` positions, ``V`` vocabulary, ``N = B·T`` flattened positions, ``P`` the
compared rows (masked positions, or adjacent pairs for the span loss), ``n`` the rows of one chunk.

Memory. With ``chunk_size=None`` a loss runs once over all ``P`` rows with plain autograd, which
keeps several ``[P, V]`` float32 intermediates alive until backward. With ``chunk_size=c`` and
reduction ``"mean"``/``"sum"``, ``_ChunkedRowSums`` differentiates each ``[c, V]`` chunk right
after computing it and keeps only the gradient buffer of each input that needs one (the same size
and dtype as that input, i.e. the gradient autograd would return anyway), so the extra memory is
O(c·V). Under ``torch.no_grad()`` chunking bounds memory for every reduction; ``"none"`` with
autograd runs the chunks with plain autograd, so it keeps every chunk's intermediates.

Which rows are compared is decided once per call with ``mask.nonzero()`` (one host sync): prompt
and padding positions are often half of a batch, and skipping them halves the work, which matters
most for DAC-KL, about 3 times the cost of forward KL per row. "mean" then divides by
``max(P, 1)``, a host integer: no division by zero and no further sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

REDUCTIONS = ("mean", "sum", "none")

# Log-probability given to vocabulary entries that are -inf in both logits (a padded vocabulary).
# exp() of it is exactly 0 in float32 and float64, so those entries still carry no probability, but
# it is finite: no formula meets -inf - (-inf) and no gradient becomes NaN.
PADDED_LOG_PROB = -1.0e4

# row_fn(*rows) -> [n, 1 + d]: column 0 the per-row loss, columns 1.. per-row diagnostics (detached).
RowFn = Callable[..., Tensor]


def upcast(logits: Tensor) -> Tensor:
    """``logits`` in float32, or float64 if they already are (the references and gradcheck use it)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def log_softmax(logits: Tensor, temperature: float) -> Tensor:
    """``log_softmax(upcast(logits) / τ)`` over the last dim; when τ = 1 the upcast happens inside the
    softmax (its ``dtype``), so a bf16 input costs no float32 [n, V] copy of itself."""
    if temperature == 1:
        return torch.log_softmax(logits, dim=-1, dtype=upcast(logits[:0]).dtype)
    return torch.log_softmax(upcast(logits) / temperature, dim=-1)


def log_softmax_pair(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Student and teacher log-probabilities ``log_softmax(z / τ)``, [n, V] each, in float32
    (float64 inputs stay float64).

    Entries that are ``-inf`` in both logits get ``PADDED_LOG_PROB``. An entry that is ``-inf`` in
    one logit only is a true zero-probability event and stays ``-inf``.
    """
    padded = torch.isneginf(student_logits) & torch.isneginf(teacher_logits)  # [n, V]
    student_log_probs = log_softmax(student_logits, temperature)
    teacher_log_probs = log_softmax(teacher_logits, temperature)
    return (
        student_log_probs.masked_fill(padded, PADDED_LOG_PROB),
        teacher_log_probs.masked_fill(padded, PADDED_LOG_PROB),
    )


def kl_terms(log_a: Tensor, log_b: Tensor) -> Tensor:
    """Elementwise ``a·(log a − log b)`` with ``0·log 0 = 0``; summing over V gives KL(a‖b).

    log_a, log_b: [..., V] log-probabilities. Where ``a = 0`` the term is 0 whatever ``b`` is; where
    ``a > 0`` and ``b = 0`` it is ``+inf``, as the formula says. The difference is zeroed (not the
    product) so that no NaN from ``-inf − (-inf)`` reaches the gradient.
    """
    a = log_a.exp()
    return a * torch.where(a > 0, log_a - log_b, 0.0)


def check_inputs(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None,
    temperature: float,
    reduction: str,
    chunk_size: int | None,
) -> None:
    """Raise ``ValueError`` with a readable message for inputs the losses cannot compare."""
    if student_logits.dim() != 3 or student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits {tuple(teacher_logits.shape)} must "
            "both be [B, T, V] with the same shape: align the positions (position t of both predicts the same "
            "token) and slice a padded vocabulary to the size of the shared tokenizer before calling the loss"
        )
    if mask is not None and (mask.dtype != torch.bool or mask.shape != student_logits.shape[:2]):
        raise ValueError(
            f"mask must be a bool tensor of shape {tuple(student_logits.shape[:2])}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    check_options(temperature, reduction, chunk_size, "positions")


def check_options(temperature: float, reduction: str, chunk_size: int | None, chunked: str) -> None:
    """Raise ``ValueError`` for a loss option out of range; ``chunked`` names what a chunk counts."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of {chunked} or None, got {chunk_size}")


def compared_positions(mask: Tensor | None, shape: torch.Size, device: torch.device) -> Tensor:
    """[P] indices, in the flattened B·T axis, of the positions to compare: the True entries of
    ``mask`` [B, T], or all positions when there is no mask."""
    if mask is None:
        return torch.arange(shape[0] * shape[1], device=device)
    return mask.reshape(-1).nonzero().squeeze(1)


def reduce_positions(
    row_fn: RowFn,
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None,
    *,
    reduction: str,
    chunk_size: int | None,
    params: Sequence[Tensor] = (),
) -> tuple[Tensor, Tensor]:
    """``reduce_rows`` for losses with one row per position: ``row_fn(student_rows, teacher_rows)``."""
    positions = compared_positions(mask, student_logits.shape, student_logits.device)
    return reduce_rows(
        row_fn,
        (student_logits, teacher_logits),
        (positions,),
        out_shape=student_logits.shape[:2],
        reduction=reduction,
        chunk_size=chunk_size,
        params=params,
    )


def reduce_rows(
    row_fn: RowFn,
    inputs: Sequence[Tensor],
    row_index: Sequence[Tensor],
    *,
    out_shape: torch.Size,
    reduction: str,
    chunk_size: int | None,
    params: Sequence[Tensor] = (),
) -> tuple[Tensor, Tensor]:
    """Apply ``row_fn`` to the compared rows and reduce.

    inputs: [B, T, V] tensors (any strides: rows are gathered, never the whole tensor reshaped).
    row_index: [P] flat B·T positions, one tensor per row role (one for token losses; the first and
    second position of each pair for the span loss). ``row_fn`` receives, for each index in turn,
    every input gathered at it ([n, V] each), and returns [n, 1 + d]. params: tensors ``row_fn``
    uses that may need gradients (ClipNet's weights).

    Returns ``(loss, diagnostics)``: loss is [] for "mean" (sum over rows / max(P, 1)) and "sum", or
    ``out_shape`` [B, T] for "none" (row i's loss at position ``row_index[0][i]``, zeros elsewhere);
    diagnostics is [d], the detached mean over rows of the diagnostic columns.
    """
    num_rows = row_index[0].numel()
    chunk = chunk_size if chunk_size is not None else max(num_rows, 1)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs, *params))
    if reduction != "none" and chunk_size is not None and needs_grad:
        sums = _ChunkedRowSums.apply(row_fn, tuple(row_index), chunk, len(inputs), *inputs, *params)
        loss = sums[0]
    else:
        with _autocast_off(inputs[0].device):
            chunks = [
                row_fn(*_gather(inputs, row_index, start, min(start + chunk, num_rows)))
                for start in range(0, max(num_rows, 1), chunk)
            ]
        values = torch.cat(chunks)  # [P, 1 + d]
        sums = values.sum(0)
        loss = sums[0]
        if reduction == "none":
            loss = values.new_zeros(out_shape.numel()).index_add(0, row_index[0], values[:, 0]).view(out_shape)
    if reduction == "mean":
        loss = loss / max(num_rows, 1)
    return loss, sums[1:].detach() / max(num_rows, 1)


def _gather(inputs: Sequence[Tensor], row_index: Sequence[Tensor], start: int, stop: int) -> list[Tensor]:
    """Rows ``start:stop`` of the compared rows: for each index, each input, [stop − start, V]."""
    blocks = []
    for index in row_index:
        rows = index[start:stop]
        for x in inputs:
            blocks.append(x[rows // x.size(1), rows % x.size(1)])
    return blocks


def _autocast_off(device: torch.device):
    """The losses compute in float32 even inside a mixed-precision region (ClipNet's Linear included)."""
    return torch.autocast(device_type=device.type, enabled=False)


class _ChunkedRowSums(torch.autograd.Function):
    """Column sums [1 + d] of ``row_fn`` over all rows, one chunk at a time, differentiated in the forward.

    Each chunk's loss is back-propagated to that chunk's rows (and to ``params``) as soon as it is
    computed, into gradient buffers the size of the inputs; then the chunk's intermediates are freed.
    So each chunk is computed once (DAC-KL sorts each chunk once) and peak extra memory is one chunk.
    Backward only scales the buffers, in place, by the incoming gradient of column 0 (the diagnostic
    columns are constants). Because of that in-place scaling the graph can be back-propagated once:
    a second backward through it (``retain_graph=True``) is refused by autograd's version check.
    """

    @staticmethod
    def forward(ctx, row_fn: RowFn, row_index, chunk_size: int, num_inputs: int, *tensors: Tensor) -> Tensor:
        inputs, params = tensors[:num_inputs], tensors[num_inputs:]
        wants_grad = ctx.needs_input_grad[4:]
        # contiguous buffers, so that an input's buffer can be addressed by flat B·T position
        grads = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) if w else None
                 for t, w in zip(tensors, wants_grad)]
        num_rows = row_index[0].numel()
        sums = None
        for start in range(0, max(num_rows, 1), chunk_size):
            stop = min(start + chunk_size, num_rows)
            # block k holds input k % num_inputs gathered at row_index[k // num_inputs]
            blocks = _gather(inputs, row_index, start, stop)
            blocks = [block.requires_grad_(wants_grad[k % num_inputs]) for k, block in enumerate(blocks)]
            with torch.enable_grad(), _autocast_off(inputs[0].device):
                values = row_fn(*blocks)  # [n, 1 + d]
                wrt = [block for block in blocks if block.requires_grad]
                wrt += [p for p, wanted in zip(params, wants_grad[num_inputs:]) if wanted]
                chunk_grads = iter(torch.autograd.grad(values[:, 0].sum(), wrt, allow_unused=True) if wrt else ())
            for k, block in enumerate(blocks):
                grad = next(chunk_grads) if block.requires_grad else None
                if grad is not None:
                    buffer = grads[k % num_inputs]
                    buffer.view(-1, buffer.size(-1)).index_add_(0, row_index[k // num_inputs][start:stop], grad)
            for j, wanted in enumerate(wants_grad[num_inputs:]):
                grad = next(chunk_grads) if wanted else None
                if grad is not None:
                    grads[num_inputs + j] += grad
            chunk_sums = values.detach().sum(0)
            sums = chunk_sums if sums is None else sums + chunk_sums
        ctx.save_for_backward(*[g for g in grads if g is not None])
        return sums

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_sums: Tensor):
        buffers = iter(ctx.saved_tensors)
        scale = grad_sums[0]
        grads = [next(buffers).mul_(scale) if wanted else None for wanted in ctx.needs_input_grad[4:]]
        return (None, None, None, None, *grads)
