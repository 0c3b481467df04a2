"""Pipeline commands ``evaluate`` and ``export`` (the steps they share with ``reproduce``, ``demo`` and the
experiments: :mod:`mgsr_lightning.pipeline.steps`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from mgsr_lightning import atomic
from mgsr_lightning.cli import validation
from mgsr_lightning.data.records import load_records
from mgsr_lightning.data.templates import PromptTemplate
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.evaluation.evaluate import EvalConfig, evaluate_model
from mgsr_lightning.evaluation.readers import EVAL_SETS, load_eval_set
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.models.checks import check_positions
from mgsr_lightning.pipeline.checks import (
    check_model_folder,
    eval_fingerprint,
    stored_path,
    student_only_module,
)
from mgsr_lightning.pipeline.labels import method_label
from mgsr_lightning.pipeline.steps import load_model

log = logging.getLogger(__name__)


def result_folders(out: Path, short_names: list[str]) -> list[Path]:
    """Where ``evaluate`` writes each model's results: ``out`` itself for one model, ``out/<name>`` for several, and
    for one model ``out/<name>`` too when ``out`` already holds other models' folders (written beside them, so that
    ``table --runs '[out]'`` reads one layout). Several models into a folder holding one model's results are refused."""
    per_model = sorted(path.parent for path in out.glob("*/metrics.json")) if out.is_dir() else []
    if len(short_names) > 1 and (out / "metrics.json").is_file():
        held = _held_results(out / "metrics.json")
        raise ConfigError(f"out: {out} holds the results of one model ({held.get('method') or out.name}) in "
                          f"metrics.json, and these {len(short_names)} models would be written into folders beside "
                          "them, two layouts `table` cannot read as one: give another --out")
    return [out / name for name in short_names] if len(short_names) > 1 or per_model else [out]


def _held_results(metrics: Path) -> dict[str, Any]:
    try:
        held = json.loads(metrics.read_text())
    except (OSError, ValueError):
        return {}
    return held if isinstance(held, dict) else {}


def _already_evaluated(target: Path, fingerprint: str) -> bool:
    """Whether ``target`` holds this very evaluation (same model files, rows and protocol: kept, not redone); results
    of anything else there are never replaced: refused, naming them."""
    metrics = target / "metrics.json"
    if not metrics.is_file():
        return False
    held = _held_results(metrics)
    if held.get("fingerprint") == fingerprint:
        return True
    raise ConfigError(f"out: {target} already holds results ({held.get('method') or target.name}, {metrics}), which "
                      "evaluate never replaces: give another --out, or move that folder away to evaluate again "
                      "(models not yet in it, given alone, are written beside)")


