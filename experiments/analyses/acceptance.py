"""The reason benchmark's acceptance check: does the published ordering of the peers reproduce?

Reads the students evaluated by ``reproduce`` (``<runs>/<method>/seed<k>/eval/metrics.json``), scores
each training run as its mean ROUGE-L over the sampling seeds, and prints per method the mean ± standard
error over training runs, then each comparison's difference in units of its standard error,
``(mean_a − mean_b) / sqrt(se_a² + se_b²)``. Acceptance: KD − SFT > 2 and DistiLLM − KD ≥ 0 or, if
negative, within 2 (not significantly below).

    python experiments/analyses/acceptance.py runs/reproduce-reason --methods sft,kd,distillm

Other comparisons (e.g. an ablation's steps) with ``--compare mgsr_scrg-mgsr_base,mgsr-mgsr_scrg_dac``.
Each comparison also prints the paired difference: every method of a training seed starts from that
seed's ``init`` student, so the per-seed differences, averaged with their own standard error, take out
what the seed shares ("paired over N seeds" after each difference). The last column is the mean training
wall-clock of the method's runs: a shared-machine time when runs trained side by side.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from mgsr_lightning.evaluation.report import mean_and_standard_error

COMPARISONS = [("kd", "sft"), ("distillm", "kd"), ("distillm", "sft")]


def run_scores(runs: Path, method: str, metric: str = "rougeL") -> dict[str, float]:
    """Training seed → that run's mean score over the sampling seeds."""
    scores = {}
    for metrics in sorted((runs / method).glob("seed*/eval/metrics.json")):
        scores[metrics.parent.parent.name] = json.loads(metrics.read_text())["avg"][metric]
    return scores


def train_seconds(runs: Path, method: str) -> list[float]:
    """Each training run's wall-clock seconds (``seed<k>/train_seconds.txt``, written by ``reproduce``)."""
    return [float(path.read_text()) for path in sorted((runs / method).glob("seed*/train_seconds.txt"))]


def summary(values: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean); the error is nan with one value."""
    mean, error = mean_and_standard_error(values)
    return mean, math.nan if error is None else error


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="runs folder of reproduce, e.g. runs/reproduce-reason")
    parser.add_argument("--methods", default="sft,kd,distillm")
    parser.add_argument("--metric", default="rougeL", choices=["rougeL", "exact_match"])
    parser.add_argument("--compare", default=None,
                        help="comma-separated a-b pairs of methods (default: KD-SFT, DistiLLM-KD, DistiLLM-SFT)")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    comparisons = COMPARISONS
    if args.compare:
        comparisons = [tuple(pair.split("-", 1)) for pair in args.compare.split(",")]
        if any(len(pair) != 2 for pair in comparisons):
            parser.error(f"--compare: give a-b pairs of method names, not {args.compare!r}")
    stats, per_seed = {}, {}
    teacher = args.runs / "teacher" / "eval" / "metrics.json"
    if teacher.is_file():
        print(f"teacher: {json.loads(teacher.read_text())['avg'][args.metric]:.2f}")
    print(f"| Method | {args.metric} mean ± SE | runs (each the mean over sampling seeds) | train s (mean) |\n"
          "|---|:---:|---|---:|")
    for method in methods:
        scores = run_scores(args.runs, method, args.metric)
        if not scores:
            print(f"| {method} | (no evaluated run) | |")
            continue
        stats[method], per_seed[method] = summary(list(scores.values())), scores
        listed = ", ".join(f"{seed} {value:.2f}" for seed, value in scores.items())
        seconds = train_seconds(args.runs, method)
        mean_seconds = f"{sum(seconds) / len(seconds):.0f}" if seconds else "—"
        print(f"| {method} | {stats[method][0]:.2f} ± {stats[method][1]:.2f} | {listed} | {mean_seconds} |")
    print()
    for a, b in comparisons:
        if a in stats and b in stats:
            (mean_a, se_a), (mean_b, se_b) = stats[a], stats[b]
            difference, se = mean_a - mean_b, math.hypot(se_a, se_b)
            in_se = f"{difference / se:+.2f} SE" if se > 0 else "n/a SE"
            seeds = sorted(set(per_seed[a]) & set(per_seed[b]))
            paired = ""
            if len(seeds) > 1:
                paired_mean, paired_se = summary([per_seed[a][seed] - per_seed[b][seed] for seed in seeds])
                paired = f"; paired over {len(seeds)} seeds {paired_mean:+.2f} ± {paired_se:.2f}"
            print(f"{a} − {b}: {difference:+.2f} {args.metric} = {in_se} (SE of the difference {se:.2f}){paired}")


if __name__ == "__main__":
    main()
