"""The tokenizer of ``prepare`` and the ``train-tokenizer`` command: a byte-level BPE trained on the training rows
(or a given tokenizer copied), planned in memory first and reused when its inputs are unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mgsr_lightning import atomic
from mgsr_lightning.cli.validation import at_least, writable_folder
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.data.templates import PromptTemplate, render_prompt
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.pipeline.checks import TOKENIZER_FILES
from mgsr_lightning.pipeline.manifest import Manifest, fingerprint, folder_sha256
from mgsr_lightning.pipeline.own_data_checks import ADVICE, same_file


def tokenizer_texts(records: list[dict[str, Any]], template: PromptTemplate) -> list[str]:
    """The text a tokenizer for these rows should compress: each prompt as training renders it, then each reference."""
    texts = []
    for record in records:
        outputs = record["output"] if isinstance(record["output"], list) else [record["output"]]
        texts += [(record.get("prompt") or render_prompt(record, template)) + output for output in outputs]
    return texts


def train_bpe(records: list[dict[str, Any]], vocab_size: int, template: PromptTemplate, model_max_length: int,
               out: Path) -> int:
    """Train a byte-level BPE on ``records`` into ``out``; returns its vocabulary size."""
    from mgsr_lightning.models.tokenizer import train_bpe_tokenizer

    with atomic.atomic_folder(out, last="tokenizer.json") as temporary:
        tokenizer = train_bpe_tokenizer(tokenizer_texts(records, template), vocab_size=vocab_size, save_dir=temporary,
                                        model_max_length=model_max_length)
    return len(tokenizer)


def train_tokenizer(
    data: str,
    out: str,
    vocab_size: int = 1024,
    template: PromptTemplate = "alpaca",
    model_max_length: int = 512,
) -> None:
    """Train a GPT-2-style byte-level BPE tokenizer on instruction data (for students and teachers built from configs).

    Args:
        data: A JSONL file of rows (instruction/input/output, instruction/context/response or
            prompt/response), or a folder holding ``train.jsonl``.
        out: Folder to save the tokenizer in (``save_pretrained`` layout); it must be new, empty, or a
            tokenizer folder (which is replaced).
        vocab_size: Vocabulary size, the 256 byte symbols and the two special tokens included.
        template: The prompt template training will use (``plain``, ``alpaca``; ``chat`` needs a tokenizer).
        model_max_length: The tokenizer's ``model_max_length`` (the positions of the models it serves).
    """
    at_least("vocab_size", vocab_size, 258)  # the 256 byte symbols and two special tokens
    at_least("model_max_length", model_max_length, 1)
    if template == "chat":
        raise ConfigError(
            "template: 'chat' renders prompts with a tokenizer's chat template; train with 'plain' or 'alpaca'"
        )
    source = Path(data)
    if source.is_dir():
        source = source / "train.jsonl"
    if not source.is_file():
        raise MissingFileError(f"data: not found: {source} (give a JSONL file or a folder holding train.jsonl)")
    folder = Path(out)
    if folder.is_file():
        raise ConfigError(f"out: {folder} is a file; give a new or empty folder (a tokenizer folder is replaced)")
    if folder.is_dir() and any(folder.iterdir()) and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"out: {folder} holds other files; give a new or empty folder (a tokenizer folder is replaced)"
        )
    writable_folder("out", folder)
    records = read_jsonl(source)
    size = train_bpe(records, vocab_size, template, model_max_length, folder)
    print(f"trained a byte-level BPE of {size} tokens on {len(records)} rows of {source} ({template} prompts); "
          f"saved to {folder}")


def tokenizer_fingerprint(train_hash: str, given: str | None, vocab_size: int, template: PromptTemplate,
                           model_max_length: int) -> str:
    if given is not None:
        return fingerprint({"copied_from": folder_sha256(given)})
    return fingerprint({"bpe_vocab_size": vocab_size, "train": train_hash, "template": template,
                        "model_max_length": model_max_length})


def planned_tokenizer(root: Path, manifest: Manifest, train_records: list[dict[str, Any]], train_hash: str,
                       given: str | None, vocab_size: int, template: PromptTemplate, model_max_length: int):
    """The tokenizer the tokenizer step will leave in ``root/tokenizer``, without writing anything: the one there
    when it is reused, ``given``, or a BPE trained on the training rows in memory."""
    from mgsr_lightning.models.tokenizer import load_tokenizer, train_bpe_tokenizer

    step_fingerprint = tokenizer_fingerprint(train_hash, given, vocab_size, template, model_max_length)
    if manifest.step_matches("tokenizer", step_fingerprint, root / "tokenizer"):
        return load_tokenizer(str(root / "tokenizer"))
    if given is not None:
        return load_tokenizer(given)
    return train_bpe_tokenizer(tokenizer_texts(train_records, template), vocab_size=vocab_size,
                               model_max_length=model_max_length)


def tokenizer_step(root: Path, manifest: Manifest, train_records: list[dict[str, Any]], train_hash: str,
                    given: str | None, vocab_size: int, template: PromptTemplate, model_max_length: int, planned=None):
    """``root/tokenizer``: a copy of ``given``, or a BPE trained on the training rows (``planned``, when
    :func:`planned_tokenizer` trained it already); reused for the same inputs. Returns (fingerprint, summary, note)."""
    tokenizer_dir = root / "tokenizer"
    step_fingerprint = tokenizer_fingerprint(train_hash, given, vocab_size, template, model_max_length)
    if manifest.step_matches("tokenizer", step_fingerprint, tokenizer_dir):
        return step_fingerprint, manifest.steps["tokenizer"]["summary"], "reused: same inputs"
    if not (given is not None and same_file(Path(given), tokenizer_dir)):
        manifest.check_step_output("tokenizer", tokenizer_dir, ADVICE)
        if tokenizer_dir.exists():
            shutil.rmtree(tokenizer_dir)
        if given is not None:
            shutil.copytree(given, tokenizer_dir)
        elif planned is not None:
            with atomic.atomic_folder(tokenizer_dir, last="tokenizer.json") as temporary:
                planned.save_pretrained(str(temporary))
        else:
            train_bpe(train_records, vocab_size, template, model_max_length, tokenizer_dir)
    from mgsr_lightning.models.tokenizer import load_tokenizer

    summary = {"vocab_size": len(load_tokenizer(str(tokenizer_dir))),
               "source": str(Path(given).resolve()) if given
               else f"byte-level BPE trained on the {len(train_records)} training rows"}
    manifest.record_step("tokenizer", step_fingerprint, summary)
    manifest.save()
    return step_fingerprint, summary, "new"
