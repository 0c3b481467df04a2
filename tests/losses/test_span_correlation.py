"""The span correlation loss against a loop reference over spans and pairs, for each relation, and
its effect on training next to forward KL."""

from __future__ import annotations

import math

import pytest
import torch

from mgsr_lightning.losses import forward_kl, span_correlation_loss, span_pair_mask
from mgsr_lightning.losses.span_correlation import RELATIONS

SPANS = torch.tensor(
    [
        [0, 0, 0, -1, 4, 4, 5],
        [2, 2, 7, 7, 7, 7, -1],
        [-1, 3, 3, -1, 3, 3, 3],  # the same id twice in a row: each run's pairs count, never the gap
    ]
)


def relation64(relation, p0, p1, q0, q1):
    """One pair's term from its formula, in float64 Python arithmetic."""
    r_p = [a * b for a, b in zip(p0, p1)]
    r_q = [a * b for a, b in zip(q0, q1)]
    if relation == "product":
        return sum((a - b) ** 2 for a, b in zip(r_p, r_q))
    if relation == "normalized":
        rho_p = [a / sum(r_p) for a in r_p]
        rho_q = [a / sum(r_q) for a in r_q]
        return sum(a * math.log(a / b) for a, b in zip(rho_p, rho_q) if a > 0)
    dot = sum(a * b for a, b in zip(r_p, r_q))
    return 1 - dot / math.sqrt(sum(a * a for a in r_p) * sum(b * b for b in r_q))


def reference_pairs(student, teacher, spans, mask, temperature, softmax_ref, relation="normalized"):
    """{(b, t): the relation's term} for every adjacent pair inside a span and the mask."""
    terms = {}
    for b in range(spans.size(0)):
        for t in range(spans.size(1) - 1):
            if spans[b, t] == -1 or spans[b, t] != spans[b, t + 1] or not (mask[b, t] and mask[b, t + 1]):
                continue
            p0, p1 = softmax_ref(teacher[b, t], temperature), softmax_ref(teacher[b, t + 1], temperature)
            q0, q1 = softmax_ref(student[b, t], temperature), softmax_ref(student[b, t + 1], temperature)
            terms[b, t] = relation64(relation, p0, p1, q0, q1)
    return terms


@pytest.fixture
def case(make_case):
    student, teacher, _ = make_case(B=3, T=7, V=9, scale=1.5)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4] = False  # drops the pairs (3, 4) and (4, 5) of row 1's span 7
    return student, teacher, mask


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_loop_reference(reduction, relation, case, softmax_ref):
    student, teacher, mask = case
    value = span_correlation_loss(student, teacher, mask, spans=SPANS, relation=relation, temperature=1.6,
                                  reduction=reduction)
    terms = reference_pairs(student, teacher, SPANS, mask, 1.6, softmax_ref, relation)
    assert set(terms) == {(0, 0), (0, 1), (0, 4), (1, 0), (1, 2), (2, 1), (2, 4), (2, 5)}
    if reduction == "none":
        expected = torch.zeros(SPANS.shape, dtype=torch.float64)
        for (b, t), term in terms.items():
            expected[b, t] = term
    else:
        expected = torch.tensor(sum(terms.values()) / (len(terms) if reduction == "mean" else 1), dtype=torch.float64)
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-8)
    assert span_pair_mask(SPANS, mask).sum() == len(terms)


@pytest.mark.parametrize("relation", RELATIONS)
def test_padded_vocabulary_columns_contribute_nothing(relation, make_case):
    student, teacher, mask = make_case(B=3, T=7, V=9)
    padded_student, padded_teacher, _ = make_case(B=3, T=7, V=9, padded=3)
    padded_student.requires_grad_(True)
    padded = span_correlation_loss(padded_student, padded_teacher, mask, spans=SPANS, relation=relation,
                                   reduction="none")
    torch.testing.assert_close(
        padded, span_correlation_loss(student, teacher, mask, spans=SPANS, relation=relation, reduction="none")
    )
    (grad,) = torch.autograd.grad(padded.sum(), padded_student)
    assert torch.isfinite(grad).all() and (grad[..., -3:] == 0).all()


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("chunk_size", [1, 2, 100])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_equals_unchunked(chunk_size, reduction, relation, case):
    student, teacher, mask = case
    student.requires_grad_(True)
    plain = span_correlation_loss(student, teacher, mask, spans=SPANS, relation=relation, reduction=reduction)
    chunked = span_correlation_loss(
        student, teacher, mask, spans=SPANS, relation=relation, reduction=reduction, chunk_size=chunk_size
    )
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
    loss = span_correlation_loss(student, teacher, mask, spans=torch.arange(7).expand(3, 7).contiguous(),
                                 chunk_size=chunk_size)
    loss.backward()
    assert loss.item() == 0.0 and (student.grad == 0).all()


