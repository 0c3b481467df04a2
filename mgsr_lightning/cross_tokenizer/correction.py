"""SCRG through text: the teacher's correction of a student response, carried over to the student's tokens.

Across tokenizers the teacher scores the student's response in its own tokens
(:func:`mgsr_lightning.cross_tokenizer.retokenize.align_student_ids`), finds the error at one of *its*
positions ``j`` and would write its token ``c`` there. The revised response is the text of the teacher's
tokens before ``j`` followed by the text of ``c``. On the student's side that is: the longest run of the
student's first tokens that spells a prefix of it (kept as they were sampled, with their KV cache), then
the rest of the revised text re-tokenised by the student's tokenizer, from which the student continues
generating. Everything is counted in bytes (the vocabularies' surfaces), so a correction that lands
inside a many-to-many group keeps the group's first characters as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TextCorrection:
    """The student's side of one correction: keep its first ``keep`` response tokens, then append the
    student tokenizer's tokens of ``text`` (then its EOS when ``ends``: the teacher's correction was its EOS)."""

    keep: int
    text: str
    ends: bool


def correction_through_text(student_surfaces: dict, student_ids: Sequence[int], teacher_surfaces: dict,
                            teacher_ids: Sequence[int], error_position: int, correction_id: int
                            ) -> TextCorrection | None:
    """The correction (module docstring) of one row: ``student_ids`` and ``teacher_ids`` are the two
    tokenizations of the same response (without padding), ``error_position`` a position of ``teacher_ids``,
    ``correction_id`` the teacher's token for it. None when the revised text would end inside a character
    (the teacher's token is part of a multi-byte character), which text cannot carry.
    """
    prefix = b"".join(_bytes(teacher_surfaces, token_id) for token_id in teacher_ids[:error_position])
    correction = teacher_surfaces.get(correction_id)
    ends = not isinstance(correction, bytes)  # a special token: with the vocabulary map's pairing, the EOS
    revised = prefix + (b"" if ends else correction)
    keep, kept_bytes = 0, 0
    for token_id in student_ids:
        piece = student_surfaces.get(token_id)
        if not isinstance(piece, bytes) or kept_bytes + len(piece) > len(prefix):
            break
        if revised[kept_bytes:kept_bytes + len(piece)] != piece:
            break
        kept_bytes += len(piece)
        keep += 1
    try:
        text = revised[kept_bytes:].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return TextCorrection(keep=keep, text=text, ends=ends)


def _bytes(surfaces: dict, token_id: int) -> bytes:
    piece = surfaces.get(token_id)
    return piece if isinstance(piece, bytes) else b""
