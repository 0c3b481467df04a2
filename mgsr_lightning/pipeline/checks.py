"""Checks the pipeline commands make before any work, and the fingerprint that keys their caches."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from mgsr_lightning.cli import validation
from mgsr_lightning.cli.config_files import config_texts
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.evaluation.evaluate import EvalConfig
from mgsr_lightning.pipeline.paths import CONFIGS

# the files of which a tokenizer folder holds at least one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def eval_fingerprint(model_dir: Path, label: str, eval_sets: dict[str, list], config: EvalConfig) -> str:
    """Hash of everything that decides an evaluation's numbers: the model's files, the rows and the protocol."""
    model_files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                         for p in Path(model_dir).glob("*") if p.is_file())
    protocol = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("show_progress", "batch_size")}
    payload = {"model": str(Path(model_dir).resolve()), "files": model_files, "label": label, "config": protocol,
               "sets": {name: records for name, records in eval_sets.items()}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False).encode()).hexdigest()


def fit_fingerprint(config: Path, seed: int, env: dict[str, str], overrides: tuple[str, ...] = ()) -> str:
    """Hash of what decides a ``reproduce`` training run: its composed config files, seed, environment and
    command-line overrides (such as the SFT-initialised student it starts from)."""
    payload = {"configs": config_texts(config), "seed": seed, "env": env}
    if overrides:
        payload["overrides"] = list(overrides)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def check_fit_fingerprint(run_dir: Path, fingerprint: str) -> None:
    """Record ``fingerprint`` in ``run_dir/fit.sha256``, or fail if the folder holds another configuration's run
    (its student or checkpoints would otherwise be reused or resumed as if they were this one's)."""
    from mgsr_lightning import atomic

    path = run_dir / "fit.sha256"
    if path.is_file() and path.read_text().strip() != fingerprint:
        raise ConfigError(f"{run_dir} holds a run trained with another configuration (its config files, seed or data "
                          f"folder changed since); delete {run_dir} to train it again")
    if not path.is_file():
        atomic.write_text(path, fingerprint + "\n")


def check_pair_and_methods(pair: str, methods: list[str] | None) -> None:
    """Fail before any work on an unknown pair or method, listing the known ones."""
    pairs = sorted(p.name for p in CONFIGS.iterdir() if (p / "base.yaml").is_file())
    if pair not in pairs:
        raise ConfigError(f"unknown pair {pair!r}; pairs: {', '.join(pairs)}")
    known = sorted(p.stem for p in (CONFIGS / pair).glob("*.yaml") if p.stem not in ("base", "teacher", "init"))
    unknown = [method for method in methods or [] if method not in known]
    if unknown:
        raise ConfigError(f"unknown method{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for pair "
                          f"{pair!r}; methods: {', '.join(known)}")


def check_model_folder(model: str) -> None:
    """A local model folder exists and holds a model and its tokenizer; a hub id is left to ``from_pretrained``."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise MissingFileError(
                f"model folder {model} has no config.json: not a folder written by `save_pretrained`"
            )
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise MissingFileError(
                f"model folder {model} has no tokenizer ({', '.join(TOKENIZER_FILES)}); evaluate reads the tokenizer "
                "saved with the model: save it there (`tokenizer.save_pretrained(folder)`), or evaluate a folder that "
                "`fit` or `export` wrote")
        return
    if folder.is_file():
        if folder.suffix == ".ckpt":
            raise ConfigError(f"model: {model} is a training checkpoint, not a model folder; turn it into one first: "
                              f"python -m mgsr_lightning export --checkpoint {model} --out <folder>")
        raise ConfigError(f"model: {model} is a file; give a model folder written by `save_pretrained` (or a hub id)")
    if os.path.lexists(folder):
        raise MissingFileError(f"model {validation.describe_missing(folder)}")
    if validation.looks_like_path(model) or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        raise MissingFileError(f"model not found: {model} (no such folder here, and hub ids are not looked up offline)")


def stored_path(value: str, checkpoint: Path, what: str) -> str:
    """A path stored in a checkpoint, found from here or from a folder above the checkpoint
    (checkpoints written before paths were stored absolute hold them relative to where `fit` ran)."""
    if Path(value).expanduser().exists():
        return value
    for folder in checkpoint.resolve().parents:
        if (folder / value).exists():
            return str(folder / value)
    if not validation.looks_like_path(value):
        return value  # a hub id
    raise MissingFileError(
        f"the checkpoint's {what} {value!r} is not found from here nor from a folder above {checkpoint}"
    )


def student_only_module(checkpoint: dict[str, Any], overrides: dict[str, Any]):
    """The checkpoint's module (its own class, e.g. a LoRA subclass) with the student's weights, the
    teacher never loaded: ``load_from_checkpoint`` would build it in ``configure_model``, and a 13B
    teacher must not be loaded to save a 1B student."""
    from lightning.pytorch.cli import instantiate_module

    from mgsr_lightning.module import DistillLightningModule

    hparams = {k: v for k, v in checkpoint.get("hyper_parameters", {}).items() if k != "_instantiator"} | overrides
    module = instantiate_module(DistillLightningModule, hparams)
    module.teacher_source = None
    module.configure_model()
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"])
    return module
