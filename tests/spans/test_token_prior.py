"""Span priors on hand-written sentences (byte-level BPE and SentencePiece-style vocabularies),
and hand-built vocabularies for each boundary rule."""

from __future__ import annotations

import pytest
import torch
from tokenizers import SentencePieceBPETokenizer, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mgsr_lightning.spans.token_prior import TokenSpanPrior, token_texts

# (sentence, its spans written by hand from the rule in mgsr_lightning/spans/token_prior.py)
SENTENCES = [
    (
        "She walked to the old house on the hill, and the children ran after her in the rain.",
        ["She walked", "to the old house", "on the hill", "the children ran", "after her", "in the rain"],
    ),
    ("The capital of France is Paris.", ["The capital", "of France", "is Paris"]),
    (
        "In the morning, we went to the market with our friends, but it was closed because of the holiday.",
        ["In the morning", "we went", "to the market", "with our friends", "it was closed", "of the holiday"],
    ),
    ("The quick brown fox jumps over the lazy dog.", ["The quick brown fox jumps", "over the lazy dog"]),
]


TEMPLATE = "### Instruction:\nReverse the word apple.\n\n### Response:\nelppa"
TEXTS = [sentence for sentence, _ in SENTENCES] + [
    TEMPLATE, "A small model learns from a large model by matching its next-token distribution."
]


def span_texts(tokenizer, prior, text: str) -> list[str]:
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    spans = prior(ids)[0]
    return [tokenizer.decode(ids[0][spans == span].tolist()).strip() for span in spans.unique().tolist() if span >= 0]


