"""MiniLLM's loss: the single-step term by hand, the policy-gradient estimator's expectation against the
exact gradient of the sequence-level reverse KL, the teacher-mixed importance weights, returns, padding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mgsr_lightning.losses.minillm import (
    MiniLLMConfig,
    minillm_loss,
    mixture_importance_weights,
    returns,
    single_step_term,
)

# The estimator exactly as the paper's gradient: no discount, scaling, clipping, whitening or normalisation.
UNBIASED = dict(gamma=1.0, length_norm=False, reward_scaling=1.0, reward_clip=None, whiten=False, clip_ratio=None)


def test_single_step_term_matches_a_hand_computed_reverse_kl():
    """q = (1/2, 1/4, 1/4), p = (1/4, 1/4, 1/2) over a vocabulary padded with a -inf entry in both:
    KL(q‖p) = 1/2·ln 2 + 0 + 1/4·ln(1/2) = ln 2 / 4 at position 0; q = p at position 1 (0); position 2
    masked. The mean over compared positions is ln 2 / 8, and ∂KL/∂z_v = q_v (log q_v/p_v − KL)."""
    neg_inf = float("-inf")
    student = torch.tensor([[[math.log(0.5), math.log(0.25), math.log(0.25), neg_inf],
                             [0.0, 0.0, 0.0, neg_inf],
                             [5.0, neg_inf, 1.0, neg_inf]]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[[math.log(0.25), math.log(0.25), math.log(0.5), neg_inf],
                             [1.0, 1.0, 1.0, neg_inf],
                             [0.0, 0.0, 0.0, neg_inf]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    value = single_step_term(student, teacher, mask)
    torch.testing.assert_close(value, torch.tensor(math.log(2) / 8, dtype=torch.float64))
    value.backward()
    q, ratio = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([math.log(2), 0.0, -math.log(2)])
    expected = q * (ratio - math.log(2) / 4) / 2  # the mean over 2 positions
    torch.testing.assert_close(student.grad[0, 0, :3].float(), expected)
    assert student.grad[0, 0, 3] == 0 and student.grad[0, 1].abs().max() == 0 and student.grad[0, 2].abs().max() == 0


def two_token_toy(seed: int = 0, vocab: int = 3):
    """A student whose position-1 logits depend on its token 0 (θ0 [V], θ1 [V, V]) and a fixed teacher alike."""
    generator = torch.Generator().manual_seed(seed)
    theta0 = torch.randn(vocab, generator=generator, dtype=torch.float64).requires_grad_()
    theta1 = torch.randn(vocab, vocab, generator=generator, dtype=torch.float64).requires_grad_()
    teacher0 = torch.randn(vocab, generator=generator, dtype=torch.float64)
    teacher1 = torch.randn(vocab, vocab, generator=generator, dtype=torch.float64)
    return (theta0, theta1), (teacher0, teacher1)


def exact_sequence_reverse_kl(student, teacher) -> torch.Tensor:
    """KL(q‖p) over all V² two-token sequences."""
    (s0, s1), (t0, t1) = student, teacher
    total = 0
    for a, b in itertools.product(range(s0.numel()), repeat=2):
        log_q = s0.log_softmax(-1)[a] + s1[a].log_softmax(-1)[b]
        log_p = t0.log_softmax(-1)[a] + t1[a].log_softmax(-1)[b]
        total = total + log_q.exp() * (log_q - log_p)
    return total


def sample_sequences(first_probs, second_probs, n, seed=1):
    """[n, 2] token pairs: token 0 from ``first_probs`` [V], token 1 from ``second_probs[token 0]`` [V, V]."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.multinomial(first_probs, n, replacement=True, generator=generator)
    second = torch.multinomial(second_probs[first], 1, generator=generator).squeeze(-1)
    return torch.stack([first, second], dim=1)


def toy_logits(params, tokens):
    """[n, 2, V] logits of the toy model over the sequences ``tokens`` [n, 2]."""
    first, second = params
    return torch.stack([first.expand(tokens.size(0), -1), second[tokens[:, 0]]], dim=1)


@pytest.mark.parametrize("single_step", [True, False])
def test_policy_gradient_expectation_is_the_exact_reverse_kl_gradient(single_step):
    """Over 200k student samples, the loss's gradient (per sequence: the token mean times 2 tokens) is the
    exact gradient of the sequence-level KL(q‖p), with the single-step decomposition (exact per-step KL +
    future rewards) and without it (plain REINFORCE on the return-to-go), to within 5 standard errors."""
    student, teacher = two_token_toy()
    exact = torch.autograd.grad(exact_sequence_reverse_kl(student, teacher), student)
    with torch.no_grad():
        tokens = sample_sequences(student[0].softmax(-1), student[1].softmax(-1), 200_000)
    config = MiniLLMConfig(single_step=single_step, teacher_mix=0.0, **UNBIASED)
    loss, _ = minillm_loss(toy_logits(student, tokens), toy_logits(teacher, tokens), tokens,
                           torch.ones_like(tokens, dtype=torch.bool), config)
    estimate = torch.autograd.grad(2 * loss, student)
    for got, want in zip(estimate, exact):
        torch.testing.assert_close(got, want, atol=0.02, rtol=0)
    assert max(g.abs().max() for g in exact) > 0.1  # the gradient is not trivially small


