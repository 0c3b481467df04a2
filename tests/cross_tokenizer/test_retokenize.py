"""The student's own ids (a rollout) spelled out as text, re-tokenised for the teacher and aligned."""

from __future__ import annotations

import pytest
import torch

from mgsr_lightning.cross_tokenizer import align_texts, token_surfaces
from mgsr_lightning.cross_tokenizer.retokenize import align_student_ids, text_and_spans

TEXTS = ["Das Café kostet 5 € heute. 日本", "The quick brown fox", "a  b\n\nnew line"]


@pytest.mark.parametrize("name", ["small_bpe", "sentencepiece"])
def test_the_spans_of_ids_are_the_fast_tokenizers_offsets(name, request):
    tokenizer = request.getfixturevalue(name)
    surfaces = token_surfaces(tokenizer)
    for text in TEXTS:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spelled, spans = text_and_spans(surfaces, encoded["input_ids"])
        assert spelled == text
        assert spans == [tuple(span) for span in encoded["offset_mapping"]]


def test_half_a_character_is_one_replacement_character(small_bpe):
    surfaces = token_surfaces(small_bpe)
    ids = small_bpe.convert_tokens_to_ids(["â", "a", "<|endoftext|>"])  # byte 0xE2 starts a 3-byte character
    assert text_and_spans(surfaces, ids) == ("\ufffda", [(0, 1), (1, 2), None])


def test_canonical_ids_align_as_the_texts_do_and_the_two_eos_pair(small_bpe, sentencepiece):
    ids = [small_bpe(text, add_special_tokens=False)["input_ids"] + [small_bpe.eos_token_id] for text in TEXTS]
    texts, alignment = align_student_ids(ids, token_surfaces(small_bpe), sentencepiece,
                                         student_eos_id=small_bpe.eos_token_id, student_pad_id=small_bpe.pad_token_id)
    assert texts == TEXTS
    reference = align_texts(TEXTS, small_bpe, sentencepiece)
    groups = reference.group_mask.size(1)
    for row, text in enumerate(TEXTS):
        n_student, n_teacher = len(ids[row]) - 1, int(reference.teacher.attention_mask[row].sum())
        assert alignment.student.groups[row, :n_student].tolist() == reference.student.groups[row, :n_student].tolist()
        assert alignment.teacher.groups[row, :n_teacher].tolist() == reference.teacher.groups[row, :n_teacher].tolist()
        # the EOS of each side: the row's last token, and one group of its own
        assert alignment.student.input_ids[row, n_student] == small_bpe.eos_token_id
        assert alignment.teacher.input_ids[row, n_teacher] == sentencepiece.eos_token_id
        assert alignment.student.groups[row, n_student] == alignment.teacher.groups[row, n_teacher] == groups
        assert alignment.group_spans[row, groups].tolist() == [len(text), len(text)]
    assert alignment.group_mask[:, groups].all() and alignment.one_to_one[:, groups].all()
    assert torch.equal(alignment.group_mask[:, :groups], reference.group_mask)


def test_a_word_sampled_letter_by_letter_aligns_with_the_teachers_word(small_bpe, large_bpe):
    letters = small_bpe.convert_tokens_to_ids(["T", "h", "e", "Ġ", "q", "u", "i", "c", "k"])
    texts, alignment = align_student_ids([letters], token_surfaces(small_bpe), large_bpe, student_eos_id=None,
                                         student_pad_id=0)
    assert texts == ["The quick"]
    teacher_pieces = large_bpe.convert_ids_to_tokens(alignment.teacher.input_ids[0].tolist())
    assert teacher_pieces[0] == "The"
    assert alignment.student.groups[0, :4].tolist() == [0, 0, 0, 1]  # "T" "h" "e" against "The", then " q..."
    assert alignment.teacher.groups[0, 0] == 0 and not alignment.one_to_one[0, 0]
    assert alignment.group_mask.all()
