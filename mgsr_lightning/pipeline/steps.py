"""The steps ``reproduce``, ``demo``, the ``evaluate`` command and the experiments share: train a config into a
run folder (resumable, fingerprinted), load and evaluate a model folder (cached), and set a pair up
(environment, evaluation sets and protocol, teacher).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from mgsr_lightning import atomic
from mgsr_lightning.data.records import load_records, write_jsonl
from mgsr_lightning.evaluation.evaluate import EvalConfig, evaluate_model
from mgsr_lightning.evaluation.readers import EVAL_SETS, load_dolly15k, load_eval_set
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.missing import ROOT_ENVS
from mgsr_lightning.pipeline.checks import check_fit_fingerprint, eval_fingerprint, fit_fingerprint
from mgsr_lightning.pipeline.paths import CONFIGS, config_path, environment
from mgsr_lightning.pipeline.tiny import prepare_tiny

log = logging.getLogger(__name__)


def fit(
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


def initialised_student(pair: str, runs_root: Path, seed: int, env: dict[str, str]) -> tuple[str, ...]:
    """Overrides that start a student from this seed's SFT-initialised checkpoint (``configs/<pair>/init.yaml``,
    trained once per seed), or none when the pair has no init stage.

    As DistiLLM, MiniLLM and MGSR distil: every method, SFT included, continues from the same
    ``init`` student, so all of them get the same total number of steps."""
    if not (CONFIGS / pair / "init.yaml").is_file():
        return ()
    init_dir = fit(pair, "init", runs_root / "init" / f"seed{seed}", seed, env)
    # one JSON value: jsonargparse reads a nested ``...student.config=null`` as the string "None"
    student = json.dumps({"name_or_path": str(init_dir.resolve()), "config": None})
    return (f"--model.init_args.student={student}",)


def load_model(folder: Path, dtype: torch.dtype = torch.float32):
    """A saved causal LM in eval mode on the GPU when there is one, and its tokenizer."""
    from transformers import AutoModelForCausalLM

    from mgsr_lightning.models.tokenizer import load_tokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    return model, load_tokenizer(str(folder))


def evaluate(model_dir: Path, out: Path, label: str, eval_sets: dict[str, list], config: EvalConfig) -> dict[str, Any]:
    """Evaluate, or reuse ``out/metrics.json`` when the same model, rows and protocol produced it."""
    metrics_path = out / "metrics.json"
    fingerprint = eval_fingerprint(model_dir, label, eval_sets, config)
    if metrics_path.is_file():
        cached = json.loads(metrics_path.read_text())
        if cached.get("fingerprint") == fingerprint:
            return cached
        log.info("%s: written with another configuration (or by an older version); evaluating again", metrics_path)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model, tokenizer = load_model(model_dir, dtype)
    results = evaluate_model(model, tokenizer, eval_sets, config, out, method=label)
    del model
    results["fingerprint"] = fingerprint
    atomic.write_text(metrics_path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return results


def pair_setup(pair: str, data_source: str | None, eval_source: str | None, max_eval_examples: int | None):
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
