"""DAC-KL's sort of bf16 and fp16 teachers on 16-bit keys (``dac_kl_band.descending_key``): a
descending order of the float32 probabilities, and, wherever no two different 16-bit logits round to
the same float32 log-probability, the same order as the stable float32 sort, hence bitwise the same
loss, diagnostics and gradients (docs/dac_kl.md, "Ties")."""

from __future__ import annotations

import pytest
import torch

from mgsr_lightning.losses import ClipNet, dac_kl, dac_kl_band
from mgsr_lightning.losses._common import PADDED_LOG_PROB, log_softmax
from mgsr_lightning.losses.dac_kl import DIAGNOSTICS

DTYPES = [torch.bfloat16, torch.float16]
OPTIONS = [dict(mode="learned"), dict(mode="fixed", fixed_bounds=(0.3, 0.5), beta=1e-3),
           dict(mode="learned", band="value_quantile")]
OPTION_IDS = ["learned", "narrow-band", "quantile"]


def _teacher_log_probs(student, teacher, temperature):
    padded = torch.isneginf(student) & torch.isneginf(teacher)
    return log_softmax(teacher, temperature).masked_fill(padded, PADDED_LOG_PROB), padded


def _reference_order(log_probs, teacher):
    """Descending log-probability, ties by descending logit, then by index: two stable sorts."""
    by_logit = teacher.float().sort(dim=-1, descending=True, stable=True).indices
    by_prob = log_probs.gather(-1, by_logit).sort(dim=-1, descending=True, stable=True).indices
    return by_logit.gather(-1, by_prob)


def _collapsed(log_probs, teacher):
    """Whether two different 16-bit logits of a row have the same float32 log-probability."""
    ordered = _reference_order(log_probs, teacher)
    lp, z = log_probs.gather(-1, ordered), teacher.float().gather(-1, ordered)
    finite = torch.isfinite(z[:, 1:]) & torch.isfinite(z[:, :-1])
    return bool(((lp[:, 1:] == lp[:, :-1]) & (z[:, 1:] != z[:, :-1]) & finite).any())


def _hard_case(dtype, vocab=70, seed=3):
    """Many exact ties (half the columns on a coarse grid), ±0, -inf in the teacher only, a padded
    vocabulary (-inf in both), and a mask."""
    generator = torch.Generator().manual_seed(seed)
    student = (torch.randn(3, 5, vocab, generator=generator) * 3).to(dtype)
    teacher = (torch.randn(3, 5, vocab, generator=generator) * 3).to(dtype)
    grid = torch.rand(3, 5, vocab, generator=generator) < 0.5
    teacher = torch.where(grid, (torch.randint(-6, 6, (3, 5, vocab), generator=generator) / 2).to(dtype), teacher)
    teacher[..., 5], teacher[..., 6] = 0.0, -0.0  # equal logits, different bits
    student[..., -4:] = teacher[..., -4:] = float("-inf")  # a padded vocabulary
    teacher[0, :, :3] = float("-inf")  # zero teacher probability, student free
    mask = torch.rand(3, 5, generator=generator) > 0.3
    return student, teacher, mask


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_key_order_is_a_descending_order_of_the_probabilities(dtype, temperature):
    # every finite value of the dtype with |z| <= 200 (both zeros), shuffled, in one row, plus -inf entries
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    values = values[torch.isfinite(values) & (values.abs() <= 200)]
    values = values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(0))]
    teacher = torch.cat([values, values[:50], torch.full((20,), float("-inf"), dtype=dtype)])[None]
    student = torch.zeros_like(teacher)
    student[0, -8:] = float("-inf")  # padded: the last 8; the 12 -inf before them are the teacher's zeros
    log_probs, padded = _teacher_log_probs(student, teacher, temperature)
    sorted_log_probs, order = dac_kl_band.sort_descending(log_probs, teacher, padded)
    assert torch.equal(order, _reference_order(log_probs, teacher))
    assert (sorted_log_probs[:, 1:] <= sorted_log_probs[:, :-1]).all()  # monotone: a descending order
    assert torch.equal(sorted_log_probs, log_probs.sort(dim=-1, descending=True).values)
    assert padded[0, order[0, -20:-12]].all() and not padded[0, order[0, -12:]].any()  # PADDED_LOG_PROB > -inf


