"""``select``: methods trained on a prepared folder, scored on validation, the best exported; resumes; refuses
a folder ``prepare`` did not make."""

from __future__ import annotations

import json
import shutil

import pytest

from mgsr_lightning.__main__ import main
from mgsr_lightning.pipeline.own_data import prepare
from mgsr_lightning.pipeline.select import last_step, paired_gain, row_scores

FIT = ["--data.batch_size=8", "--model.init_args.validation.rouge_examples=8", "--trainer.enable_progress_bar=false"]


@pytest.fixture
def prepared(tmp_path, user_data):
    root = tmp_path / "root"
    prepare(data=str(user_data["train"].parent), out=str(root), vocab_size=300, teacher_steps=2, init_steps=2)
    return root


def run_select(root, *extra: str) -> None:
    main(["select", "--root", str(root), "--methods", "[sft, kd]", "--max_steps", "3", "--seeds", "[10, 20]",
          "--parallel", "2", "--progress_every", "0.2", "--fit_args", json.dumps(FIT), *extra])


def test_select_trains_scores_exports_the_best_and_resumes(prepared, capsys):
    run_select(prepared)
    printed = capsys.readouterr().out
    selection = json.loads((prepared / "students" / "best" / "selection.json").read_text())
    assert selection["tried"] == ["sft", "kd"] and selection["split"] == "validation"
    scores = {method: selection["scores"][method]["rougeL"] for method in ("sft", "kd")}
    assert selection["winner"] == max(scores, key=scores.get)
    assert (prepared / "students" / "best" / "config.json").is_file()
    assert "select: sft trained" in printed and "select: kd trained" in printed
    assert f"the best on validation is {selection['winner']}" in printed
    table = (prepared / "select" / "table.md").read_text()
    assert "| SFT |" in table and "| KD |" in table
    assert (prepared / "select" / "chart.png").read_bytes()[:4] == b"\x89PNG"
    for method in ("sft", "kd"):  # every method started from the folder's SFT-initialised student
        config = next((prepared / "select" / method).glob("logs/version_*/config.yaml")).read_text()
        assert str(prepared / "init") in config
        assert last_step(prepared / "select" / method) == 3

    # interrupted: kd killed after its checkpoint, before its export; sft finished
    sft_written = (prepared / "select" / "sft" / "hf" / "config.json").stat().st_mtime_ns
    checkpoints = next((prepared / "select" / "kd").glob("logs/version_*/checkpoints"))
    shutil.copyfile(next(checkpoints.glob("best-*.ckpt")), checkpoints / "last.ckpt")
    shutil.rmtree(prepared / "select" / "kd" / "hf")
    run_select(prepared)
    capsys.readouterr()
    assert (prepared / "select" / "sft" / "hf" / "config.json").stat().st_mtime_ns == sft_written  # not retrained
    assert "resuming from" in (prepared / "select" / "kd" / "train.log").read_text()
    assert (prepared / "select" / "kd" / "hf" / "config.json").is_file()


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_select_refuses_a_folder_prepare_did_not_make(tmp_path, make, capsys):
    root = tmp_path / "root"
    if make == "empty":
        root.mkdir()
    with pytest.raises(SystemExit) as exited:
        main(["select", "--root", str(root)])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "prepare" in error[0] and str(root) in error[0]


def test_select_refuses_an_empty_method_list_and_an_unknown_method(prepared, capsys):
    for methods, expected in (("[]", "at least one method"), ("[sft, nonsense]", "nonsense")):
        with pytest.raises(SystemExit) as exited:
            main(["select", "--root", str(prepared), "--methods", methods])
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err


def test_paired_gain_is_the_mean_and_standard_error_of_row_differences():
    winner, reference = {0: 50.0, 1: 40.0, 2: 30.0, 3: 99.0}, {0: 45.0, 1: 41.0, 2: 30.0}
    mean, error = paired_gain(winner, reference)
    differences = [5.0, -1.0, 0.0]  # row 3 is not shared
    assert mean == pytest.approx(sum(differences) / 3)
    variance = sum((d - mean) ** 2 for d in differences) / 2
    assert error == pytest.approx((variance / 3) ** 0.5)


def test_row_scores_average_each_row_over_sampling_seeds(tmp_path):
    rows = [{"index": 0, "seed": 10, "rougeL": 10.0}, {"index": 0, "seed": 20, "rougeL": 30.0},
            {"index": 1, "seed": 10, "rougeL": 5.0}]
    (tmp_path / "generations.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert row_scores(tmp_path) == {0: 20.0, 1: 5.0}
