"""The ceilings of the bounded divergences and their vanishing gradients, and the first-step check built on them."""

from __future__ import annotations

import math

import pytest
import torch

from mgsr_lightning.losses import (
    alpha_beta_divergence,
    forward_kl,
    generalized_jsd,
    skew_forward_kl,
    skew_reverse_kl,
    total_variation,
)
from mgsr_lightning.losses.saturation import (
    alpha_beta_far_value,
    divergence_ceiling,
    saturation_message,
    skew_forward_kl_bound,
)


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


def _disjoint_pair(vocab: int = 64):
    """A teacher sure of token 3 and a student sure of token 7: the farthest a student can be."""
    teacher = torch.full((1, 1, vocab), -200.0)
    teacher[..., 3] = 200.0
    student = torch.full((1, 1, vocab), -200.0)
    student[..., 7] = 200.0
    return student, teacher


@pytest.mark.parametrize("alpha, beta", [(0.2, 0.7), (0.1, 0.8), (0.5, 0.5), (1.0, 1.0), (0.3, 1.2)])
def test_alpha_beta_divergence_of_a_far_student_is_one_over_alpha_beta(alpha, beta):
    """Disjoint supports: the cross term sum p^a q^b is 0, leaving (a sum p^(a+b) + b sum q^(a+b)) / (ab(a+b)) =
    1/(ab) for one-hot p and q; with a + b >= 1 no pair goes above it."""
    student, teacher = _disjoint_pair()
    value = float(alpha_beta_divergence(student, teacher, alpha=alpha, beta=beta))
    assert value == pytest.approx(alpha_beta_far_value(alpha, beta), rel=1e-5)
    assert divergence_ceiling("abkd", {"alpha": alpha, "beta": beta}).value == pytest.approx(1 / (alpha * beta))
    torch.manual_seed(0)
    if alpha + beta >= 1:
        for scale in (1.0, 10.0, 50.0):
            pair = torch.randn(2, 4, 6, 100) * scale
            assert float(alpha_beta_divergence(pair[0], pair[1], alpha=alpha, beta=beta)) <= 1 / (alpha * beta) + 1e-4


def test_alpha_beta_divergence_of_a_spread_far_student_follows_the_formula():
    """alpha + beta < 1 (ABKD's 0.2, 0.7): a student spread over the tokens the teacher never gives sits at
    (a sum p^s + b sum q^s) / (ab s), s = a + b, above 1/(ab)."""
    alpha, beta, vocab = 0.2, 0.7, 1024
    teacher = torch.full((1, 1, vocab), -60.0)
    teacher[..., 0] = 60.0
    student = torch.zeros(1, 1, vocab)
    student[..., 0] = -60.0
    s = alpha + beta
    expected = (alpha * 1.0 + beta * (vocab - 1) * (1 / (vocab - 1)) ** s) / (alpha * beta * s)
    assert float(alpha_beta_divergence(student, teacher, alpha=alpha, beta=beta)) == pytest.approx(expected, rel=1e-4)
    assert expected > 1 / (alpha * beta)


@pytest.mark.parametrize("alpha, beta", [(0.2, 0.7), (0.1, 0.8), (0.5, 0.5)])
def test_alpha_beta_gradient_on_a_missed_token_scales_with_q_to_the_beta(alpha, beta):
    """dD/dq_v = q_v^(b-1) (q_v^a - p_v^a) / a, so the gradient on the logit of a token the teacher is sure of
    and the student misses is about -q^b / a (forward KL's: q - p, about -1)."""
    student, teacher = _peaked_pair(missed=1e-4)
    student = student.double().requires_grad_()
    alpha_beta_divergence(student, teacher.double(), alpha=alpha, beta=beta).backward()
    p = torch.softmax(teacher[0, 0].double(), -1)
    q = torch.softmax(student.detach()[0, 0], -1)
    f = q.pow(beta - 1) * (q.pow(alpha) - p.pow(alpha)) / alpha
    expected = q * (f - (q * f).sum())
    torch.testing.assert_close(student.grad[0, 0], expected, rtol=1e-6, atol=1e-10)
    missed = float(student.grad[0, 0, 5])
    assert missed < 0 and 0.5 < abs(missed) / (float(q[5]) ** beta / alpha) < 1.1
    assert abs(missed) < 0.2


