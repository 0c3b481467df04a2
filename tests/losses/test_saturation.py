"""The skew forward KL's ceiling and vanishing gradient, and the first-step check built on them."""

from __future__ import annotations

import math

import pytest
import torch

from mgsr_lightning.losses import forward_kl, skew_forward_kl
from mgsr_lightning.losses.saturation import saturation_message, skew_forward_kl_bound


def _peaked_pair(vocab: int = 64, target: int = 5, missed: float = 1e-4):
    """One position: a teacher sure of ``target`` (p ≈ 0.99) and a student giving it probability ``missed``."""
    teacher = torch.full((1, 1, vocab), -10.0)
    teacher[..., target] = math.log(0.99 * (vocab - 1) * math.exp(-10.0) / 0.01)
    student = torch.zeros(1, 1, vocab)
    student[..., target] = math.log(missed * (vocab - 1) / (1 - missed))
    return student, teacher


@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_skew_forward_kl_gradient_on_a_missed_token_scales_with_q(alpha):
    """Where the teacher is sure and the student is not, the gradient is -(1-a) q (p/m - sum p q / m):
    about -((1-a)/a) q, thousands of times smaller than forward KL's q - p."""
    student, teacher = _peaked_pair(missed=1e-4)
    student.requires_grad_()
    skew_forward_kl(student, teacher, alpha=alpha).backward()
    skew_grad = student.grad[0, 0].clone()
    student.grad = None
    forward_kl(student, teacher).backward()
    fkl_grad = student.grad[0, 0]

    p = torch.softmax(teacher[0, 0].double(), -1)
    q = torch.softmax(student.detach()[0, 0].double(), -1)
    m = alpha * p + (1 - alpha) * q
    expected = -(1 - alpha) * q * (p / m - (p * q / m).sum())
    torch.testing.assert_close(skew_grad.double(), expected, rtol=1e-4, atol=1e-7)
    assert q[5] == pytest.approx(1e-4, rel=1e-3)
    assert abs(float(skew_grad[5])) < 1.1 * (1 - alpha) / alpha * 1e-4
    assert float(fkl_grad[5]) == pytest.approx(float(q[5] - p[5]), abs=1e-5)
    assert abs(float(fkl_grad[5])) > 0.98


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5])
def test_skew_forward_kl_never_exceeds_log_one_over_alpha_and_reaches_it_when_the_student_misses(alpha):
    bound = skew_forward_kl_bound(alpha)
    torch.manual_seed(0)
    for scale in (1.0, 10.0, 50.0):
        value = skew_forward_kl(torch.randn(4, 6, 100) * scale, torch.randn(4, 6, 100) * scale, alpha=alpha)
        assert float(value) <= bound + 1e-5
    student, teacher = _peaked_pair(missed=1e-9)
    assert 0.9 * bound <= float(skew_forward_kl(student, teacher, alpha=alpha)) <= bound
    assert skew_forward_kl_bound(0.0) == math.inf


def test_saturation_message_only_for_a_skew_forward_kl_near_its_bound():
    bound = math.log(10)
    message = saturation_message("skew_forward_kl", {"alpha": 0.1}, 0.99 * bound, step=0)
    assert message is not None and "99% of its bound log(1/alpha) = 2.30" in message
    assert "model.init_args.student.name_or_path" in message and "sft_weight" in message
    assert saturation_message("skew_forward_kl", {}, 0.49 * bound) is None  # alpha defaults to DistiLLM's 0.1
    assert saturation_message("skew_forward_kl", {"alpha": 0.1}, 0.51 * bound) is not None
    assert saturation_message("forward_kl", {}, 50.0) is None  # unbounded: it keeps its gradient
    assert saturation_message("skew_forward_kl", {"alpha": 0.0}, 50.0) is None
