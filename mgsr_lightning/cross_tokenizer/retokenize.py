"""Text the student produced, re-tokenised for the teacher and aligned: the student's rollouts and SCRG.

The student's sampled ids are not always the tokenization its tokenizer would give their text (a word
sampled as ``H`` + ``ello``), and its loss is on the ids it sampled. So the student's side is never
re-tokenised: each of its tokens gets the characters it spells from its bytes (the vocabulary map's
surfaces), the teacher tokenises the text they spell (with offsets), and the two are aligned as any pair
of tokenizations (:func:`mgsr_lightning.cross_tokenizer.alignment.align_tokens`). When a student row
ends with its EOS, the teacher's row ends with the teacher's, and the two form the row's last group.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from mgsr_lightning.cross_tokenizer.alignment import (
    SideTokens,
    Span,
    TextAlignment,
    TokenizedSide,
    align_tokens,
    pad_token_id_of,
    tokenize_with_spans,
)

_LONE_SURROGATE = re.compile("[\udc80-\udcff]")


def text_and_spans(surfaces: dict, ids: Sequence[int]) -> tuple[str, list[Span]]:
    """The text ``ids`` spell and each token's characters in it; special tokens (surfaces that are not
    bytes) spell nothing and get None. ``surfaces`` is ``token_surfaces(tokenizer)``.

    Bytes are decoded as UTF-8; each byte that is not part of a valid character (a sampled row can hold
    half a character) becomes one U+FFFD. A token holding part of a multi-byte character covers that
    whole character, as fast tokenizers' offsets do.
    """
    pieces = [surfaces.get(token_id) for token_id in ids]
    data = b"".join(piece for piece in pieces if isinstance(piece, bytes))
    characters = data.decode("utf-8", errors="surrogateescape")  # an invalid byte: one lone surrogate
    char_at = []  # the character each byte belongs to
    for index, character in enumerate(characters):
        size = 1 if "\udc80" <= character <= "\udcff" else len(character.encode())
        char_at.extend([index] * size)
    spans: list[Span] = []
    offset = 0
    for piece in pieces:
        if not isinstance(piece, bytes):
            spans.append(None)
            continue
        start, end = offset, offset + len(piece)
        offset = end
        spans.append((char_at[start], char_at[end - 1] + 1) if end > start else (len(characters), len(characters)))
    return _LONE_SURROGATE.sub("\ufffd", characters), spans


def align_student_ids(student_ids: Sequence[Sequence[int]], student_surfaces: dict, teacher_tokenizer, *,
                      student_eos_id: int | None, student_pad_id: int, max_length: int | None = None
                      ) -> tuple[list[str], TextAlignment]:
    """The texts the student's ids spell, and their alignment with the teacher's tokenization of them
    (module docstring). Rows: the student's response ids without padding (its EOS may end them)."""
    texts, spans = zip(*(text_and_spans(student_surfaces, ids) for ids in student_ids)) if student_ids else ((), ())
    tokenized = tokenize_with_spans(teacher_tokenizer, texts, side="teacher")
    teacher_eos = teacher_tokenizer.eos_token_id
    ends_with_eos = [bool(ids) and ids[-1] == student_eos_id for ids in student_ids]
    teacher = SideTokens([[*ids, teacher_eos] if eos else ids for ids, eos in zip(tokenized.ids, ends_with_eos)],
                         [[*row, None] if eos else row for row, eos in zip(tokenized.spans, ends_with_eos)])
    student = SideTokens([list(ids) for ids in student_ids], list(spans))
    alignment = align_tokens(list(texts), student, teacher, student_pad_id=student_pad_id,
                             teacher_pad_id=pad_token_id_of(teacher_tokenizer), max_length=max_length)
    return list(texts), _pair_final_eos(alignment, ends_with_eos, student_eos_id, teacher_eos)


def _pair_final_eos(alignment: TextAlignment, ends_with_eos: list[bool], student_eos_id: int | None,
                    teacher_eos_id: int | None) -> TextAlignment:
    """Give each row's two final EOS tokens one more group, number G (after every row's groups)."""
    if not any(ends_with_eos):
        return alignment
    student, teacher = alignment.student, alignment.teacher
    batch, eos_group = alignment.group_mask.shape
    group_mask = torch.cat([alignment.group_mask, torch.zeros(batch, 1, dtype=torch.bool)], 1)
    one_to_one = torch.cat([alignment.one_to_one, torch.zeros(batch, 1, dtype=torch.bool)], 1)
    group_spans = torch.cat([alignment.group_spans, torch.zeros(batch, 1, 2, dtype=torch.long)], 1)
    student_groups, teacher_groups = student.groups.clone(), teacher.groups.clone()
    for row in (row for row, eos in enumerate(ends_with_eos) if eos):
        student_last = int(student.attention_mask[row].sum()) - 1
        teacher_last = int(teacher.attention_mask[row].sum()) - 1
        if (student_last < 0 or teacher_last < 0 or student.input_ids[row, student_last] != student_eos_id
                or teacher.input_ids[row, teacher_last] != teacher_eos_id):
            continue  # truncated: a side's last token is not its EOS
        student_groups[row, student_last] = teacher_groups[row, teacher_last] = eos_group
        group_mask[row, eos_group] = one_to_one[row, eos_group] = True
        text_end = int(alignment.group_spans[row, :, 1].max()) if eos_group else 0
        group_spans[row, eos_group] = torch.tensor([text_end, text_end])
    return TextAlignment(
        student=TokenizedSide(student.input_ids, student.attention_mask, student_groups, student.offsets),
        teacher=TokenizedSide(teacher.input_ids, teacher.attention_mask, teacher_groups, teacher.offsets),
        group_mask=group_mask, one_to_one=one_to_one, group_spans=group_spans,
    )
