"""Shared fixtures: a locally trained tokenizer and tiny real architectures (GPT-2, OPT, LLaMA).

Everything is built here from configs; nothing touches a hub.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, OPTConfig

from mgsr_lightning.tokenizer import train_bpe_tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
    "### Instruction:\nReverse the word apple.\n\n### Response:\nelppa",
    "### Input:\nred, green, blue\n\n### Response:\nblue, green, red",
    "What is the capital of France? The capital of France is Paris.",
    "Add 12 and 30. The sum is 42. Count the letters in banana: 6.",
    "She walked to the old house on the hill, and the children ran after her in the rain.",
    "Sort these numbers: 9 3 7 1 -> 1 3 7 9. Translate to upper case: hello -> HELLO.",
    "A small model learns from a large model by matching its next-token distribution.",
    "In the morning, we went to the market with our friends, but it was closed because of the holiday.",
]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE (≈400 tokens) trained on ``CORPUS``, saved with ``save_pretrained``."""
    path = tmp_path_factory.mktemp("tokenizer")
    train_bpe_tokenizer(CORPUS * 20, vocab_size=400, save_dir=path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


def tiny_config(family: str, vocab_size: int, n_layer: int = 2, hidden: int = 32, max_positions: int = 128):
    """A tiny config of a real architecture family (``gpt2``, ``opt`` or ``llama``)."""
    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_positions=max_positions, n_embd=hidden, n_layer=n_layer, n_head=2,
            bos_token_id=0, eos_token_id=0, pad_token_id=1,
        )
    if family == "opt":
        return OPTConfig(
            vocab_size=vocab_size, max_position_embeddings=max_positions, hidden_size=hidden,
            num_hidden_layers=n_layer, num_attention_heads=2, ffn_dim=2 * hidden, word_embed_proj_dim=hidden,
            bos_token_id=0, eos_token_id=0, pad_token_id=1,
        )
    if family == "llama":
        return LlamaConfig(
            vocab_size=vocab_size, max_position_embeddings=max_positions, hidden_size=hidden,
            intermediate_size=2 * hidden, num_hidden_layers=n_layer, num_attention_heads=2, num_key_value_heads=1,
            bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False,
        )
    raise ValueError(f"unknown family {family!r}")


def build_tiny_model(family: str, vocab_size: int, seed: int = 0, **kwargs):
    """A randomly initialised tiny causal LM in eval mode, deterministic for a given seed."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size, **kwargs))
    return model.eval()


@pytest.fixture
def tiny_gpt2_pair(tiny_tokenizer):
    """(teacher, student): GPT-2 configs, teacher 2 layers d=64, student 1 layer d=32."""
    vocab = len(tiny_tokenizer)
    teacher = build_tiny_model("gpt2", vocab, seed=1, n_layer=2, hidden=64)
    student = build_tiny_model("gpt2", vocab, seed=2, n_layer=1, hidden=32)
    return teacher, student
