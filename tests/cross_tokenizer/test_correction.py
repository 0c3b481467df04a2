"""SCRG through text: the teacher's correction at one of its positions, carried to the student's tokens."""

from __future__ import annotations

from mgsr_lightning.cross_tokenizer import token_surfaces
from mgsr_lightning.cross_tokenizer.correction import TextCorrection, correction_through_text

TEXT = "The quick brown fox"


def _ids(tokenizer, text=TEXT):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_student_keeps_the_tokens_before_the_error_and_appends_the_correction(small_bpe, large_bpe):
    student, teacher = _ids(small_bpe), _ids(large_bpe)
    assert large_bpe.convert_ids_to_tokens(teacher) == ["The", "Ġquick", "Ġbrown", "Ġfox"]
    lazy = large_bpe.convert_tokens_to_ids("Ġlazy")
    got = correction_through_text(token_surfaces(small_bpe), student, token_surfaces(large_bpe), teacher, 2, lazy)
    # "The", "Ġ", "q", "u", "ick" spell "The quick": kept as sampled
    assert got == TextCorrection(keep=5, text=" lazy", ends=False)
    got = correction_through_text(token_surfaces(small_bpe), student, token_surfaces(large_bpe), teacher, 1, lazy)
    assert got == TextCorrection(keep=1, text=" lazy", ends=False)


def test_an_error_inside_a_group_keeps_its_first_characters_as_text(small_bpe, large_bpe):
    student, teacher = _ids(large_bpe), _ids(small_bpe)  # the student has " brown" whole, the teacher " b" "r" "o" ...
    position = small_bpe.convert_ids_to_tokens(teacher).index("o")
    correction = small_bpe.convert_tokens_to_ids("a")
    got = correction_through_text(token_surfaces(large_bpe), student, token_surfaces(small_bpe), teacher, position,
                                  correction)
    assert got == TextCorrection(keep=2, text=" bra", ends=False)  # "The" " quick" kept, " br" + "a" re-tokenised


def test_an_eos_correction_ends_the_response(small_bpe, large_bpe):
    student, teacher = _ids(small_bpe), _ids(large_bpe)
    got = correction_through_text(token_surfaces(small_bpe), student, token_surfaces(large_bpe), teacher, 3,
                                  large_bpe.eos_token_id)
    assert got == TextCorrection(keep=10, text="", ends=True)  # "The quick brown": 10 student tokens


def test_a_correction_ending_inside_a_character_is_refused(small_bpe, large_bpe):
    student, teacher = _ids(small_bpe, "5 €"), _ids(large_bpe, "5 €")
    half = large_bpe.convert_tokens_to_ids("â")  # the first byte of "€"
    position = len(teacher) - 1
    assert correction_through_text(token_surfaces(small_bpe), student, token_surfaces(large_bpe), teacher, position,
                                   half) is None
