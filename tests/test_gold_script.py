"""experiments/cross_tokenizer/gold.py (TRL's GOLD on a cross-tokenizer pair, scored by our evaluator): what it
refuses, the rows it gives GOLD, how it reads GOLD's process and what it writes to gold.json, with a stand-in for
TRL's interpreter; end to end with TRL in a slow test."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "cross_tokenizer" / "gold.py"
TRL_PYTHON = REPO / ".venv-bench" / "bin" / "python"  # make bench creates it


@pytest.fixture(scope="module")
def gold():
    return runpy.run_path(str(SCRIPT))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Folders gold.py checks before running GOLD: facts rows, and two model folders (config and tokenizer only:
    the stand-in interpreter never loads weights)."""
    from transformers import GPT2Config

    from mgsr_lightning.data.records import read_jsonl
    from mgsr_lightning.data.tasks.knowledge import write_facts_dataset
    from mgsr_lightning.models.tokenizer import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("gold_pair")
    write_facts_dataset(root / "data", {"train": 40, "validation": 4, "test": 4}, seed=0)
    texts = [row["instruction"] + "\n" + row["output"] for row in read_jsonl(root / "data" / "train.jsonl")]
    for side, size in (("student", 300), ("teacher", 330)):
        tokenizer = train_bpe_tokenizer(texts * 3 if side == "student" else texts[::-1] * 3, vocab_size=size,
                                        save_dir=root / side)
        GPT2Config(vocab_size=len(tokenizer), n_layer=1, n_embd=16, n_head=2).save_pretrained(root / side)
    return root


def arguments(pair: Path, out: Path, *extra: str) -> list[str]:
    return ["--teacher", str(pair / "teacher"), "--student", str(pair / "student"), "--data", str(pair / "data"),
            "--steps", "3", "--batch-size", "2", "--out", str(out), *extra]


def stand_in(folder: Path, output: str, status: int) -> Path:
    """An executable that prints ``output`` and exits with ``status``, in place of TRL's interpreter."""
    path = folder / "python"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {status}\n")
    path.chmod(0o755)
    return path


