"""``select``: the best student for a prepared folder, chosen on its validation split.

On a folder that ``prepare`` made, every listed method is trained from the folder's SFT-initialised
student (``fit --config configs/<pair>/<method>.yaml --config <root>/init_student.yaml``, as the own-data
path does by hand), each exported student is scored on the validation split over sampling seeds, and the
best is copied to ``<root>/students/best`` with ``selection.json`` (what was tried, every score, the
winner). Which method wins depends on the task family (``experiments/results/suite/``): this command
measures it on the user's own data instead of guessing.

Layout, all under ``<root>/select/``: ``<method>/`` (the run: logs, checkpoints, ``hf/`` export, ``train.log``),
``eval/<method>/`` (its validation scores and generations), ``table.md`` and ``chart.png``, ``selection.json``.
A finished method is never retrained; an interrupted one resumes from its last checkpoint; a scored one is
not scored again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mgsr_lightning import atomic
from mgsr_lightning.cli.validation import at_least
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.evaluation.report import mean_and_standard_error
from mgsr_lightning.missing import ROOT_ENVS
from mgsr_lightning.pipeline.manifest import MANIFEST_NAME, Manifest
from mgsr_lightning.pipeline.own_data import INIT_STUDENT_CONFIG, step_overrides
from mgsr_lightning.pipeline.paths import CONFIGS, composed_config

DEFAULT_METHODS = ("sft", "kd", "distillm", "abkd", "mgsr", "mgsr_paper")
SELECTION = "selection.json"
NOISE_SE = 2.0  # a winner less than this many standard errors above SFT is within the validation noise


class WithinNoiseWarning(UserWarning):
    """The selected method is not above SFT by more than the validation noise."""


def prepared_root(root: str | None) -> tuple[Path, str]:
    """The prepared folder and its pair, or one clear error when ``prepare`` did not make it."""
    given = root or next((os.environ[env] for env in ROOT_ENVS.values() if os.environ.get(env)), None)
    if not given:
        raise ConfigError("select needs the folder `prepare` filled: --root DIR, or MGSR_TINY_DIR=DIR in the "
                          "environment")
    folder = Path(given).expanduser().resolve()
    if not folder.is_dir():
        raise MissingFileError(f"root: {folder} does not exist; run `python -m mgsr_lightning prepare --data "
                               f"<your data> --out {folder}` first")
    steps = Manifest(folder).steps if (folder / MANIFEST_NAME).is_file() else {}
    if "init" not in steps or not (folder / INIT_STUDENT_CONFIG).is_file():
        raise ConfigError(f"root: {folder} was not made by `prepare` (no {MANIFEST_NAME} with an initial student and "
                          f"no {INIT_STUDENT_CONFIG}); run `python -m mgsr_lightning prepare --data <your data> "
                          f"--out {folder}` first")
    config = str(steps["init"].get("summary", {}).get("config", "configs/tiny/sft.yaml"))
    return folder, Path(config).parent.name


def total_steps(pair: str, method: str, max_steps: int | None) -> int:
    return max_steps or int(composed_config(pair, method)["trainer"]["max_steps"])


def train_method(root: str, pair: str, method: str, seed: int, max_steps: int | None, fit_args: list[str]) -> None:
    """Train one method into ``<root>/select/<method>`` (in this process; resumes, or finds it trained)."""
    from mgsr_lightning.pipeline import steps

    folder = Path(root)
    steps_given = step_overrides(composed_config(pair, method), max_steps)
    overrides = ("--config", str(folder / INIT_STUDENT_CONFIG), *steps_given, *fit_args)
    steps.fit(pair, method, folder / "select" / method, seed, {ROOT_ENVS[pair]: str(folder)}, overrides)


def last_step(run_dir: Path) -> int:
    """The latest training step a run's CSV log holds (0 before its first log line)."""
    step = 0
    for metrics in run_dir.glob("logs/version_*/metrics.csv"):
        lines = metrics.read_text().splitlines()
        if len(lines) > 1:
            header = lines[0].split(",")
            if "step" in header:
                column = header.index("step")
                step = max([step] + [int(line.split(",")[column]) + 1 for line in lines[1:]
                                     if line.split(",")[column].isdigit()])
    return step


