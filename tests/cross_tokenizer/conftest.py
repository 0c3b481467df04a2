"""Small tokenizers trained here with the ``tokenizers`` package, wrapped as fast Hugging Face tokenizers:
two byte-level BPEs of different sizes (so different merges) and a SentencePiece-style BPE with byte
fallback. Each trains in milliseconds on the corpus below."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from mgsr_lightning.models.tokenizer import train_bpe_tokenizer

CORPUS = [
    "Hello world, the capital of France is Paris.",
    "The answer is 42. Das Café kostet 5 euros heute.",
    "a  b   c\n\nnew line",
    "naive resume, the quick brown fox jumps over the lazy dog.",
] * 20


def byte_level_bpe(vocab_size: int) -> PreTrainedTokenizerFast:
    """GPT-2-style, the project's own (``prepare``'s) tokenizer trainer."""
    return train_bpe_tokenizer(CORPUS, vocab_size)


def sentencepiece_bpe(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """LLaMA-2 style: ``▁`` for spaces, characters outside the vocabulary as ``<0xAB>`` byte tokens, and a
    template that adds ``<s>`` in front."""
    tokenizer = Tokenizer(models.BPE(byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>", *byte_tokens],
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", tokenizer.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.fixture(scope="session")
def small_bpe() -> PreTrainedTokenizerFast:
    return byte_level_bpe(300)


@pytest.fixture(scope="session")
def large_bpe() -> PreTrainedTokenizerFast:
    return byte_level_bpe(420)


@pytest.fixture(scope="session")
def sentencepiece() -> PreTrainedTokenizerFast:
    return sentencepiece_bpe()
