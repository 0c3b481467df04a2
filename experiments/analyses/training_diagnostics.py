"""Summarise and plot what happened inside training runs: SCRG's corrections, DAC-KL's bounds, the regime.

Reads every ``metrics.csv`` (Lightning's CSVLogger) below the given folders, groups the runs by method
(the folder right under each given root, as ``make reproduce`` lays them out: <root>/<method>/seed<k>/logs/...),
prints one markdown row per method with each diagnostic averaged over training steps and then over
runs, and draws the diagnostics over training steps (mean over a method's runs) to a PNG.

    python experiments/analyses/training_diagnostics.py runs/reproduce-tiny \\
        --out experiments/results/tiny/diagnostics.png
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

# (column, heading); a method shows the ones its runs logged.
COLUMNS = [
    ("scrg/corrected_fraction", "SCRG rows corrected"),
    ("scrg/mean_error_position", "SCRG error position"),
    ("scrg/mean_regenerated_tokens", "SCRG tokens re-generated"),
    ("scrg/regenerated_share", "SCRG re-generated share"),
    ("scrg/teacher_nll_before", "teacher NLL before SCRG"),
    ("scrg/teacher_nll_after", "teacher NLL after SCRG"),
    ("scrg/seconds", "SCRG s"),
    ("dac_kl/lower", "DAC-KL lower"),
    ("dac_kl/upper", "DAC-KL upper"),
    ("dac_kl/kept_mass", "DAC-KL kept mass"),
    ("source/fresh", "fresh share"),
    ("source/replay", "replay share"),
    ("source/ground_truth", "ground-truth share"),
    ("regime/threshold", "final threshold"),
    ("val/rougeL", "best val ROUGE-L"),
]
PLOTTED = ["scrg/corrected_fraction", "scrg/regenerated_share", "scrg/teacher_nll_after", "dac_kl/lower",
           "dac_kl/upper", "dac_kl/kept_mass", "source/fresh", "val/rougeL"]


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """column -> [(step, value)] for the non-empty cells of one CSVLogger file."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            step = int(float(row["step"]))
            for column, cell in row.items():
                if column not in ("step", "epoch") and cell not in ("", None):
                    series[column].append((step, float(cell)))
    add_regenerated_share(series)
    return series


def add_regenerated_share(series: dict[str, list[tuple[int, float]]]) -> None:
    """``scrg/regenerated_share``: per step, the response tokens SCRG re-generated per row over the fresh
    rollout's response tokens per row, = corrected_fraction · mean_regenerated_tokens / response_tokens
    (above 1 when later corrections re-generate tokens an earlier one wrote)."""
    columns = ("scrg/corrected_fraction", "scrg/mean_regenerated_tokens", "rollout/response_tokens")
    if not all(column in series for column in columns):
        return
    corrected, regenerated, response = (dict(series[column]) for column in columns)
    series["scrg/regenerated_share"] = [
        (step, corrected[step] * regenerated[step] / response[step])
        for step in sorted(set(corrected) & set(regenerated) & set(response)) if response[step] > 0
    ]


def summarise(series: dict[str, list[tuple[int, float]]], column: str) -> float | None:
    points = series.get(column)
    if not points:
        return None
    values = [value for _, value in points]
    if column == "regime/threshold":
        return values[-1]
    if column == "val/rougeL":
        return max(values)
    return sum(values) / len(values)


def runs_by_method(roots: list[Path]) -> dict[str, list[dict[str, list[tuple[int, float]]]]]:
    methods: dict[str, list] = defaultdict(list)
    for root in roots:
        for path in sorted(root.rglob("metrics.csv")):
            method = path.relative_to(root).parts[0] if path.parent != root else root.name
            methods[method].append(read_metrics(path))
    if not methods:
        raise SystemExit(f"no metrics.csv below {', '.join(map(str, roots))}")
    return methods


def table(methods: dict[str, list]) -> str:
    shown = [(c, h) for c, h in COLUMNS if any(c in run for runs in methods.values() for run in runs)]
    lines = ["| Method | runs | " + " | ".join(h for _, h in shown) + " |", "|---|:---:|" + ":---:|" * len(shown)]
    for method, runs in methods.items():
        cells = []
        for column, _ in shown:
            values = [v for v in (summarise(run, column) for run in runs) if v is not None]
            cells.append(f"{sum(values) / len(values):.3g}" if values else "")
        lines.append(f"| {method} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(methods: dict[str, list], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [c for c in PLOTTED if any(c in run for runs in methods.values() for run in runs)]
    n_cols = 3
    n_rows = math.ceil(len(columns) / n_cols)
    figure, axes = plt.subplots(n_rows, n_cols, figsize=(4.2 * n_cols, 3.2 * n_rows), squeeze=False)
    palette = plt.get_cmap("tab20" if len(methods) > 10 else "tab10")
    colours = {method: palette(i % palette.N) for i, method in enumerate(methods)}
    for axis, column in zip(axes.flat, columns):
        for method, runs in methods.items():
            by_step: dict[int, list[float]] = defaultdict(list)
            for run in runs:
                for step, value in run.get(column, []):
                    by_step[step].append(value)
            if not by_step:
                continue
            steps = sorted(by_step)
            means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
            if column.startswith(("scrg/", "source/")) and len(steps) > 20:  # per-step 0/1-like: smooth
                window = max(len(steps) // 20, 1)
                means = [sum(means[max(0, i - window + 1) : i + 1]) / len(means[max(0, i - window + 1) : i + 1])
                         for i in range(len(means))]
            axis.plot(steps, means, color=colours[method], marker="o" if len(steps) < 20 else None, markersize=3)
        axis.set_title(column)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(columns) :]:
        axis.axis("off")
    handles = [plt.Line2D([], [], color=colours[method]) for method in methods]
    figure.legend(handles, list(methods), loc="lower center", ncol=min(len(methods), 6), fontsize=8)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path, help="folders holding <method>/.../metrics.csv")
    parser.add_argument("--methods", default=None, help="comma-separated subset of methods, in this order")
    parser.add_argument("--out", type=Path, default=None, help="PNG of the diagnostics over training steps")
    args = parser.parse_args()
    methods = runs_by_method(args.roots)
    if args.methods:
        wanted = args.methods.split(",")
        missing = [m for m in wanted if m not in methods]
        if missing:
            raise SystemExit(f"no runs for {missing}; found {sorted(methods)}")
        methods = {m: methods[m] for m in wanted}
    print(table(methods))
    if args.out:
        plot(methods, args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
