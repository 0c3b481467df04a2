"""The alignment of two tokenizations on the text: hand-made spans with known groups, then tokenizers
trained here (byte-level BPEs of two sizes, a SentencePiece-style BPE with byte fallback)."""

from __future__ import annotations

import pytest
import torch
from transformers import ByT5Tokenizer

from mgsr_lightning.cross_tokenizer import (
    SideTokens,
    align_spans,
    align_texts,
    align_tokens,
    shared_vocabulary,
    token_surfaces,
)
from mgsr_lightning.errors import ConfigError, user_message


def test_groups_where_both_cut():
    student, teacher, cuts = align_spans("Hello world", [(0, 5), (5, 11)], [(0, 3), (3, 5), (5, 11)])
    assert student == [0, 1]
    assert teacher == [0, 0, 1]
    assert cuts == [(0, 5), (5, 11)]


@pytest.mark.parametrize("other", [
    [(0, 3), (3, 7)],  # byte-level BPE, the space in " cat"
    [(0, 3), (4, 7)],  # offsets trimmed of the space, or WordPiece (no token covers it)
    [(0, 4), (4, 7)],  # the space at the end of "the "
])
def test_whitespace_conventions_cut_alike(other):
    student, teacher, cuts = align_spans("the cat", [(0, 3), (3, 7)], other)
    assert student == [0, 1] and teacher == [0, 1]
    assert cuts == [(0, 3), (3, 7)]


def test_whitespace_only_tokens_join_the_next_group():
    # "a", "  ", "b" against "a", " ", " b": the two runs of whitespace differ, so group 1 is many-to-many
    student, teacher, cuts = align_spans("a  b", [(0, 1), (1, 3), (3, 4)], [(0, 1), (1, 2), (2, 4)])
    assert student == [0, 1, 1]
    assert teacher == [0, 1, 1]
    assert cuts == [(0, 1), (1, 4)]


def test_trailing_whitespace_is_a_group_only_on_both_sides():
    assert align_spans("a ", [(0, 1), (1, 2)], [(0, 1), (1, 2)]) == ([0, 1], [0, 1], [(0, 1), (1, 2)])
    assert align_spans("a ", [(0, 1), (1, 2)], [(0, 1)]) == ([0, -1], [0], [(0, 1)])


def test_a_character_split_across_tokens_stays_in_one_group():
    # byte-level pieces of "€" share its character offsets (1, 2)
    pieces = [(0, 1), (1, 2), (1, 2), (2, 3)]
    assert align_spans("x€y", pieces, [(0, 2), (2, 3)])[:2] == ([0, 0, 0, 1], [0, 1])
    # against "€" as one token, the cut after the first piece is no cut
    assert align_spans("x€y", pieces, [(0, 1), (1, 2), (2, 3)])[:2] == ([0, 1, 1, 2], [0, 1, 2])


def test_byte_fallback_tokens_form_one_group():
    # "<0xE2><0x82><0xAC>" against "€"
    assert align_spans("€ok", [(0, 1), (0, 1), (0, 1), (1, 3)], [(0, 1), (1, 3)])[:2] == ([0, 0, 0, 1], [0, 1])


def test_special_tokens_are_in_no_group():
    student, teacher, _ = align_spans("Hello", [None, (0, 5), None], [(0, 5)])
    assert student == [-1, 0, -1] and teacher == [0]


def test_truncation_drops_the_groups_it_cuts_on_either_side():
    text = "Hello world again"
    student = SideTokens(ids=[[11, 12, 13]], spans=[[(0, 5), (5, 11), (11, 17)]])
    teacher = SideTokens(ids=[[21, 22, 23, 24, 25]], spans=[[(0, 3), (3, 5), (5, 8), (8, 11), (11, 17)]])
    alignment = align_tokens([text], student, teacher, student_pad_id=0, teacher_pad_id=0, max_length=3)
    # the teacher keeps "Hel", "lo", " wo": " world" is cut on its side, " again" is lost on its side
    assert alignment.student.groups.tolist() == [[0, -1, -1]]
    assert alignment.teacher.groups.tolist() == [[0, 0, -1]]
    assert alignment.teacher.input_ids.tolist() == [[21, 22, 23]]
    assert alignment.group_mask.tolist() == [[True]]
    assert alignment.one_to_one.tolist() == [[False]]