def one_line_error(gold, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        gold["main"](argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


@pytest.mark.parametrize(("extra", "message"), [
    (("--steps", "0"), "--steps must be at least 1, got 0"),
    (("--max-new-tokens", "136"), "--max-new-tokens (136) must be under --max-length (136)"),
    (("--set", "lmbda"), "--set 'lmbda': expected KEY=VALUE"),
    (("--seeds", "10,x"), "--seeds: comma-separated integers"),
])
def test_bad_arguments_are_one_line(gold, pair, tmp_path, capsys, extra, message):
    err = one_line_error(gold, arguments(pair, tmp_path / "out", *extra), capsys)
    assert message in err
    assert not (tmp_path / "out").exists()


def test_missing_folders_are_one_line(gold, pair, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((pair / "teacher" / "config.json").read_text())
    argv = arguments(pair, tmp_path / "out")
    argv[argv.index("--teacher") + 1] = str(bare)
    assert "no tokenizer.json" in one_line_error(gold, argv, capsys)
    argv[argv.index("--teacher") + 1] = str(tmp_path / "nowhere")
    assert "not a model folder (no config.json)" in one_line_error(gold, argv, capsys)
    argv = arguments(pair, tmp_path / "out")
    argv[argv.index("--data") + 1] = str(bare)
    assert "no student_train.jsonl or train.jsonl" in one_line_error(gold, argv, capsys)


def test_overrides_read_json_values_else_strings(gold):
    assert gold["gold_overrides"](["lmbda=1.0", "use_vllm=false", "uld_hybrid_matched_weight=null",
                                   "uld_token_merge_strategy=bayesian"]) == {
        "lmbda": 1.0, "use_vllm": False, "uld_hybrid_matched_weight": None, "uld_token_merge_strategy": "bayesian"}


def test_worker_output_is_read_as_a_result_or_a_reason(gold):
    assert gold["worker_result"](0, 'noise\nRESULT {"seconds_per_step": 0.5}\n', "") == {"seconds_per_step": 0.5}
    with pytest.raises(gold["GoldFailed"], match="^ValueError: tokenizer refused$"):
        gold["worker_result"](1, "FAILED ValueError: tokenizer refused\n", "Traceback ...")
    crash = "Traceback (most recent call last):\n  File x\nRuntimeError: index out of range\nwarning: bye\n"
    with pytest.raises(gold["GoldFailed"], match=r"exited with status -9: RuntimeError: index out of range$"):
        gold["worker_result"](-9, "", crash)


def test_summary_of_a_result_and_of_a_failure(gold, pair, tmp_path):
    args = gold["parse_args"](arguments(pair, tmp_path / "out", "--seeds", "10,20"))
    result = {"seconds_per_step": 0.25, "timed_steps": 2, "on_policy_steps": 1, "peak_rss_mib": 512.0,
              "threads": 1, "versions": {"trl": "1.16.0"}, "settings": {"lmbda": 0.5, "use_uld_loss": True},
              "train_loss": [0.3, 0.2, 0.1]}
    metrics = {"sets": {"test": {"rougeL": 31.5, "rougeL_std": 1.25, "rougeL_per_seed": [30.6, 32.4],
                                 "exact_match": 2.0, "num_examples": 4}}}
    record = gold["summary"](args, result, metrics, {"kept": 40})
    assert record["status"] == "ok" and record["steps_per_s"] == 4.0 and record["peak_rss_mib"] == 512.0
    assert (record["rougeL"], record["rougeL_std"], record["rougeL_per_seed"]) == (31.5, 1.25, [30.6, 32.4])
    assert record["gold_settings"] == {"lmbda": 0.5, "use_uld_loss": True} and record["versions"]["trl"] == "1.16.0"
    assert record["sampling_seeds"] == [10, 20] and record["test_rows"] == 4
    assert record["train_file"].endswith("train.jsonl")
    failed = gold["summary"](args, None, None, {"kept": 40}, reason="ValueError: no offsets")
    assert failed["status"] == "failed" and failed["reason"] == "ValueError: no offsets"
    assert "rougeL" not in failed and "steps_per_s" not in failed


def test_a_failure_of_gold_is_one_line_and_its_reason_is_written(gold, pair, tmp_path, capsys):
    from mgsr_lightning.data.records import read_jsonl
    from mgsr_lightning.data.templates import render_prompt

    python = stand_in(tmp_path, "FAILED ValueError: the teacher's tokenizer has no offsets", 1)
    out = tmp_path / "out"
    err = one_line_error(gold, arguments(pair, out, "--trl-python", str(python), "--max-prompt-length", "12"), capsys)
    assert "GOLD did not run on this pair: ValueError: the teacher's tokenizer has no offsets" in err
    record = json.loads((out / "gold.json").read_text())
    assert record["status"] == "failed" and record["reason"] == "ValueError: the teacher's tokenizer has no offsets"
    # GOLD's rows: the data module's, prompts rendered by the package's template, long prompts dropped
    rows = [json.loads(line) for line in (out / "gold_train.jsonl").read_text().splitlines()]
    records = read_jsonl(pair / "data" / "train.jsonl")
    assert record["training_rows"]["kept"] == len(rows) and record["training_rows"]["dropped_long_prompt"] > 0
    expected = {render_prompt(r, "plain"): r["output"] for r in records}
    assert all(expected[row["prompt"]] == row["completion"] and row["prompt"].endswith("\n") for row in rows)
    spec = json.loads((out / "gold_worker.json").read_text())
    assert spec["config"]["use_uld_loss"] and spec["config"]["uld_use_hybrid_loss"]
    assert spec["config"]["max_steps"] == 3 and spec["config"]["warmup_steps"] == 3
    assert "already holds a GOLD run" in one_line_error(gold, arguments(pair, out), capsys)


def test_no_trl_interpreter_is_the_reason(gold, pair, tmp_path, capsys):
    out = tmp_path / "out"
    err = one_line_error(gold, arguments(pair, out, "--trl-python", str(tmp_path / "none" / "python")), capsys)
    assert "no TRL interpreter at" in err
    assert json.loads((out / "gold.json").read_text())["reason"].startswith("no TRL interpreter at")


def test_relative_paths_reach_gold_from_any_working_directory(gold, pair, tmp_path, monkeypatch, capsys):
    """GOLD's process runs where the command was given: the relative --out (its worker spec inside) resolves."""
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    python = stand_ins / "python"  # $3: the worker spec's path, as gold.py passes it
    python.write_text('#!/bin/sh\nif [ -f "$3" ]; then echo "FAILED spec found at $3"; else echo "FAILED no spec"; fi\n'
                      "exit 1\n")
    python.chmod(0o755)
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["--teacher", str(pair / "teacher"), "--student", str(pair / "student"), "--data", str(pair / "data"),
            "--steps", "3", "--batch-size", "2", "--out", "out", "--trl-python", str(python)]
    err = one_line_error(gold, argv, capsys)
    assert "spec found at out/gold_worker.json" in err
    assert (work / "out" / "gold.json").is_file()


@pytest.mark.slow
def test_gold_trains_and_is_scored_on_a_tiny_cross_tokenizer_pair(tmp_path):
    if not TRL_PYTHON.is_file():
        pytest.skip(f"no TRL interpreter at {TRL_PYTHON} (make bench creates .venv-bench)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(SCRIPT.parent / "gold_smoke.py"), "--work", str(tmp_path),
                           "--trl-python", str(TRL_PYTHON)], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "gold" / "gold.json").read_text())
    assert record["status"] == "ok" and record["versions"]["trl"] == "1.16.0"
    assert record["timed_steps"] == 3 and record["steps_per_s"] > 0 and record["peak_rss_mib"] > 0
    assert record["gold_settings"]["use_uld_loss"] and record["gold_settings"]["uld_use_hybrid_loss"]
    assert len(record["rougeL_per_seed"]) == 2 and 0 <= record["rougeL"] <= 100
    # the smoke pair's vocabularies differ both ways: GOLD's exact-match part and its ULD part both carry loss
    assert len(record["train_loss"]) == 4 and any(loss > 0 for loss in record["train_unmatched_loss"])
    assert any(loss > 0 for loss in record["train_matched_loss"])
    assert (tmp_path / "gold" / "student" / "mgsr_training.json").is_file()
