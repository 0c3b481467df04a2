"""The span correlation loss against a loop reference over spans and pairs."""

from __future__ import annotations

import pytest
import torch

from mgsr_lightning.losses import span_correlation_loss

SPANS = torch.tensor(
    [
        [0, 0, 0, -1, 4, 4, 5],
        [2, 2, 7, 7, 7, 7, -1],
        [-1, 3, 3, -1, 3, 3, 3],  # the same id twice in a row: each run's pairs count, never the gap
    ]
)


def reference_pairs(student, teacher, spans, mask, temperature, softmax_ref):
    """{(b, t): Σ_v (p_t p_{t+1} − q_t q_{t+1})²} for every adjacent pair inside a span and the mask."""
    terms = {}
    for b in range(spans.size(0)):
        for t in range(spans.size(1) - 1):
            if spans[b, t] == -1 or spans[b, t] != spans[b, t + 1] or not (mask[b, t] and mask[b, t + 1]):
                continue
            p0, p1 = softmax_ref(teacher[b, t], temperature), softmax_ref(teacher[b, t + 1], temperature)
            q0, q1 = softmax_ref(student[b, t], temperature), softmax_ref(student[b, t + 1], temperature)
            terms[b, t] = sum((a * c - x * y) ** 2 for a, c, x, y in zip(p0, p1, q0, q1))
    return terms


@pytest.fixture
def case(make_case):
    student, teacher, _ = make_case(B=3, T=7, V=9, scale=1.5)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4] = False  # drops the pairs (3, 4) and (4, 5) of row 1's span 7
    return student, teacher, mask


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_loop_reference(reduction, case, softmax_ref):
    student, teacher, mask = case
    value = span_correlation_loss(student, teacher, mask, spans=SPANS, temperature=1.6, reduction=reduction)
    terms = reference_pairs(student, teacher, SPANS, mask, 1.6, softmax_ref)
    assert set(terms) == {(0, 0), (0, 1), (0, 4), (1, 0), (1, 2), (2, 1), (2, 4), (2, 5)}
    if reduction == "none":
        expected = torch.zeros(SPANS.shape, dtype=torch.float64)
        for (b, t), term in terms.items():
            expected[b, t] = term
    else:
        expected = torch.tensor(sum(terms.values()) / (len(terms) if reduction == "mean" else 1), dtype=torch.float64)
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-9)


def test_padded_vocabulary_columns_contribute_nothing(make_case):
    student, teacher, mask = make_case(B=3, T=7, V=9)
    padded_student, padded_teacher, _ = make_case(B=3, T=7, V=9, padded=3)
    torch.testing.assert_close(
        span_correlation_loss(padded_student, padded_teacher, mask, spans=SPANS, reduction="none"),
        span_correlation_loss(student, teacher, mask, spans=SPANS, reduction="none"),
    )


@pytest.mark.parametrize("chunk_size", [1, 2, 100])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_equals_unchunked(chunk_size, reduction, case):
    student, teacher, mask = case
    student.requires_grad_(True)
    plain = span_correlation_loss(student, teacher, mask, spans=SPANS, reduction=reduction)
    chunked = span_correlation_loss(student, teacher, mask, spans=SPANS, reduction=reduction, chunk_size=chunk_size)
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-9)
    (plain_grad,) = torch.autograd.grad(plain.sum(), student)
    (chunked_grad,) = torch.autograd.grad(chunked.sum(), student)
    torch.testing.assert_close(chunked_grad, plain_grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_gradients_reach_the_student_only(chunk_size, case):
    student, teacher, mask = case
    student.requires_grad_(True)
    teacher.requires_grad_(True)
    span_correlation_loss(student, teacher, mask, spans=SPANS, chunk_size=chunk_size).backward()
    assert student.grad.abs().sum() > 0
    assert teacher.grad is None


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_no_pairs_gives_zero_with_zero_gradient(chunk_size, case):
    student, teacher, mask = case
    student.requires_grad_(True)
    loss = span_correlation_loss(student, teacher, mask, spans=torch.arange(7).expand(3, 7).contiguous(), chunk_size=chunk_size)
    loss.backward()
    assert loss.item() == 0.0 and (student.grad == 0).all()


def test_gradcheck_float64(make_case):
    student, teacher, mask = make_case(B=2, T=4, V=5, dtype=torch.float64)
    mask[:] = True
    spans = torch.tensor([[0, 0, 0, -1], [1, 1, 2, 2]])
    student.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: span_correlation_loss(s, teacher, mask, spans=spans, temperature=0.7), (student,))


def test_bf16_inputs_are_computed_in_float32(case, softmax_ref):
    student, teacher, mask = case
    student_bf16, teacher_bf16 = student.bfloat16(), teacher.bfloat16()
    value = span_correlation_loss(student_bf16, teacher_bf16, mask, spans=SPANS)
    assert value.dtype == torch.float32
    terms = reference_pairs(student_bf16.double(), teacher_bf16.double(), SPANS, mask, 1.0, softmax_ref)
    assert value.item() == pytest.approx(sum(terms.values()) / len(terms), rel=1e-5)


def test_spans_must_match_the_logits(case):
    student, teacher, mask = case
    with pytest.raises(ValueError, match="spans must have shape"):
        span_correlation_loss(student, teacher, mask, spans=SPANS[:, :-1])