def test_batch_is_padded_and_groups_numbered_per_row():
    texts = ["ab cd", "ab"]
    student = SideTokens(ids=[[1, 2], [1]], spans=[[(0, 2), (2, 5)], [(0, 2)]])
    teacher = SideTokens(ids=[[5, 6, 7], [5]], spans=[[(0, 2), (2, 4), (4, 5)], [(0, 2)]])
    alignment = align_tokens(texts, student, teacher, student_pad_id=0, teacher_pad_id=9)
    assert alignment.student.input_ids.tolist() == [[1, 2], [1, 0]]
    assert alignment.teacher.input_ids.tolist() == [[5, 6, 7], [5, 9, 9]]
    assert alignment.teacher.attention_mask.tolist() == [[True, True, True], [True, False, False]]
    assert alignment.teacher.groups.tolist() == [[0, 1, 1], [0, -1, -1]]
    assert alignment.group_mask.tolist() == [[True, True], [True, False]]
    assert alignment.one_to_one.tolist() == [[True, False], [True, False]]
    assert alignment.group_spans.tolist() == [[[0, 2], [2, 5]], [[0, 2], [0, 0]]]


TEXTS = [
    "Hello world, the capital of France is Paris.",
    "Das Café kostet 5 € heute. 日本",
    "a  b   c\n\nnew line ",
    "naïve résumé: 42",
]


def _group_bytes(tokenizer, ids, groups, group) -> bytes:
    surfaces = token_surfaces(tokenizer)
    return b"".join(surfaces[i] for i, g in zip(ids, groups) if g == group)


@pytest.mark.parametrize("pair", [("small_bpe", "large_bpe"), ("small_bpe", "sentencepiece"),
                                  ("sentencepiece", "large_bpe")])
def test_groups_spell_the_same_text_on_both_sides(pair, request):
    student_tokenizer, teacher_tokenizer = (request.getfixturevalue(name) for name in pair)
    alignment = align_texts(TEXTS, student_tokenizer, teacher_tokenizer)
    assert alignment.group_mask.any(1).all()
    for row, text in enumerate(TEXTS):
        student_ids, teacher_ids = alignment.student.input_ids[row].tolist(), alignment.teacher.input_ids[row].tolist()
        student_groups, teacher_groups = alignment.student.groups[row].tolist(), alignment.teacher.groups[row].tolist()
        covered = ""
        for group in alignment.group_mask[row].nonzero().flatten().tolist():
            start, end = alignment.group_spans[row, group].tolist()
            spelled = text[start:end].encode()
            for tokenizer, ids, groups in ((student_tokenizer, student_ids, student_groups),
                                           (teacher_tokenizer, teacher_ids, teacher_groups)):
                assert _group_bytes(tokenizer, ids, groups, group).strip() == spelled.strip()
            covered += text[start:end]
        assert covered == text  # with these tokenizers every group is complete
        assert all(g >= 0 for g, m in zip(student_groups, alignment.student.attention_mask[row]) if m)


def test_identical_tokenizers_align_one_to_one_on_single_token_characters(small_bpe):
    alignment = align_texts(TEXTS[:1], small_bpe, small_bpe)
    assert torch.equal(alignment.student.groups, alignment.teacher.groups)
    assert alignment.one_to_one.equal(alignment.group_mask)
    assert alignment.student.groups[0].tolist() == list(range(alignment.student.input_ids.size(1)))


def test_byte_fallback_and_special_tokens_of_a_sentencepiece_teacher(small_bpe, sentencepiece):
    alignment = align_texts(["5 € heute"], small_bpe, sentencepiece, add_special_tokens=True)
    pieces = sentencepiece.convert_ids_to_tokens(alignment.teacher.input_ids[0].tolist())
    groups = alignment.teacher.groups[0].tolist()
    assert pieces[0] == "<s>" and groups[0] == -1 and alignment.teacher.attention_mask[0, 0]
    euro = [groups[pieces.index(byte)] for byte in ("<0xE2>", "<0x82>", "<0xAC>")]
    assert len(set(euro)) == 1 and euro[0] >= 0
    start, end = alignment.group_spans[0, euro[0]].tolist()
    assert "5 € heute"[start:end].strip() == "€"
    assert not alignment.one_to_one[0, euro[0]]


def test_a_slow_tokenizer_gets_one_clear_line(small_bpe):
    with pytest.raises(ConfigError, match="not a fast tokenizer") as error:
        align_texts(["hi"], small_bpe, ByT5Tokenizer())
    message = user_message(error.value)
    assert "teacher" in message and "\n" not in message
    with pytest.raises(ConfigError, match="the student tokenizer .* is not a fast tokenizer"):
        shared_vocabulary(ByT5Tokenizer(), small_bpe)
