"""DAC-KL's "rest" variant over the α-β divergence with its written-out backward
(``dac_kl_terms.alpha_beta_rest`` through ``RestKL``) against the taped formulas (``written_backward=False``,
the reference): values, diagnostics and gradients to the student and to ClipNet, in float64 and float32,
with padded columns, -inf teacher entries, masks, both bands, the target class on and off, chunks, blocks
and the anti-collapse guard; bf16 logits; and the limit cases, which stay taped. The blocked sort on hard
inputs (ties, bf16) is test_dac_kl.py's, run over both written bases."""

from __future__ import annotations

import sys

import pytest
import torch

from mgsr_lightning.losses import ClipNet, alpha_beta_divergence, dac_kl
from mgsr_lightning.losses.dac_kl import DIAGNOSTICS
from mgsr_lightning.losses.dac_kl_terms import _alpha_beta_rest_entry, forward_kl_rest, written_terms
from tests.losses.conftest import BoundClipNet, written_and_taped

PAIRS = [(0.2, 0.7), (0.5, 0.5), (1.5, 2.0)]  # MGSR's default, Amari's α-divergence (Hellinger), both above 1
OPTIONS = {
    "learned": dict(mode="learned"),
    "guard-chunked": dict(mode="learned", rho_min=0.9, chunk_size=4),  # kept ≈ 0.9: the guard acts on some rows
    "quantile": dict(mode="learned", band="value_quantile", target_class=False, temperature=0.7, chunk_size=7),
    "fixed-chunked": dict(mode="fixed", fixed_bounds=(0.1, 0.6), beta=0.05, chunk_size=5),
    "fixed-no-target": dict(mode="fixed", fixed_bounds=(0.05, 0.9), target_class=False),
    "everything": dict(mode="fixed", fixed_bounds=(0.0, 1.0), target_class=False),
}
# (value, gradient) as (rtol, atol), the gradient's atol in units of its largest entry: in float32 both
# paths are within about 3e-6 of that of the float64 gradient, the written one no further than the taped
TOLERANCES = {
    torch.float64: ((1e-10, 1e-12), (1e-9, 1e-12)),
    torch.float32: ((1e-5, 1e-6), (1e-4, 1e-5)),
}


def hard_case(dtype, *, B=3, T=6, V=40, padded=3, teacher_zeros=True, seed=0):
    """Student and teacher logits [B, T, V + padded] (padded columns -inf in both; with ``teacher_zeros``
    two -inf teacher entries in the first batch row, where the student is free) and a mask [B, T]."""
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(B, T, V + padded, generator=generator, dtype=torch.float64) * 3
    teacher = torch.randn(B, T, V + padded, generator=generator, dtype=torch.float64) * 3
    student[..., V:] = teacher[..., V:] = float("-inf")
    if teacher_zeros:
        teacher[0, :, :2] = float("-inf")
    mask = torch.rand(B, T, generator=generator) > 0.3
    mask[0, 0], mask[-1, -1] = True, False
    return student.to(dtype), teacher.to(dtype), mask