def test_importance_weights_by_hand():
    """w = q / (α·p + (1 − α)·q): q = 1/2, p = 1/4, α = 0.2 gives 0.5 / 0.45; α = 0 gives 1; p = 0 gives
    1 / (1 − α); all finite."""
    log_q = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.5)])
    log_p = torch.tensor([math.log(0.25), float("-inf"), math.log(0.5)])
    weights = mixture_importance_weights(log_q, log_p, 0.2)
    torch.testing.assert_close(weights, torch.tensor([0.5 / 0.45, 1 / 0.8, 1.0]))
    assert torch.equal(mixture_importance_weights(log_q, log_p, 0.0), torch.ones(3))


def test_teacher_mixed_samples_with_importance_weights_estimate_the_student_gradient():
    """One token sampled from p̃ = α·p + (1 − α)·q (α = 0.4), weighted by w = q/p̃: the policy gradient's
    expectation is the exact ∇KL(q‖p), as if the student had sampled (single step off, so the return
    is the sampled token's reward)."""
    (theta, _), (teacher, _) = two_token_toy(seed=3, vocab=4)
    exact = torch.autograd.grad(
        (theta.softmax(-1) * (theta.log_softmax(-1) - teacher.log_softmax(-1))).sum(), theta)[0]
    alpha = 0.4
    with torch.no_grad():
        mixture = (1 - alpha) * theta.softmax(-1) + alpha * teacher.softmax(-1)
        tokens = torch.multinomial(mixture, 200_000, replacement=True,
                                   generator=torch.Generator().manual_seed(5))[:, None]  # [n, 1]
    config = MiniLLMConfig(single_step=False, teacher_mix=alpha, **UNBIASED)
    n = tokens.size(0)
    loss, diagnostics = minillm_loss(theta.expand(n, 1, -1), teacher.expand(n, 1, -1), tokens,
                                     torch.ones_like(tokens, dtype=torch.bool), config)
    torch.testing.assert_close(torch.autograd.grad(loss, theta)[0], exact, atol=0.01, rtol=0)
    assert abs(float(diagnostics["minillm/importance_weight"]) - 1.0) < 0.01  # E_p̃[q/p̃] = 1
    # without the weights the estimate is biased towards the teacher: far from the exact gradient
    unweighted, _ = minillm_loss(theta.expand(n, 1, -1), teacher.expand(n, 1, -1), tokens,
                                 torch.ones_like(tokens, dtype=torch.bool), MiniLLMConfig(single_step=False,
                                                                                          teacher_mix=0.0, **UNBIASED))
    assert (torch.autograd.grad(unweighted, theta)[0] - exact).abs().max() > 0.03


def test_returns_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 7.0]])
    mask = torch.tensor([[True, True, True, False]])
    torch.testing.assert_close(returns(rewards, mask, gamma=0.5, future_only=False, length_norm=False),
                               torch.tensor([[1 + 1 + 0.75, 2 + 1.5, 3.0, 0.0]]))
    torch.testing.assert_close(returns(rewards, mask, gamma=0.5, future_only=True, length_norm=False),
                               torch.tensor([[2 + 1.5, 3.0, 0.0, 0.0]]))
    torch.testing.assert_close(returns(rewards, mask, gamma=1.0, future_only=False, length_norm=True),
                               torch.tensor([[6 / 3, 5 / 2, 3.0, 0.0]]))
    torch.testing.assert_close(returns(rewards, mask, gamma=1.0, future_only=True, length_norm=True),
                               torch.tensor([[5 / 2, 3.0, 0.0, 0.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_and_neg_inf_logits_stay_finite(dtype):
    """Masked positions (whose token is a pad id outside the vocabulary) get no gradient; a vocabulary entry
    -inf in both models (padding) counts for nothing; a sampled token the teacher alone gives probability 0
    has a finite, clipped reward (the single-step KL is then truly infinite, so it is off there); bf16
    logits work; all masked gives 0 with a zero gradient."""
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(2, 4, 6, generator=generator).to(dtype)
    teacher = torch.randn(2, 4, 6, generator=generator).to(dtype)
    student[..., 5] = teacher[..., 5] = float("-inf")
    student.requires_grad_()
    tokens = torch.tensor([[2, 1, 0, 999], [3, 999, 999, 999]])
    mask = tokens != 999
    loss, diagnostics = minillm_loss(student, teacher, tokens, mask, MiniLLMConfig())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in diagnostics.values())
    assert torch.isfinite(student.grad).all() and student.grad[~mask].abs().max() == 0
    impossible = teacher.clone()
    impossible[0, 0, 2] = float("-inf")
    student.grad = None
    loss, diagnostics = minillm_loss(student, impossible, tokens, mask, MiniLLMConfig(single_step=False))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(student.grad).all()
    assert float(diagnostics["minillm/reward"]) < -1000  # log p = PADDED_LOG_PROB, not -inf
    empty = torch.zeros_like(mask)
    student.grad = None
    loss, _ = minillm_loss(student, teacher, tokens, empty, MiniLLMConfig())
    loss.backward()
    assert float(loss.detach()) == 0 and student.grad.abs().max() == 0
