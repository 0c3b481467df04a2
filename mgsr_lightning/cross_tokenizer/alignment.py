"""Aligning two tokenizations of the same texts on their characters: which student tokens and which
teacher tokens spell the same piece of text.

Each fast tokenizer gives every token the characters it covers (``offset_mapping``). A *cut* of one
tokenization is a character position where one token ends and the next begins; the text is cut into
*groups* at the positions where both tokenizations cut, so that each group is a run of consecutive
student tokens and a run of consecutive teacher tokens over the same characters: one token on each
side is a one-to-one group, anything else many-to-many. Groups are numbered 0, 1, ... in text order
per row; the losses take them as :class:`mgsr_lightning.losses.cross_tokenizer.AlignedGroups`.

What counts as a cut, so that the tokenizers' conventions do not matter:

- **Whitespace** is no character of its own: a token's end is the end of its last non-whitespace
  character. Byte-level BPE's leading-space tokens (``Ġworld``, offsets with or without the space),
  SentencePiece's ``▁world`` and WordPiece's tokens (which cover no space at all) then cut at the same
  places. A token of whitespace only (``Ġ``, ``\\n\\n``) joins the group of the next token on its side;
  trailing whitespace tokens form a last group when both sides have some, and are left out otherwise.
  Where both sides cut at the very same character inside a group (whitespace tokens alike on both
  sides: ``Ġ`` + ``Ca`` against ``Ġ`` + ``Ca``), the group is split there, so identical tokenizations
  align one to one.
- **Characters split across tokens** (byte-level BPE's pieces of a multi-byte character, SentencePiece's
  byte-fallback tokens ``<0xE2><0x82><0xAC>``) give several tokens the same character offsets. A token
  whose successor starts before its end (they overlap) is no cut: the pieces stay in one group (even
  with one tokenizer on both sides: character offsets cannot tell two ways of splitting a character's
  bytes apart).
- **Special tokens** (the tokenizer's own, BOS/EOS/pad, whether added by its template or written in the
  text) and **padding** belong to no group (−1).
- **Truncation** (``max_length``, counted in tokens of each side) is applied after aligning the full
  texts, and a group with a token beyond the cut on either side is dropped (its tokens on both sides
  get −1): a partial group never pairs with a complete one.

Only fast tokenizers give offsets: a slow (Python) tokenizer gets a :class:`ConfigError`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mgsr_lightning.errors import ConfigError
from mgsr_lightning.losses.cross_tokenizer import AlignedGroups

# (start, end) character offsets of a token, or None for a token that is aligned to nothing (special)
Span = tuple[int, int] | None


@dataclass(frozen=True)
class SideTokens:
    """One side's tokens of a batch of texts, before padding: per row the ids and each token's span."""

    ids: list[list[int]]
    spans: list[list[Span]]


@dataclass(frozen=True)
class TokenizedSide:
    """One side of a :class:`TextAlignment`, right-padded.

    input_ids [B, T] long (``pad_token_id`` after each row's end), attention_mask [B, T] bool,
    groups [B, T] long (the group of each token, −1 for special and padding tokens and for dropped
    groups), offsets [B, T, 2] long (each token's characters in its text; (0, 0) for special and padding).
    """

    input_ids: Tensor
    attention_mask: Tensor
    groups: Tensor
    offsets: Tensor


@dataclass(frozen=True)
class TextAlignment:
    """Both tokenizations of a batch of texts and their groups.

    group_mask [B, G] bool: the complete groups (present on both sides, not cut by truncation).
    one_to_one [B, G] bool: the complete groups of exactly one token on each side.
    group_spans [B, G, 2] long: the characters ``[start, end)`` of each group in its text (from the
    previous common cut to this one, so a group's leading whitespace is in it); (0, 0) past a row's groups.
    """

    student: TokenizedSide
    teacher: TokenizedSide
    group_mask: Tensor
    one_to_one: Tensor
    group_spans: Tensor

    def aligned_groups(self) -> AlignedGroups:
        """The tensors the cross-tokenizer losses take."""
        return AlignedGroups(
            student_ids=self.student.input_ids,
            student_groups=self.student.groups,
            teacher_ids=self.teacher.input_ids,
            teacher_groups=self.teacher.groups,
            group_mask=self.group_mask,
        )


def require_offsets(tokenizer, side: str) -> None:
    """Raise a one-line :class:`ConfigError` unless ``tokenizer`` is a fast tokenizer (one that gives offsets)."""
    if not getattr(tokenizer, "is_fast", False):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"the {side} tokenizer {name!r} ({type(tokenizer).__name__}) is not a fast tokenizer: distilling across "
            "tokenizers aligns tokens on the characters they cover, which only fast (Rust) tokenizers report; "
            "load it with use_fast=True or convert it to a tokenizer.json"
        )


def tokenize_with_spans(tokenizer, texts: Sequence[str], *, add_special_tokens: bool = False,
                        side: str = "student") -> SideTokens:
    """Tokenise ``texts`` with ``tokenizer`` (no truncation, no padding) and keep each token's characters;
    special tokens get the span None."""
    require_offsets(tokenizer, side)
    encoded = tokenizer(list(texts), add_special_tokens=add_special_tokens, return_offsets_mapping=True,
                        return_special_tokens_mask=True)
    special_ids = set(tokenizer.all_special_ids)
    spans = [
        [None if is_special or token_id in special_ids else (int(start), int(end))
         for token_id, (start, end), is_special in zip(ids, offsets, specials)]
        for ids, offsets, specials in zip(encoded["input_ids"], encoded["offset_mapping"],
                                          encoded["special_tokens_mask"])
    ]
    return SideTokens(ids=[list(ids) for ids in encoded["input_ids"]], spans=spans)


def align_texts(texts: Sequence[str], student_tokenizer, teacher_tokenizer, *, add_special_tokens: bool = False,
                max_length: int | None = None) -> TextAlignment:
    """Tokenise ``texts`` with both tokenizers and align them (module docstring).

    ``add_special_tokens`` lets each tokenizer add its own (BOS, EOS, ...): they are in ``input_ids``
    and in no group. ``max_length`` truncates each side to that many tokens, dropping cut groups.
    """
    student = tokenize_with_spans(student_tokenizer, texts, add_special_tokens=add_special_tokens, side="student")
    teacher = tokenize_with_spans(teacher_tokenizer, texts, add_special_tokens=add_special_tokens, side="teacher")
    return align_tokens(texts, student, teacher, student_pad_id=pad_token_id_of(student_tokenizer),
                        teacher_pad_id=pad_token_id_of(teacher_tokenizer), max_length=max_length)


def align_tokens(texts: Sequence[str], student: SideTokens, teacher: SideTokens, *, student_pad_id: int,
                 teacher_pad_id: int, max_length: int | None = None) -> TextAlignment:
    """Align tokens already tokenised (``tokenize_with_spans``, or pieces put together by the caller with
    their spans in the same text), truncate each side to ``max_length`` and pad: the batched alignment."""
    if not (len(texts) == len(student.ids) == len(teacher.ids)):
        raise ValueError(f"{len(texts)} texts, {len(student.ids)} student rows and {len(teacher.ids)} teacher rows")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be a positive number of tokens or None, got {max_length}")
    rows = []
    for text, student_spans, teacher_spans in zip(texts, student.spans, teacher.spans):
        student_groups, teacher_groups, cuts = align_spans(text, student_spans, teacher_spans)
        rows.append(_truncate(student_groups, teacher_groups, cuts, max_length))
    batch = len(texts)
    num_groups = max((len(cuts) for _, _, cuts in rows), default=0)
    mask_rows, one_to_one_rows, span_rows = [], [], []
    for student_groups, teacher_groups, cuts in rows:
        student_sizes, teacher_sizes = _group_sizes(student_groups, len(cuts)), _group_sizes(teacher_groups, len(cuts))
        padding = num_groups - len(cuts)
        mask_rows.append([s > 0 and t > 0 for s, t in zip(student_sizes, teacher_sizes)] + [False] * padding)
        one_to_one_rows.append([s == 1 and t == 1 for s, t in zip(student_sizes, teacher_sizes)] + [False] * padding)
        span_rows.append([list(cut) for cut in cuts] + [[0, 0]] * padding)
    group_mask = torch.tensor(mask_rows, dtype=torch.bool).view(batch, num_groups)
    one_to_one = torch.tensor(one_to_one_rows, dtype=torch.bool).view(batch, num_groups)
    group_spans = torch.tensor(span_rows, dtype=torch.long).view(batch, num_groups, 2)
    return TextAlignment(
        student=_pad_side(student, [r[0] for r in rows], student_pad_id, max_length),
        teacher=_pad_side(teacher, [r[1] for r in rows], teacher_pad_id, max_length),
        group_mask=group_mask,
        one_to_one=one_to_one,
        group_spans=group_spans,
    )


def align_spans(text: str, student_spans: Sequence[Span], teacher_spans: Sequence[Span]
                ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """One row: the group of each student and each teacher token (−1 for none) and each group's
    characters ``[start, end)``, in text order."""
    content_end = _content_ends(text)
    student_ends, teacher_ends = _token_ends(content_end, student_spans), _token_ends(content_end, teacher_spans)
    common = sorted(_cuts(student_spans, student_ends) & _cuts(teacher_spans, teacher_ends))
    student_groups = _assign(student_spans, student_ends, common)
    teacher_groups = _assign(teacher_spans, teacher_ends, common)
    # a tail past the last common cut (trailing whitespace) is a group only when both sides have tokens in it
    tail = len(common)
    if tail in student_groups and tail in teacher_groups:
        common.append(len(text))
    else:
        student_groups = [-1 if g == tail else g for g in student_groups]
        teacher_groups = [-1 if g == tail else g for g in teacher_groups]
    return _split_at_shared_raw_cuts(student_spans, student_groups, teacher_spans, teacher_groups, common)


def _split_at_shared_raw_cuts(student_spans: Sequence[Span], student_groups: list[int], teacher_spans: Sequence[Span],
                              teacher_groups: list[int], common: list[int]
                              ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Split groups where both sides cut at the same character inside them, whitespace included (both
    ``Ġ`` + ``Ca`` against ``Ġ`` + ``Ca``: two one-to-one groups, not one group of two), and renumber.
    A cut is a position that no token of the side overlaps."""
    student_raw, teacher_raw = _raw_cuts(student_spans, student_groups), _raw_cuts(teacher_spans, teacher_groups)
    starts = [0, *common[:-1]]
    first_of_group, inner_cuts = [], []  # per old group: its first new number, its inner common cuts
    spans: list[tuple[int, int]] = []
    for group, (start, end) in enumerate(zip(starts, common)):
        inner = sorted(p for p in student_raw.get(group, set()) & teacher_raw.get(group, set()) if start < p < end)
        bounds = [start, *inner, end]
        first_of_group.append(len(spans))
        inner_cuts.append(inner)
        spans.extend(zip(bounds[:-1], bounds[1:]))

    def renumber(side_spans: Sequence[Span], side_groups: list[int]) -> list[int]:
        return [g if g < 0 else first_of_group[g] + bisect.bisect_right(inner_cuts[g], side_spans[i][0])
                for i, g in enumerate(side_groups)]

    return renumber(student_spans, student_groups), renumber(teacher_spans, teacher_groups), spans


def _raw_cuts(spans: Sequence[Span], groups: list[int]) -> dict[int, set[int]]:
    """Per group, the raw character positions between two of its consecutive tokens that no token overlaps."""
    cuts: dict[int, set[int]] = {}
    members = [(g, span) for g, span in zip(groups, spans) if g >= 0]
    reach = -1  # the furthest end so far in the group
    for (group, span), (next_group, next_span) in zip(members, members[1:]):
        reach = max(reach, span[1])
        if group == next_group and next_span[0] >= reach:
            cuts.setdefault(group, set()).add(reach)
        if group != next_group:
            reach = -1
    return cuts


def _token_ends(content_end: list[int], spans: Sequence[Span]) -> list[int | None]:
    """Per token, the end of its last non-whitespace character (None: special, or whitespace only), made
    non-decreasing along the row; ``content_end`` is the text's ``_content_ends``."""
    ends: list[int | None] = []
    highest = 0
    for span in spans:
        end = None if span is None else content_end[min(span[1], len(content_end) - 1)]
        if end is None or end <= span[0]:
            ends.append(None)
            continue
        highest = max(highest, end)
        ends.append(highest)
    return ends


def _content_ends(text: str) -> list[int]:
    """For each position p (0..len), the end of the last non-whitespace character before p (0 if none)."""
    ends = [0] * (len(text) + 1)
    for position, character in enumerate(text, start=1):
        ends[position] = ends[position - 1] if character.isspace() else position
    return ends


def _cuts(spans: Sequence[Span], ends: Sequence[int | None]) -> set[int]:
    """The positions where this tokenization cuts: the end of each content token that the next token does
    not overlap (the next token with a span; the row's last content token always cuts)."""
    cuts = set()
    following_start = None  # start of the next token with a span, scanning backwards
    for span, end in zip(reversed(spans), reversed(ends)):
        if end is not None and (following_start is None or following_start >= end):
            cuts.add(end)
        if span is not None:
            following_start = span[0]
    return cuts


def _assign(spans: Sequence[Span], ends: Sequence[int | None], common: list[int]) -> list[int]:
    """Group of each token: the first common cut at or after its end; whitespace-only tokens take the group
    of the next content token (the tail group ``len(common)`` when there is none); special tokens −1."""
    groups = [-1] * len(spans)
    pending = []  # whitespace-only tokens waiting for the next content token
    for index, (span, end) in enumerate(zip(spans, ends)):
        if span is None:
            continue
        if end is None:
            pending.append(index)
            continue
        group = bisect.bisect_left(common, end)
        for waiting in pending:
            groups[waiting] = group
        pending.clear()
        groups[index] = group
    for waiting in pending:
        groups[waiting] = len(common)
    return groups


def _truncate(student_groups: list[int], teacher_groups: list[int], cuts: list[tuple[int, int]],
              max_length: int | None) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Keep each side's first ``max_length`` tokens; a group with a token past the cut on either side goes."""
    if max_length is None:
        return student_groups, teacher_groups, cuts
    cut_groups = set(student_groups[max_length:]) | set(teacher_groups[max_length:])
    kept_student = [-1 if g in cut_groups else g for g in student_groups[:max_length]]
    kept_teacher = [-1 if g in cut_groups else g for g in teacher_groups[:max_length]]
    last = max([*kept_student, *kept_teacher, -1])
    return kept_student, kept_teacher, cuts[: last + 1]


def _group_sizes(groups: list[int], num_groups: int) -> list[int]:
    sizes = [0] * num_groups
    for group in groups:
        if group >= 0:
            sizes[group] += 1
    return sizes


def _pad_side(side: SideTokens, groups: list[list[int]], pad_id: int, max_length: int | None) -> TokenizedSide:
    ids = [row[:max_length] if max_length is not None else row for row in side.ids]
    length = max((len(row) for row in ids), default=0)
    batch = len(ids)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(batch, length, dtype=torch.bool)
    group_ids = torch.full((batch, length), -1, dtype=torch.long)
    offsets = torch.zeros(batch, length, 2, dtype=torch.long)
    for row, (row_ids, row_groups, row_spans) in enumerate(zip(ids, groups, side.spans)):
        n = len(row_ids)
        input_ids[row, :n] = torch.tensor(row_ids, dtype=torch.long)
        attention_mask[row, :n] = True
        group_ids[row, :n] = torch.tensor(row_groups, dtype=torch.long)
        offsets[row, :n] = torch.tensor([span or (0, 0) for span in row_spans[:n]], dtype=torch.long).view(n, 2)
    return TokenizedSide(input_ids=input_ids, attention_mask=attention_mask, groups=group_ids, offsets=offsets)


def pad_token_id_of(tokenizer) -> int:
    """The id that pads ``tokenizer``'s rows: its pad token, else its EOS, else 0."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0
