"""gradient_norm_ratio: a known ratio, terms that do not reach the parameters, and the graph kept."""

from __future__ import annotations

import torch

from mgsr_lightning.losses import forward_kl, gradient_norm_ratio, span_correlation_loss


def test_known_ratio_and_the_graph_is_kept():
    weight = torch.randn(3, 4, requires_grad=True)
    bias = torch.randn(4, requires_grad=True)
    base = (weight.sum(0) + bias).pow(2).sum()
    ratio = gradient_norm_ratio(3 * base, base, [weight, bias])
    torch.testing.assert_close(ratio, torch.tensor(3.0))  # up to float32 rounding of the two norms
    assert not ratio.requires_grad
    (base + 3 * base).backward()  # still differentiable afterwards
    assert weight.grad is not None


def test_terms_that_do_not_reach_the_parameters():
    weight = torch.randn(3, requires_grad=True)
    other = torch.randn(3, requires_grad=True)
    assert gradient_norm_ratio(other.sum(), weight.pow(2).sum(), [weight]).item() == 0.0
    assert gradient_norm_ratio(other.sum(), other.sum() * 2, [weight]).item() == 0.0
    assert gradient_norm_ratio(weight.pow(2).sum(), other.sum(), [weight]).item() == float("inf")


def test_on_detached_logits_with_chunked_losses(make_case):
    student, teacher, mask = make_case()
    logits = student.detach().requires_grad_(True)
    spans = torch.zeros(mask.shape, dtype=torch.long)
    chunked = gradient_norm_ratio(
        span_correlation_loss(logits, teacher, mask, spans=spans, chunk_size=2),
        forward_kl(logits, teacher, mask, chunk_size=2),
        [logits],
    )
    plain = gradient_norm_ratio(
        span_correlation_loss(logits, teacher, mask, spans=spans), forward_kl(logits, teacher, mask), [logits]
    )
    torch.testing.assert_close(chunked, plain)
