"""SCRG: revision (``scrg.revise``) with tiny real GPT-2 pairs.

The controlled tests use ``positional_gpt2`` pairs (next-token logits fixed per absolute position),
so every error position, teacher token and length edge is known in advance. The invariance tests
(batch vs row, padding, "the suffix is the student's") use ordinary random tiny models.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_generation import (
    EOS,
    IDS,
    PAD,
    PROMPTS,
    VOCAB,
    left_padded,
    peaked_table,
    positional_gpt2,
    sharpened,
    with_output_bias,
)
from tiny_models import build_tiny_model

from mgsr_lightning.batch import Rollout
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.sampling import DecodingConfig, SamplingConfig
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.scrg.error_search import find_error_positions
from mgsr_lightning.scrg.revise import ScrgConfig, revise
from mgsr_lightning.seeding import derive_seeds


def nll_float64(logits: torch.Tensor, rollout: Rollout) -> float:
    """The mean NLL per real response token of ``rollout`` under response-aligned ``logits``, in float64."""
    log_probs = logits.detach().double().log_softmax(-1).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    return float(-log_probs[rollout.response_mask].mean())


def test_config_rejects_unknown_choices():
    bad_choices = (
        dict(n_corrections=-1), dict(difference="tvd"), dict(teacher_token="beam"), dict(criterion="last"),
        dict(unlikely_below=0.0), dict(unlikely_below=1.5),
    )
    for bad in bad_choices:
        with pytest.raises(ValueError):
            ScrgConfig(**bad)


# ---------------------------------------------------------------- revise with positional GPT-2 pairs
#
# The prompt [5, 6] puts response token r at position 1 + r. The student puts almost all its mass on
# token 20 + t at position t, so its rollout (and anything it re-generates) is 21, 22, 23, ...
# The teacher agrees with it except at the positions a test overrides.

PROMPT = [5, 6]
STUDENT_ROLLOUT = [21 + r for r in range(8)]
STUDENT_TABLE = peaked_table([20 + t for t in range(16)], strength=20.0)
EIGHT_TOKENS = SamplingConfig(max_new_tokens=8)


def disagreeing(rollout_token: int, teacher_token: int, margin: float) -> torch.Tensor:
    """A teacher row splitting its mass between the rollout token and its own (preferred by ``margin``).

    The larger the margin, the larger the KL to the near-certain student: 0.1 → 9.8, 0.5 → 11.7, 1 → 14.0.
    """
    row = torch.zeros(VOCAB)
    row[rollout_token], row[teacher_token] = 15.0, 15.0 + margin
    return row


def agreeing_but_spread(rollout_token: int) -> torch.Tensor:
    """A teacher row whose argmax is the rollout token but whose mass is spread over 100 others (KL ≈ 15.2)."""
    row = torch.zeros(VOCAB)
    row[100:200], row[rollout_token] = 9.9, 10.0
    return row


def positional_pair(teacher_rows: dict[int, torch.Tensor]):
    """(student, teacher): the teacher's table is the student's with ``teacher_rows`` {response index: row}."""
    table = STUDENT_TABLE.clone()
    for response_index, row in teacher_rows.items():
        table[1 + response_index] = row
    return positional_gpt2(STUDENT_TABLE), positional_gpt2(table)


# Response index: 1 disagrees (KL ≈ 11.7), 2 agrees with the largest KL (≈ 15.2), 4 disagrees the
# most (≈ 14.0), 6 disagrees the least (≈ 9.8).
MAIN_TEACHER_ROWS = {
    1: disagreeing(22, 60, 0.5),
    2: agreeing_but_spread(23),
    4: disagreeing(25, 50, 1.0),
    6: disagreeing(27, 70, 0.1),
}


PAPER = ScrgConfig(criterion="max_difference")  # the paper's reading: the largest difference among mismatches


def run_revise(student, teacher, rollout, config=PAPER, sampling=EIGHT_TOKENS, seeds=None, **limits):
    """``revise`` with the tests' EOS/pad ids, ``limits`` (vocab_size, max_length) and, unless given, one seed
    per row."""
    seeds = torch.arange(rollout.batch_size) if seeds is None else seeds
    return revise(student, teacher, rollout, config, Decoding(sampling, **IDS, **limits), seeds=seeds)


def responses(result) -> list[list[int]]:
    return result.rollout.to_token_lists()[1]


def score(student, teacher, rollout: Rollout, config: ScrgConfig = PAPER):
    """``find_error_positions`` on one teacher and one student forward over the rollout, as in round 1 of ``revise``."""
    return find_error_positions(
        response_logits(teacher, rollout),
        response_logits(student, rollout),
        rollout.response_ids,
        rollout.response_mask,
        criterion=config.criterion,
        unlikely_below=config.unlikely_below,
    )


def test_corrects_the_mismatch_with_the_largest_difference():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)
    rollout = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)

    scores = score(student, teacher, rollout).scores[0]
    assert scores.argmax().item() == 2  # the agreeing position scores highest, but is no candidate
    assert scores[[1, 2, 4, 6]].tolist() == pytest.approx([11.7, 15.2, 14.0, 9.8], abs=0.1)

    result = run_revise(student, teacher, rollout)

    # Prefix kept, teacher token 50 at position 4, the rest re-generated by the student.
    assert responses(result) == [[21, 22, 23, 24, 50, 26, 27, 28]]
    assert result.rollout.to_token_lists()[0] == [PROMPT]
    assert result.stats["corrected_fraction"] == 1.0
    assert result.stats["mean_error_position"] == 4.0
    assert result.stats["mean_regenerated_tokens"] == 3.0
    assert result.stats["regenerated_tokens"] == 3.0 and result.stats["unchanged_fraction"] == 0.0
    assert result.stats["seconds"] > 0
    # The last round changed the row: one more teacher forward scores the final sequence.
    assert torch.equal(result.teacher_logits, response_logits(teacher, result.rollout))


def test_second_correction_comes_after_the_first():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)
    rollout = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)

    two = run_revise(student, teacher, rollout, ScrgConfig(n_corrections=2, criterion="max_difference"))
    # Position 1 disagrees with a larger KL than position 6, but lies before the first correction.
    assert responses(two) == [[21, 22, 23, 24, 50, 26, 70, 28]]
    assert two.stats["mean_error_position"] == 5.0  # (4 + 6) / 2
    assert two.stats["mean_regenerated_tokens"] == 4.0  # 3 after position 4, then 1 after position 6

    # A third round finds nothing after position 6, so the teacher logits it computed are the final ones.
    three = run_revise(student, teacher, rollout, ScrgConfig(n_corrections=3, criterion="max_difference"))
    assert responses(three) == responses(two)
    assert torch.equal(three.teacher_logits, response_logits(teacher, three.rollout))


def test_left_padding_and_batch_company_do_not_change_the_result():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)
    # Row 1's longer prompt shifts its positions by 2: its response index r sits at position 3 + r,
    # so its only mismatch (teacher token 50 at position 5) is at response index 2.
    prompts, rollouts = [PROMPT, [5, 6, 7, 8]], [STUDENT_ROLLOUT, [23 + r for r in range(6)]]
    batch = Rollout.from_token_lists(prompts, rollouts, pad_token_id=PAD)

    batched = run_revise(student, teacher, batch, seeds=torch.tensor([3, 4]))

    assert responses(batched) == [[21, 22, 23, 24, 50, 26, 27, 28], [23, 24, 50, 26, 27, 28, 29, 30]]
    for row in range(2):
        prompt_ids, prompt_mask = left_padded([prompts[row]], extra_padding=4)
        alone = Rollout(prompt_ids, prompt_mask, batch.response_ids[row : row + 1], batch.response_mask[row : row + 1])
        revised_alone = run_revise(student, teacher, alone, seeds=torch.tensor([3 + row]))
        assert responses(revised_alone) == [responses(batched)[row]]


def test_rows_without_a_mismatch_are_untouched():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)
    teacher_argmax_response = [21, 60, 23, 24, 50, 26, 70, 28]
    batch = Rollout.from_token_lists([PROMPT, PROMPT], [STUDENT_ROLLOUT, teacher_argmax_response], pad_token_id=PAD)

    mixed = run_revise(student, teacher, batch)
    assert responses(mixed)[1] == teacher_argmax_response
    assert mixed.rollout.response_mask[1].all()
    assert mixed.stats["corrected_fraction"] == 0.5 and mixed.stats["unchanged_fraction"] == 0.5
    assert torch.equal(mixed.teacher_logits, response_logits(teacher, mixed.rollout))

    clean = batch.select(torch.tensor([1]))
    untouched = run_revise(student, teacher, clean)
    assert untouched.rollout is clean  # bit for bit: the very same tensors
    assert torch.equal(untouched.teacher_logits, response_logits(teacher, clean))
    assert untouched.stats["corrected_fraction"] == 0.0 and untouched.stats["mean_error_position"] == 0.0


# Response index: 1 disagrees but keeps teacher probability 0.38 for the student token, 3 has 0.047,
# 5 has 0.0025 (the largest difference and teacher NLL), 7 has 0.018.
FIRST_UNLIKELY = ScrgConfig(criterion="first_unlikely", unlikely_below=0.1)
UNLIKELY_TEACHER_ROWS = {
    1: disagreeing(22, 60, 0.5),
    3: disagreeing(24, 50, 3.0),
    5: disagreeing(26, 70, 6.0),
    7: disagreeing(28, 80, 4.0),
}


def test_first_unlikely_corrects_the_earliest_unlikely_token():
    student, teacher = positional_pair(UNLIKELY_TEACHER_ROWS)
    rollout = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)

    first = run_revise(student, teacher, rollout, FIRST_UNLIKELY)
    assert responses(first) == [[21, 22, 23, 50, 25, 26, 27, 28]]
    assert first.stats["mean_error_position"] == 3.0 and first.stats["mean_regenerated_tokens"] == 4.0
    default = run_revise(student, teacher, rollout, ScrgConfig())  # p < 0.02: position 3 is no error
    assert responses(default) == [[21, 22, 23, 24, 25, 70, 27, 28]]

    paper = run_revise(student, teacher, rollout, ScrgConfig(criterion="max_difference"))
    assert responses(paper) == [[21, 22, 23, 24, 25, 70, 27, 28]]
    least_likely = run_revise(student, teacher, rollout, ScrgConfig(criterion="max_teacher_nll"))
    assert responses(least_likely) == responses(paper)


@pytest.mark.parametrize("n_corrections", [3, 5])
def test_several_corrections_come_at_increasing_positions(n_corrections):
    student, teacher = positional_pair(UNLIKELY_TEACHER_ROWS)
    rollout = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)

    config = dataclasses.replace(FIRST_UNLIKELY, n_corrections=n_corrections)
    result = run_revise(student, teacher, rollout, config)

    # 3, then 5, then 7 (the last token of the budget: nothing re-generated); position 1 stays.
    assert responses(result) == [[21, 22, 23, 50, 25, 70, 27, 80]]
    assert result.stats["mean_error_position"] == 5.0
    assert result.stats["mean_regenerated_tokens"] == 6.0  # 4 after position 3, 2 after 5, none after 7
    assert torch.equal(result.teacher_logits, response_logits(teacher, result.rollout))


@pytest.mark.parametrize("criterion", ["first_unlikely", "max_difference"])
def test_teacher_nll_before_and_after_are_logged(criterion):
    student, teacher = positional_pair(UNLIKELY_TEACHER_ROWS)
    # Row 1 is shorter and padded, so the means are over real tokens only.
    batch = Rollout.from_token_lists([PROMPT, PROMPT], [STUDENT_ROLLOUT, STUDENT_ROLLOUT[:5]], pad_token_id=PAD)

    result = run_revise(student, teacher, batch, ScrgConfig(n_corrections=3, criterion=criterion))

    stats = result.stats
    assert stats["teacher_nll_before"] == pytest.approx(nll_float64(response_logits(teacher, batch), batch), abs=1e-5)
    if criterion == "max_difference":  # the one criterion that runs a student forward
        assert stats["student_nll_before"] == pytest.approx(nll_float64(response_logits(student, batch), batch),
                                                            abs=1e-5)
    else:  # no forward, and no sampling state to read it from: not logged rather than guessed
        assert "student_nll_before" not in stats
    after = nll_float64(response_logits(teacher, result.rollout), result.rollout)
    assert stats["teacher_nll_after"] == pytest.approx(after, abs=1e-5)
    assert stats["teacher_nll_after"] < stats["teacher_nll_before"]

    off = run_revise(student, teacher, batch, ScrgConfig(n_corrections=0))
    assert "teacher_nll_before" not in off.stats and "teacher_nll_after" not in off.stats


def test_teacher_eos_ends_the_row():
    student, teacher = positional_pair({4: disagreeing(25, EOS, 1.0)})
    rollout = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)

    result = run_revise(student, teacher, rollout)

    assert responses(result) == [[21, 22, 23, 24, EOS]]
    assert result.rollout.response_ids.shape == (1, 5)
    assert result.stats["mean_regenerated_tokens"] == 0.0


def test_student_eos_can_be_the_error():
    # The student stopped at response index 5; the teacher would have gone on with token 80.
    student, teacher = positional_pair({5: disagreeing(EOS, 80, 1.0), 2: disagreeing(23, 60, 0.1)})
    rollout = Rollout.from_token_lists([PROMPT], [[21, 22, 23, 24, 25, EOS]], pad_token_id=PAD)

    result = run_revise(student, teacher, rollout)

    assert responses(result) == [[21, 22, 23, 24, 25, 80, 27, 28]]  # continued up to the 8-token budget


def test_length_budget_limits_the_regeneration():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)

    # The error is the last token allowed by max_new_tokens: corrected, nothing re-generated.
    five = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT[:5]], pad_token_id=PAD)
    at_cap = run_revise(student, teacher, five, sampling=SamplingConfig(max_new_tokens=5))
    assert responses(at_cap) == [[21, 22, 23, 24, 50]]
    assert at_cap.stats["corrected_fraction"] == 1.0 and at_cap.stats["mean_regenerated_tokens"] == 0.0

    # max_length = 8 leaves 6 response tokens after the 2-token prompt: one re-generated after position 4.
    full = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)
    capped = run_revise(student, teacher, full, max_length=8)
    assert responses(capped) == [[21, 22, 23, 24, 50, 26]]


def test_zero_corrections_is_a_no_op():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)
    rollout = Rollout.from_token_lists([PROMPT], [STUDENT_ROLLOUT], pad_token_id=PAD)
    result = run_revise(student, teacher, rollout, ScrgConfig(n_corrections=0))
    assert result.rollout is rollout and result.teacher_logits is None
    assert result.stats["corrected_fraction"] == 0.0


def test_empty_responses_are_left_alone_and_modes_restored():
    student, teacher = positional_pair(MAIN_TEACHER_ROWS)
    student.train()
    rollout = Rollout.from_token_lists([PROMPT, [5]], [[], []], pad_token_id=PAD)  # e.g. a zero length budget

    result = run_revise(student, teacher, rollout)

    assert result.rollout is rollout
    assert result.teacher_logits.shape == (2, 0, VOCAB)
    assert student.training and not teacher.training


# ---------------------------------------------------------------- revise with random tiny GPT-2 pairs


@pytest.fixture
def random_pair():
    """(student, teacher): random tiny GPT-2s (1 and 2 layers, d = 32), sharpened so their tokens depend on context."""
    student = sharpened(build_tiny_model("gpt2", VOCAB, seed=2, n_layer=1))
    teacher = sharpened(build_tiny_model("gpt2", VOCAB, seed=1, n_layer=2))
    return student, teacher


def student_rollout(student, prompts, seeds, max_new_tokens=8, extra_padding=0) -> Rollout:
    config = SamplingConfig(max_new_tokens=max_new_tokens)
    return sample(student, *left_padded(prompts, extra_padding), Decoding(config, **IDS), seeds=seeds)


@pytest.mark.parametrize("config", [PAPER, ScrgConfig()], ids=["max_difference", "default"])
def test_suffix_is_what_the_student_samples_after_the_corrected_prefix(random_pair, config):
    student, teacher = random_pair
    seeds = torch.tensor([10, 20, 30])
    rollout = student_rollout(student, PROMPTS, seeds)
    errors = score(student, teacher, rollout, config)
    assert errors.has_error.all()

    result = run_revise(student, teacher, rollout, config, seeds=seeds)

    prompts, original = rollout.to_token_lists()
    regeneration_seeds = derive_seeds(seeds, 0, "regenerate")
    for row, revised in enumerate(responses(result)):
        j, teacher_token = errors.positions[row].item(), errors.teacher_tokens[row].item()
        assert revised[:j] == original[row][:j]
        assert revised[j] == teacher_token
        if teacher_token == EOS:
            assert len(revised) == j + 1
            continue
        continuation = sample(
            student,
            *left_padded([prompts[row] + revised[: j + 1]]),
            Decoding(EIGHT_TOKENS, **IDS),
            seeds=regeneration_seeds[row : row + 1],
            max_length=len(prompts[row]) + EIGHT_TOKENS.max_new_tokens,
        )
        assert revised[j + 1 :] == continuation.to_token_lists()[1][0]
        assert len(revised) <= EIGHT_TOKENS.max_new_tokens


@pytest.mark.parametrize(
    ("criterion", "teacher_token"),
    [("max_difference", "argmax"), ("max_difference", "sample"), ("first_unlikely", "argmax"),
     ("first_unlikely", "sample"), ("max_teacher_nll", "argmax")],
)
def test_batched_equals_row_by_row_with_any_padding(random_pair, criterion, teacher_token):
    student, teacher = random_pair
    seeds = torch.tensor([7, 8, 9])
    config = ScrgConfig(n_corrections=3, criterion=criterion, teacher_token=teacher_token)

    batched = run_revise(student, teacher, student_rollout(student, PROMPTS, seeds), config, seeds=seeds)
    assert batched.stats["corrected_fraction"] > 0

    for row, prompt in enumerate(PROMPTS):
        row_seeds = seeds[row : row + 1]
        alone = student_rollout(student, [prompt], row_seeds, extra_padding=5)
        assert responses(run_revise(student, teacher, alone, config, seeds=row_seeds)) == [responses(batched)[row]]


def test_padded_vocabulary_is_cut_before_scoring(random_pair):
    student, _ = random_pair
    # A teacher whose argmax is always in the padded rows 300..399: without the cut it would write them.
    bias = torch.zeros(VOCAB)
    bias[300:] = 100.0
    teacher = with_output_bias(build_tiny_model("gpt2", VOCAB, seed=1, n_layer=2), bias)
    seeds = torch.tensor([1, 2, 3])
    rollout = sample(
        student, *left_padded(PROMPTS), Decoding(EIGHT_TOKENS, **IDS, vocab_size=300), seeds=seeds
    )

    uncut = run_revise(student, teacher, rollout, seeds=seeds)
    cut = run_revise(student, teacher, rollout, seeds=seeds, vocab_size=300)

    assert (uncut.rollout.response_ids >= 300).any()
    assert cut.stats["corrected_fraction"] > 0
    assert (cut.rollout.response_ids[cut.rollout.response_mask] < 300).all()


# ---------------------------------------------------------------- re-generation from the scoring forward's KV cache


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
def test_regeneration_from_the_cache_equals_re_encoding(family):
    student = sharpened(build_tiny_model(family, VOCAB, seed=2, n_layer=2))
    teacher = sharpened(build_tiny_model(family, VOCAB, seed=1, n_layer=2))
    seeds = torch.tensor([10, 20, 30])
    rollout = sample(student, *left_padded(PROMPTS, 2), Decoding(EIGHT_TOKENS, **IDS), seeds=seeds)
    config = ScrgConfig(n_corrections=3)

    cached = run_revise(student, teacher, rollout, config, seeds=seeds)
    encoded = run_revise(student, teacher, rollout, dataclasses.replace(config, reuse_cache=False), seeds=seeds)

    assert cached.stats["corrected_fraction"] > 0 and cached.stats["mean_regenerated_tokens"] > 0
    assert torch.equal(cached.rollout.response_ids, encoded.rollout.response_ids)
    assert torch.equal(cached.rollout.response_mask, encoded.rollout.response_mask)
    torch.testing.assert_close(cached.teacher_logits, encoded.teacher_logits)


def test_the_final_teacher_scoring_skips_what_no_row_changed():
    student = sharpened(build_tiny_model("gpt2", VOCAB, seed=2, n_layer=2))
    teacher = sharpened(build_tiny_model("gpt2", VOCAB, seed=1, n_layer=2))
    seeds = torch.tensor([10, 20, 30])
    rollout = sample(student, *left_padded(PROMPTS, 2), Decoding(EIGHT_TOKENS, **IDS), seeds=seeds)
    widths = []
    hook = teacher.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].size(1)),
                                             with_kwargs=True)
    try:
        reused = run_revise(student, teacher, rollout, ScrgConfig(n_corrections=1), seeds=seeds)
        scoring_calls = len(widths)
        full = run_revise(student, teacher, rollout, ScrgConfig(n_corrections=1, reuse_teacher_cache=False),
                          seeds=seeds)
    finally:
        hook.remove()

    assert reused.stats["corrected_fraction"] > 0
    assert torch.equal(reused.rollout.response_ids, full.rollout.response_ids)
    # the scoring forward over prompt + response, then the final one over the response columns from the earliest
    # error on
    final_width = reused.rollout.prompt_ids.size(1) + reused.rollout.response_ids.size(1)
    assert scoring_calls == 2 and widths[0] == rollout.prompt_ids.size(1) + rollout.response_ids.size(1)
    assert widths[1] <= reused.rollout.response_ids.size(1) < final_width  # the prompt is not encoded again
    assert widths[scoring_calls + 1] == final_width  # without the cache: the whole sequence again
    mask = reused.rollout.response_mask
    torch.testing.assert_close(reused.teacher_logits[mask], full.teacher_logits[mask], rtol=1e-5, atol=1e-5)
    assert torch.equal(full.teacher_logits, response_logits(teacher, full.rollout))


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
def test_cut_and_continue_on_the_static_cache_equals_the_dynamic_one(family):
    student = sharpened(build_tiny_model(family, VOCAB, seed=2, n_layer=2))
    teacher = sharpened(build_tiny_model(family, VOCAB, seed=1, n_layer=2))
    seeds = torch.tensor([10, 20, 30])
    rollout = sample(student, *left_padded(PROMPTS, 2), Decoding(EIGHT_TOKENS, **IDS), seeds=seeds)
    config = ScrgConfig(n_corrections=3)
    results = {
        static: revise(student, teacher, rollout, config,
                       Decoding(EIGHT_TOKENS, **IDS, loop=DecodingConfig(static_cache=static)), seeds=seeds)
        for static in (True, False)
    }

    static, dynamic = results[True], results[False]
    assert static.stats["regenerated_tokens"] > 0
    assert static.stats["regenerated_tokens"] == dynamic.stats["regenerated_tokens"]
    assert static.stats["regenerated_tokens"] == pytest.approx(
        static.stats["mean_regenerated_tokens"] * static.stats["corrected_fraction"] * rollout.batch_size)
    assert torch.equal(static.rollout.response_ids, dynamic.rollout.response_ids)
    assert torch.equal(static.rollout.response_mask, dynamic.rollout.response_mask)
    torch.testing.assert_close(static.teacher_logits, dynamic.teacher_logits)


class _CountingForwards(torch.nn.Module):
    """A model wrapper that counts full-rollout forwards (more than one column without a cache)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.scoring_forwards = model, 0

    def forward(self, input_ids, cache=None, **kwargs):
        if cache is None and input_ids.size(1) > 1 and kwargs.get("logits_to_keep", 0) != 1:
            self.scoring_forwards += 1
        return self.model(input_ids=input_ids, cache=cache, **kwargs)