@pytest.mark.parametrize("written", [True, False], ids=["written", "taped"])
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sixteen_bit_keys_equal_the_float32_sort(dtype, temperature, options, written):
    student, teacher, mask = _hard_case(dtype)
    rows = teacher[mask]
    log_probs, padded = _teacher_log_probs(student[mask], rows, temperature)
    assert not _collapsed(log_probs, rows)  # the condition for the same order, so bitwise the same results
    clip_net = ClipNet(k=8, hidden=16) if options["mode"] == "learned" else None
    if clip_net is not None:
        torch.nn.init.normal_(clip_net.mlp[-1].weight, generator=torch.Generator().manual_seed(1), std=0.5)
    results = []
    for keys in (True, False):
        s = student.clone().requires_grad_(True)
        loss, diagnostics = dac_kl(s, teacher, mask, clip_net=clip_net, temperature=temperature,
                                   written_backward=written, chunk_size=4, sixteen_bit_keys=keys, **options)
        wrt = [s, *(clip_net.parameters() if clip_net is not None else ())]
        results.append((loss, diagnostics, torch.autograd.grad(loss, wrt)))
    (loss, diagnostics, grads), (float_loss, float_diagnostics, float_grads) = results
    assert torch.isfinite(loss) and loss > 0
    assert torch.equal(loss, float_loss)
    for name in DIAGNOSTICS:
        assert torch.equal(diagnostics[name], float_diagnostics[name]), name
    for grad, float_grad in zip(grads, float_grads):
        assert torch.equal(grad, float_grad)
    assert grads[0].dtype == dtype and grads[0].abs().sum() > 0
    assert grads[0][~mask].abs().sum() == 0  # rows outside the mask are not compared


@pytest.mark.parametrize("dtype", DTYPES)
def test_blocked_sort_on_keys_equals_the_float32_sort_at_a_real_vocabulary(dtype, monkeypatch):
    # rows over 2**15 entries: the 1-D int16 sort of each row is a radix sort on CPU
    student, teacher, _ = _hard_case(dtype, vocab=40_000, seed=4)
    student, teacher = student[0, :3], teacher[0, :3]
    monkeypatch.setattr(dac_kl_band, "BLOCK_ELEMENTS", 2 * 40_000)  # blocks of two rows
    assert not _collapsed(_teacher_log_probs(student, teacher, 1.0)[0], teacher)
    results = []
    for keys in (True, False):
        results.append(dac_kl_band.sort_teacher(student, teacher, 1.0, band="value_quantile", summary_k=256,
                                                sixteen_bit_keys=keys))
    for ours, reference in zip(*results):
        assert torch.equal(ours, reference)


def test_the_order_within_ties_changes_the_loss():
    # why both paths break ties the same way (by index): two tied teacher entries on either side of
    # the band's upper edge; swapping the student's two entries swaps which one is in the band
    teacher = torch.tensor([[[2.0, 1.0, 1.0, 0.0, 0.0, -1.0]]], dtype=torch.bfloat16)
    student = torch.tensor([[[1.0, 2.0, -1.0, 0.5, 0.0, 0.0]]], dtype=torch.bfloat16)
    swapped = student[..., [0, 2, 1, 3, 4, 5]]
    losses = [dac_kl(s, teacher, mode="fixed", fixed_bounds=(0.0, 0.6), beta=0.02)[0] for s in (student, swapped)]
    assert (losses[0] - losses[1]).abs() > 1e-2


@pytest.mark.parametrize("band", ["mass", "value_quantile"])
def test_collapsed_logits_change_the_loss_by_less_than_rounding(band):
    # different logits near 0 round to the same float32 log-probability when the row's top logit is 20:
    # the key orders them by logit, the float32 sort by index. Their probability p <= e^-20 bounds the
    # weights' difference within such a tie (mass band: (m − 1) p / (4β); value quantile: (m − 1) / (4β(V' − 1))
    # times terms of size p and q), far below float32 rounding of the loss
    generator = torch.Generator().manual_seed(5)
    tiny = torch.tensor([3e-6, -2e-6, 1e-6, 0.0, 4e-6, -5e-6, 2e-6, -1e-6] * 4)
    teacher = torch.cat([torch.tensor([20.0, 18.0, 15.0]), tiny, torch.randn(29, generator=generator)])
    teacher = teacher.expand(2, 4, -1).bfloat16()
    student = (torch.randn(2, 4, teacher.size(-1), generator=generator) * 2).bfloat16()
    assert _collapsed(_teacher_log_probs(student[0], teacher[0], 1.0)[0], teacher[0])
    results = []
    for keys in (True, False):
        s = student.clone().requires_grad_(True)
        loss, _ = dac_kl(s, teacher, mode="fixed", fixed_bounds=(0.0, 0.98), band=band, sixteen_bit_keys=keys)
        results.append((loss, torch.autograd.grad(loss, s)[0]))
    (loss, grad), (float_loss, float_grad) = results
    torch.testing.assert_close(loss, float_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.float(), float_grad.float(), rtol=0, atol=1e-8)
