"""A user's results are never lost and nothing goes silently wrong: each case of a hostile but realistic user
pass over the command line, with the line it now gets and a check that the earlier result is intact.

- an export is written only by a fit that trained and validated (or asked for its last weights by name), and
  replacing a better one says so;
- `evaluate` never replaces results already in its output folder, and `table` refuses mixed layouts and sets;
- option values Lightning would reject, empty lists, defaults that need a download offline, a truncated
  `metrics.json`, a file given as a folder and a device the machine lacks each end in one line, exit status 2;
- `prepare` names the students it left stale, and Lightning's log lines print once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_errors import KD_CONFIG, OFFLINE_ENV, REPO, error_line, files_under, fit_args, model_folder, write_rows

from mgsr_lightning.__main__ import main
from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.training.callbacks import ExportReplacesBetterWarning, ExportSkippedWarning


def contents(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in files_under(folder)}


@pytest.fixture(scope="module")
def exported(tiny_assets, tmp_path_factory):
    """A kd fit of 2 steps, validated at step 2, that exported its best student."""
    root = tmp_path_factory.mktemp("exported")
    run_cli(fit_args(tiny_assets, root / "run", f"--model.init_args.export_dir={root / 'students' / 'kd'}"))
    return root / "students" / "kd"


@pytest.fixture
def students(exported, tmp_path):
    """A copy of the exported student at ``tmp_path/students/kd``, for a fit that must leave it (or replace it)."""
    folder = tmp_path / "students" / "kd"
    shutil.copytree(exported, folder)
    return folder


def export_to(folder: Path) -> str:
    return f"--model.init_args.export_dir={folder}"


# ---- 1, 5: option values Lightning would reject, refused before any work ----------------------------

@pytest.mark.parametrize("option, expected", [
    ("--trainer.max_steps=0", "trainer.max_steps must be -1 (no step limit) or >= 1, got 0: a fit of 0 steps trains "
                              "nothing, and exports nothing"),
    ("--trainer.max_steps=-5", "trainer.max_steps must be -1 (no step limit) or >= 1, got -5"),
    ("--trainer.max_epochs=-3", "trainer.max_epochs must be -1 (no epoch limit) or >= 1, got -3"),
    ("--trainer.fast_dev_run=-1", "trainer.fast_dev_run must be true, false or a number of batches >= 0, got -1"),
    ("--trainer.accelerator=gpu", "trainer.accelerator=gpu: this machine has no such device (PyTorch finds no CUDA "
                                  "GPU); use --trainer.accelerator=cpu"),
    ("--trainer.val_check_interval=0", "trainer.val_check_interval must be > 0 (steps between validations, or a share "
                                       "of an epoch in (0, 1]), got 0; to validate never, set "
                                       "--trainer.limit_val_batches=0"),
    ("--seed_everything=-1", "seed_everything must be in [0, 2**32 - 1] (what numpy accepts), got -1"),
])
def test_trainer_values_lightning_rejects_are_one_line_before_any_work(option, expected, students, tiny_assets,
                                                                        tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.backends.mps.is_available", lambda: False)
    before = contents(students)
    line = error_line(fit_args(tiny_assets, tmp_path / "run", export_to(students), option), capsys)
    assert expected in line
    assert contents(students) == before and not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, expected", [
    ("--trainer.devices=0", "value is not a valid input using cpu accelerator."),
    ("--trainer.strategy=fsdp", "trainer: The strategy `fsdp` requires a GPU accelerator, but received "
                                "`accelerator='cpu'`"),
])
def test_a_trainer_value_only_lightning_knows_is_one_line_too(option, expected, tiny_assets, tmp_path, capsys):
    assert expected in error_line(fit_args(tiny_assets, tmp_path / "run", option), capsys)
    assert not (tmp_path / "run").exists()


# ---- 2, 4: only a fit that trained and validated exports ------------------------------------------------

def test_fast_dev_run_leaves_the_export_unchanged(students, tiny_assets, tmp_path):
    before = contents(students)
    with pytest.warns(ExportSkippedWarning, match=f"nothing exported: {students} keeps its earlier student, as "
                                                  "fast_dev_run=True is a trial of the code, not a training run"):
        run_cli(fit_args(tiny_assets, tmp_path / "run", export_to(students), "--trainer.fast_dev_run=true"))
    assert contents(students) == before


@pytest.mark.parametrize("option, reason", [
    ("--trainer.val_check_interval=100", "it validates every 100 steps (trainer.val_check_interval) and stopped at "
                                         "step 2"),
    ("--trainer.limit_val_batches=0", "trainer.limit_val_batches=0"),
])
def test_a_fit_that_never_validated_exports_nothing_and_says_so(option, reason, students, tiny_assets, tmp_path,
                                                                capsys):
    before = contents(students)
    with pytest.warns(ExportSkippedWarning, match="nothing exported") as warned:
        run_cli(fit_args(tiny_assets, tmp_path / "run", export_to(students), option))
    message = next(str(w.message) for w in warned if w.category is ExportSkippedWarning)
    assert f"as the fit never validated ({reason}), so nothing shows its student is sound" in message
    assert "--model.init_args.export_weights=last" in message
    assert f"val/rougeL by step: none, this fit never validated ({reason})" in capsys.readouterr().out
    assert contents(students) == before
    with pytest.warns(ExportSkippedWarning, match=f"{tmp_path / 'new'} was not written"):
        run_cli(fit_args(tiny_assets, tmp_path / "run2", export_to(tmp_path / "new"), option))
    assert not (tmp_path / "new").exists()


def test_last_weights_asked_by_name_are_exported_unvalidated(students, tiny_assets, tmp_path):
    before = contents(students)
    run_cli(fit_args(tiny_assets, tmp_path / "run", export_to(students), "--model.init_args.export_weights=last",
                     "--trainer.limit_val_batches=0"))
    assert contents(students) != before
    assert json.loads((students / "mgsr_training.json").read_text())["validation"] == {"step": 2, "val/rougeL": None}


@pytest.mark.parametrize("weights", ["best", "last"])
def test_replacing_a_better_export_is_said(weights, students, tiny_assets, tmp_path):
    settings = json.loads((students / "mgsr_training.json").read_text())
    assert settings["validation"]["step"] == 2 and isinstance(settings["validation"]["val/rougeL"], float)
    settings["validation"] = {"step": 400, "val/rougeL": 99.0}  # as if a longer run had exported it
    (students / "mgsr_training.json").write_text(json.dumps(settings))
    extra = ["--trainer.limit_val_batches=0"] if weights == "last" else []
    scored = "which was not validated" if weights == "last" else "which scored"
    with pytest.warns(ExportReplacesBetterWarning, match=f"{students} held a student with validation ROUGE-L 99.0 "
                                                         rf"\(step 400 of its run\); it is replaced by this run's, "
                                                         f"{scored}"):
        run_cli(fit_args(tiny_assets, tmp_path / "run", export_to(students),
                         f"--model.init_args.export_weights={weights}", *extra))
    assert json.loads((students / "mgsr_training.json").read_text())["validation"]["step"] == 2


# ---- 3, 10: evaluate never replaces results; one model is written beside the others --------------------

def evaluate_args(models: list[Path], out: Path, tiny_assets) -> list[str]:
    test_set = tiny_assets["data"] / "test.jsonl"
    return ["evaluate", "--model", f"[{', '.join(map(str, models))}]", "--sets", f"[{test_set}]", "--out", str(out),
            "--seeds", "[10]", "--template", "plain", "--max_examples", "2", "--max_new_tokens", "4",
            "--max_prompt_length", "56"]


def test_evaluate_refuses_to_replace_results_and_writes_one_model_beside_the_others(tiny_assets, tmp_path, capsys):
    a_teacher = model_folder(tiny_assets, tmp_path / "A" / "teacher")
    b_sft = model_folder(tiny_assets, tmp_path / "B" / "sft")
    c_teacher = model_folder(tiny_assets, tmp_path / "C" / "teacher")
    c_kd = model_folder(tiny_assets, tmp_path / "C" / "kd")
    out = tmp_path / "E"
    main(evaluate_args([a_teacher, b_sft], out, tiny_assets))
    before = contents(out)
    line = error_line(evaluate_args([c_teacher, b_sft], out, tiny_assets), capsys)
    assert (f"out: {out / 'teacher'} already holds results (Teacher, {out / 'teacher' / 'metrics.json'}), which "
            "evaluate never replaces: give another --out") in line
    assert contents(out) == before
    main(evaluate_args([a_teacher, b_sft], out, tiny_assets))  # the same command again (after a Ctrl-C): kept
    printed = capsys.readouterr().out
    assert f"{a_teacher}: already evaluated this way, kept in {out / 'teacher'}" in printed
    assert f"{b_sft}: already evaluated this way, kept in {out / 'sft'}" in printed
    assert contents(out) == before
    main(evaluate_args([c_kd], out, tiny_assets))  # one model: beside the others, not into E itself
    assert f"{out} holds other models' results, each in its folder: {c_kd} is written beside them" in (
        capsys.readouterr().out)
    assert not (out / "metrics.json").exists() and (out / "kd" / "metrics.json").is_file()
    assert {k: v for k, v in contents(out).items() if not k.startswith("kd/")} == before
    single = tmp_path / "F"
    main(evaluate_args([c_kd], single, tiny_assets))
    before = contents(single)
    line = error_line(evaluate_args([a_teacher, b_sft], single, tiny_assets), capsys)
    assert f"out: {single} holds the results of one model (KD) in metrics.json" in line
    assert contents(single) == before


# ---- 7, 10, 11: table refuses what it cannot read as one table ---------------------------------------------

def write_metrics(folder: Path, method: str, sets=("test",)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    result = {"rougeL": 40.0, "rougeL_per_seed": [40.0], "exact_match": 0.0, "exact_match_per_seed": [0.0],
              "records_sha256": "abc"}
    config = {"seeds": [10], "sampling": {"max_new_tokens": 8}, "max_prompt_length": 48, "max_examples": None,
              "template": "plain"}
    (folder / "metrics.json").write_text(json.dumps({"method": method, "sets": {name: result for name in sets},
                                                     "config": config}))
    return folder / "metrics.json"


def test_table_refuses_a_truncated_metrics_file(tmp_path, capsys):
    write_metrics(tmp_path / "E" / "sft", "SFT")
    cut = write_metrics(tmp_path / "E" / "kd", "KD")
    cut.write_text(cut.read_text()[:40])
    before = contents(tmp_path / "E")
    line = error_line(["table", "--runs", f"[{tmp_path / 'E'}]", "--out", str(tmp_path / "t")], capsys)
    assert f"{cut} is not valid JSON (" in line and "cut short or edited; evaluate that model again" in line
    assert contents(tmp_path / "E") == before and not (tmp_path / "t").exists()


def test_table_refuses_mixed_layouts_and_mixed_sets(tmp_path, capsys):
    write_metrics(tmp_path / "E", "Teacher")  # one model evaluated into E itself ...
    write_metrics(tmp_path / "E" / "teacher", "Teacher")  # ... beside an earlier evaluation of several
    line = error_line(["table", "--runs", f"[{tmp_path / 'E'}]", "--out", str(tmp_path / "t")], capsys)
    assert (f"runs: {tmp_path / 'E'} holds one model's results (its metrics.json) and also the folders of others "
            f"({tmp_path / 'E' / 'teacher'}), two evaluations mixed in one folder") in line
    write_metrics(tmp_path / "G" / "sft", "SFT", sets=("test",))
    write_metrics(tmp_path / "G" / "kd", "KD", sets=("dolly", "vicuna"))
    line = error_line(["table", "--runs", f"[{tmp_path / 'G'}]", "--out", str(tmp_path / "t")], capsys)
    assert (f"{tmp_path / 'G' / 'kd' / 'metrics.json'} was scored on the sets ['dolly', 'vicuna'] but "
            f"{tmp_path / 'G' / 'sft' / 'metrics.json'} on ['test']; one table compares runs on the same sets") in line
    assert not (tmp_path / "t").exists()


# ---- 6, 12: an empty list is an error; a default that needs a download says so offline --------------------

def test_evaluate_with_no_sets_or_an_empty_list_of_them(tiny_assets, tmp_path, capsys, monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("offline mode is enabled")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    student = model_folder(tiny_assets, tmp_path / "student")
    out = tmp_path / "eval"
    line = error_line(["evaluate", "--model", str(student), "--sets", "[]", "--out", str(out), "--preset", "tiny"],
                      capsys)
    assert "sets: give at least one evaluation set (a JSONL file or one of dolly, self_inst, vicuna, sinst, uinst), " \
           "or leave --sets out for all five of MiniLLM's" in line
    line = error_line(["evaluate", "--model", str(student), "--out", str(out), "--preset", "tiny"], capsys)
    assert ("sets: left out, so MiniLLM's five sets (dolly, self_inst, vicuna, sinst, uinst) are scored, and could "
            "not get valid.jsonl from the hub dataset repo MiniLLM/dolly: offline (HF_HUB_OFFLINE=1") in line
    assert "--eval_source" not in line or "pass DIR as the source" in line
    assert "or give your own JSONL files: --sets '[test.jsonl]'" in line
    assert not out.exists()


def test_reproduce_refuses_empty_lists_and_says_which_data_it_uses(tmp_path, capsys, monkeypatch):
    from mgsr_lightning.errors import UserError
    from mgsr_lightning.pipeline import steps

    monkeypatch.chdir(tmp_path)
    results = ["--results_dir", str(tmp_path / "results")]
    assert ("train_seeds: give at least one, or leave --train_seeds out for the pair's default"
            in error_line(["reproduce", "--pair", "tiny", "--train_seeds", "[]", *results], capsys))
    assert ("methods: give at least one, or leave --methods out for the pair's default"
            in error_line(["reproduce", "--pair", "tiny", "--methods", "[]", *results], capsys))
    assert files_under(tmp_path) == []

    def stop(*args):
        raise UserError("stopped before preparing the data")

    monkeypatch.setattr(steps, "pair_setup", stop)
    monkeypatch.setenv("MGSR_TINY_DIR", str(tmp_path / "mine"))
    with pytest.raises(SystemExit):
        main(["reproduce", "--pair", "tiny", *results])
    assert (f"note: reproduce --pair tiny generates and uses the embedded data in artifacts/tiny; "
            f"MGSR_TINY_DIR={tmp_path / 'mine'} is not read") in capsys.readouterr().out


# ---- 8: cache-teacher's output folder and device -----------------------------------------------------------

def test_cache_teacher_refuses_a_file_as_its_folder_and_a_device_the_machine_lacks(tiny_assets, tmp_path, capsys,
                                                                                   monkeypatch):
    from tiny_models import cli_overrides

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    existing = tmp_path / "cache.bin"
    existing.write_text("mine")
    base = ["cache-teacher", "--config", KD_CONFIG, "--overrides", json.dumps(cli_overrides(tiny_assets, "gpt2"))]
    line = error_line([*base, "--out", str(existing)], capsys)
    assert f"out: {existing} is a file, not a folder" in line
    line = error_line([*base, "--out", str(tmp_path / "cache"), "--device", "cuda"], capsys)
    assert "device: cuda is not on this machine (PyTorch finds 0 CUDA GPUs); use --device cpu" in line
    assert "is not a device PyTorch knows" in error_line([*base, "--device", "gpu0"], capsys)
    assert "batch_size must be >= 1, got 0" in error_line([*base, "--batch_size", "0"], capsys)
    theirs = tmp_path / "documents"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    line = error_line([*base, "--out", str(theirs)], capsys)
    assert f"out: {theirs} holds other files (notes.txt) and is not a teacher cache" in line
    assert existing.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["cache.bin", "documents"]


# ---- 9: a new prepare names the students it left stale ----------------------------------------------------

def test_prepare_again_on_other_data_names_the_students_left_from_the_old_data(tmp_path, capsys, monkeypatch):
    from mgsr_lightning.pipeline import own_data

    def trained(folder_name):
        def stub(pair, root, *args):  # the SFT runs, not what this test is about: a model folder, quickly
            (root / folder_name).mkdir(exist_ok=True)
            (root / folder_name / "config.json").write_text("{}")
            return {"steps": 1, "parameters": 1000, "best_val_rougeL": None, "seconds": 0.0}
        return stub

    monkeypatch.setattr(own_data, "_train_teacher", trained("teacher"))
    monkeypatch.setattr(own_data, "_train_init_student", trained("init"))
    rows = [{"instruction": f"What is {a} plus {a}?", "input": "", "output": f"{2 * a}"} for a in range(12)]
    old = write_rows(tmp_path / "old", {"train": rows[:8], "validation": rows[8:10], "test": rows[10:]})
    root = tmp_path / "root"
    prepare = ["prepare", "--out", str(root), "--vocab_size", "300"]
    main([*prepare, "--data", str(old)])
    (root / "students" / "sft").mkdir(parents=True)  # what `fit` exports on the old data
    (root / "students" / "sft" / "config.json").write_text('{"old": true}')
    capsys.readouterr()
    main([*prepare, "--data", str(old)])  # the same data: everything reused, the students still match
    assert "holds students trained before this prepare" not in capsys.readouterr().out
    rows = [{"instruction": f"What is {a} times 3?", "input": "", "output": f"{3 * a}"} for a in range(12)]
    new = write_rows(tmp_path / "new", {"train": rows[:8], "validation": rows[8:10], "test": rows[10:]})
    main([*prepare, "--data", str(new)])
    assert (f"warning: {root / 'students'} holds students trained before this prepare, on the previous data, "
            f"tokenizer or starting student: sft; they no longer match {root}") in capsys.readouterr().out
    assert (root / "students" / "sft" / "config.json").read_text() == '{"old": true}'


# ---- 13: each log line once --------------------------------------------------------------------------------

def test_lightning_log_lines_print_once():
    code = ("import sys; sys.argv = ['mgsr_lightning', '--help']; from mgsr_lightning.__main__ import main; main(); "
            "from mgsr_lightning.lightning_workarounds import quiet_lightning; quiet_lightning(); "
            "from lightning.pytorch.utilities.rank_zero import rank_zero_info; rank_zero_info('GPU available: no')")
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if "GPU available: no" in line]
    assert lines == ["INFO lightning.pytorch.utilities.rank_zero: GPU available: no"], result.stderr


# ---- a second pass: config files of the wrong shape, an interval past the epoch, Ctrl-C, a file as a folder ------

def test_a_config_file_of_the_wrong_shape_is_named(tmp_path, capsys):
    cases = {"list.yaml": ("- trainer\n- data\n", "a config file is a mapping of options (trainer:, model:, data:, "
                                                    "...); it holds a list"),
             "empty.yaml": ("", "a config file is a mapping of options (trainer:, model:, data:, ...); it is empty"),
             "scalar.yaml": ("data: 5\n", "data is a group of options (data: {...}), got the value 5")}
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        line = error_line(["fit", "--config", KD_CONFIG, "--config", str(tmp_path / name)], capsys)
        assert f"error: {tmp_path / name}: {expected}" in line


def test_a_validation_interval_longer_than_an_epoch_is_one_line(tiny_assets, tmp_path, capsys):
    line = error_line(fit_args(tiny_assets, tmp_path / "run", "--trainer.check_val_every_n_epoch=1",
                               "--trainer.val_check_interval=1000"), capsys, only_line=False)
    assert ("trainer.val_check_interval: `val_check_interval` (1000) must be less than or equal to the number of the "
            "training batches (21)") in line


def test_ctrl_c_in_a_pipeline_command_is_one_line(tiny_assets, tmp_path, capsys, monkeypatch):
    from mgsr_lightning.pipeline import commands

    def ctrl_c(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "load_model", ctrl_c)
    student = model_folder(tiny_assets, tmp_path / "student")
    line = error_line(evaluate_args([student], tmp_path / "eval", tiny_assets), capsys, only_line=False)
    assert line.startswith("error: evaluate interrupted (Ctrl-C); its files are written whole or marked unfinished")
    assert not (tmp_path / "eval").exists()


def test_train_tokenizer_names_a_file_given_as_its_folder(tiny_assets, tmp_path, capsys):
    mine = tmp_path / "tokenizer"
    mine.write_text("mine")
    line = error_line(["train-tokenizer", "--data", str(tiny_assets["data"] / "train.jsonl"), "--out", str(mine)],
                      capsys)
    assert f"out: {mine} is a file; give a new or empty folder" in line and mine.read_text() == "mine"


def test_a_resumed_fit_exports_where_its_command_says_not_where_the_checkpoint_did(exported, tiny_assets, tmp_path):
    before = contents(exported)
    checkpoint = exported.parent.parent / "run" / "kd" / "version_0" / "checkpoints" / "last.ckpt"
    run_cli(fit_args(tiny_assets, tmp_path / "run", export_to(tmp_path / "resumed"), "--trainer.max_steps=4",
                     f"--ckpt_path={checkpoint}"))
    assert json.loads((tmp_path / "resumed" / "mgsr_training.json").read_text())["validation"]["step"] == 4
    assert contents(exported) == before


def test_evaluate_refuses_an_empty_label(tiny_assets, tmp_path, capsys):
    student = model_folder(tiny_assets, tmp_path / "student")
    line = error_line([*evaluate_args([student], tmp_path / "eval", tiny_assets), "--label", " "], capsys)
    assert "label: give the row's name, or leave --label out for the folder's name" in line
    assert not (tmp_path / "eval").exists()
