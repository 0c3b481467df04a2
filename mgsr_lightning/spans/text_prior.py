"""A span prior from a linguistic chunker on decoded text (optional; the default is ``token_prior.TokenSpanPrior``).

``TextChunkSpanPrior`` runs a chunker on the decoded text, with ``spacy_chunker`` for spaCy (NP,
PP = preposition + NP, VP = run of verbs/auxiliaries/particles), and maps the character spans back to
token positions; same output as :mod:`mgsr_lightning.spans.token_prior` (span ids [B, T], -1 outside any span,
spans of at least 2 tokens). It needs spaCy and a model installed, runs on the CPU with a Python loop
per row, and raises a clear error when they are missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from mgsr_lightning.spans.vocabulary import token_texts


class TextChunkSpanPrior:
    """Span prior from a chunker on decoded text (optional; e.g. ``spacy_chunker()``).

    Each run of masked positions of a row is decoded piece by piece (the text of token i is
    ``texts[id_i]``, so character offsets map back to positions exactly, with no re-tokenisation);
    ``chunk_text(text)`` returns the phrases as character ranges ``[start, end)``; a token belongs to
    a phrase when its text, leading and trailing whitespace aside, lies inside the range. Same call
    interface as ``TokenSpanPrior``, on the CPU, with a Python loop per row.
    """

    def __init__(self, texts: Sequence[str], chunk_text: Callable[[str], Iterable[tuple[int, int]]]):
        self.texts = list(texts)
        self.chunk_text = chunk_text

    @classmethod
    def from_tokenizer(cls, tokenizer, chunk_text: Callable[[str], Iterable[tuple[int, int]]], scheme: str = "auto"):
        return cls(token_texts(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))), scheme), chunk_text)

    def __call__(self, token_ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """token_ids [B, T] long, mask [B, T] bool (None: all positions) -> span ids [B, T] long."""
        ids = token_ids.tolist()
        keep = mask.tolist() if mask is not None else [[True] * len(row) for row in ids]
        spans = [[-1] * len(row) for row in ids]
        for row, (row_ids, row_keep) in enumerate(zip(ids, keep)):
            next_id = 0
            position = 0
            while position < len(row_ids):
                if not row_keep[position]:
                    position += 1
                    continue
                run_end = position
                while run_end < len(row_ids) and row_keep[run_end]:
                    run_end += 1
                for members in self._phrase_members(row_ids[position:run_end]):
                    if len(members) >= 2:
                        for member in members:
                            spans[row][position + member] = next_id
                        next_id += 1
                position = run_end
        return torch.tensor(spans, dtype=torch.long, device=token_ids.device)

    def _phrase_members(self, run_ids: list[int]) -> list[list[int]]:
        """Token indices (within the run) of each phrase the chunker finds in the run's text."""
        pieces = [self.texts[i] if 0 <= i < len(self.texts) else "" for i in run_ids]
        starts, offset = [], 0
        for piece in pieces:
            starts.append(offset)
            offset += len(piece)
        inner = []  # character range of each token's text without surrounding whitespace
        for start, piece in zip(starts, pieces):
            content = piece.strip()
            lead = len(piece) - len(piece.lstrip()) if content else 0
            inner.append((start + lead, start + lead + len(content) if content else start + len(piece)))
        return [
            [i for i, (a, b) in enumerate(inner) if a >= phrase_start and b <= phrase_end and b > a]
            for phrase_start, phrase_end in self.chunk_text("".join(pieces))
        ]


def spacy_chunker(model: str = "en_core_web_sm") -> Callable[[str], list[tuple[int, int]]]:
    """A ``chunk_text`` for ``TextChunkSpanPrior`` built on spaCy: noun chunks (NP), a preposition
    followed by a noun chunk (PP), and maximal runs of verbs, auxiliaries and particles (VP), as
    non-overlapping character ranges. Raises ``ImportError``/``OSError`` naming the fix when spaCy or
    the model is not installed."""
    try:
        import spacy
    except ImportError as error:
        raise ImportError(
            "spacy_chunker needs spaCy and an English model: `pip install spacy && python -m spacy download "
            f"{model}`. The default span prior, TokenSpanPrior, needs neither."
        ) from error
    try:
        nlp = spacy.load(model, disable=["ner", "lemmatizer"])
    except OSError as error:
        raise OSError(f"spaCy model {model!r} is not installed: `python -m spacy download {model}`") from error

    def chunk_text(text: str) -> list[tuple[int, int]]:
        return phrase_ranges(nlp(text))

    return chunk_text


def phrase_ranges(doc) -> list[tuple[int, int]]:
    """NP/PP/VP character ranges ``[start, end)`` of a parsed spaCy ``Doc``, non-overlapping, in order."""
    phrases = []
    for chunk in doc.noun_chunks:
        first = chunk.start - 1 if chunk.start > 0 and doc[chunk.start - 1].pos_ == "ADP" else chunk.start
        phrases.append((doc[first].idx, chunk.end_char))
    run: list = []
    for token in [*doc, None]:
        if token is not None and token.pos_ in ("AUX", "VERB", "PART"):
            run.append(token)
        elif run:
            phrases.append((run[0].idx, run[-1].idx + len(run[-1].text)))
            run = []
    chosen: list[tuple[int, int]] = []
    for start, end in sorted(phrases, key=lambda phrase: (phrase[0], -phrase[1])):
        if not chosen or start >= chosen[-1][1]:
            chosen.append((start, end))
    return chosen
