"""experiments/acceptance.py: per-method mean ± SE over training seeds and the differences between methods,
unpaired and paired by seed, from the metrics files ``reproduce`` writes."""

import json
import math
import runpy
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "acceptance.py"


def write_runs(root: Path, scores: dict[str, list[float]]) -> None:
    for method, values in scores.items():
        for seed, value in enumerate(values):
            folder = root / method / f"seed{seed}" / "eval"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"avg": {"rougeL": value, "exact_match": 0.0}}))


def run(argv: list[str], capsys) -> str:
    main = runpy.run_path(str(SCRIPT))["main"]
    main(argv)
    return capsys.readouterr().out


def test_unpaired_and_paired_differences(tmp_path, capsys):
    # b is a plus a seed-specific offset; the paired difference sees the constant gap the unpaired one blurs
    a, b = [27.0, 28.0, 29.5], [27.5, 28.4, 30.1]
    write_runs(tmp_path, {"a": a, "b": b})
    out = run([str(tmp_path), "--methods", "a,b", "--compare", "b-a"], capsys)
    se_a, se_b = (statistics.stdev(v) / math.sqrt(3) for v in (a, b))
    difference = statistics.fmean(b) - statistics.fmean(a)
    gaps = [y - x for x, y in zip(a, b)]
    paired_se = statistics.stdev(gaps) / math.sqrt(3)
    assert f"| a | {statistics.fmean(a):.2f} ± {se_a:.2f} |" in out
    assert f"b − a: {difference:+.2f} rougeL = {difference / math.hypot(se_a, se_b):+.2f} SE" in out
    assert f"paired over 3 seeds {statistics.fmean(gaps):+.2f} ± {paired_se:.2f}" in out


def test_default_comparisons_and_missing_method(tmp_path, capsys):
    write_runs(tmp_path, {"sft": [27.0, 27.2], "kd": [27.5, 27.9]})
    out = run([str(tmp_path), "--methods", "sft,kd,distillm"], capsys)
    assert "| distillm | (no evaluated run) | |" in out
    assert "kd − sft: +0.60 rougeL" in out
    assert "distillm −" not in out


def test_malformed_compare_is_refused(tmp_path, capsys):
    write_runs(tmp_path, {"sft": [27.0, 27.2]})
    with pytest.raises(SystemExit):
        run([str(tmp_path), "--compare", "sft"], capsys)
    assert "give a-b pairs" in capsys.readouterr().err
