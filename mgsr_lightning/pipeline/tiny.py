"""The embedded default: generated data, a locally trained tokenizer and an SFT-trained tiny teacher.

Everything is cached under one folder (``artifacts/tiny`` by default); a step whose output exists is
skipped, so a second run reuses the teacher.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mgsr_lightning import validation
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.data.templates import render_prompt
from mgsr_lightning.data.tiny_tasks import write_tiny_dataset
from mgsr_lightning.pipeline.paths import TINY_ROOT_ENV, config_path, environment
from mgsr_lightning.tokenizer import train_bpe_tokenizer

log = logging.getLogger(__name__)

DEFAULT_SIZES = {"train": 20000, "validation": 200, "test": 400}


def fit_config(pair: str, method: str, root: Path, *overrides: str) -> None:
    """``python -m mgsr_lightning fit --config configs/<pair>/<method>.yaml [overrides]``, in process."""
    from mgsr_lightning.cli import run_cli

    with environment(**{TINY_ROOT_ENV: str(root)}):
        run_cli(["fit", "--config", str(config_path(pair, method)), *overrides])


def prepare_tiny(
    out: str = "artifacts/tiny",
    train_size: int = DEFAULT_SIZES["train"],
    validation_size: int = DEFAULT_SIZES["validation"],
    test_size: int = DEFAULT_SIZES["test"],
    vocab_size: int = 1024,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Prepare the embedded default: data, tokenizer and the SFT-trained tiny teacher.

    Args:
        out: Folder of the artifacts (``data/``, ``tokenizer/``, ``teacher/``); configs/tiny reads it
            through ``${oc.env:MGSR_TINY_DIR,artifacts/tiny}``.
        train_size: Generated training rows.
        validation_size: Generated validation rows.
        test_size: Generated test rows.
        vocab_size: Byte-level BPE vocabulary size.
        seed: Seed of the data generator.
        force: Redo every step even if its output exists.
    """
    for name, size in (("train_size", train_size), ("validation_size", validation_size), ("test_size", test_size)):
        validation.at_least(name, size, 1)
    validation.at_least("vocab_size", vocab_size, 258)  # the 256 byte symbols and two special tokens
    validation.writable_folder("out", out)
    root = Path(out).resolve()
    data_dir, tokenizer_dir, teacher_dir = root / "data", root / "tokenizer", root / "teacher"
    if force or not (data_dir / "test.jsonl").is_file():
        write_tiny_dataset(data_dir, {"train": train_size, "validation": validation_size, "test": test_size}, seed)
        log.info("wrote the tiny dataset to %s", data_dir)
    if force or not (tokenizer_dir / "tokenizer.json").is_file():
        records = read_jsonl(data_dir / "train.jsonl")
        texts = [render_prompt(r, "alpaca") + r["output"] for r in records]
        train_bpe_tokenizer(texts, vocab_size=vocab_size, save_dir=tokenizer_dir, model_max_length=128)
        log.info("trained a %d-token BPE tokenizer into %s", vocab_size, tokenizer_dir)
    if force or not (teacher_dir / "config.json").is_file():
        log.info("training the tiny teacher (SFT); cached in %s for later runs", teacher_dir)
        fit_config("tiny", "teacher", root)
    return root
