"""How strongly one loss term pulls against another: the ratio of their gradient norms."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def gradient_norm_ratio(term_a: Tensor, term_b: Tensor, params: Sequence[Tensor]) -> Tensor:
    """``‖∂term_a/∂params‖₂ / ‖∂term_b/∂params‖₂``, the norms taken over all of ``params`` together.

    term_a, term_b: scalar losses whose graphs reach ``params`` (the student's parameters, or its
    logits). Returns a detached float32 scalar: 0 when ``term_a``'s gradient is zero (whatever
    ``term_b``'s), +inf when only ``term_b``'s is.

    Both graphs are kept (``retain_graph=True``) so the caller can still back-propagate the total
    loss through plain-autograd terms. A loss computed with ``chunk_size`` has already been
    differentiated in its forward and takes one backward only; for those, and to avoid a second
    pass through the model, measure on detached logits instead:

        logits = student_logits.detach().requires_grad_()
        ratio = gradient_norm_ratio(span_loss(logits, ...), distill_loss(logits, ...), [logits])
    """
    norms = []
    for term in (term_a, term_b):
        grads = torch.autograd.grad(term, list(params), retain_graph=True, allow_unused=True)
        squares = [grad.detach().float().pow(2).sum() for grad in grads if grad is not None]
        norms.append(torch.stack(squares).sum().sqrt() if squares else term.new_zeros((), dtype=torch.float32))
    numerator, denominator = norms
    return torch.where(numerator > 0, numerator / denominator, 0.0)