@pytest.mark.parametrize("relation", RELATIONS)
def test_gradcheck_float64(relation, make_case):
    student, teacher, mask = make_case(B=2, T=4, V=5, dtype=torch.float64)
    mask[:] = True
    spans = torch.tensor([[0, 0, 0, -1], [1, 1, 2, 2]])
    student.requires_grad_(True)

    def loss(s):
        return span_correlation_loss(s, teacher, mask, spans=spans, relation=relation, temperature=0.7)

    assert torch.autograd.gradcheck(loss, (student,))


@pytest.mark.parametrize("relation", RELATIONS)
def test_bf16_inputs_are_computed_in_float32(relation, case, softmax_ref):
    student, teacher, mask = case
    student_bf16, teacher_bf16 = student.bfloat16(), teacher.bfloat16()
    value = span_correlation_loss(student_bf16, teacher_bf16, mask, spans=SPANS, relation=relation)
    assert value.dtype == torch.float32
    terms = reference_pairs(student_bf16.double(), teacher_bf16.double(), SPANS, mask, 1.0, softmax_ref, relation)
    assert value.item() == pytest.approx(sum(terms.values()) / len(terms), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("relation", RELATIONS)
def test_zero_with_zero_gradient_at_student_equal_teacher(relation, case):
    _, teacher, mask = case
    student = (teacher.double() + 1.5).requires_grad_(True)  # the same distributions
    loss = span_correlation_loss(student, teacher.double(), mask, spans=SPANS, relation=relation)
    (grad,) = torch.autograd.grad(loss, student)
    assert loss.abs() < 1e-12 and grad.abs().max() < 1e-12


def test_normalized_relation_gradient_is_comparable_to_forward_kl_and_the_product_is_not():
    # random logits at the scale of a trained LM's (peaked rows, V = 512): the gradient norm of each
    # relation on the student logits against forward KL's over the same positions
    generator = torch.Generator().manual_seed(0)
    teacher = torch.randn(2, 16, 512, generator=generator) * 4
    student = (teacher + torch.randn(2, 16, 512, generator=generator) * 2).requires_grad_(True)
    spans = torch.arange(16).div(4, rounding_mode="floor").expand(2, 16).contiguous()  # spans of 4 tokens

    def grad_norm(loss):
        return torch.autograd.grad(loss, student)[0].norm().item()

    reference = grad_norm(forward_kl(student, teacher))
    ratios = {r: grad_norm(span_correlation_loss(student, teacher, spans=spans, relation=r)) / reference
              for r in RELATIONS}
    assert 0.1 < ratios["normalized"] < 10
    assert ratios["product"] < 0.1 * ratios["normalized"]


@pytest.mark.parametrize("relation", ["normalized", "product"])
def test_the_span_term_changes_training(relation):
    # a few Adam steps of a tiny linear student with forward KL alone vs forward KL + the span term
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 12, 8, generator=generator)
    teacher = torch.randn(2, 12, 64, generator=generator) * 3
    spans = torch.arange(12).div(3, rounding_mode="floor").expand(2, 12).contiguous()

    def train(span_weight):
        torch.manual_seed(0)
        head = torch.nn.Linear(8, 64)
        optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
        for _ in range(20):
            logits = head(features)
            loss = forward_kl(logits, teacher)
            loss = loss + span_weight * span_correlation_loss(logits, teacher, spans=spans, relation=relation)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        span = span_correlation_loss(head(features), teacher, spans=spans, relation=relation).item()
        return head.weight.detach(), span

    (plain_weight, plain_span), (span_weight, with_span) = train(0.0), train(1.0)
    change = (span_weight - plain_weight).norm() / plain_weight.norm()
    assert with_span < plain_span
    if relation == "normalized":
        assert change > 1e-2 and with_span < 0.9 * plain_span


def test_spans_must_match_the_logits(case):
    student, teacher, mask = case
    with pytest.raises(ValueError, match="spans must have shape"):
        span_correlation_loss(student, teacher, mask, spans=SPANS[:, :-1])
    with pytest.raises(ValueError, match="relation"):
        span_correlation_loss(student, teacher, mask, spans=SPANS, relation="hadamard")
