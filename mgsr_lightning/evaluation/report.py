"""Table 1 of the paper (markdown) and a bar chart of the same numbers, from per-run metric dicts.

A *run* is the ``metrics.json`` that :func:`mgsr_lightning.evaluation.evaluate.evaluate_model`
writes for one trained model, with a ``method`` key naming its row::

    {"method": "MGSR", "sets": {"dolly": {"rougeL_per_seed": [..5 values..], ...}, ...}, "config": {"seeds": [...]}}

Layout (rows = methods in order of first appearance; columns = the evaluation sets present, known
sets in the paper's order DollyEval, SelfInst, Vicuna, S-NI, UnNI, then others; ``Avg`` when there
are at least two sets; with ``exact_match=True`` one exact-match column per set after ``Avg``).

Each cell is "mean ± std" of ROUGE-L ×100:

- a method with **several training runs**: each run's score is its mean over the sampling seeds;
  the cell is the mean ± sample std of those run scores across runs;
- a method with **one run**: mean ± sample std across its sampling seeds.

``Avg`` is computed per run (per seed) as the mean over the set columns, then aggregated the same
way; it is left empty ("–") for a method missing any set. The best mean of each column is bold.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgsr_lightning.atomic import atomic_path, write_text
from mgsr_lightning.evaluation.readers import EVAL_SETS

AVG_COLUMN = "Avg"
MISSING = "–"


@dataclass(frozen=True)
class Cell:
    """One table cell: ``std`` is None when there is a single value to aggregate."""

    mean: float
    std: float | None


@dataclass(frozen=True)
class Column:
    """A table column: ``metric`` is ``rougeL`` or ``exact_match``; ``set_name`` None for ``Avg``."""

    header: str
    metric: str
    set_name: str | None


@dataclass
class Table:
    """Columns, and per method (row order kept) the cells by column header, plus runs per method."""

    columns: list[Column]
    cells: dict[str, dict[str, Cell]]
    runs_per_method: dict[str, int]
    sampling_seeds: list[int] | None


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean (sample std / √n) of ``values``, e.g. one score per
    training seed; the error is None for a single value."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None


def _mean_std(values: Sequence[float]) -> Cell:
    return Cell(statistics.fmean(values), statistics.stdev(values) if len(values) >= 2 else None)


def _per_seed(run: Mapping[str, Any], set_name: str, metric: str) -> list[float] | None:
    """A run's per-seed scores on a set (its single mean if per-seed values are absent)."""
    result = run["sets"].get(set_name)
    if result is None or metric not in result:
        return None
    return list(result.get(f"{metric}_per_seed") or [result[metric]])


def _column_per_seed(run: Mapping[str, Any], column: Column, set_columns: Sequence[Column]) -> list[float] | None:
    """Per-seed scores of a run in a column; for ``Avg``, the per-seed mean over the set columns."""
    if column.set_name is not None:
        return _per_seed(run, column.set_name, column.metric)
    per_set = [_per_seed(run, c.set_name, c.metric) for c in set_columns]
    if any(values is None for values in per_set) or len({len(values) for values in per_set}) != 1:
        return None
    return [statistics.fmean(seed_values) for seed_values in zip(*per_set)]


