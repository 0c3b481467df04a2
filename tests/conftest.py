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
from tiny_models import build_tiny_model

from mgsr_lightning.models.tokenizer import train_bpe_tokenizer

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


@pytest.fixture
def tiny_gpt2_pair(tiny_tokenizer):
    """(teacher, student): GPT-2 configs, teacher 2 layers d=64, student 1 layer d=32."""
    vocab = len(tiny_tokenizer)
    teacher = build_tiny_model("gpt2", vocab, seed=1, n_layer=2, hidden=64)
    student = build_tiny_model("gpt2", vocab, seed=2, n_layer=1, hidden=32)
    return teacher, student


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """A miniature embedded default on disk: generated data, a BPE trained on it, and saved tiny
    teachers/students per architecture family (GPT-2, OPT, LLaMA), for CLI and module tests.

    Returns a dict with ``root``, ``tokenizer`` and ``data`` folders and ``models[family]["teacher"|"student"]``.
    """
    from mgsr_lightning.data.records import read_jsonl
    from mgsr_lightning.data.tasks.tiny import write_tiny_dataset

    root = tmp_path_factory.mktemp("tiny_assets")
    paths = write_tiny_dataset(root / "data", {"train": 96, "validation": 20, "test": 20}, seed=0)
    texts = [r["instruction"] + "\n" + r["input"] + "\n" + r["output"] for r in read_jsonl(paths["train"])]
    tokenizer = train_bpe_tokenizer(texts * 3, vocab_size=300, save_dir=root / "tokenizer")
    models = {}
    for family in ("gpt2", "opt", "llama"):
        models[family] = {}
        for role, (layers, hidden, seed) in {"teacher": (2, 48, 1), "student": (1, 32, 2)}.items():
            folder = root / family / role
            build_tiny_model(family, len(tokenizer), seed=seed, n_layer=layers, hidden=hidden).save_pretrained(folder)
            models[family][role] = folder
    return {"root": root, "tokenizer": root / "tokenizer", "data": root / "data", "models": models}
