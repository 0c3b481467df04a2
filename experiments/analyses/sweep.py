"""A tuning grid on an embedded pair: train its candidates, read their validation curves, pick winners.

The grid is a YAML file written before any run (``experiments/results/facts/tuning/grid.yaml``): groups
of named candidates, each a config of ``configs/<pair>/`` plus command-line overrides. Every candidate
starts from its training seed's SFT-initialised student, as ``reproduce`` trains them, and lands in
``runs/reproduce-<pair>/<candidate>/seed<k>``, so ``experiments/analyses/acceptance.py`` reads its test scores
beside the shipped methods'.

    # seed 0 of every candidate of two groups, three trainings at a time (one torch thread each)
    python experiments/analyses/sweep.py experiments/results/facts/tuning/grid.yaml train --groups distillm,abkd \\
        --jobs 3
    # the validation table: best validation ROUGE-L per candidate, the winner of each method group
    python experiments/analyses/sweep.py experiments/results/facts/tuning/grid.yaml table
    # the winners on more seeds, scored on the test split (5 sampling seeds)
    python experiments/analyses/sweep.py experiments/results/facts/tuning/grid.yaml train \\
        --candidates mgsr,abkd_a01_b08 --seeds 0,1,2 --test --jobs 3
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
TIE = 0.1  # a candidate must beat its method's shipped default by more than this to win


def load_grid(path: Path) -> dict:
    grid = yaml.safe_load(path.read_text())
    # the method groups, then every other top-level mapping of candidates (analyses such as table_3c)
    others = {key: value for key, value in grid.items() if key not in ("methods", "pair") and isinstance(value, dict)}
    groups = {**grid.get("methods", {}), **others}
    return {"pair": grid.get("pair", "facts"), "groups": groups, "methods": list(grid.get("methods", {}))}


def candidates_of(grid: dict) -> dict[str, dict]:
    return {name: spec for group in grid["groups"].values() for name, spec in group.items()}


def overrides_of(spec: dict) -> tuple[str, ...]:
    """``--key=value`` per override: strings as they are (a quoted JSON string would reach a ``Literal`` option
    with its quotes), everything else as JSON."""
    return tuple(f"--{key}={value if isinstance(value, str) else json.dumps(value)}"
                 for key, value in spec.get("overrides", {}).items())


def train_one(grid: dict, name: str, seed: int, test: bool) -> None:
    """Train (or find trained) one candidate on one seed in this process; with ``test``, score it on the
    pair's test split as ``reproduce`` does."""
    import torch

    from mgsr_lightning.pipeline import steps

    torch.set_num_threads(1)
    pair, spec = grid["pair"], candidates_of(grid)[name]
    env, eval_sets, eval_config, _ = steps.pair_setup(pair, None, None, None)
    runs_root = Path("runs") / f"reproduce-{pair}"
    init = steps.initialised_student(pair, runs_root, seed, env)
    run_dir = runs_root / name / f"seed{seed}"
    student = steps.fit(pair, spec["config"], run_dir, seed, env, init + overrides_of(spec))
    if test:
        steps.evaluate(student, run_dir / "eval", name, eval_sets, eval_config)


def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, val/rougeL) of a run's CSV logs, in order."""
    curve = []
    for metrics in sorted(run_dir.glob("logs/version_*/metrics.csv")):
        with metrics.open() as f:
            for row in csv.DictReader(f):
                if row.get("val/rougeL"):
                    curve.append((int(row["step"]), float(row["val/rougeL"])))
    return sorted(set(curve))


def table(grid: dict, seed: int) -> str:
    """The validation table in Markdown: every candidate's best validation ROUGE-L on ``seed``, and the winners."""
    runs_root = Path("runs") / f"reproduce-{grid['pair']}"
    lines = [f"Validation ROUGE-L, training seed {seed} (best of the validations; the exported checkpoint's)", ""]
    lines += ["| group | candidate | best | at step | curve |", "|---|---|:---:|:---:|---|"]
    winners = {}
    for group, members in grid["groups"].items():
        scores = {}
        for name in members:
            curve = validation_curve(runs_root / name / f"seed{seed}")
            best = max(curve, key=lambda point: point[1]) if curve else (None, math.nan)
            scores[name] = best[1]
            shown = ", ".join(f"{value:.1f}" for _, value in curve) or "not trained"
            step = best[0] if best[0] is not None else ""
            lines.append(f"| {group} | {name} | {best[1]:.2f} | {step} | {shown} |")
        if group in grid["methods"] and all(not math.isnan(v) for v in scores.values()):
            default = next(iter(members))  # the first candidate of a method group is its shipped default
            best_name = max(scores, key=scores.get)
            winners[group] = best_name if scores[best_name] > scores[default] + TIE else default
    lines.append("")
    for group, name in winners.items():
        lines.append(f"- {group}: **{name}** (ties within {TIE} go to the shipped default, the group's first row)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path)
    parser.add_argument("action", choices=["train", "table", "init", "one"],
                        help="train: the candidates, in parallel jobs; table: the validation table; init: the seeds' "
                             "SFT-initialised students; one: the candidates here, one after another")
    parser.add_argument("--groups", default=None, help="comma-separated groups of the grid (default: all)")
    parser.add_argument("--candidates", default=None, help="comma-separated candidate names (instead of --groups)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--jobs", type=int, default=1, help="trainings at once, one torch thread each")
    parser.add_argument("--test", action="store_true", help="also score each trained candidate on the test split")
    args = parser.parse_args(argv)
    grid = load_grid(args.grid)
    known = candidates_of(grid)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.action == "table":
        print(table(grid, seeds[0]), end="")
        return
    if args.action == "init":
        from mgsr_lightning.pipeline import steps

        env = steps.pair_setup(grid["pair"], None, None, None)[0]
        for seed in seeds:
            steps.initialised_student(grid["pair"], Path("runs") / f"reproduce-{grid['pair']}", seed, env)
        return
    if args.candidates:
        names = args.candidates.split(",")
    else:
        groups = args.groups.split(",") if args.groups else list(grid["groups"])
        unknown = [g for g in groups if g not in grid["groups"]]
        if unknown:
            parser.error(f"unknown group(s) {unknown}; the grid has {list(grid['groups'])}")
        names = [name for group in groups for name in grid["groups"][group]]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown candidate(s) {unknown}; the grid has {list(known)}")
    if args.action == "one":
        for seed in seeds:
            for name in names:
                train_one(grid, name, seed, args.test)
        return
    # each seed's init student first, once, so that parallel jobs never train it twice
    subprocess.run([sys.executable, __file__, str(args.grid), "init", "--seeds", args.seeds], check=True)

    def launch(job: tuple[str, int]) -> tuple[str, int, int]:
        name, seed = job
        log = Path("runs") / f"reproduce-{grid['pair']}" / "sweep-logs" / f"{name}-seed{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, __file__, str(args.grid), "one", "--candidates", name, "--seeds", str(seed)]
        with log.open("a") as out:
            code = subprocess.run(command + (["--test"] if args.test else []), stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}).returncode
        print(f"{name} seed {seed}: {'done' if code == 0 else f'failed ({code}), see {log}'}", flush=True)
        return name, seed, code

    jobs = [(name, seed) for seed in seeds for name in names]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        failed = [job for job in pool.map(launch, jobs) if job[2] != 0]
    if failed:
        sys.exit(f"{len(failed)} of {len(jobs)} trainings failed: {failed}")


if __name__ == "__main__":
    main()