class Progress:
    """Every ``every`` seconds, one line: each running method's step of its total and its time left."""

    def __init__(self, folder: Path, totals: dict[str, int], every: float = 30.0):
        self.folder, self.totals, self.every = folder, totals, every
        self.started: dict[str, tuple[float, int]] = {}
        self.done: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def begin(self, method: str) -> None:
        self.started[method] = (time.monotonic(), last_step(self.folder / method))

    def finish(self, method: str) -> None:
        self.started.pop(method, None)
        self.done.append(method)
        print(f"select: {method} trained ({len(self.done)} of {len(self.totals)})", flush=True)

    def line(self) -> str:
        parts = []
        for method, (began, first) in list(self.started.items()):
            step, total = last_step(self.folder / method), self.totals[method]
            rate = (time.monotonic() - began) / (step - first) if step > first else None
            left = f", {format_seconds(rate * (total - step))} left" if rate else ""
            parts.append(f"{method} step {step}/{total}{left}")
        return f"select: {'; '.join(parts)} ({len(self.done)} of {len(self.totals)} trained)"

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            if self.started:
                print(self.line(), flush=True)


def format_seconds(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def train_all(folder: Path, pair: str, methods: list[str], seed: int, max_steps: int | None, fit_args: list[str],
              parallel: int, progress_every: float) -> None:
    """Each method in its own process (``parallel`` at a time, the cores shared between them)."""
    totals = {method: total_steps(pair, method, max_steps) for method in methods}
    threads = max(1, (os.cpu_count() or 1) // parallel)
    failed = []
    with Progress(folder / "select", totals, progress_every) as progress:

        def run(method: str) -> None:
            if (folder / "select" / method / "hf" / "config.json").is_file():
                progress.finish(method)
                return
            progress.begin(method)
            log = folder / "select" / method / "train.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            code = (f"import logging, torch; torch.set_num_threads({threads}); "
                    "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s'); "
                    "from mgsr_lightning.pipeline.select import train_method; "
                    f"train_method({str(folder)!r}, {pair!r}, {method!r}, {seed}, {max_steps!r}, {fit_args!r})")
            with log.open("a") as out:
                returncode = subprocess.run([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, "OMP_NUM_THREADS": str(threads)}).returncode
            if returncode != 0:
                failed.append(method)
                progress.started.pop(method, None)
                print(f"select: {method} failed (exit {returncode}); its log: {log}", flush=True)
            else:
                progress.finish(method)

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(run, methods))
    if failed:
        last = (folder / "select" / failed[0] / "train.log").read_text().strip().splitlines()[-1:]
        raise ConfigError(f"{len(failed)} of {len(methods)} methods failed to train ({', '.join(failed)}); "
                          f"{failed[0]}'s last line: {last[0] if last else '(empty log)'}; run select again to resume")


def row_scores(eval_dir: Path) -> dict[int, float]:
    """Validation row -> its ROUGE-L averaged over the sampling seeds, from ``generations.jsonl``."""
    sums: dict[int, list[float]] = {}
    for line in (eval_dir / "generations.jsonl").read_text().splitlines():
        row = json.loads(line)
        sums.setdefault(row["index"], []).append(row["rougeL"])
    return {index: sum(values) / len(values) for index, values in sums.items()}


def paired_gain(winner: dict[int, float], reference: dict[int, float]) -> tuple[float, float]:
    """Mean and standard error of the per-row difference ``winner - reference`` over their shared rows."""
    rows = sorted(set(winner) & set(reference))
    mean, error = mean_and_standard_error([winner[i] - reference[i] for i in rows])
    return mean, 0.0 if error is None else error  # one shared row: no spread to measure


