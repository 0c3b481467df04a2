"""The baseline divergences against float64 references written from their formulas, plus gradients,
chunking and the properties every divergence must have."""

from __future__ import annotations

import inspect

import pytest
import torch

from mgsr_lightning.losses import (
    DIVERGENCES,
    alpha_beta_divergence,
    forward_kl,
    generalized_jsd,
    reverse_kl,
    skew_forward_kl,
    skew_reverse_kl,
    symmetric_kl,
    total_variation,
)

CASES = [
    ("forward_kl", {}),
    ("reverse_kl", {}),
    ("symmetric_kl", {}),
    ("symmetric_kl", {"lam": 0.3}),
    ("skew_forward_kl", {}),
    ("skew_forward_kl", {"alpha": 0.6}),
    ("skew_reverse_kl", {}),
    ("skew_reverse_kl", {"alpha": 0.7}),
    ("generalized_jsd", {}),
    ("generalized_jsd", {"beta": 0.1}),
    ("generalized_jsd", {"beta": 0.0}),
    ("generalized_jsd", {"beta": 1.0}),
    ("total_variation", {}),
    ("abkd", {}),
    ("abkd", {"alpha": 0.5, "beta": 0.5}),
    ("abkd", {"alpha": 1.5, "beta": -0.4}),
    ("abkd", {"alpha": 0.7, "beta": 0.0}),
    ("abkd", {"alpha": 0.0, "beta": 0.6}),
    ("abkd", {"alpha": 0.4, "beta": -0.4}),
    ("abkd", {"alpha": 0.0, "beta": 0.0}),
]
CASE_IDS = [f"{name}-{params}" for name, params in CASES]


@pytest.fixture
def reference(softmax_ref, kl_ref, reduce_ref, divergence_ref):
    def compute(name, params, student, teacher, mask, temperature, reduction):
        per_position = [
            [
                divergence_ref(name, params, softmax_ref(teacher[b, t], temperature),
                               softmax_ref(student[b, t], temperature), kl_ref)
                for t in range(student.size(1))
            ]
            for b in range(student.size(0))
        ]
        return reduce_ref(per_position, mask, reduction)

    return compute


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_matches_float64_reference(name, params, reduction, make_case, reference):
    student, teacher, mask = make_case()
    value = DIVERGENCES[name](student, teacher, mask, temperature=1.7, reduction=reduction, **params)
    expected = reference(name, params, student, teacher, mask, 1.7, reduction)
    assert value.dtype == torch.float32
    assert value.shape == expected.shape
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_float64_inputs_stay_float64(name, params, make_case, reference):
    student, teacher, mask = make_case(dtype=torch.float64)
    value = DIVERGENCES[name](student, teacher, mask, temperature=0.6, **params)
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, reference(name, params, student, teacher, mask, 0.6, "mean"),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_padded_vocabulary_columns_contribute_nothing(name, params, make_case):
    student, teacher, mask = make_case()
    padded_student, padded_teacher, _ = make_case(padded=5)
    padded_student.requires_grad_(True)
    student.requires_grad_(True)
    plain = DIVERGENCES[name](student, teacher, mask, temperature=1.3, reduction="none", **params)
    padded = DIVERGENCES[name](padded_student, padded_teacher, mask, temperature=1.3, reduction="none", **params)
    torch.testing.assert_close(padded, plain, rtol=1e-6, atol=1e-7)
    (plain_grad,) = torch.autograd.grad(plain.sum(), student)
    (padded_grad,) = torch.autograd.grad(padded.sum(), padded_student)
    assert torch.isfinite(padded_grad).all()
    assert (padded_grad[..., -5:] == 0).all()
    torch.testing.assert_close(padded_grad[..., :-5], plain_grad, rtol=1e-5, atol=1e-7)


