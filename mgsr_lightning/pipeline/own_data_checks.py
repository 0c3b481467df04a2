"""What ``prepare`` checks in the given data before it writes anything: the three split files, how many rows fit
the pair's length limits (and a clear error when none of a split does), and rows shared between the splits."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.missing import ROOT_ENVS
from mgsr_lightning.pipeline.paths import composed_config

SPLITS = ("train", "validation", "test")
SPLIT_FILE_NAMES = {"train": ("train.jsonl",), "validation": ("validation.jsonl", "valid.jsonl", "val.jsonl"),
                    "test": ("test.jsonl",)}
# what ``prepare`` says when its folder holds a file it did not write
ADVICE = "choose another --out, or move it away"


def input_files(data: str | None, train: str | None, validation_file: str | None, test: str | None) -> dict[str, Path]:
    """The train, validation and test files, from ``--data DIR`` or given one by one (which take precedence)."""
    given = {"train": train, "validation": validation_file, "test": test}
    if data is None and None in given.values():
        missing = ", ".join(f"--{split}" for split, path in given.items() if path is None)
        raise ConfigError("prepare needs your train, validation and test JSONL files: "
                          "--data DIR (holding train.jsonl, "
                          f"validation.jsonl and test.jsonl) or --train/--validation/--test; missing: {missing}")
    files = {}
    for split in SPLITS:
        if given[split] is not None:
            path = Path(given[split])
        else:
            folder = Path(data)
            if not folder.is_dir():
                raise MissingFileError(f"data: no such folder: {folder}")
            candidates = [folder / name for name in SPLIT_FILE_NAMES[split]]
            path = next((candidate for candidate in candidates if candidate.is_file()), candidates[0])
        if not path.is_file():
            raise MissingFileError(f"{split} data not found: {path}" + (
                f" (--data needs {' or '.join(SPLIT_FILE_NAMES[split])} in {data}, or give --{split})"
                if given[split] is None else ""))
        files[split] = path.resolve()
    return files


def same_file(a: Path, b: Path) -> bool:
    return b.exists() and os.path.samefile(a, b)


def rows_within_limits(records: list[dict[str, Any]], tokenizer, data_config: dict[str, Any], max_length: int | None,
          name: str) -> tuple[int, dict[str, int]]:
    """How many rows the pair's length limits keep (as training and evaluation encode them), and why the others go."""
    from mgsr_lightning.data.datamodule import encode_records
    from mgsr_lightning.models.tokenizer import token_id

    datamodule_log = logging.getLogger("mgsr_lightning.data.datamodule")
    tokenizer_log = logging.getLogger("transformers.tokenization_utils_base")  # "longer than model_max_length"
    levels = datamodule_log.level, tokenizer_log.level
    datamodule_log.setLevel(logging.ERROR)  # the summary states the counts; training logs the drops again anyway
    tokenizer_log.setLevel(logging.ERROR)  # rows over the limits are counted here, not fed to a model
    try:
        examples, stats = encode_records(records, tokenizer, template=data_config.get("template", "alpaca"),
                                     eos_token_id=token_id(tokenizer, data_config.get("eos_token")),
                                     max_length=max_length,
                                     max_prompt_length=data_config["max_prompt_length"], name=name)
    finally:
        datamodule_log.setLevel(levels[0])
        tokenizer_log.setLevel(levels[1])
    return len(examples), stats


def check_some_rows_fit(pair: str, files: dict[str, Path], records: dict[str, list[dict[str, Any]]],
                         stats: dict[str, dict[str, int]], data_config: dict[str, Any], trains_tokenizer: bool) -> None:
    """Fail, before anything is written, when no row of a split fits the pair's length limits."""
    empty = [split for split in SPLITS if stats[split]["kept"] == 0]
    if not empty:
        return
    split = empty[0]
    limit_text = (f"prompts <= {data_config['max_prompt_length']} tokens"
                  + (f", prompt + response <= {data_config['max_length']}" if split != "test" else ""))
    reasons = f"{stats[split]['dropped_long_prompt']} have a longer prompt" + (
        f", {stats[split]['dropped_long_response']} a longer prompt + response" if split != "test" else "")
    longer = []
    for other in ROOT_ENVS:
        other_data = composed_config(other)["data"]
        if (other_data["max_prompt_length"], other_data["max_length"]) > (data_config["max_prompt_length"],
                                                                            data_config["max_length"]):
            longer.append(f"--pair {other} (prompts <= {other_data['max_prompt_length']}, prompt + response <= "
                          f"{other_data['max_length']})")
    options = ([f"a pair with longer limits: {' or '.join(longer)}"] if longer else []) + (
        ["a larger --vocab_size (fewer tokens per row)"] if trains_tokenizer else [])
    raise ConfigError(
        f"none of the {len(records[split])} {split} rows of {files[split]} fits the {pair} pair's length limits with "
        f"this tokenizer ({limit_text}; configs/{pair}/base.yaml): {reasons}; shorten the rows"
        + (f", or prepare them with {', or '.join(options)}" if options else ""))


def overlap_warnings(files: dict[str, Path], records: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Warnings about rows of the evaluation splits that are training rows, and about duplicated rows."""
    def prompt(record: dict[str, Any]) -> str:
        return record.get("prompt") or json.dumps([record["instruction"], record["input"]])

    warnings = []
    training_prompts = {prompt(record) for record in records["train"]}
    for split in ("validation", "test"):
        shared = sum(prompt(record) in training_prompts for record in records[split])
        if shared:
            warnings.append(f"{shared} of the {len(records[split])} {split} rows ask the prompt of a training row "
                            f"({files[split]}): their scores measure recall of the training data, not what the "
                            f"student learnt; remove them from the {split} file")
    for split in SPLITS:
        duplicated = len(records[split]) - len({json.dumps(record, sort_keys=True) for record in records[split]})
        if duplicated:
            warnings.append(f"{files[split]} holds {duplicated} duplicated rows (a prompt and answer given again), "
                            "each copy counted again; remove them")
    return warnings
