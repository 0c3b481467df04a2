"""The ``table`` command: several ``evaluate`` outputs merged into one Table-1-style markdown table and chart."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mgsr_lightning.cli import validation
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.evaluation.report import write_report

# what must agree between runs for their numbers to share a table
PROTOCOL_KEYS = ("seeds", "sampling", "max_prompt_length", "max_examples", "template")


def _row_order(path: Path) -> tuple[int, str]:
    """Known methods in the order of the paper's Table 1 (teacher first), then the others by name."""
    from mgsr_lightning.pipeline.labels import TABLE_ORDER

    known = list(TABLE_ORDER)
    name = path.parent.name
    return (known.index(name) if name in known else len(known), str(path))


def find_metrics(paths: Sequence[str]) -> list[Path]:
    """The ``metrics.json`` files named, or found under the folders named, in the order given
    (inside a folder: the teacher, then the methods in the order of the paper's Table 1, then others)."""
    if not paths:
        raise ConfigError("runs: give at least one `evaluate` output folder or metrics.json, e.g. --runs '[runs/eval]'")
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            inside = sorted(path.rglob("metrics.json"), key=_row_order)
            if not inside:
                raise MissingFileError(f"no metrics.json under {path}: give folders written by `evaluate`")
            if (path / "metrics.json").is_file() and len(inside) > 1:
                below = [str(found_path.parent) for found_path in inside if found_path.parent != path]
                raise ConfigError(
                    f"runs: {path} holds one model's results (its metrics.json) and also the folders of others "
                    f"({', '.join(below[:3])}{', ...' if len(below) > 3 else ''}), two evaluations mixed in one "
                    "folder; name the metrics.json files or folders to put in the table, e.g. "
                    f"--runs '[{path / 'metrics.json'}, {below[0]}]'")
            found += inside
        else:
            raise MissingFileError(
                f"runs: {validation.describe_missing(path)} (give `evaluate` output folders or their metrics.json)"
            )
    return list(dict.fromkeys(found))


def _protocol(run: Mapping[str, Any]) -> dict[str, Any]:
    config = run.get("config", {})
    sets = {name: result.get("records_sha256") for name, result in run.get("sets", {}).items()}
    return {**{key: config.get(key) for key in PROTOCOL_KEYS}, "rows": sets}


def check_same_protocol(runs: Sequence[Mapping[str, Any]], sources: Sequence[Path]) -> None:
    """Refuse to put runs side by side that were scored on other sets or rows, or with another protocol."""
    reference = _protocol(runs[0])
    for run, source in zip(runs[1:], sources[1:]):
        protocol = _protocol(run)
        if set(protocol["rows"]) != set(reference["rows"]):
            raise ConfigError(f"{source} was scored on the sets {sorted(protocol['rows'])} but {sources[0]} on "
                              f"{sorted(reference['rows'])}; one table compares runs on the same sets: evaluate them "
                              "on the same --sets, or make one table per set of sets")
        differing = [key for key in reference if key != "rows" and protocol[key] != reference[key]]
        shared = set(reference["rows"]) & set(protocol["rows"])
        differing += [f"rows of {name}" for name in sorted(shared) if reference["rows"][name] != protocol["rows"][name]]
        if differing:
            details = ", ".join(f"{key}: {reference.get(key)} vs {protocol.get(key)}" if key in reference else key
                                for key in differing)
            raise ConfigError(f"{source} was evaluated differently from {sources[0]} ({details}); its scores are not "
                              "comparable: evaluate both the same way")


def write_table(runs: Sequence[Mapping[str, Any]], out: Path, title: str | None = None) -> dict[str, Path]:
    """``table.md`` and ``chart.png`` in ``out`` (exact-match columns included); prints the table."""
    paths = write_report(runs, out, exact_match=True, title=title)
    print(paths["table"].read_text())
    print(f"table: {paths['table']}\nchart: {paths['chart']}")
    return paths


def table(runs: list[str], out: str, title: str | None = None) -> None:
    """Merge ``evaluate`` outputs into one Table-1-style table (``table.md``) and bar chart (``chart.png``).

    Rows are the runs' labels (a label evaluated several times, e.g. one per training seed, becomes
    one row with the std across runs); columns are the evaluation sets, their average and exact match.

    Args:
        runs: ``evaluate`` output folders or their ``metrics.json`` files; a folder is searched for every
            ``metrics.json`` below it.
        out: Folder for ``table.md`` and ``chart.png``.
        title: Heading of the table and the chart.
    """
    sources = find_metrics(runs)
    validation.writable_folder("out", out)
    loaded = []
    for source in sources:
        try:
            run = json.loads(source.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            reason = f"{error.msg} at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else "not UTF-8"
            raise ConfigError(f"{source} is not valid JSON ({reason}): cut short or edited; evaluate that model "
                              "again (into a new --out) or leave it out of --runs") from None
        if not isinstance(run, dict) or not isinstance(run.get("sets"), dict):
            raise ConfigError(f"{source} is not a metrics.json written by `evaluate`")
        loaded.append({**run, "method": run.get("method") or source.parent.name})
    check_same_protocol(loaded, sources)
    write_table(loaded, Path(out), title)