def test_neg_inf_in_one_logit_follows_the_formula():
    # the teacher gives token 0 probability exactly 0: forward KL skips it (0·log 0 = 0), reverse KL is +inf
    student = torch.tensor([[[1.0, 0.0, -1.0]]])
    teacher = torch.tensor([[[float("-inf"), 0.5, 0.0]]])
    assert torch.isfinite(forward_kl(student, teacher))
    assert reverse_kl(student, teacher) == float("inf")


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_bf16_inputs_are_computed_in_float32(name, params, make_case, reference):
    # Tolerance: against the reference on the same bf16-rounded logits the result must agree to
    # float32 accuracy (1e-5 relative), which a bf16 computation (8-bit mantissa, ~4e-3) would not;
    # against the unrounded float32 logits it may differ by the rounding of the logits, 2e-2.
    student, teacher, mask = make_case()
    student_bf16, teacher_bf16 = student.bfloat16(), teacher.bfloat16()
    value = DIVERGENCES[name](student_bf16, teacher_bf16, mask, **params)
    assert value.dtype == torch.float32
    expected = reference(name, params, student_bf16.double(), teacher_bf16.double(), mask, 1.0, "mean")
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(value, DIVERGENCES[name](student, teacher, mask, **params), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_gradcheck_float64(name, params, make_case):
    student, teacher, mask = make_case(B=1, T=3, V=5, dtype=torch.float64)
    student.requires_grad_(True)
    teacher.requires_grad_(True)

    def loss(s, t):
        return DIVERGENCES[name](s, t, mask, temperature=1.4, **params)

    assert torch.autograd.gradcheck(loss, (student, teacher))


@pytest.mark.parametrize("chunk_size", [1, 3, 64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_chunked_equals_unchunked(name, params, reduction, chunk_size, make_case):
    student, teacher, mask = make_case(B=3, T=7)
    student.requires_grad_(True)
    plain = DIVERGENCES[name](student, teacher, mask, temperature=1.2, reduction=reduction, **params)
    chunked = DIVERGENCES[name](student, teacher, mask, temperature=1.2, reduction=reduction, chunk_size=chunk_size,
                                **params)
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-7)
    weights = torch.rand(plain.shape)  # a non-trivial upstream gradient
    (plain_grad,) = torch.autograd.grad((plain * weights).sum(), student)
    (chunked_grad,) = torch.autograd.grad((chunked * weights).sum(), student)
    # the chunked path scales the gradient after the softmax's cancellation, the plain one before it;
    # the α-β-divergence's 1/α², 1/β² amplify that float32 rounding difference to a few 1e-6
    tolerance = dict(rtol=1e-5, atol=1e-6) if name == "abkd" else dict(rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(chunked_grad, plain_grad, **tolerance)


@pytest.mark.parametrize("chunk_size", [None, 2])
@pytest.mark.parametrize("name", list(DIVERGENCES))
def test_all_positions_masked_out_gives_zero_with_zero_gradient(name, chunk_size, make_case):
    student, teacher, _ = make_case()
    student.requires_grad_(True)
    loss = DIVERGENCES[name](student, teacher, torch.zeros(student.shape[:2], dtype=torch.bool), chunk_size=chunk_size)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.isfinite(student.grad).all() and (student.grad == 0).all()


def test_mean_divides_by_the_number_of_compared_positions(make_case):
    student, teacher, mask = make_case()
    total = forward_kl(student, teacher, mask, reduction="sum")
    assert forward_kl(student, teacher, mask) == pytest.approx((total / mask.sum()).item(), rel=1e-6)
    assert forward_kl(student, teacher) == pytest.approx(
        forward_kl(student, teacher, reduction="sum").item() / mask.numel(), rel=1e-6
    )


def test_sliced_non_contiguous_logits_give_the_same_result(make_case):
    student, teacher, mask = make_case(T=8)
    sliced_student, sliced_teacher = student[:, 1:-1], teacher[:, 1:-1]
    assert not sliced_student.is_contiguous()
    for chunk_size in (None, 3):
        torch.testing.assert_close(
            forward_kl(sliced_student, sliced_teacher, mask[:, 1:-1], chunk_size=chunk_size),
            forward_kl(sliced_student.contiguous(), sliced_teacher.contiguous(), mask[:, 1:-1]),
        )


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_non_negative_and_zero_iff_equal(name, params, make_case):
    student, teacher, _ = make_case(B=4, T=16, V=32, scale=4.0)
    assert (DIVERGENCES[name](student, teacher, reduction="none", **params) > 1e-4).all()
    shifted = teacher + 3.0  # the same distributions
    assert DIVERGENCES[name](shifted, teacher, reduction="none", **params).abs().max() < 1e-6


def test_total_variation_is_at_most_one():
    student = torch.tensor([[[60.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    teacher = torch.tensor([[[0.0, 60.0, 0.0], [0.0, 0.0, 60.0]]])
    values = total_variation(student, teacher, reduction="none")
    assert (values <= 1.0).all()
    assert values[0, 0] > 0.999  # disjoint supports reach the bound


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_jsd_at_one_half_is_symmetric(make_case, temperature):
    student, teacher, mask = make_case()
    torch.testing.assert_close(
        generalized_jsd(student, teacher, mask, beta=0.5, temperature=temperature, reduction="none"),
        generalized_jsd(teacher, student, mask, beta=0.5, temperature=temperature, reduction="none"),
    )


def test_special_cases_reduce_to_forward_and_reverse_kl(make_case):
    student, teacher, mask = make_case()
    forward, reverse = forward_kl(student, teacher, mask), reverse_kl(student, teacher, mask)
    torch.testing.assert_close(generalized_jsd(student, teacher, mask, beta=0.0), forward)
    torch.testing.assert_close(generalized_jsd(student, teacher, mask, beta=1.0), reverse)
    torch.testing.assert_close(symmetric_kl(student, teacher, mask, lam=0.0), forward)
    torch.testing.assert_close(symmetric_kl(student, teacher, mask, lam=1.0), reverse)
    torch.testing.assert_close(skew_forward_kl(student, teacher, mask, alpha=0.0), forward)
    torch.testing.assert_close(skew_reverse_kl(student, teacher, mask, alpha=0.0), reverse)
    assert generalized_jsd(student, teacher, mask, beta=0.01) < 0.1 * forward  # TRL's β = 0 is not the limit


def test_alpha_beta_divergence_reduces_to_known_divergences(make_case):
    student, teacher, mask = make_case(dtype=torch.float64)
    forward, reverse = forward_kl(student, teacher, mask), reverse_kl(student, teacher, mask)
    torch.testing.assert_close(alpha_beta_divergence(student, teacher, mask, alpha=1.0, beta=0.0), forward)
    torch.testing.assert_close(alpha_beta_divergence(student, teacher, mask, alpha=0.0, beta=1.0), reverse)
    # the special cases are the limits of the general formula
    torch.testing.assert_close(alpha_beta_divergence(student, teacher, mask, alpha=1.0, beta=1e-6), forward,
                               rtol=1e-5, atol=0)
    torch.testing.assert_close(alpha_beta_divergence(student, teacher, mask, alpha=1e-6, beta=1.0), reverse,
                               rtol=1e-5, atol=0)
    near_limits = [((0.3, -0.3 + 1e-7), (0.3, -0.3)), ((0.5, 1e-7), (0.5, 0.0)), ((1e-7, 0.5), (0.0, 0.5)),
                   ((1e-4, 1e-4), (0.0, 0.0))]
    for (alpha, beta), (alpha_limit, beta_limit) in near_limits:
        near = alpha_beta_divergence(student, teacher, mask, alpha=alpha, beta=beta)
        exact = alpha_beta_divergence(student, teacher, mask, alpha=alpha_limit, beta=beta_limit)
        torch.testing.assert_close(near, exact, rtol=1e-3, atol=0)
    p, q = torch.softmax(teacher, -1), torch.softmax(student, -1)
    hellinger = 2 * ((p.sqrt() - q.sqrt()) ** 2).sum(-1)
    squared = 0.5 * ((p - q) ** 2).sum(-1)
    for (alpha, beta), expected in [((0.5, 0.5), hellinger), ((1.0, 1.0), squared)]:
        value = alpha_beta_divergence(student, teacher, mask, alpha=alpha, beta=beta, reduction="none")
        torch.testing.assert_close(value, expected * mask)


def test_alpha_beta_divergence_refuses_non_finite_parameters(make_case):
    student, teacher, mask = make_case()
    with pytest.raises(ValueError, match="finite"):
        alpha_beta_divergence(student, teacher, mask, alpha=float("nan"))


def test_registry_names_and_common_signature():
    assert set(DIVERGENCES) == {
        "forward_kl", "reverse_kl", "symmetric_kl", "skew_forward_kl", "skew_reverse_kl", "generalized_jsd",
        "total_variation", "abkd", "alpha_beta",
    }
    for name, fn in DIVERGENCES.items():
        assert fn.__name__ == {"abkd": "alpha_beta_divergence", "alpha_beta": "alpha_beta_divergence"}.get(name, name)
        parameters = inspect.signature(fn).parameters
        assert list(parameters)[:3] == ["student_logits", "teacher_logits", "mask"]
        for keyword in ("temperature", "reduction", "chunk_size"):
            assert parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY
        assert callable(fn.terms)  # the per-entry terms DAC-KL applies to its clipped vectors


def test_misspelt_parameter_is_refused_before_any_work(make_case):
    student, teacher, mask = make_case()
    with pytest.raises(TypeError, match="alpah"):
        skew_forward_kl(student, teacher, mask, alpah=0.1)


def test_bad_inputs_raise_readable_errors(make_case):
    student, teacher, mask = make_case()
    with pytest.raises(ValueError, match="slice a padded vocabulary"):
        forward_kl(student, teacher[..., :-1], mask)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        forward_kl(student, teacher, mask.float())
    with pytest.raises(ValueError, match="reduction"):
        forward_kl(student, teacher, mask, reduction="batchmean")
    with pytest.raises(ValueError, match="temperature"):
        forward_kl(student, teacher, mask, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        forward_kl(student, teacher, mask, chunk_size=0)
    with pytest.raises(ValueError, match="alpha"):
        skew_forward_kl(student, teacher, mask, alpha=1.5)
