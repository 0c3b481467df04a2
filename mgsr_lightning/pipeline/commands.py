"""Pipeline commands ``evaluate`` and ``export``, and the steps ``reproduce``, ``demo`` and the experiments
share: train a config into a run folder (resumable, fingerprinted), evaluate a model folder (cached),
and set a pair up (environment, evaluation sets and protocol, teacher).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from mgsr_lightning import atomic
from mgsr_lightning.cli import validation
from mgsr_lightning.data.records import load_records, write_jsonl
from mgsr_lightning.data.templates import PromptTemplate
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.evaluation.evaluate import EvalConfig, evaluate_model
from mgsr_lightning.evaluation.readers import EVAL_SETS, load_dolly15k, load_eval_set
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.models.checks import check_positions
from mgsr_lightning.pipeline.checks import (
    check_fit_fingerprint,
    check_model_folder,
    eval_fingerprint,
    fit_fingerprint,
    stored_path,
    student_only_module,
)
from mgsr_lightning.pipeline.labels import method_label
from mgsr_lightning.pipeline.paths import CONFIGS, ROOT_ENVS, config_path, environment
from mgsr_lightning.pipeline.tiny import prepare_tiny

log = logging.getLogger(__name__)

def _fit(
    pair: str, method: str, run_dir: Path, seed: int, env: dict[str, str], overrides: tuple[str, ...] = ()
) -> Path:
    """Train ``configs/<pair>/<method>.yaml`` with ``seed`` (and CLI ``overrides``) into ``run_dir``; returns
    the exported student."""
    from mgsr_lightning.cli.lightning_cli import run_cli

    export_dir = run_dir / "hf"
    check_fit_fingerprint(run_dir, fit_fingerprint(config_path(pair, method), seed, env, overrides))
    if (export_dir / "config.json").is_file():
        log.info("%s/%s seed %d: already trained (%s)", pair, method, seed, export_dir)
        return export_dir
    # the CSV logger puts checkpoints in its version folder: <run_dir>/logs/version_N/checkpoints
    checkpoints = sorted(run_dir.glob("logs/version_*/checkpoints/last.ckpt"), key=lambda path: path.stat().st_mtime)
    last = checkpoints[-1] if checkpoints else run_dir / "checkpoints" / "last.ckpt"
    args = [
        "fit", "--config", str(config_path(pair, method)), f"--seed_everything={seed}",
        f"--trainer.default_root_dir={run_dir}", f"--trainer.logger.init_args.save_dir={run_dir}",
        "--trainer.logger.init_args.name=logs", f"--model.init_args.export_dir={export_dir}", *overrides,
    ]
    if last.is_file():
        args.append(f"--ckpt_path={last}")
        log.info("%s/%s seed %d: resuming from %s", pair, method, seed, last)
    started = time.perf_counter()
    with environment(**env):
        cli = run_cli(args)
    atomic.write_text(run_dir / "train_seconds.txt", f"{time.perf_counter() - started:.1f}\n")
    del cli
    return export_dir


def _initialised_student(pair: str, runs_root: Path, seed: int, env: dict[str, str]) -> tuple[str, ...]:
    """Overrides that start a student from this seed's SFT-initialised checkpoint (``configs/<pair>/init.yaml``,
    trained once per seed), or none when the pair has no init stage.

    As DistiLLM, MiniLLM and MGSR distil: every method, SFT included, continues from the same
    ``init`` student, so all of them get the same total number of steps."""
    if not (CONFIGS / pair / "init.yaml").is_file():
        return ()
    init_dir = _fit(pair, "init", runs_root / "init" / f"seed{seed}", seed, env)
    # one JSON value: jsonargparse reads a nested ``...student.config=null`` as the string "None"
    student = json.dumps({"name_or_path": str(init_dir.resolve()), "config": None})
    return (f"--model.init_args.student={student}",)


def _load(folder: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    from mgsr_lightning.models.tokenizer import load_tokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    return model, load_tokenizer(str(folder))


def _evaluate(model_dir: Path, out: Path, label: str, eval_sets: dict[str, list], config: EvalConfig) -> dict[str, Any]:
    """Evaluate, or reuse ``out/metrics.json`` when the same model, rows and protocol produced it."""
    metrics_path = out / "metrics.json"
    fingerprint = eval_fingerprint(model_dir, label, eval_sets, config)
    if metrics_path.is_file():
        cached = json.loads(metrics_path.read_text())
        if cached.get("fingerprint") == fingerprint:
            return cached
        log.info("%s: written with another configuration (or by an older version); evaluating again", metrics_path)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model, tokenizer = _load(model_dir, dtype)
    results = evaluate_model(model, tokenizer, eval_sets, config, out, method=label)
    del model
    results["fingerprint"] = fingerprint
    atomic.write_text(metrics_path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return results


def _pair_setup(pair: str, data_source: str | None, eval_source: str | None, max_eval_examples: int | None):
    """(environment, evaluation sets, evaluation config, teacher folder) of a pair."""
    if pair == "smollm2" or pair in ROOT_ENVS:
        from mgsr_lightning.pipeline.eval_settings import preset_settings

        if pair == "smollm2":
            from mgsr_lightning.pipeline.smollm2 import ROOT_ENV, prepare_smollm2

            root, env, batch_size = prepare_smollm2(), ROOT_ENV, 32
        else:  # the embedded data, whatever MGSR_TINY_DIR holds
            root, env, batch_size = prepare_tiny(out=f"artifacts/{pair}", pair=pair), ROOT_ENVS[pair], 100
        settings = preset_settings(pair)  # the template and lengths of the pair's configs/<pair>/base.yaml
        eval_sets = {f"{pair}-test": load_records(str(root / "data" / "test.jsonl"))}
        config = EvalConfig(sampling=SamplingConfig(max_new_tokens=settings["max_new_tokens"]), batch_size=batch_size,
                            max_prompt_length=settings["max_prompt_length"], template=settings["template"],
                            max_examples=max_eval_examples, show_progress=False)
        return {env: str(root)}, eval_sets, config, root / "teacher"
    data_dir = Path("data")
    if not (data_dir / "dolly" / "train.jsonl").is_file():
        splits = load_dolly15k(data_source)
        write_jsonl(splits["train"], data_dir / "dolly" / "train.jsonl")
        write_jsonl(splits["valid"], data_dir / "dolly" / "valid.jsonl")
    eval_sets = {name: load_eval_set(name, eval_source, max_examples=max_eval_examples) for name in EVAL_SETS}
    env = {"MGSR_DATA_DIR": str(data_dir.resolve()), "MGSR_RUNS_DIR": str(Path("runs").resolve())}
    return env, eval_sets, EvalConfig(max_examples=max_eval_examples), Path("runs") / pair / "teacher" / "hf"


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
        sets: Names of MiniLLM's sets (dolly, self_inst, vicuna, sinst, uinst) or JSONL paths (default: all five).
        eval_source: Folder holding MiniLLM's evaluation sets (default: the hub releases).
        out: Output folder.
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
    if label is not None and len(models) > 1:
        raise ConfigError("label names one model's row; with several models each row is named after its folder")
    validation.at_least("batch_size", batch_size, 1)
    validation.at_least("max_new_tokens", max_new_tokens, 1)
    validation.at_least("max_prompt_length", max_prompt_length, 1)
    validation.at_least("max_examples", max_examples, 1)
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
    eval_sets = {}
    for name in sets or list(EVAL_SETS):
        eval_sets[Path(name).stem if name not in EVAL_SETS else name] = (
            load_eval_set(name, eval_source) if name in EVAL_SETS else load_records(name)
        )
    for name, settings, sources in plans:
        folder = Path(name)
        short_name = folder.parent.name if folder.name == "hf" else folder.name
        settings, sources, note = answer_lengths.sized_for(name, settings, sources, eval_sets, max_examples)
        print(f"evaluating {name}: {eval_settings.describe(settings, sources)}", flush=True)
        if note is not None:
            print(note, flush=True)
        config = EvalConfig(
            seeds=seeds or [10, 20, 30, 40, 50], sampling=SamplingConfig(max_new_tokens=settings["max_new_tokens"]),
            batch_size=batch_size, max_prompt_length=settings["max_prompt_length"], max_examples=max_examples,
            template=settings["template"], eos_token=settings["eos_token"],
        )
        loaded, tokenizer = _load(folder, torch.bfloat16 if torch.cuda.is_available() else torch.float32)
        model_out = Path(out) if len(plans) == 1 else Path(out) / short_name
        evaluate_model(loaded, tokenizer, eval_sets, config, model_out,
                       method=label or method_label(short_name))
        del loaded
        print((model_out / "table.md").read_text())
    if len(plans) > 1:
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