def clip_net_for(options, dtype):
    if options["mode"] != "learned":
        return None
    torch.manual_seed(0)
    clip_net = ClipNet(k=8, hidden=16).to(dtype)
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    return clip_net


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize(("alpha", "beta"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_written_alpha_beta_equals_the_taped_loss(alpha, beta, options, dtype):
    student, teacher, mask = hard_case(dtype)
    options = dict(options, base="alpha_beta", base_params={"alpha": alpha, "beta": beta})
    (loss, diagnostics, grads), (taped, taped_diagnostics, taped_grads) = written_and_taped(
        student, teacher, mask, clip_net_for(options, dtype), **options)
    (value_rtol, value_atol), (grad_rtol, grad_atol) = TOLERANCES[dtype]
    assert torch.isfinite(loss) and loss > 0
    torch.testing.assert_close(loss, taped, rtol=value_rtol, atol=value_atol)
    for name in DIAGNOSTICS:
        torch.testing.assert_close(diagnostics[name], taped_diagnostics[name], rtol=value_rtol, atol=value_atol)
    for grad, taped_grad in zip(grads, taped_grads):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, taped_grad, rtol=grad_rtol, atol=grad_atol * taped_grad.abs().max())
    assert (grads[0][..., -3:] == 0).all()  # the padded columns get no gradient
    assert all(grad.abs().sum() > 0 for grad in grads[:3])
    if "rho_min" in options:
        assert 0 < diagnostics["coverage_penalty"]  # the guard is active at some rows


def test_alpha_beta_is_written_for_positive_powers_only():
    assert written_terms("forward_kl", {}) is forward_kl_rest
    for base, params in [("alpha_beta", {}), ("abkd", {"alpha": 0.2, "beta": 0.7}), ("alpha_beta", {"alpha": 2})]:
        assert written_terms(base, params) is not None, (base, params)
    for base, params in [("alpha_beta", {"alpha": 0.2, "beta": 0.0}), ("alpha_beta", {"alpha": 0.0, "beta": 0.7}),
                         ("alpha_beta", {"alpha": 0.5, "beta": -0.5}), ("alpha_beta", {"alpha": -0.3, "beta": 0.7}),
                         ("reverse_kl", {}), ("skew_forward_kl", {"alpha": 0.1})]:
        assert written_terms(base, params) is None, (base, params)


@pytest.mark.parametrize("params", [{"alpha": 0.2, "beta": 0.0}, {"alpha": 0.5, "beta": -0.5}],
                         ids=["beta=0", "alpha=-beta"])
def test_limit_cases_run_taped(params, monkeypatch):
    # no zero in the teacher: a negative power of it is +inf, as the formula says
    student, teacher, mask = hard_case(torch.float32, teacher_zeros=False)
    options = dict(mode="learned", base="alpha_beta", base_params=params)
    results = written_and_taped(student, teacher, mask, clip_net_for(options, torch.float32), **options)

    class Refused:
        @staticmethod
        def apply(*args):
            raise AssertionError("RestKL ran for a limit case")

    # the module, not the function of the same name that the package exports
    monkeypatch.setattr(sys.modules["mgsr_lightning.losses.dac_kl"], "RestKL", Refused)
    again = written_and_taped(student, teacher, mask, clip_net_for(options, torch.float32), **options)
    (loss, _, grads), (taped, _, taped_grads) = results
    assert torch.isfinite(loss) and torch.equal(loss, taped) and torch.equal(again[0][0], loss)
    for grad, taped_grad in zip(grads, taped_grads):
        assert torch.equal(grad, taped_grad)


def test_bf16_logits_are_close_to_the_float32_reference():
    # distinct teacher logits on a grid bf16 holds exactly: the same sort in bf16 and float32 (no ties)
    generator = torch.Generator().manual_seed(1)
    B, T, V = 2, 5, 48
    teacher = torch.stack([torch.randperm(V, generator=generator) for _ in range(B * T)]).view(B, T, V) * 0.125 - 3
    student = (torch.randn(B, T, V, generator=generator) * 3).bfloat16().float()
    teacher[..., -2:] = student[..., -2:] = float("-inf")
    mask = torch.ones(B, T, dtype=torch.bool)
    options = dict(mode="learned", base="alpha_beta", base_params={"alpha": 0.2, "beta": 0.7}, chunk_size=4)
    clip_net = clip_net_for(options, torch.float32)
    losses, grads = [], []
    for dtype, written in ((torch.bfloat16, True), (torch.float32, False)):
        s = student.to(dtype).requires_grad_(True)
        loss, _ = dac_kl(s, teacher.to(dtype), mask, clip_net=clip_net, written_backward=written, **options)
        losses.append(loss)
        grads.append(torch.autograd.grad(loss, [s, *clip_net.parameters()]))
    assert grads[0][0].dtype == torch.bfloat16
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0][0].float(), grads[1][0], rtol=1e-2, atol=1e-5)
    for grad, reference in zip(grads[0][1:], grads[1][1:]):
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-6 * reference.abs().max())


def test_gradcheck_float64_written_alpha_beta():
    student, teacher, mask = hard_case(torch.float64, B=1, T=3, V=6, padded=1)
    student.requires_grad_(True)
    clip_net = ClipNet(k=4, hidden=3).double()
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    names = [name for name, _ in clip_net.named_parameters()]
    weights = [p.detach().clone().requires_grad_(True) for p in clip_net.parameters()]
    options = dict(temperature=1.3, beta=0.1, lam_cov=0.0, base="alpha_beta", base_params={"alpha": 0.2, "beta": 0.7})

    def loss(s, *w):
        bound = BoundClipNet(clip_net, dict(zip(names, w)))
        return dac_kl(s, teacher, mask, clip_net=bound, **options)[0]

    assert torch.autograd.gradcheck(loss, (student, *weights))



@pytest.mark.parametrize(("alpha", "beta"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_rest_entry_value_and_slopes(alpha, beta):
    # positive masses: the α-β term and its autograd derivatives; a zero mass: no slope in that mass
    t = torch.tensor([0.3, 1e-6, 0.0, 0.2, 0.0], dtype=torch.float64, requires_grad=True)
    s = torch.tensor([0.1, 0.4, 0.5, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    value, teacher_slope, student_slope = _alpha_beta_rest_entry(t.detach(), s.detach(), alpha, beta)
    positive = slice(0, 2)
    terms = alpha_beta_divergence.terms(s[positive].log()[None], t[positive].log()[None], alpha=alpha, beta=beta)
    expected_t, expected_s = torch.autograd.grad(terms.sum(), [t, s])
    torch.testing.assert_close(value[positive], terms[0].detach(), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(teacher_slope[positive], expected_t[positive], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(student_slope[positive], expected_s[positive], rtol=1e-12, atol=1e-15)
    gamma = alpha + beta
    torch.testing.assert_close(value[2:], torch.tensor([0.5**gamma / (alpha * gamma), 0.2**gamma / (beta * gamma), 0],
                                                       dtype=torch.float64))
    assert teacher_slope[2] == 0 and student_slope[3] == 0 and teacher_slope[4] == 0 and student_slope[4] == 0
    torch.testing.assert_close(student_slope[2], torch.tensor(0.5 ** (gamma - 1) / alpha, dtype=torch.float64))
    torch.testing.assert_close(teacher_slope[3], torch.tensor(0.2 ** (gamma - 1) / beta, dtype=torch.float64))
