"""The ``table`` command merges ``evaluate`` outputs into one table and chart, and only comparable ones."""

from __future__ import annotations

import json

import pytest

from mgsr_lightning.__main__ import main
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.pipeline.table import table

CONFIG = {"seeds": [10, 20], "sampling": {"max_new_tokens": 24}, "max_prompt_length": 48, "max_examples": None,
          "template": "plain"}


def write_metrics(folder, method, rouge_per_seed, config=CONFIG, rows="abc"):
    folder.mkdir(parents=True, exist_ok=True)
    result = {"rougeL": sum(rouge_per_seed) / 2, "rougeL_per_seed": rouge_per_seed, "exact_match": 0.0,
              "exact_match_per_seed": [0.0, 0.0], "records_sha256": rows}
    (folder / "metrics.json").write_text(json.dumps({"method": method, "sets": {"test": result}, "config": config}))


def test_table_merges_evaluations_into_markdown_and_png(tmp_path, capsys):
    write_metrics(tmp_path / "a" / "sft", "SFT", [40.0, 42.0])
    write_metrics(tmp_path / "a" / "teacher", "Teacher", [70.0, 72.0])
    write_metrics(tmp_path / "b" / "sft", "SFT", [44.0, 46.0])  # a second training seed of SFT
    main(["table", "--runs", f"[{tmp_path / 'a'}, {tmp_path / 'b' / 'sft' / 'metrics.json'}]",
          "--out", str(tmp_path / "t"), "--title", "My data"])
    text = (tmp_path / "t" / "table.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[0] == "| Method | test | test EM |"
    assert lines[1].startswith("| Teacher | **71.00 ± 1.41** |")
    assert lines[2].startswith("| SFT | 43.00 ± 2.83 |")  # the std across the two runs' means (41, 45)
    assert "Training runs: Teacher 1, SFT 2" in text and text.startswith("# My data")
    assert (tmp_path / "t" / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| Teacher | **71.00 ± 1.41** |" in capsys.readouterr().out


def test_table_refuses_runs_scored_differently(tmp_path):
    write_metrics(tmp_path / "a", "SFT", [40.0, 42.0])
    write_metrics(tmp_path / "b", "KD", [40.0, 42.0], config={**CONFIG, "template": "alpaca"})
    write_metrics(tmp_path / "c", "KD", [40.0, 42.0], rows="other")
    with pytest.raises(ConfigError, match="evaluated differently .*template: plain vs alpaca"):
        table([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "t"))
    with pytest.raises(ConfigError, match="evaluated differently .*rows of test"):
        table([str(tmp_path / "a"), str(tmp_path / "c")], str(tmp_path / "t"))
    with pytest.raises(MissingFileError, match="not found"):
        table([str(tmp_path / "nope")], str(tmp_path / "t"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="no metrics.json under"):
        table([str(tmp_path / "empty")], str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()
