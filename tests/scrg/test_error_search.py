"""Error-position scoring (``error_search.find_error_positions``, ``token_nll``) on hand-made tensors,
against float64 references."""

from __future__ import annotations

import pytest
import torch

from mgsr_lightning.scrg.error_search import find_error_positions, token_nll
from mgsr_lightning.seeding import row_generators


def kl_float64(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) over the last dim, in float64."""
    log_p, log_q = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def jsd_float64(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    p, q = p_logits.double().softmax(-1), q_logits.double().softmax(-1)
    mixture_log = (0.5 * (p + q)).log()
    return 0.5 * (p * (p.log() - mixture_log)).sum(-1) + 0.5 * (q * (q.log() - mixture_log)).sum(-1)


# ---------------------------------------------------------------- find_error_positions on hand-made tensors


def test_error_is_the_largest_difference_among_mismatched_positions():
    # Row 0, V = 3: position 0 agrees (teacher argmax 0 = token 0) but has the largest KL; positions 1
    # and 2 disagree, with KL ≈ 0.78 and ≈ 1.14, so the error is position 2 and the teacher token 1.
    # Row 1: the response is the teacher's argmax everywhere. Row 2: its only mismatch is padding.
    teacher = torch.tensor([[[5.0, 0, 0], [0, 0, 2], [0, 3, 0]]] * 3)
    student = torch.tensor([[[0.0, 0, 5], [0, 1, 0], [0, 0, 1]]] * 3)
    response_ids = torch.tensor([[0, 1, 2], [0, 2, 1], [0, 2, 2]])
    response_mask = torch.tensor([[True, True, True], [True, True, True], [True, True, False]])

    errors = find_error_positions(teacher, student, response_ids, response_mask, criterion="max_difference")

    assert errors.has_error.tolist() == [True, False, False]
    assert errors.positions.tolist() == [2, 0, 0]
    assert errors.teacher_tokens[0].item() == 1
    reference = kl_float64(teacher, student)  # [3, 3]
    assert torch.allclose(errors.scores[0].double(), reference[0], atol=1e-5)
    assert errors.scores[0].argmax().item() == 0  # the matched position is not chosen despite scoring highest


def test_start_excludes_earlier_positions_and_ties_go_to_the_earliest():
    teacher = torch.tensor([[[0.0, 4], [0, 4], [0, 4], [0, 4]]])  # argmax 1 everywhere
    student = torch.zeros(1, 4, 2)
    response_ids = torch.zeros(1, 4, dtype=torch.long)  # mismatched everywhere, equal differences
    response_mask = torch.ones(1, 4, dtype=torch.bool)

    paper = dict(criterion="max_difference")
    assert find_error_positions(teacher, student, response_ids, response_mask, **paper).positions.item() == 0
    later = find_error_positions(teacher, student, response_ids, response_mask, start=torch.tensor([2]), **paper)
    assert later.positions.item() == 2
    none_left = find_error_positions(teacher, student, response_ids, response_mask, start=torch.tensor([4]), **paper)
    assert not none_left.has_error.item() and none_left.positions.item() == 0


@pytest.mark.parametrize(
    ("difference", "reference"),
    [
        ("forward_kl", lambda t, s: kl_float64(t, s)),
        ("reverse_kl", lambda t, s: kl_float64(s, t)),
        ("jsd", jsd_float64),
    ],
)
def test_difference_switch_uses_the_named_divergence(difference, reference):
    teacher, student = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    response_ids = torch.randint(7, (2, 5))
    response_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])

    errors = find_error_positions(
        teacher, student, response_ids, response_mask, criterion="max_difference", difference=difference
    )

    expected = reference(teacher, student)  # [2, 5]
    assert torch.allclose(errors.scores.double()[response_mask], expected[response_mask], atol=1e-5)
    for row in range(2):  # the chosen position, recomputed by a plain loop
        candidates = [
            r for r in range(5) if response_mask[row, r] and teacher[row, r].argmax() != response_ids[row, r]
        ]
        assert errors.has_error[row].item() == bool(candidates)
        if candidates:
            assert errors.positions[row].item() == max(candidates, key=lambda r: expected[row, r].item())


def test_sampled_teacher_tokens_use_per_row_generators():
    # Flat teacher logits, so sampled tokens vary; row 1 has 3 real positions.
    teacher, student = 0.1 * torch.randn(2, 6, 50), torch.randn(2, 6, 50)
    response_ids = torch.randint(50, (2, 6))
    response_mask = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    seeds = torch.tensor([5, 9])

    def pick(rows: slice, width: int, row_seeds: torch.Tensor):
        return find_error_positions(
            teacher[rows, :width],
            student[rows, :width],
            response_ids[rows, :width],
            response_mask[rows, :width],
            criterion="max_difference",
            teacher_token="sample",
            generator=row_generators(row_seeds, torch.device("cpu")),
        )

    batched = pick(slice(0, 2), 6, seeds)
    alone = pick(slice(1, 2), 3, seeds[1:])  # narrower batch: only the row's real positions
    assert batched.positions[1] == alone.positions[0]
    assert batched.teacher_tokens[1] == alone.teacher_tokens[0]
    assert batched.has_error[1] == alone.has_error[0]
    assert torch.equal(pick(slice(0, 2), 6, seeds).teacher_tokens, batched.teacher_tokens)

    draws = {tuple(pick(slice(0, 1), 6, torch.tensor([s])).teacher_tokens.tolist()) for s in range(20)}
    assert len(draws) > 1  # different seeds, different teacher samples

    # A teacher that is certain is always sampled as its argmax.
    certain = teacher.clone()
    certain[..., 7] = 50.0
    one_generator = torch.Generator().manual_seed(5)  # a single generator for the whole batch
    sampled = find_error_positions(
        certain, student, response_ids, response_mask, criterion="max_difference", teacher_token="sample",
        generator=one_generator,
    )
    assert (sampled.teacher_tokens[sampled.has_error] == 7).all()


def test_first_unlikely_is_the_earliest_mismatch_the_teacher_finds_unlikely():
    # V = 4, teacher argmax 3 everywhere. Student tokens' teacher probabilities: 0.48 (its argmax: no
    # mismatch), then about 0.18, 0.045, 0.002 and 0.10.
    teacher = torch.tensor([[[0.0, 0, 0, 1], [0, 0, 0, 1], [-1, 0, 0, 3], [-4, 0, 0, 2], [-1, 0, 0, 2]]])
    student = torch.zeros(1, 5, 4)
    response_ids = torch.tensor([[3, 2, 1, 0, 1]])
    response_mask = torch.ones(1, 5, dtype=torch.bool)
    teacher_probs = teacher.softmax(-1).gather(-1, response_ids[..., None]).squeeze(-1)[0]
    assert teacher_probs[2] < 0.1 < teacher_probs[1] and teacher_probs[3] < teacher_probs[2]

    def pick(criterion, **options):
        return find_error_positions(teacher, student, response_ids, response_mask, criterion=criterion, **options)

    first = pick("first_unlikely", unlikely_below=0.1)
    assert first.positions.tolist() == [2] and first.teacher_tokens.tolist() == [3]
    assert torch.allclose(first.scores.double(), -teacher_probs.double().log(), atol=1e-5)
    assert pick("first_unlikely", unlikely_below=0.5).positions.tolist() == [1]
    assert pick("first_unlikely", unlikely_below=0.1, start=torch.tensor([3])).positions.tolist() == [3]
    assert not pick("first_unlikely", unlikely_below=0.1, start=torch.tensor([5])).has_error.item()
    assert pick("first_unlikely").positions.tolist() == [3]  # the default threshold, 0.02
    assert not pick("first_unlikely", unlikely_below=0.001).has_error.item()
    assert pick("max_teacher_nll").positions.tolist() == [3]  # the least likely student token


def test_token_nll_matches_float64():
    logits, tokens = torch.randn(2, 3, 11), torch.randint(11, (2, 3))
    reference = -logits.double().log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    assert torch.allclose(token_nll(logits, tokens).double(), reference, atol=1e-5)


def test_vocabulary_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="vocab"):
        find_error_positions(
            torch.zeros(1, 2, 10),
            torch.zeros(1, 2, 12),
            torch.zeros(1, 2, dtype=torch.long),
            torch.ones(1, 2, dtype=torch.bool),
        )
