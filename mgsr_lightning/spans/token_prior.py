"""Span priors: split each training sequence's response into short phrase-like spans (paper.md §4).

The span loss compares adjacent-position distributions inside spans, so a span prior maps token
ids [B, T] (and the response mask) to span ids [B, T]: positions sharing an id ≥ 0 form one span,
-1 is outside any span, only spans of at least 2 tokens get an id, ids are unique within a row.

``TokenSpanPrior`` (the default) is a data-free approximation of NP/VP/PP chunking that works on
token ids, so SCRG-revised sequences need no decoding. It is built once from the tokenizer and runs
vectorised on the device of the ids. Its rule, over words (a word is a token whose text starts with
a space, or follows a boundary, together with the tokens glued to it):

1. Boundaries end spans and belong to none: punctuation-only tokens, tokens containing a newline,
   special tokens, ids outside the table (a padded vocabulary), positions outside the mask, and
   conjunctions ("and", "but", "because", ...).
2. Function words open a new span, so that "in the old house" is a PP-like chunk and "was closed" a
   VP-like one: a preposition opens one unless it follows a preposition ("out of"); a determiner or
   pronoun unless it follows a preposition or determiner ("in the", "after her"); an auxiliary or
   modal unless it follows a determiner/pronoun or auxiliary ("it was", "has been").
3. Every other word continues the current span.

So "She walked to the old house on the hill, and the children ran after her in the rain." gives
[She walked] [to the old house] [on the hill] , and [the children ran] [after her] [in the rain].
Content words are never split from each other ("the quick brown fox jumps" is one span): without a
tagger, noun and verb phrases that touch are not told apart. A function word is recognised when
the word's token ids equal the tokenizer's own encoding of it (up to 3 tokens, with or without the
leading space and capital), so whole words only: "theory" is not "the".

The optional linguistic chunker on decoded text (spaCy) is :mod:`mgsr_lightning.spans.text_prior`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

from mgsr_lightning.spans.text_prior import TextChunkSpanPrior, spacy_chunker
from mgsr_lightning.spans.vocabulary import token_texts

# Word classes (0: any other word).
NONE, PREPOSITION, DETERMINER, AUXILIARY, CONJUNCTION = 0, 1, 2, 3, 4
FUNCTION_WORDS: dict[int, frozenset[str]] = {
    PREPOSITION: frozenset(
        "about above across after against along among around at before behind below beneath beside between beyond by "
        "despite down during except for from in inside into like near of off on onto out outside over past per since "
        "through throughout to toward towards under underneath until up upon via with within without".split()
    ),
    DETERMINER: frozenset(
        "a an the this that these those my your his her its our their some any each every no all both either neither "
        "another such what which whose who whom i you he she it we they me him us them".split()
    ),
    AUXILIARY: frozenset(
        "am is are was were be been being have has had do does did will would shall should can could may might "
        "must".split()
    ),
    CONJUNCTION: frozenset(
        "and or but nor yet so because although though while whereas if unless whether than".split()
    ),
}
# A word of class C opens a new span unless the previous word's class is one of these.
CONTINUES_AFTER: dict[int, tuple[int, ...]] = {
    PREPOSITION: (PREPOSITION,),
    DETERMINER: (PREPOSITION, DETERMINER),
    AUXILIARY: (DETERMINER, AUXILIARY),
}
_ID_BITS = 20  # a function word's ids (up to 3) are packed into one int64 key, 20 bits each
_MAX_WORD_TOKENS = 3


class TokenSpanPrior(nn.Module):
    """Data-free span prior on token ids (rule in the module docstring).

    Holds per-vocabulary flags ``word_start``, ``space`` (whitespace-only, no newline),
    ``punctuation``, ``newline_or_special`` ([V] bool each) and the function-word table
    (``word_keys`` [K] sorted int64 packed id sequences, ``word_classes`` [K]). The buffers are not
    saved in checkpoints and follow the device of the ids.
    """

    def __init__(
        self,
        texts: Sequence[str],
        special_ids: Iterable[int] = (),
        encode: Callable[[str], list[int]] | None = None,
    ):
        """texts: the text of each vocabulary entry (``token_texts``); special_ids: entries that are
        always boundaries; encode: text -> token ids without special tokens (the tokenizer's), used to
        find function words spelled with several tokens; without it only single-token ones count."""
        super().__init__()
        vocab_size = len(texts)
        if vocab_size >= 1 << _ID_BITS:
            raise ValueError(f"vocabularies of up to {1 << _ID_BITS} entries are supported, got {vocab_size}")
        special = torch.zeros(vocab_size, dtype=torch.bool)
        special[[i for i in special_ids if 0 <= i < vocab_size]] = True
        stripped = [text.strip() for text in texts]
        self.vocab_size = vocab_size
        word_start = [text[:1].isspace() for text in texts]
        space = [bool(t) and not s and "\n" not in t for t, s in zip(texts, stripped)]
        # U+FFFD is part of a multi-byte character split across tokens: a letter, not punctuation
        punctuation = [bool(s) and all(not ch.isalnum() and ch != "\ufffd" for ch in s) for s in stripped]
        newline = torch.tensor(["\n" in t or "\r" in t or not t for t in texts], dtype=torch.bool)
        self.register_buffer("word_start", torch.tensor(word_start, dtype=torch.bool), persistent=False)
        self.register_buffer("space", torch.tensor(space, dtype=torch.bool), persistent=False)
        self.register_buffer("punctuation", torch.tensor(punctuation, dtype=torch.bool), persistent=False)
        self.register_buffer("newline_or_special", newline | special, persistent=False)

        entries_of: dict[str, list[int]] = {}
        for i, s in enumerate(stripped):
            entries_of.setdefault(s, []).append(i)
        spellings: dict[tuple[int, ...], int] = {}  # token ids of a function word -> its class
        for word_class, words in FUNCTION_WORDS.items():
            for word in words:
                for variant in (word, word.capitalize()):
                    spellings.update({(i,): word_class for i in entries_of.get(variant, ()) if not special[i]})
                    if encode is not None:
                        for text in (variant, " " + variant):
                            ids = tuple(encode(text))
                            if 0 < len(ids) <= _MAX_WORD_TOKENS:
                                spellings[ids] = word_class
        keys = torch.tensor([_pack(ids) for ids in spellings], dtype=torch.int64)
        keys, order = keys.sort()
        self.register_buffer("word_keys", keys, persistent=False)
        classes = torch.tensor(list(spellings.values()), dtype=torch.int64)[order]
        self.register_buffer("word_classes", classes, persistent=False)

    @classmethod
    def from_tokenizer(cls, tokenizer, scheme: str = "auto") -> TokenSpanPrior:
        """Build the table once from a Hugging Face tokenizer (byte-level BPE or SentencePiece-style)."""
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        return cls(
            token_texts(tokens, scheme),
            special_ids=tokenizer.all_special_ids,
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        )

    def forward(self, token_ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """token_ids [B, T] long, mask [B, T] bool (None: all positions) -> span ids [B, T] long."""
        if self.word_start.device != token_ids.device:
            self.to(token_ids.device)
        in_table = (token_ids >= 0) & (token_ids < self.vocab_size)
        ids = torch.where(in_table, token_ids, 0).long()  # [B, T]; out-of-table ids are boundaries below
        boundary = ~in_table | self.punctuation[ids] | self.newline_or_special[ids]
        if mask is not None:
            boundary |= ~mask
        space = self.space[ids] & ~boundary
        piece = ~boundary & ~space
        # a word begins at a bare space, or at a piece that starts with a space or follows a boundary
        word_begin = space | (piece & (self.word_start[ids] | _shift_right(boundary, True)))
        word = torch.cumsum(word_begin | boundary, dim=1)  # [B, T] index of each token's word, from 1
        word_length = _segment_sizes(word, torch.ones_like(word))  # [B, T] tokens in the token's word

        begin_class = torch.zeros_like(ids)  # class of the function word beginning here, 0 elsewhere
        for length in range(1, _MAX_WORD_TOKENS + 1 if len(self.word_keys) else 1):
            key = _pack_positions(ids, length)  # [B, T] key of ids[t : t + length]
            slot = torch.searchsorted(self.word_keys, key).clamp(max=len(self.word_keys) - 1)
            found = (self.word_keys[slot] == key) & word_begin & (word_length == length)
            begin_class = torch.where(found, self.word_classes[slot], begin_class)
        class_of_word = torch.zeros(ids.size(0), ids.size(1) + 1, dtype=ids.dtype, device=ids.device)
        class_of_word.scatter_add_(1, word, begin_class)  # one non-zero entry per word at most
        current, previous = class_of_word.gather(1, word), class_of_word.gather(1, word - 1)

        boundary |= current == CONJUNCTION
        starts = boundary | _shift_right(boundary, True)
        for word_class, after in CONTINUES_AFTER.items():
            follows = torch.zeros_like(boundary)
            for previous_class in after:
                follows |= previous == previous_class
            starts |= word_begin & (current == word_class) & ~follows
        segment = torch.cumsum(starts, dim=1)  # [B, T], unique per row
        in_span = ~boundary
        span_length = _segment_sizes(segment, in_span.long())
        return torch.where(in_span & (span_length >= 2), segment, -1)


def _pack(ids: Sequence[int]) -> int:
    key = len(ids) << (_ID_BITS * _MAX_WORD_TOKENS)
    for position, token_id in enumerate(ids):
        key |= token_id << (_ID_BITS * position)
    return key


def _pack_positions(ids: Tensor, length: int) -> Tensor:
    """[B, T] int64: ``_pack(ids[b, t : t + length])`` at every position (ids past the row end read 0)."""
    key = torch.full_like(ids, length << (_ID_BITS * _MAX_WORD_TOKENS))
    for position in range(length):
        following = torch.nn.functional.pad(ids[:, position:], (0, position))
        key |= following << (_ID_BITS * position)
    return key


def _shift_right(flags: Tensor, fill: bool) -> Tensor:
    """flags[:, t − 1] at t, ``fill`` at t = 0: [B, T] -> [B, T]."""
    return torch.cat([torch.full_like(flags[:, :1], fill), flags[:, :-1]], dim=1)


def _segment_sizes(segment: Tensor, counts: Tensor) -> Tensor:
    """Per position, the sum of ``counts`` over its segment: segment [B, T] ids in [0, T], -> [B, T]."""
    totals = torch.zeros(segment.size(0), segment.size(1) + 1, dtype=counts.dtype, device=segment.device)
    return totals.scatter_add_(1, segment, counts).gather(1, segment)


def build_span_prior(tokenizer, prior: str = "tokens") -> Callable[[Tensor, Tensor | None], Tensor]:
    """The span prior of ``SpanLoss.prior``: ``tokens`` (``TokenSpanPrior``) or ``spacy`` (``text_spans``)."""
    if prior == "tokens":
        return TokenSpanPrior.from_tokenizer(tokenizer)
    return TextChunkSpanPrior.from_tokenizer(tokenizer, spacy_chunker())
