"""The optional text chunker span prior: character ranges mapped back to tokens, and spaCy's phrases."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from mgsr_lightning.spans.text_prior import TextChunkSpanPrior, phrase_ranges, spacy_chunker


def test_text_chunker_maps_character_ranges_back_to_tokens(tiny_tokenizer):
    text = "the old house on the hill"

    def chunk_text(decoded: str) -> list[tuple[int, int]]:
        assert decoded == text
        return [(0, 13), (14, 25)]  # "the old house", "on the hill"

    prior = TextChunkSpanPrior.from_tokenizer(tiny_tokenizer, chunk_text)
    ids = tiny_tokenizer(text)["input_ids"]
    padded = torch.tensor([[1, *ids, 1]])
    mask = torch.tensor([[False, *[True] * len(ids), False]])
    spans = prior(padded, mask)[0]
    groups = [tiny_tokenizer.decode(padded[0][spans == span].tolist()).strip()
              for span in spans.unique().tolist() if span >= 0]
    assert groups == ["the old house", "on the hill"]
    assert spans[0] == -1 and spans[-1] == -1


def test_spacy_chunker_says_what_to_install_when_spacy_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    with pytest.raises(ImportError, match="TokenSpanPrior"):
        spacy_chunker()


def test_phrase_ranges_from_a_parsed_doc():
    # "she walked to the old house": a stand-in for a spaCy Doc, with its attributes as spaCy sets them
    words = [("she", "PRON"), ("walked", "VERB"), ("to", "ADP"), ("the", "DET"), ("old", "ADJ"), ("house", "NOUN")]
    tokens, offset = [], 0
    for i, (word, pos) in enumerate(words):
        tokens.append(SimpleNamespace(i=i, text=word, pos_=pos, idx=offset))
        offset += len(word) + 1

    class Doc(list):
        noun_chunks = [SimpleNamespace(start=0, end_char=3), SimpleNamespace(start=3, end_char=offset - 1)]

    assert phrase_ranges(Doc(tokens)) == [(0, 3), (4, 10), (11, 27)]  # she | walked | to the old house
