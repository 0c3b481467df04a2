"""Fixtures for the loss tests: random aligned logits with a response mask, and float64 helpers
written plainly with ``math`` (one position at a time) for the references."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from mgsr_lightning.losses import dac_kl


def _make_case(B=2, T=5, V=11, *, scale=2.0, padded=0, dtype=torch.float32, seed=0):
    """(student [B, T, V + padded], teacher [B, T, V + padded], mask [B, T]); padded columns are -inf in both."""
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(B, T, V, generator=generator, dtype=torch.float64) * scale
    teacher = torch.randn(B, T, V, generator=generator, dtype=torch.float64) * scale
    if padded:
        pad = torch.full((B, T, padded), float("-inf"), dtype=torch.float64)
        student, teacher = torch.cat([student, pad], -1), torch.cat([teacher, pad], -1)
    mask = torch.rand(B, T, generator=generator) > 0.35
    mask[0, 0] = True
    mask[-1, -1] = False
    return student.to(dtype), teacher.to(dtype), mask


@pytest.fixture
def make_case():
    return _make_case


def softmax64(logits: torch.Tensor, temperature: float = 1.0) -> list[float]:
    """Softmax of one row in float64 Python arithmetic; -inf entries get probability 0."""
    values = [float(x) / temperature for x in logits.tolist()]
    top = max(v for v in values if v != float("-inf"))
    weights = [0.0 if v == float("-inf") else math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


def kl64(a: list[float], b: list[float]) -> float:
    """KL(a‖b) = Σ a_v log(a_v / b_v) over a_v > 0."""
    return sum(x * (math.log(x) - math.log(y)) for x, y in zip(a, b) if x > 0)


@pytest.fixture
def softmax_ref():
    return softmax64


@pytest.fixture
def kl_ref():
    return kl64


def reduce64(per_position: list[list[float]], mask: torch.Tensor, reduction: str):
    """Reduce a [B][T] list of per-position values over the mask, in float64."""
    values = torch.tensor(per_position, dtype=torch.float64) * mask
    if reduction == "none":
        return values
    total = values.sum()
    return total / max(int(mask.sum()), 1) if reduction == "mean" else total


@pytest.fixture
def reduce_ref():
    return reduce64


def reference_divergence(name, params, p, q, kl):
    """One position's divergence from its textbook formula; p teacher, q student (float lists); ``alpha_beta``
    is ``abkd``'s other name."""
    if name == "forward_kl":
        return kl(p, q)
    if name == "reverse_kl":
        return kl(q, p)
    if name == "symmetric_kl":
        lam = params.get("lam", 0.9)
        return (1 - lam) * kl(p, q) + lam * kl(q, p)
    if name == "skew_forward_kl":
        alpha = params.get("alpha", 0.1)
        return kl(p, [alpha * a + (1 - alpha) * b for a, b in zip(p, q)])
    if name == "skew_reverse_kl":
        alpha = params.get("alpha", 0.1)
        return kl(q, [(1 - alpha) * a + alpha * b for a, b in zip(p, q)])
    if name == "generalized_jsd":  # TRL's generalized_jsd_loss, including its end points
        beta = params.get("beta", 0.5)
        if beta == 0:
            return kl(p, q)
        if beta == 1:
            return kl(q, p)
        m = [beta * a + (1 - beta) * b for a, b in zip(p, q)]
        return beta * kl(p, m) + (1 - beta) * kl(q, m)
    if name == "total_variation":
        return 0.5 * sum(abs(a - b) for a, b in zip(p, q))
    if name in ("abkd", "alpha_beta"):
        return alpha_beta64(p, q, params.get("alpha", 0.2), params.get("beta", 0.7))
    raise AssertionError(name)


def alpha_beta64(p, q, a, b):
    """Cichocki et al.'s D_AB^(α,β)(p‖q) and its limits, term by term over the entries with p or q > 0."""
    pairs = [(x, y) for x, y in zip(p, q) if x > 0 or y > 0]
    if a == 0 and b == 0:
        return 0.5 * sum((math.log(x) - math.log(y)) ** 2 for x, y in pairs)
    if b == 0:
        return sum(x**a * math.log(x**a / y**a) - x**a + y**a for x, y in pairs) / a**2
    if a == 0:
        return sum(y**b * math.log(y**b / x**b) - y**b + x**b for x, y in pairs) / b**2
    if a + b == 0:
        return sum(math.log(y**a / x**a) + x**a / y**a - 1 for x, y in pairs) / a**2
    return -sum(x**a * y**b - a / (a + b) * x ** (a + b) - b / (a + b) * y ** (a + b) for x, y in pairs) / (a * b)


@pytest.fixture
def divergence_ref():
    return reference_divergence


class BoundClipNet(torch.nn.Module):
    """``clip_net`` called with the given weights (so gradcheck can perturb them)."""

    def __init__(self, clip_net, weights):
        super().__init__()
        self.clip_net, self.weights = clip_net, weights

    def forward(self, probs):
        return functional_call(self.clip_net, self.weights, (probs,))

    def parameters(self, recurse=True):
        return iter(self.weights.values())


def written_and_taped(student, teacher, mask, clip_net, **options):
    """[(loss, diagnostics, grads to the student and ClipNet)] for the written path, then the taped one."""
    results = []
    for written in (True, False):
        s = student.clone().requires_grad_(True)
        loss, diagnostics = dac_kl(s, teacher, mask, clip_net=clip_net, written_backward=written, **options)
        wrt = [s, *(clip_net.parameters() if clip_net is not None else ())]
        results.append((loss, diagnostics, torch.autograd.grad(loss, wrt)))
    return results