@pytest.mark.parametrize("criterion", ["first_unlikely", "max_teacher_nll"])
def test_a_criterion_that_reads_only_the_teacher_reuses_the_rollout_instead_of_a_student_forward(criterion):
    from mgsr_lightning.generation.decode import DecodeState

    student = _CountingForwards(build_tiny_model("gpt2", 64, seed=1)).eval()
    teacher = build_tiny_model("gpt2", 64, seed=2).eval()
    prompts = Rollout.from_token_lists([[5, 6, 7], [8, 9], [10, 11, 12, 13]], [[], [], []], pad_token_id=PAD)
    decoding = Decoding(EIGHT_TOKENS, **IDS, vocab_size=64)
    seeds = torch.arange(3)
    state = DecodeState()
    rollout = sample(student, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds, state=state)
    assert state.cache is not None and state.token_nll.shape == rollout.response_ids.shape
    config = ScrgConfig(criterion=criterion)

    reused = revise(student, teacher, rollout, config, decoding, seeds=seeds, rollout_state=state)
    assert student.scoring_forwards == 0
    assert reused.stats["corrected_fraction"] > 0
    assert reused.stats["student_nll_before"] == pytest.approx(
        nll_float64(response_logits(student.model, rollout), rollout), abs=1e-5)
    # the same revision as from a scoring forward's cache, and as re-encoding the prefix
    encoded = revise(student, teacher, rollout, dataclasses.replace(config, reuse_cache=False), decoding, seeds=seeds)
    assert torch.equal(reused.rollout.response_ids, encoded.rollout.response_ids)
    torch.testing.assert_close(reused.teacher_logits, encoded.teacher_logits)
