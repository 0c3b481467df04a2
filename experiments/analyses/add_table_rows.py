"""Add trained runs to a committed results table: ``runs.json`` gains their evaluations, ``table.md`` and
``chart.png`` are rewritten from it.

    python experiments/analyses/add_table_rows.py experiments/results/facts \\
        --rows "MiniLLM=runs/reproduce-facts/minillm" --after KD

Each ``Label=folder`` adds ``folder/seed<k>/eval/metrics.json`` of every training seed found (as ``reproduce``
and ``experiments/analyses/sweep.py`` write them), relabelled, and ``folder/seed<k>/train_seconds.txt`` to the
training times. A label already in the table is replaced, so the command can be run again as more seeds finish.
Rows scored under another protocol (rows, sampling seeds, lengths) than the table's are refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mgsr_lightning.evaluation.report import write_report  # noqa: E402
from mgsr_lightning.pipeline.table import check_same_protocol  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="folder holding runs.json (rewritten with table.md, chart.png)")
    parser.add_argument("--rows", required=True, help="Label=folder, comma-separated")
    parser.add_argument("--after", default=None, help="put the new rows after this label's (default: at the end)")
    parser.add_argument("--title", default=None, help="the table's heading (default: the current table.md's)")
    args = parser.parse_args(argv)

    runs_path = args.results / "runs.json"
    committed = json.loads(runs_path.read_text())
    runs, seconds = committed["runs"], committed.get("train_seconds", {})
    sources = [runs_path] * len(runs)
    for spec in args.rows.split(","):
        label, folder = spec.split("=", 1)
        folder = Path(folder)
        metrics = sorted(folder.glob("seed*/eval/metrics.json"))
        if not metrics:
            raise SystemExit(f"error: no seed*/eval/metrics.json under {folder}")
        kept = [i for i, run in enumerate(runs) if run["method"] != label]
        runs, sources = [runs[i] for i in kept], [sources[i] for i in kept]
        labels = [run["method"] for run in runs]
        at = len(labels) - labels[::-1].index(args.after) if args.after in labels else len(runs)
        for path in metrics:
            run = json.loads(path.read_text())
            run["method"] = label
            runs.insert(at, run)
            sources.insert(at, path)
            at += 1
            timing = path.parent.parent / "train_seconds.txt"
            key = f"{folder.name}/{path.parent.parent.name}"
            seconds[key] = timing.read_text().strip() if timing.is_file() else "?"
    check_same_protocol(runs, sources)
    title = args.title
    if title is None and (args.results / "table.md").is_file():
        first = (args.results / "table.md").read_text().splitlines()[0]
        title = first[2:] if first.startswith("# ") else None
    runs_path.write_text(json.dumps({"runs": runs, "train_seconds": seconds}, indent=1) + "\n")
    paths = write_report(runs, args.results, exact_match=True, title=title)
    print(paths["table"].read_text())


if __name__ == "__main__":
    main()
