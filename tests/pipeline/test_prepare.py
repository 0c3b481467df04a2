"""``prepare`` (your own data), ``train-tokenizer`` and ``prepare-tiny``: what they write, reuse and refuse.

The teacher's training is replaced by a stub that records its calls (the end-to-end test of the
README trains it for real); everything else runs: row checks, copies, the BPE, fingerprints.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import yaml
from user_data import write_user_data

from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.pipeline import own_data, own_tokenizer, tiny
from mgsr_lightning.pipeline.manifest import file_sha256


@pytest.fixture
def teacher_runs(monkeypatch):
    """Replace the teacher's and the initial student's SFT by stubs that write a model folder's marker; returns
    their calls."""
    calls = Calls()

    def fake_train_teacher(pair, root, steps, teacher_config):
        calls.append(steps)
        (root / "teacher").mkdir(parents=True, exist_ok=True)
        (root / "teacher" / "config.json").write_text("{}")
        return {"steps": steps or 600, "parameters": 1000, "best_val_rougeL": 12.5, "seconds": 0.0}

    def fake_train_init_student(pair, root, steps):
        calls.init.append(steps)
        (root / "init").mkdir(parents=True, exist_ok=True)
        (root / "init" / "config.json").write_text("{}")
        return {"steps": steps or 400, "parameters": 500, "best_val_rougeL": 8.5, "seconds": 0.0}

    monkeypatch.setattr(own_data, "_train_teacher", fake_train_teacher)
    monkeypatch.setattr(own_data, "_train_init_student", fake_train_init_student)
    return calls


class Calls(list):
    """The teacher's steps per training call; ``init``: the initial student's."""

    def __init__(self):
        super().__init__()
        self.init: list[int | None] = []


def hashes(paths):
    return {split: file_sha256(path) for split, path in paths.items()}


def test_prepare_copies_trains_and_says_what_it_trained_on(user_data, tmp_path, teacher_runs, capsys):
    before = hashes(user_data)
    root = own_data.prepare(data=str(tmp_path / "my_data"), out=str(tmp_path / "root"), vocab_size=300, teacher_steps=3)
    printed = capsys.readouterr().out
    assert hashes(user_data) == before  # the user's files are only read
    assert {split: file_sha256(root / "data" / f"{split}.jsonl") for split in user_data} == before
    assert (root / "tokenizer" / "tokenizer.json").is_file() and teacher_runs == [3]
    assert re.search(r"train +48 rows, +\d+ within the length limits", printed)
    assert re.search(r"validation +8 rows", printed) and re.search(r"test +8 rows", printed)
    assert "tokenizer: vocabulary 300, byte-level BPE trained on the 48 training rows (new)" in printed
    assert "teacher: 0.00 M parameters, 3 SFT steps, best validation ROUGE-L 12.50" in printed
    assert f"export MGSR_TINY_DIR={root}" in printed
    assert teacher_runs.init == [None]  # configs/tiny/sft.yaml's own steps
    assert ("initial student: 0.00 M parameters, 400 SFT steps of configs/tiny/sft.yaml, best validation ROUGE-L 8.50 "
            f"(trained in 0 s); every method starts from it with --config {root / 'init_student.yaml'}") in printed
    assert f"fit --config configs/tiny/mgsr.yaml --config {root / 'init_student.yaml'}" in printed
    assert yaml.safe_load((root / "init_student.yaml").read_text()) == {
        "model": {"init_args": {"student": {"name_or_path": str(root / "init"), "config": None}}}}
    manifest = json.loads((root / "prepared.json").read_text())
    assert set(manifest["steps"]) == {"tokenizer", "teacher", "init"} and len(manifest["files"]) == 4


def test_prepare_reuses_a_step_only_when_its_inputs_match(user_data, tmp_path, teacher_runs, capsys):
    args = {"data": str(tmp_path / "my_data"), "out": str(tmp_path / "root"), "vocab_size": 300, "teacher_steps": 3}
    root = own_data.prepare(**args)
    tokenizer_time = (root / "tokenizer" / "tokenizer.json").stat().st_mtime_ns
    capsys.readouterr()
    own_data.prepare(**args)
    printed = capsys.readouterr().out
    assert teacher_runs == [3] and "(reused: same inputs)" in printed and "(reused: same data, tokenizer" in printed
    assert teacher_runs.init == [None]
    own_data.prepare(**{**args, "teacher_steps": 4})  # the teacher's input changed, the tokenizer's did not
    assert teacher_runs == [3, 4] and teacher_runs.init == [None]
    own_data.prepare(**{**args, "teacher_steps": 4, "init_steps": 7})  # the initial student's steps changed
    assert teacher_runs == [3, 4] and teacher_runs.init == [None, 7]
    assert (root / "tokenizer" / "tokenizer.json").stat().st_mtime_ns == tokenizer_time
    write_user_data(tmp_path / "my_data", {"train": 40, "validation": 8, "test": 8}, seed=1)  # new data
    own_data.prepare(**{**args, "teacher_steps": 4})
    assert teacher_runs == [3, 4, 4] and teacher_runs.init == [None, 7, None]
    assert "trained on the 40 training rows (new)" in capsys.readouterr().out
    assert file_sha256(root / "data" / "train.jsonl") == file_sha256(tmp_path / "my_data" / "train.jsonl")


def test_prepare_never_replaces_files_it_did_not_write(user_data, tmp_path, teacher_runs):
    root = tmp_path / "root"
    theirs = write_user_data(root / "data", seed=5)  # someone's own files where the copies would go
    before = hashes(theirs)
    with pytest.raises(ConfigError, match="prepare would overwrite .*train.jsonl.*which it did not write"):
        own_data.prepare(data=str(tmp_path / "my_data"), out=str(root), vocab_size=300)
    assert hashes(theirs) == before and teacher_runs == [] and not (root / "tokenizer").exists()
    # files already in the root are used in place and never rewritten
    own_data.prepare(data=str(root / "data"), out=str(root), vocab_size=300)
    assert hashes(theirs) == before and teacher_runs == [None]
    # a tokenizer folder the command did not make is neither reused nor replaced
    other = tmp_path / "other"
    write_user_data(other / "tokenizer", seed=6)
    with pytest.raises(ConfigError, match="tokenizer exists but was not made by this command"):
        own_data.prepare(data=str(tmp_path / "my_data"), out=str(other), vocab_size=300)


def test_prepare_checks_its_inputs_before_any_work(tmp_path, user_data, teacher_runs, monkeypatch):
    monkeypatch.delenv("MGSR_TINY_DIR", raising=False)
    with pytest.raises(ConfigError, match="prepare needs your train, validation and test JSONL files"
                                          ".*missing: --validation, --test"):
        own_data.prepare(train=str(user_data["train"]), out=str(tmp_path / "root"))
    with pytest.raises(ConfigError, match="needs a folder to fill: --out DIR, or MGSR_TINY_DIR"):
        own_data.prepare(data=str(tmp_path / "my_data"))
    user_data["test"].unlink()
    with pytest.raises(MissingFileError, match="test data not found: .*test.jsonl"):
        own_data.prepare(data=str(tmp_path / "my_data"), out=str(tmp_path / "root"))
    with pytest.raises(ConfigError, match="not both"):
        own_data.prepare(data=str(tmp_path / "my_data"), tokenizer=str(tmp_path), vocab_size=300)
    assert not (tmp_path / "root").exists() and teacher_runs == []


def test_prepare_uses_a_given_tokenizer_and_validation_files_by_other_names(tmp_path, user_data, teacher_runs, capsys,
                                                                            tiny_tokenizer_dir):
    user_data["validation"].rename(tmp_path / "my_data" / "valid.jsonl")
    root = own_data.prepare(data=str(tmp_path / "my_data"), out=str(tmp_path / "root"),
                            tokenizer=str(tiny_tokenizer_dir))
    assert re.search(r"validation +8 rows,.*my_data/valid\.jsonl", capsys.readouterr().out)
    assert file_sha256(root / "tokenizer" / "tokenizer.json") == file_sha256(tiny_tokenizer_dir / "tokenizer.json")


def test_train_tokenizer_command(tmp_path, user_data, capsys):
    from mgsr_lightning.__main__ import main
    from mgsr_lightning.models.tokenizer import load_tokenizer

    main(["train-tokenizer", "--data", str(tmp_path / "my_data"), "--vocab_size", "280", "--template", "plain",
          "--out", str(tmp_path / "tok")])
    tokenizer = load_tokenizer(str(tmp_path / "tok"))
    assert len(tokenizer) == 280 and tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    assert "trained a byte-level BPE of 280 tokens on 48 rows" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="holds other files"):
        own_tokenizer.train_tokenizer(str(user_data["train"]), str(tmp_path / "my_data"))
    assert sorted(p.name for p in (tmp_path / "my_data").iterdir()) == ["test.jsonl", "train.jsonl", "validation.jsonl"]


# ---- prepare-tiny ----------------------------------------------------------------------------------

@pytest.fixture
def tiny_teacher_runs(monkeypatch):
    calls = []

    def fake_fit_config(pair, method, root, *overrides):
        calls.append(method)
        (root / "teacher").mkdir(parents=True, exist_ok=True)
        (root / "teacher" / "config.json").write_text("{}")

    monkeypatch.setattr(tiny, "fit_config", fake_fit_config)
    return calls


SMALL_TINY = {"train_size": 30, "validation_size": 5, "test_size": 5, "vocab_size": 300}


def test_prepare_tiny_never_overwrites_data_it_did_not_generate(tmp_path, tiny_teacher_runs):
    root = tmp_path / "tiny"
    theirs = write_user_data(root / "data", {"train": 10, "validation": 4}, seed=3)  # no test.jsonl
    before = hashes(theirs)
    with pytest.raises(ConfigError, match="prepare-tiny would overwrite .*which it did not write.*prepare --data"):
        tiny.prepare_tiny(out=str(root), **SMALL_TINY)
    assert hashes(theirs) == before and tiny_teacher_runs == []
    write_user_data(root / "data", {"test": 4}, seed=3)
    tiny.prepare_tiny(out=str(root), **SMALL_TINY)  # all three present: reused as they are
    with pytest.raises(ConfigError, match="which it did not write"):
        tiny.prepare_tiny(out=str(root), force=True, **SMALL_TINY)
    assert hashes(theirs) == before


def test_prepare_tiny_regenerates_its_own_data_with_force_unless_changed(tmp_path, tiny_teacher_runs, caplog):
    import logging

    root = tmp_path / "tiny"
    tiny.prepare_tiny(out=str(root), **SMALL_TINY)
    with caplog.at_level(logging.INFO, logger="mgsr_lightning.pipeline.tiny"):
        tiny.prepare_tiny(out=str(root), **SMALL_TINY)
    assert "reusing the tiny dataset" in caplog.text and "reusing the teacher" in caplog.text
    tiny.prepare_tiny(out=str(root), force=True, **{**SMALL_TINY, "train_size": 20})
    assert len((root / "data" / "train.jsonl").read_text().splitlines()) == 20
    (root / "data" / "train.jsonl").write_text('{"instruction": "mine", "input": "", "output": "kept"}\n')
    with pytest.raises(ConfigError, match="which it did not write \\(or which changed since\\)"):
        tiny.prepare_tiny(out=str(root), force=True, **SMALL_TINY)
    assert "kept" in (root / "data" / "train.jsonl").read_text()
    (root / "data" / "test.jsonl").unlink()
    with pytest.raises(ConfigError, match="which it did not write"):
        tiny.prepare_tiny(out=str(root), **SMALL_TINY)
    assert tiny_teacher_runs == ["teacher", "teacher"]
    shutil.rmtree(root)


def test_prepare_tiny_fills_the_folder_the_configs_read(tmp_path, tiny_teacher_runs, monkeypatch):
    """With MGSR_TINY_DIR set, prepare-tiny prepares that folder (configs/tiny read it), not artifacts/tiny;
    an explicit --out still wins."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MGSR_TINY_DIR", str(tmp_path / "mine"))
    assert tiny.prepare_tiny(**SMALL_TINY) == tmp_path / "mine"
    assert (tmp_path / "mine" / "data" / "test.jsonl").is_file() and (tmp_path / "mine" / "tokenizer").is_dir()
    assert not (tmp_path / "artifacts").exists() and tiny_teacher_runs == ["teacher"]
    assert tiny.prepare_tiny(out=str(tmp_path / "other"), **SMALL_TINY) == tmp_path / "other"  # --out wins


