"""SCRG through text: the teacher's correction, found in its own tokens, lands in the student's response as text."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import build_tiny_model

from mgsr_lightning.batch import Rollout
from mgsr_lightning.cross_tokenizer import align_student_ids, token_surfaces
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.models.tokenizer import train_bpe_tokenizer
from mgsr_lightning.scrg.revise import ScrgConfig
from mgsr_lightning.scrg.through_text import revise_through_text

TEXTS = ["the capital of France is Paris", "reverse the word apple: elppa", "add 12 and 30: the sum is 42"] * 10


@pytest.fixture(scope="module")
def pair():
    student_tokenizer = train_bpe_tokenizer(TEXTS, vocab_size=290)
    teacher_tokenizer = train_bpe_tokenizer(TEXTS[::-1], vocab_size=330)
    student = build_tiny_model("gpt2", len(student_tokenizer), seed=2, n_layer=1, hidden=32)
    teacher = build_tiny_model("gpt2", len(teacher_tokenizer), seed=1, n_layer=2, hidden=48)
    return student_tokenizer, teacher_tokenizer, student, teacher


def _text(surfaces, ids):
    return b"".join(p for p in (surfaces.get(i) for i in ids) if isinstance(p, bytes)).decode("utf-8", "replace")


def test_each_corrected_row_reads_the_teacher_s_prefix_and_token_then_the_student_s_continuation(pair):
    student_tokenizer, teacher_tokenizer, student, teacher = pair
    prompts = ["the capital of", "reverse the word", "add 12 and"]
    student_prompts = student_tokenizer(prompts)["input_ids"]
    teacher_prompts = Rollout.from_token_lists(teacher_tokenizer(prompts)["input_ids"], [[]] * 3,
                                               pad_token_id=teacher_tokenizer.pad_token_id)
    decoding = Decoding(SamplingConfig(max_new_tokens=10), student_tokenizer.eos_token_id,
                        student_tokenizer.pad_token_id, len(student_tokenizer), max_length=40)
    prompt_rollout = Rollout.from_token_lists(student_prompts, [[]] * 3, pad_token_id=student_tokenizer.pad_token_id)
    seeds = torch.tensor([3, 4, 5])
    rollout = sample(student, prompt_rollout.prompt_ids, prompt_rollout.prompt_mask, decoding, seeds=seeds)
    student_surfaces, teacher_surfaces = token_surfaces(student_tokenizer), token_surfaces(teacher_tokenizer)
    revised, stats = revise_through_text(
        student, teacher, rollout, teacher_prompts.prompt_ids, teacher_prompts.prompt_mask,
        ScrgConfig(n_corrections=1, criterion="first_unlikely", unlikely_below=0.5), decoding,
        student_tokenizer=student_tokenizer, teacher_tokenizer=teacher_tokenizer, student_surfaces=student_surfaces,
        teacher_surfaces=teacher_surfaces, teacher_vocab_size=len(teacher_tokenizer), seeds=seeds,
    )
    # the reference: the teacher's first token below p = 0.5 where its argmax differs, in plain loops
    _, responses = rollout.to_token_lists()
    _, alignment = align_student_ids(responses, student_surfaces, teacher_tokenizer,
                                     student_eos_id=student_tokenizer.eos_token_id,
                                     student_pad_id=student_tokenizer.pad_token_id)
    teacher_rollout = Rollout(teacher_prompts.prompt_ids, teacher_prompts.prompt_mask, alignment.teacher.input_ids,
                              alignment.teacher.attention_mask)
    with torch.no_grad():
        log_probs = response_logits(teacher, teacher_rollout, len(teacher_tokenizer)).log_softmax(-1)
    _, revised_responses = revised.to_token_lists()
    corrected = 0
    for row in range(3):
        ids = alignment.teacher.input_ids[row][alignment.teacher.attention_mask[row]].tolist()
        error = next((j for j, token in enumerate(ids) if log_probs[row, j, token] < math.log(0.5)
                      and int(log_probs[row, j].argmax()) != token), None)
        if error is None:
            assert revised_responses[row] == responses[row]
            continue
        correction = int(log_probs[row, error].argmax())
        expected = _text(teacher_surfaces, ids[:error]) + _text(teacher_surfaces, [correction])
        assert _text(student_surfaces, revised_responses[row]).startswith(expected)
        corrected += 1
    assert corrected > 0 and stats["corrected_fraction"] == pytest.approx(corrected / 3)
    assert revised.prompt_ids.equal(rollout.prompt_ids)
