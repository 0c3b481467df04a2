"""A sparse teacher (top-k + rest) densified: exact at k = V for every loss, a distribution at any k."""

from __future__ import annotations

import math

import pytest
import torch

from mgsr_lightning.losses.dac_kl import ClipNet, dac_kl
from mgsr_lightning.losses.divergences import DIVERGENCES
from mgsr_lightning.losses.span_correlation import span_correlation_loss
from mgsr_lightning.losses.sparse_teacher import densify, top_k_entries

PARAMS = {"skew_forward_kl": {"alpha": 0.1}, "skew_reverse_kl": {"alpha": 0.1}, "generalized_jsd": {"beta": 0.5},
          "symmetric_kl": {"lam": 0.9}, "abkd": {"alpha": 0.2, "beta": 0.7}, "alpha_beta": {"alpha": 0.2, "beta": 0.7}}


def _densified(teacher, k):
    return densify(*top_k_entries(teacher, k), teacher.size(-1))


def _loss_and_grad(loss_fn, student, teacher, mask):
    student = student.clone().requires_grad_()
    loss = loss_fn(student, teacher, mask)
    loss = loss[0] if isinstance(loss, tuple) else loss
    loss.backward()
    return loss.detach(), student.grad


def _assert_same_loss(loss_fn, make_case):
    student, teacher, mask = make_case(B=2, T=6, V=37, scale=3.0)
    live_loss, live_grad = _loss_and_grad(loss_fn, student, teacher, mask)
    cached_loss, cached_grad = _loss_and_grad(loss_fn, student, _densified(teacher, 37), mask)
    assert live_loss.item() > 1e-4  # a loss that could differ
    torch.testing.assert_close(cached_loss, live_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cached_grad, live_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_every_divergence_equals_the_live_teacher_at_k_equal_v(name, temperature, make_case):
    def loss_fn(student, teacher, mask):
        return DIVERGENCES[name](student, teacher, mask, temperature=temperature, chunk_size=4, **PARAMS.get(name, {}))

    _assert_same_loss(loss_fn, make_case)


@pytest.mark.parametrize("base", ["forward_kl", "alpha_beta"])
@pytest.mark.parametrize("mode", ["learned", "fixed"])
def test_dac_kl_equals_the_live_teacher_at_k_equal_v(mode, base, make_case):
    clip_net = ClipNet(k=8, hidden=16) if mode == "learned" else None
    params = {"alpha": 0.2, "beta": 0.7} if base == "alpha_beta" else None

    def loss_fn(student, teacher, mask):
        return dac_kl(student, teacher, mask, clip_net=clip_net, mode=mode, base=base, base_params=params,
                      fixed_bounds=(0.02, 0.9))

    _assert_same_loss(loss_fn, make_case)


def test_span_loss_equals_the_live_teacher_at_k_equal_v(make_case):
    spans = torch.tensor([[0, 0, 0, 1, 1, -1], [2, 2, -1, 3, 3, 3]])

    def loss_fn(student, teacher, mask):
        return span_correlation_loss(student, teacher, mask, spans=spans, relation="normalized")

    _assert_same_loss(loss_fn, make_case)


@pytest.mark.parametrize("k", [1, 5, 36])
def test_densified_teacher_is_a_distribution_keeping_the_top_k_and_spreading_the_rest_evenly(k):
    teacher = torch.randn(3, 4, 37) * 3
    ids, logprobs, rest = top_k_entries(teacher, k)
    dense = densify(ids, logprobs, rest, 37)
    torch.testing.assert_close(dense.exp().sum(-1), torch.ones(3, 4))
    torch.testing.assert_close(dense.gather(-1, ids), torch.log_softmax(teacher, -1).gather(-1, ids))
    others = torch.ones_like(dense, dtype=torch.bool).scatter(-1, ids, False)
    spread = (rest - math.log(37 - k)).unsqueeze(-1).expand_as(dense)
    torch.testing.assert_close(dense[others], spread[others])
    torch.testing.assert_close(rest.exp(), 1 - logprobs.exp().sum(-1), rtol=1e-4, atol=1e-6)


def test_top_k_at_the_whole_vocabulary_leaves_no_rest_and_refuses_a_k_past_it():
    ids, logprobs, rest = top_k_entries(torch.randn(2, 9), 9)
    assert torch.isneginf(rest).all() and sorted(ids[0].tolist()) == list(range(9))
    with pytest.raises(ValueError, match="k must be between 1"):
        top_k_entries(torch.randn(2, 9), 10)