def _set_order(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    present = [name for run in runs for name in run["sets"]]
    known = [name for name in EVAL_SETS if name in present]
    others = list(dict.fromkeys(name for name in present if name not in EVAL_SETS))
    return known + others


def summarize_runs(runs: Sequence[Mapping[str, Any]], *, exact_match: bool = False) -> Table:
    """Aggregate per-run metric dicts (each with ``method`` and ``sets``) into Table 1's cells."""
    if not runs:
        raise ValueError("no runs to report")
    missing_method = [i for i, run in enumerate(runs) if not run.get("method")]
    if missing_method:
        raise ValueError(f"runs {missing_method} have no 'method' key naming their table row")
    set_names = _set_order(runs)
    display = {name: EVAL_SETS[name].display_name if name in EVAL_SETS else name for name in set_names}
    set_columns = [Column(display[name], "rougeL", name) for name in set_names]
    columns = list(set_columns)
    if len(set_columns) >= 2:
        columns.append(Column(AVG_COLUMN, "rougeL", None))
    if exact_match:
        columns += [Column(f"{display[name]} EM", "exact_match", name) for name in set_names]

    runs_by_method: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        runs_by_method.setdefault(run["method"], []).append(run)
    cells: dict[str, dict[str, Cell]] = {}
    for method, method_runs in runs_by_method.items():
        cells[method] = {}
        for column in columns:
            per_run = [_column_per_seed(run, column, set_columns) for run in method_runs]
            if any(values is None for values in per_run):
                continue
            if len(per_run) == 1:
                cells[method][column.header] = _mean_std(per_run[0])
            else:
                cells[method][column.header] = _mean_std([statistics.fmean(values) for values in per_run])
    seeds = runs[0].get("config", {}).get("seeds")
    return Table(columns, cells, {m: len(r) for m, r in runs_by_method.items()}, seeds)


def format_table1(runs: Sequence[Mapping[str, Any]], *, exact_match: bool = False, digits: int = 2) -> str:
    """Markdown Table 1: ``| Method | DollyEval | ... | Avg |`` with "mean ± std" cells and a footnote."""
    table = summarize_runs(runs, exact_match=exact_match)
    headers = ["Method"] + [column.header for column in table.columns]
    best = {
        column.header: max((row[column.header].mean for row in table.cells.values() if column.header in row),
                           default=None)
        for column in table.columns
    }
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + [":---:"] * len(table.columns)) + "|"]
    for method, row in table.cells.items():
        rendered = [method]
        for column in table.columns:
            cell = row.get(column.header)
            if cell is None:
                rendered.append(MISSING)
                continue
            text = f"{cell.mean:.{digits}f}" + ("" if cell.std is None else f" ± {cell.std:.{digits}f}")
            is_best = len(table.cells) > 1 and round(cell.mean, digits) == round(best[column.header], digits)
            rendered.append(f"**{text}**" if is_best else text)
        lines.append("| " + " | ".join(rendered) + " |")
    seeds = ", ".join(str(s) for s in table.sampling_seeds) if table.sampling_seeds else "see metrics.json"
    runs_note = ", ".join(f"{method} {count}" for method, count in table.runs_per_method.items())
    lines += [
        "",
        "ROUGE-L F ×100 (rouge-score, Porter stemming, max over references)"
        f"{'; EM = exact match ×100' if exact_match else ''}. "
        f"Cells: mean ± std. Methods with several training runs: std across runs, each run scored as its mean over "
        f"sampling seeds {seeds}; methods with one run: std across those sampling seeds. Training runs: {runs_note}.",
    ]
    return "\n".join(lines) + "\n"


def plot_table1(runs: Sequence[Mapping[str, Any]], path: str | Path, *, exact_match: bool = False,
                title: str | None = None) -> Path:
    """A PNG grouped bar chart of Table 1 (bars = methods, groups = columns, error bars = the ± std).

    ROUGE-L columns go in one panel, exact-match columns (``exact_match=True``) in a second. Uses the
    Agg canvas directly, so no pyplot state or display is touched.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("the chart needs matplotlib: pip install 'mgsr-lightning[plot]'") from error

    table = summarize_runs(runs, exact_match=exact_match)
    panels = [("ROUGE-L", [c for c in table.columns if c.metric == "rougeL"])]
    if exact_match:
        panels.append(("Exact match", [c for c in table.columns if c.metric == "exact_match"]))
    methods = list(table.cells)
    bar_width = 0.8 / len(methods)
    figure = Figure(figsize=(max(6.0, 1.2 * len(table.columns) + 2), 4.0 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)
    for panel_index, (ylabel, columns) in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, panel_index + 1)
        for method_index, method in enumerate(methods):
            row = table.cells[method]
            offset = (method_index - (len(methods) - 1) / 2) * bar_width
            present = [(i, row[c.header]) for i, c in enumerate(columns) if c.header in row]  # missing cells: no bar
            axes.bar([i + offset for i, _ in present], [cell.mean for _, cell in present], bar_width,
                     yerr=[cell.std or 0.0 for _, cell in present], capsize=3, label=method)
        axes.set_xticks(range(len(columns)), [c.header for c in columns])
        axes.set_ylabel(f"{ylabel} (×100)")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
        axes.grid(axis="y", alpha=0.3)
    if title:
        figure.suptitle(wrapped_title(title, figure.get_figwidth()))
    path = Path(path)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=150, format=path.suffix.lstrip(".") or "png")
    return path


def wrapped_title(title: str, width_inches: float) -> str:
    """``title`` broken into lines that fit a figure ``width_inches`` wide (about 9 characters an inch at
    matplotlib's default title size), so a long pair name is not cut off at the figure's edges."""
    return textwrap.fill(title, width=max(20, int(9 * width_inches)))


def write_report(runs: Sequence[Mapping[str, Any]], output_dir: str | Path, *, exact_match: bool = False,
                 title: str | None = None) -> dict[str, Path]:
    """Write ``table.md`` and ``chart.png`` into ``output_dir``; returns their paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table_path = output_dir / "table.md"
    heading = f"# {title}\n\n" if title else ""
    write_text(table_path, heading + format_table1(runs, exact_match=exact_match))
    chart_path = plot_table1(runs, output_dir / "chart.png", exact_match=exact_match, title=title)
    return {"table": table_path, "chart": chart_path}