def select(
    root: str | None = None,
    methods: list[str] | None = None,
    parallel: int = 1,
    seed: int = 0,
    seeds: list[int] | None = None,
    max_steps: int | None = None,
    max_examples: int | None = None,
    fit_args: list[str] | None = None,
    progress_every: float = 30.0,
) -> dict[str, Any]:
    """Train several methods on a prepared folder, score each on its validation split, export the best.

    Every method starts from the folder's SFT-initialised student and trains its config's steps
    (``configs/<pair>/<method>.yaml``); each is scored by ROUGE-L on ``<root>/data/validation.jsonl`` over the
    sampling seeds; the best is copied to ``<root>/students/best`` with ``selection.json``. Run it again after
    an interruption: finished methods are kept, an interrupted one resumes from its last checkpoint.

    Args:
        root: The folder ``prepare`` filled (default: ``$MGSR_TINY_DIR``).
        methods: Configs of ``configs/<pair>/`` to try (default: sft, kd, distillm, abkd, mgsr, mgsr_paper).
        parallel: Trainings at once, the machine's cores shared between them.
        seed: Training seed of every method.
        seeds: Sampling seeds of the validation scores (default 10 20 30 40 50).
        max_steps: Train every method this many steps instead of its config's (quick looks).
        max_examples: Score only the first N validation rows.
        fit_args: Extra ``fit`` options for every method, e.g. ``--fit_args '[--data.batch_size=16]'``.
        progress_every: Seconds between progress lines.
    """
    from mgsr_lightning.data.records import load_records
    from mgsr_lightning.evaluation.evaluate import EvalConfig
    from mgsr_lightning.generation.sampling import SamplingConfig
    from mgsr_lightning.pipeline import steps
    from mgsr_lightning.pipeline.eval_settings import preset_settings
    from mgsr_lightning.pipeline.labels import method_label

    folder, pair = prepared_root(root)
    methods = list(DEFAULT_METHODS if methods is None else methods)
    if not methods:
        raise ConfigError("methods: give at least one method, e.g. --methods '[sft, mgsr]' (the default when left out)")
    if len(set(methods)) < len(methods):
        raise ConfigError(f"methods: each method once; given {methods}")
    unknown = [method for method in methods if not (CONFIGS / pair / f"{method}.yaml").is_file()]
    if unknown:
        known = sorted(path.stem for path in (CONFIGS / pair).glob("*.yaml") if path.stem not in ("base", "teacher"))
        raise ConfigError(f"methods: no config for {', '.join(unknown)} in configs/{pair}; methods: {', '.join(known)}")
    at_least("parallel", parallel, 1)
    at_least("max_steps", max_steps, 1)
    at_least("max_examples", max_examples, 1)
    if seeds is not None and not seeds:
        raise ConfigError("seeds: give at least one sampling seed, e.g. --seeds '[10, 20, 30]'")
    print(f"select: {len(methods)} methods on {folder} ({pair} configs), {parallel} at a time: {', '.join(methods)}",
          flush=True)
    train_all(folder, pair, methods, seed, max_steps, list(fit_args or []), parallel, progress_every)

    settings = preset_settings(pair)
    config = EvalConfig(seeds=list(seeds or [10, 20, 30, 40, 50]),
                        sampling=SamplingConfig(max_new_tokens=settings["max_new_tokens"]),
                        max_prompt_length=settings["max_prompt_length"], template=settings["template"],
                        max_examples=max_examples, show_progress=False)
    validation = {"validation": load_records(str(folder / "data" / "validation.jsonl"))}
    scores: dict[str, dict[str, Any]] = {}
    for method in methods:
        print(f"select: scoring {method} on the validation split", flush=True)
        out = folder / "select" / "eval" / method
        metrics = steps.evaluate(folder / "select" / method / "hf", out, method_label(method), validation, config)
        scores[method] = {"rougeL": metrics["sets"]["validation"]["rougeL"],
                          "rougeL_per_seed": metrics["sets"]["validation"]["rougeL_per_seed"],
                          "exact_match": metrics["sets"]["validation"]["exact_match"]}
    winner = max(methods, key=lambda method: scores[method]["rougeL"])
    selection: dict[str, Any] = {"root": str(folder), "pair": pair, "tried": methods, "training_seed": seed,
                                 "max_steps": max_steps, "fit_args": list(fit_args or []),
                                 "sampling_seeds": config.seeds, "split": "validation", "scores": scores,
                                 "winner": winner}
    if winner != "sft" and "sft" in methods:
        gain, error = paired_gain(row_scores(folder / "select" / "eval" / winner),
                                  row_scores(folder / "select" / "eval" / "sft"))
        selection["gain_over_sft"] = {"mean": gain, "standard_error": error}
        selection["within_noise_of_sft"] = gain < NOISE_SE * error
    from mgsr_lightning.pipeline.table import table

    table([str(folder / "select" / "eval")], str(folder / "select"), title=f"select on {folder.name}: validation")
    atomic.write_text(folder / "select" / SELECTION, json.dumps(selection, indent=2) + "\n")
    best = folder / "students" / "best"
    if best.exists():
        earlier = json.loads((best / SELECTION).read_text()).get("winner") if (best / SELECTION).is_file() else None
        if earlier != winner:
            print(f"select: replacing {best} (was {earlier or 'not written by select'})", flush=True)
        shutil.rmtree(best)
    shutil.copytree(folder / "select" / winner / "hf", best)
    atomic.write_text(best / SELECTION, json.dumps(selection, indent=2) + "\n")
    print((folder / "select" / "table.md").read_text())
    print(f"select: the best on validation is {winner} (ROUGE-L {scores[winner]['rougeL']:.2f}); "
          f"exported to {best} with {SELECTION}")
    if selection.get("within_noise_of_sft"):
        import warnings

        gain = selection["gain_over_sft"]
        warnings.warn(f"{winner} is above SFT by {gain['mean']:+.2f} ± {gain['standard_error']:.2f} ROUGE-L on "
                      f"validation, within the noise ({NOISE_SE:.0f} standard errors): SFT is as good a choice on "
                      "this data, and cheaper", WithinNoiseWarning, stacklevel=2)
    return selection
