"""Fixtures for the loss tests: random aligned logits with a response mask, and float64 helpers
written plainly with ``math`` (one position at a time) for the references."""

from __future__ import annotations

import math

import pytest
import torch


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