@pytest.mark.parametrize("name, function, params, ceiling", [
    ("skew_reverse_kl", skew_reverse_kl, {"alpha": 0.1}, math.log(10)),
    ("skew_reverse_kl", skew_reverse_kl, {}, math.log(10)),
    ("generalized_jsd", generalized_jsd, {"beta": 0.5}, math.log(2)),
    ("generalized_jsd", generalized_jsd, {"beta": 0.1}, -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))),
    ("total_variation", total_variation, {}, 1.0),
    ("skew_forward_kl", skew_forward_kl, {"alpha": 0.1}, math.log(10)),
])
def test_bounded_divergences_reach_their_ceiling_only_far_from_the_teacher(name, function, params, ceiling):
    assert divergence_ceiling(name, params).value == pytest.approx(ceiling)
    student, teacher = _disjoint_pair()
    assert float(function(student, teacher, **params)) == pytest.approx(ceiling, rel=1e-5)
    torch.manual_seed(0)
    for scale in (1.0, 10.0, 50.0):
        pair = torch.randn(2, 4, 6, 100) * scale
        assert float(function(pair[0], pair[1], **params)) <= ceiling + 1e-5


@pytest.mark.parametrize("name, params", [("forward_kl", {}), ("reverse_kl", {}), ("symmetric_kl", {}),
                                          ("skew_forward_kl", {"alpha": 0.0}), ("skew_reverse_kl", {"alpha": 0.0}),
                                          ("generalized_jsd", {"beta": 0.0}), ("generalized_jsd", {"beta": 1.0}),
                                          ("abkd", {"alpha": 1.0, "beta": 0.0}),
                                          ("alpha_beta", {"alpha": 0.0, "beta": 1.0}),
                                          ("alpha_beta", {"alpha": -0.5, "beta": 0.5}), ("dac_kl", {})])
def test_unbounded_terms_have_no_ceiling_and_never_warn(name, params):
    assert divergence_ceiling(name, params) is None
    assert saturation_message(name, params, 1e6) is None


@pytest.mark.parametrize("name, params, value, expected", [
    ("abkd", {"alpha": 0.2, "beta": 0.7}, 12.6,
     "the alpha-beta divergence (ABKD) is 12.60 nats per token at step 0, 176% of its value for a student far from "
     "the teacher, 1/(alpha*beta) = 7.14"),
    ("alpha_beta", {}, 7.0, "(ABKD) is 7.00 nats per token at step 0, 98% of its value"),  # ABKD's defaults 0.2, 0.7
    ("abkd", {"alpha": 0.5, "beta": 0.5}, 3.0,
     "(ABKD) is 3.00 nats per token at step 0, 75% of its bound 1/(alpha*beta) = 4.00"),
    ("skew_reverse_kl", {"alpha": 0.1}, 2.0, "the skew reverse KL is 2.00 nats per token at step 0, 87% of its bound "
     "log(1/alpha) = 2.30"),
    ("generalized_jsd", {"beta": 0.5}, 0.6, "the generalised JSD is 0.60 nats per token at step 0, 87% of its bound"),
    ("total_variation", {}, 0.9, "the total variation distance is 0.90 per token at step 0, 90% of its bound 1:"),
])
def test_saturation_message_for_every_bounded_divergence(name, params, value, expected):
    message = saturation_message(name, params, value)
    assert message is not None and expected in message
    assert "init_student.yaml" in message and '"config": null' in message
    ceiling = divergence_ceiling(name, params).value
    assert saturation_message(name, params, 0.49 * ceiling) is None


def test_saturation_message_only_for_a_skew_forward_kl_near_its_bound():
    bound = math.log(10)
    message = saturation_message("skew_forward_kl", {"alpha": 0.1}, 0.99 * bound, step=0)
    assert message is not None and "99% of its bound log(1/alpha) = 2.30" in message
    assert "--model.init_args.student='{\"name_or_path\": " in message and "sft_weight" in message
    assert saturation_message("skew_forward_kl", {}, 0.49 * bound) is None  # alpha defaults to DistiLLM's 0.1
    assert saturation_message("skew_forward_kl", {"alpha": 0.1}, 0.51 * bound) is not None
    assert saturation_message("forward_kl", {}, 50.0) is None  # unbounded: it keeps its gradient
    assert saturation_message("skew_forward_kl", {"alpha": 0.0}, 50.0) is None