def evaluate(
    model: str | list[str],
    sets: list[str] | None = None,
    eval_source: str | None = None,
    out: str = "runs/eval",
    seeds: list[int] | None = None,
    preset: str | None = None,
    template: PromptTemplate | None = None,
    max_new_tokens: int | None = None,
    max_prompt_length: int | None = None,
    batch_size: int = 16,
    max_examples: int | None = None,
    eos_token: str | None = None,
    label: str | None = None,
) -> None:
    """ROUGE-L (and exact match) of saved models over sampling seeds; writes generations, metrics and a table.

    Each model is prompted as it was trained: template and lengths come from the command line, else
    ``--preset``, else the training settings saved beside the model (``mgsr_training.json``), else
    MiniLLM's protocol (alpaca, 256-token prompts, 256 new tokens). The line printed first says which.

    Args:
        model: A folder written by ``save_pretrained`` (e.g. a run's ``hf/``) or a hub id; or a list of
            them, each evaluated into ``out/<name>/`` (``table --runs '[out]'`` merges them into one table).
            One model is evaluated into ``out`` itself, or into ``out/<name>/`` when ``out`` holds such folders.
        sets: Names of MiniLLM's sets (dolly, self_inst, vicuna, sinst, uinst) or JSONL paths (default: all five).
        eval_source: Folder holding MiniLLM's evaluation sets (default: the hub releases).
        out: Output folder; results already in it are never replaced: the same evaluation (same model files, rows
            and protocol) is kept, any other is refused, naming it.
        seeds: Sampling seeds (default 10 20 30 40 50).
        preset: A model pair (``tiny``, ``reason``, ``gpt2``, ...) whose ``configs/<pair>/base.yaml`` gives
            the template and lengths, for models saved without training settings.
        template: Prompt template for rows without a ``prompt`` field (overrides the model's and the preset's).
        max_new_tokens: Most generated tokens per response (overrides them too).
        max_prompt_length: Longer prompts are dropped and counted (overrides them too).
        batch_size: Prompts per generation batch (results do not depend on it).
        max_examples: Only the first N rows of each set.
        eos_token: Token that ends a response (default: the model's training setting, else the tokenizer's EOS).
        label: Row name in the table, for one model (default: the folder's name, or its parent's for ``.../hf``).
    """
    from mgsr_lightning.pipeline import answer_lengths, eval_settings

    models = [model] if isinstance(model, str) else list(model)
    if not models:
        raise ConfigError("model: give at least one model folder")
    if label is not None and not label.strip():
        raise ConfigError("label: give the row's name, or leave --label out for the folder's name")
    if label is not None and len(models) > 1:
        raise ConfigError("label names one model's row; with several models each row is named after its folder")
    validation.at_least("batch_size", batch_size, 1)
    validation.at_least("max_new_tokens", max_new_tokens, 1)
    validation.at_least("max_prompt_length", max_prompt_length, 1)
    validation.at_least("max_examples", max_examples, 1)
    if sets is not None and not sets:
        raise ConfigError(f"sets: give at least one evaluation set (a JSONL file or one of {', '.join(EVAL_SETS)}), "
                          "or leave --sets out for all five of MiniLLM's")
    if seeds is not None and not seeds:
        raise ConfigError("seeds: give at least one sampling seed, e.g. --seeds '[10, 20, 30, 40, 50]' "
                          "(the default when --seeds is left out)")
    if preset is not None:
        eval_settings.preset_settings(preset)  # an unknown pair fails here, before any model is loaded
    given = {"template": template, "max_new_tokens": max_new_tokens, "max_prompt_length": max_prompt_length,
             "eos_token": eos_token}
    plans = []
    for name in models:
        check_model_folder(name)
        settings, sources = eval_settings.resolve(name, preset, given)
        try:
            check_positions("model", {"name_or_path": name},
                                       settings["max_prompt_length"] + settings["max_new_tokens"],
                                       "max_prompt_length + max_new_tokens")
        except ConfigError as error:
            defaulted = [key for key in ("max_prompt_length", "max_new_tokens")
                         if sources[key] == eval_settings.DEFAULT_SOURCE]
            if not defaulted:
                raise
            raise ConfigError(
                f"{error}; {' and '.join(defaulted)} {'is' if len(defaulted) == 1 else 'are'} MiniLLM's default, as "
                f"neither the command line nor {Path(name) / eval_settings.TRAINING_SETTINGS} set "
                f"{'it' if len(defaulted) == 1 else 'them'}: "
                "pass --preset <pair> (the pair the model was trained with, e.g. --preset tiny) or --max_prompt_length "
                "and --max_new_tokens") from None
        plans.append((name, settings, sources))
    short_names = [Path(name).parent.name if Path(name).name == "hf" else Path(name).name for name in models]
    if len(set(short_names)) < len(short_names):
        raise ConfigError(
            f"models: each is evaluated into out/<its folder's name>, and these share names: {short_names}"
        )
    differing = [plan for plan in plans[1:] if plan[1] != plans[0][1]]
    if differing:
        raise ConfigError(f"{differing[0][0]} would be evaluated with {differing[0][1]} "
                          f"but {plans[0][0]} with {plans[0][1]} "
                          "(their training settings differ), and their scores would not be comparable: pass --preset "
                          "or --template/--max_new_tokens/--max_prompt_length to evaluate them alike")
    for name in sets or []:
        if name not in EVAL_SETS and not Path(name).is_file():
            raise MissingFileError(
                f"evaluation set not found: {name!r} is neither a file nor one of {', '.join(EVAL_SETS)}"
            )
    validation.writable_folder("out", out)
    targets = result_folders(Path(out), short_names)
    if len(plans) == 1 and targets[0] != Path(out):
        print(f"{out} holds other models' results, each in its folder: {models[0]} is written beside them, into "
              f"{targets[0]}", flush=True)
    eval_sets = {}
    for name in sets or list(EVAL_SETS):
        try:
            eval_sets[Path(name).stem if name not in EVAL_SETS else name] = (
                load_eval_set(name, eval_source) if name in EVAL_SETS else load_records(name)
            )
        except MissingFileError as error:
            if sets is not None:
                raise
            raise MissingFileError(f"sets: left out, so MiniLLM's five sets ({', '.join(EVAL_SETS)}) are scored, and "
                                   f"{error}; or give your own JSONL files: --sets '[test.jsonl]'") from None
    runs = []
    for (name, settings, sources), model_out in zip(plans, targets):  # every folder checked before any model loads
        folder = Path(name)
        short_name = folder.parent.name if folder.name == "hf" else folder.name
        settings, sources, note = answer_lengths.sized_for(name, settings, sources, eval_sets, max_examples)
        config = EvalConfig(
            seeds=seeds or [10, 20, 30, 40, 50], sampling=SamplingConfig(max_new_tokens=settings["max_new_tokens"]),
            batch_size=batch_size, max_prompt_length=settings["max_prompt_length"], max_examples=max_examples,
            template=settings["template"], eos_token=settings["eos_token"],
        )
        method = label or method_label(short_name)
        fingerprint = eval_fingerprint(folder, method, eval_sets, config)
        runs.append((name, settings, sources, note, config, method, model_out, fingerprint,
                     _already_evaluated(model_out, fingerprint)))
    for name, settings, sources, note, config, method, model_out, fingerprint, done in runs:
        if done:
            print(f"{name}: already evaluated this way, kept in {model_out}", flush=True)
        else:
            print(f"evaluating {name}: {eval_settings.describe(settings, sources)}", flush=True)
            if note is not None:
                print(note, flush=True)
            loaded, tokenizer = load_model(Path(name), torch.bfloat16 if torch.cuda.is_available() else torch.float32)
            results = evaluate_model(loaded, tokenizer, eval_sets, config, model_out, method=method)
            del loaded
            results["fingerprint"] = fingerprint  # so that running the same command again keeps it
            atomic.write_text(model_out / "metrics.json", json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        print((model_out / "table.md").read_text())
    if len(targets) > 1 or targets[0] != Path(out):
        print(f"one table of all of them: python -m mgsr_lightning table --runs '[{out}]' --out <folder>")


def export(checkpoint: str, out: str) -> None:
    """Save the student of a training checkpoint (``.ckpt``) as a Hugging Face model folder.

    Args:
        checkpoint: A checkpoint written during ``fit`` (the teacher is not in it and is not loaded).
        out: Output folder, loadable with ``from_pretrained`` and ``pipeline("text-generation", ...)``; it must
            be new, empty, or a model folder (whose files are replaced).
    """
    from mgsr_lightning.models.export import export_student, training_settings

    saved = validation.check_checkpoint(checkpoint, "checkpoint")
    hparams = saved.get("hyper_parameters", {})
    validation.model_output_folder("out", out)
    overrides: dict[str, Any] = {}
    student = hparams.get("student")
    name_or_path = student.get("name_or_path") if isinstance(student, dict) else getattr(student, "name_or_path", None)
    if name_or_path:
        found = stored_path(name_or_path, Path(checkpoint), "student")
        overrides["student"] = ({**student, "name_or_path": found} if isinstance(student, dict)
                                else dataclasses.replace(student, name_or_path=found))
    if hparams.get("tokenizer"):
        overrides["tokenizer"] = stored_path(hparams["tokenizer"], Path(checkpoint), "tokenizer")
    module = student_only_module(saved, overrides)
    settings = training_settings(saved.get("datamodule_hyper_parameters"), module.sampling.max_new_tokens)
    export_student(module.student, module.tokenizer, out, eos_token_id=module.eos_token_id, training_settings=settings)
    print(f"student saved to {out}")
