"""ExAccErr on cases whose answer is known: a student equal to its teacher, students whose error does
not depend on the prefix, and greedy bigram models whose curves are computed by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from tiny_models import build_tiny_model
from torch import nn

from mgsr_lightning.evaluation.exposure_bias import ex_acc_err, exposure_bias
from mgsr_lightning.generation.decode import Decoding
from mgsr_lightning.generation.sampling import SamplingConfig

EOS, PAD, A, B = 0, 1, 2, 3
NEVER = float("-inf")


class TableLM(nn.Module):
    """A bigram LM over 4 tokens: the logits at a position are ``table[token at that position]``.

    It has the call signature ``sample`` and ``response_logits`` use; it needs no cache, since only
    the last token matters. EOS and PAD are never generated (-inf in every row).
    """

    def __init__(self, next_probs: dict[int, list[float]]):
        super().__init__()
        table = torch.full((4, 4), NEVER)
        for token, (prob_a, prob_b) in next_probs.items():
            table[token, A], table[token, B] = math.log(prob_a), math.log(prob_b)
        table[PAD] = table[A]  # left padding is never the last prompt token; any finite row will do
        self.table = nn.Parameter(table, requires_grad=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False, logits_to_keep=0):
        logits = self.table[input_ids]  # [B, L, 4]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits, cache=None)


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def prompts(*rows):
    """One left-padded batch (prompt_ids, prompt_mask) from token lists."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[PAD] * (width - len(row)) + row for row in rows])
    return ids, ids != PAD


def test_student_equal_to_teacher_has_no_error_and_zero_ex_acc_err():
    model = build_tiny_model("gpt2", 48)
    batch = (torch.randint(2, 48, (3, 5)), torch.ones(3, 5, dtype=torch.bool))
    result = exposure_bias(
        model, model, [batch], Decoding(SamplingConfig(max_new_tokens=6), 0, 1), samples=2
    )
    assert result.regret.shape == (6,) and result.prompts == 3
    assert (result.regret == 0).all() and (result.forced_error == 0).all() and (result.ex_acc_err == 0).all()


def test_an_error_independent_of_the_prefix_accumulates_without_excess():
    # unigram models: the same next-token distributions whatever the prefix, so every step's error is
    # KL(p‖q) on the student's prefixes and on the teacher's alike
    teacher = TableLM({token: [0.7, 0.3] for token in (A, B)})
    student = TableLM({token: [0.4, 0.6] for token in (A, B)})
    step = kl([0.7, 0.3], [0.4, 0.6])
    result = exposure_bias(
        student, teacher, [prompts([A], [B, A, B])], Decoding(SamplingConfig(max_new_tokens=5), EOS, PAD), samples=3,
    )
    lengths = torch.arange(1, 6, dtype=torch.float32)
    torch.testing.assert_close(result.forced_error, step * lengths)
    torch.testing.assert_close(result.regret, step * lengths)
    assert result.ex_acc_err.abs().max() < 1e-4


def test_greedy_bigram_curves_computed_by_hand():
    # after A the teacher continues A and the student B; after B the teacher goes back to A and the
    # student stays on B, where it is much worse: the student's own prefixes lead it into its errors
    teacher = TableLM({A: [0.7, 0.3], B: [0.9, 0.1]})
    student = TableLM({A: [0.4, 0.6], B: [0.3, 0.7]})
    error_after_a, error_after_b = kl([0.7, 0.3], [0.4, 0.6]), kl([0.9, 0.1], [0.3, 0.7])
    steps = 4
    # prompt [A]: teacher A A A A (errors a a a a), student B B B B (a b b b)
    # prompt [B]: teacher A A A A (b a a a),         student B B B B (b b b b)
    forced = [[error_after_a] * steps, [error_after_b] + [error_after_a] * (steps - 1)]
    free = [[error_after_a] + [error_after_b] * (steps - 1), [error_after_b] * steps]
    expected_forced = torch.tensor(forced, dtype=torch.float64).cumsum(-1).mean(0)
    expected_regret = torch.tensor(free, dtype=torch.float64).cumsum(-1).mean(0)

    result = exposure_bias(
        student, teacher, [prompts([A], [B])],
        Decoding(SamplingConfig(do_sample=False, max_new_tokens=steps), EOS, PAD), samples=1,
    )
    torch.testing.assert_close(result.forced_error.double(), expected_forced, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.regret.double(), expected_regret, rtol=1e-5, atol=1e-6)
    expected = 100 * (expected_regret - expected_forced) / expected_forced
    torch.testing.assert_close(result.ex_acc_err.double(), expected, rtol=1e-4, atol=1e-3)
    assert result.ex_acc_err[0].abs() < 1e-4 and (result.ex_acc_err[1:] > 50).all()


def test_steps_after_every_sample_ended_add_nothing():
    # after A the student ends (EOS 0.5, A 0.25, B 0.25) at step 1; the teacher (A 0.5, B 0.5) runs on
    # through A A A, and the student's error after A is KL = log 2 at every one of those steps
    teacher = TableLM({A: [0.5, 0.5], B: [0.5, 0.5]})
    student = TableLM({A: [0.25, 0.25], B: [0.5, 0.5]})
    student.table.data[A, EOS] = math.log(0.5)
    result = exposure_bias(
        student, teacher, [prompts([A])], Decoding(SamplingConfig(do_sample=False, max_new_tokens=3), EOS, PAD),
        samples=1,
    )
    torch.testing.assert_close(result.regret, torch.full((3,), math.log(2)))
    torch.testing.assert_close(result.forced_error, math.log(2) * torch.arange(1.0, 4.0))
    torch.testing.assert_close(result.ex_acc_err, torch.tensor([0.0, -50.0, -200 / 3]))


def test_ex_acc_err_of_zero_error_is_zero_and_of_excess_over_zero_is_infinite():
    regret, forced = torch.tensor([0.0, 1.0, 3.0]), torch.tensor([0.0, 0.0, 2.0])
    torch.testing.assert_close(ex_acc_err(regret, forced), torch.tensor([0.0, float("inf"), 50.0]))


def test_bad_arguments_raise():
    model = build_tiny_model("gpt2", 48)
    with pytest.raises(ValueError, match="samples"):
        exposure_bias(model, model, [], Decoding(SamplingConfig(), 0, 1), samples=0)
    with pytest.raises(ValueError, match="at least one batch"):
        exposure_bias(model, model, [], Decoding(SamplingConfig(), 0, 1))