@pytest.mark.parametrize("how", ["init_student.yaml", "the warning's override"])
def test_the_initial_student_and_the_advised_override_load_the_sft_student_s_weights(
        user_data, tmp_path, teacher_runs, tiny_assets, how):
    """``fit --config configs/tiny/<method>.yaml --config <root>/init_student.yaml``, and the override the
    warnings give, build the student from the SFT student's weights, not from the tiny configs' random init."""
    from tiny_models import cli_overrides
    from transformers import AutoModelForCausalLM

    from mgsr_lightning.cli.lightning_cli import run_cli
    from mgsr_lightning.pipeline.paths import CONFIGS

    root = own_data.prepare(data=str(tmp_path / "my_data"), out=str(tmp_path / "root"), vocab_size=300)
    shutil.rmtree(root / "init")
    shutil.copytree(tiny_assets["models"]["gpt2"]["student"], root / "init")  # a trained student in its place
    if how == "init_student.yaml":
        student = ["--config", str(root / "init_student.yaml")]
    else:
        student = [f'--model.init_args.student={{"name_or_path": "{root / "init"}", "config": null}}']
    overrides = [arg for arg in cli_overrides(tiny_assets, "gpt2", tmp_path / "run")
                 if not arg.startswith("--model.init_args.student=")]
    cli = run_cli(["--config", str(CONFIGS / "tiny" / "abkd.yaml"), *student, *overrides], run=False)
    cli.model.configure_model()
    expected = AutoModelForCausalLM.from_pretrained(root / "init").state_dict()
    loaded = cli.model.student.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