@pytest.fixture(scope="module")
def sentencepiece_tokenizer():
    """A SentencePiece-style BPE ("▁" marks a word start) trained on the test texts; punctuation is
    split off as in Llama's vocabulary (a token mixing letters and punctuation, such as "g,", would
    keep its punctuation inside the span)."""
    model = SentencePieceBPETokenizer(unk_token="<unk>")
    model.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
    model.train_from_iterator(TEXTS * 20, vocab_size=300, special_tokens=["</s>", "<pad>", "<unk>"],
                              show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=model, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


@pytest.mark.parametrize(("sentence", "expected"), SENTENCES, ids=[s[:20] for s, _ in SENTENCES])
def test_byte_level_sentences(sentence, expected, tiny_tokenizer):
    # this small BPE spells many function words with several tokens ("Ġa" "fter", "Ġ" "on"): they still count
    assert span_texts(tiny_tokenizer, TokenSpanPrior.from_tokenizer(tiny_tokenizer), sentence) == expected


@pytest.mark.parametrize(("sentence", "expected"), SENTENCES, ids=[s[:20] for s, _ in SENTENCES])
def test_sentencepiece_sentences(sentence, expected, sentencepiece_tokenizer):
    pieces = sentencepiece_tokenizer.convert_ids_to_tokens(sentencepiece_tokenizer(sentence)["input_ids"])
    assert pieces[1].startswith("▁") and not any(piece.startswith("Ġ") for piece in pieces)
    prior = TokenSpanPrior.from_tokenizer(sentencepiece_tokenizer)
    assert span_texts(sentencepiece_tokenizer, prior, sentence) == expected


def test_instruction_template_newlines_and_markup_are_boundaries(tiny_tokenizer):
    assert span_texts(tiny_tokenizer, TokenSpanPrior.from_tokenizer(tiny_tokenizer), TEMPLATE) == [
        "Instruction", "Reverse", "the word apple", "elppa",
    ]


# A hand-built byte-level vocabulary: 0 is special, "Ġ" is a bare space, "on" is glued to it.
VOCAB = ["<s>", "Ġred", "Ġthe", "r", "mal", "Ġhouse", "Ġin", ",", "Ċ", "Ġ", "on", "Ġand"]
RED, THE, R, MAL, HOUSE, IN, COMMA, NEWLINE, SPACE, ON, AND = range(1, 12)


@pytest.fixture
def hand_prior():
    return TokenSpanPrior(token_texts(VOCAB, "byte_level"), special_ids=[0],
                          encode=lambda text: {" on": [SPACE, ON]}.get(text, []))


def spans_of(prior, ids, mask=None):
    return prior(torch.tensor([ids]), None if mask is None else torch.tensor([mask])).tolist()[0]


def same_groups(spans: list[int]) -> list[int]:
    """Span ids renamed 0, 1, ... in order of appearance (-1 kept), to compare with hand-written groups."""
    names: dict[int, int] = {}
    return [-1 if s < 0 else names.setdefault(s, len(names)) for s in spans]


@pytest.mark.parametrize(
    ("ids", "groups"),
    [
        ([RED, THE, R, MAL], [0, 0, 0, 0]),  # "the"+"r"+"mal" is "thermal", not the determiner
        ([RED, THE, HOUSE], [-1, 0, 0]),  # a determiner opens a span; "red" alone is too short
        ([THE, HOUSE, IN, THE, HOUSE], [0, 0, 1, 1, 1]),  # a preposition opens a span, "in the" stays together
        ([THE, HOUSE, COMMA, RED, HOUSE], [0, 0, -1, 1, 1]),  # punctuation
        ([THE, HOUSE, NEWLINE, RED, HOUSE], [0, 0, -1, 1, 1]),  # newline
        ([THE, HOUSE, 0, RED, HOUSE], [0, 0, -1, 1, 1]),  # special token
        ([THE, HOUSE, 99, RED, HOUSE], [0, 0, -1, 1, 1]),  # id beyond the table (padded vocabulary)
        ([THE, HOUSE, AND, RED, HOUSE], [0, 0, -1, 1, 1]),  # conjunction
        ([RED, HOUSE, SPACE, ON, THE, HOUSE], [0, 0, 1, 1, 1, 1]),  # " on" spelled "Ġ" "on" opens a span at the space
    ],
)
def test_boundary_and_opening_rules(ids, groups, hand_prior):
    assert same_groups(spans_of(hand_prior, ids)) == groups


def test_int32_ids_give_the_same_spans(hand_prior):
    ids = torch.tensor([[RED, HOUSE, SPACE, ON, THE, HOUSE, COMMA, THE, R, MAL]])
    torch.testing.assert_close(hand_prior(ids.int()), hand_prior(ids))


def test_multi_token_function_words_need_the_tokenizers_encoding():
    # without encode only single-token spellings are known: " on" is then a content word, and "the"
    # opens the span instead of "on" ([red house on] [the house] rather than [red house] [on the house])
    prior = TokenSpanPrior(token_texts(VOCAB, "byte_level"), special_ids=[0])
    assert same_groups(spans_of(prior, [RED, HOUSE, SPACE, ON, THE, HOUSE])) == [0, 0, 0, 0, 1, 1]


def test_mask_and_batching(tiny_tokenizer):
    prior = TokenSpanPrior.from_tokenizer(tiny_tokenizer)
    prompt = tiny_tokenizer("### Response:\n")["input_ids"]
    responses = [tiny_tokenizer(text)["input_ids"]
                 for text in ("She walked to the old house.", "The capital of France is Paris.")]
    length = len(prompt) + max(map(len, responses)) + 2
    ids = torch.full((2, length), tiny_tokenizer.pad_token_id)
    mask = torch.zeros(2, length, dtype=torch.bool)
    for row, response in enumerate(responses):
        ids[row, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        mask[row, len(prompt) : len(prompt) + len(response)] = True
    spans = prior(ids, mask)
    assert spans.dtype == torch.long and spans.shape == ids.shape
    assert (spans[~mask] == -1).all()
    for row, response in enumerate(responses):  # the batch gives each row what it gives alone
        alone = prior(torch.tensor([response]))[0]
        assert same_groups(spans[row, mask[row]].tolist()) == same_groups(alone.tolist())


@pytest.mark.parametrize("sentence", TEXTS)
def test_span_ids_are_unique_contiguous_and_at_least_two_tokens(sentence, tiny_tokenizer):
    spans = TokenSpanPrior.from_tokenizer(tiny_tokenizer)(torch.tensor([tiny_tokenizer(sentence)["input_ids"]]))[0]
    for span in spans.unique().tolist():
        if span < 0:
            continue
        positions = (spans == span).nonzero().squeeze(1)
        assert len(positions) >= 2
        assert (positions.diff() == 1).all()


def test_token_texts_decode_both_schemes():
    assert token_texts(["Ġthe", "Ċ", "Ġ", "Ã©t", "the"], "byte_level") == [" the", "\n", " ", "ét", "the"]
    assert token_texts(["▁the", "<0x0A>", "▁", "the", None], "sentencepiece") == [" the", "\n", " ", "the", ""]
    assert token_texts(["Ġthe", "Ġa", "b"])[0] == " the"  # auto: byte-level
    assert token_texts(["▁the", "▁a", "Ġ"])[0] == " the"  # auto: SentencePiece
    with pytest.raises(ValueError, match="word-start marker"):
        token_texts(["the", "a"])
