"""Bad input, from every command: one ``error:`` line on stderr, exit status 2, nothing left behind.

Most cases fail in the checks made before any model loads, so they run in-process through
``main``; a few train for 2-4 steps to hit a full disk, a NaN loss or a resume. Two run the real
``python -m mgsr_lightning`` to see the exact stderr and exit status, and ``--debug``.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import cli_overrides, last_checkpoint

from mgsr_lightning.__main__ import main
from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.errors import user_message

REPO = Path(__file__).resolve().parents[1]
KD_CONFIG = str(REPO / "configs" / "tiny" / "kd.yaml")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def error_line(args: list[str], capsys, *, only_line: bool = True) -> str:
    """Run ``main(args)``; assert exit status 2 and one ``error:`` line (the only stderr line when
    ``only_line``, else among the run's own log lines), no traceback; return that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    if only_line:
        assert lines == errors, stderr
    return errors[0]


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def fit_args(assets, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", KD_CONFIG, *cli_overrides(assets, "gpt2", run_dir), *extra]


# ---- fit, validate, test, predict: the parsed config is checked before anything loads ------------

FIT_CASES = {
    "learning_rate": (["--model.init_args.optimizer.lr=0"], "model.init_args.optimizer.lr must be > 0, got 0.0"),
    "distill_temperature": (["--model.init_args.distill.temperature=0"], "distill.temperature must be > 0"),
    "sampling_temperature": (["--model.init_args.sampling.temperature=-1"], "sampling.temperature must be > 0"),
    "top_p": (["--model.init_args.sampling.top_p=1.5"], "sampling.top_p must be in (0, 1]"),
    "probability": (["--model.init_args.regime.lmbda=1.5"], "regime.lmbda must be in [0, 1], got 1.5"),
    "response_budget": (["--model.init_args.sampling.max_new_tokens=0"],
                        "model.init_args.sampling.max_new_tokens must be >= 1, got 0"),
    "adam_beta": (["--model.init_args.optimizer.betas=[0.9, 1.5]"], "optimizer.betas[1] must be in [0, 1]"),
    "divergence_beta": (['--model.init_args.distill.params={{"beta": 2}}'], "distill.params.beta must be in [0, 1]"),
    "batch_size": (["--data.batch_size=0"], "data.batch_size must be >= 1, got 0"),
    "eval_batch_size": (["--data.eval_batch_size=0"], "data.eval_batch_size must be >= 1, got 0"),
    "prompt_not_below_length": (["--data.max_prompt_length=80"],
                                "data.max_prompt_length (80) must be smaller than data.max_length (80)"),
    "positions": (["--data.max_length=200"], "the student has 128 positions but data.max_length"),
    "train_data": (["--data.train_data={missing}/train.jsonl"], "data.train_data: data file not found"),
    "tokenizer": (["--data.tokenizer={missing}/tokenizer"], "data.tokenizer: tokenizer folder not found"),
    "student": (['--model.init_args.student={{"name_or_path": "{missing}/student"}}'],
                "student: model folder not found"),
    "ckpt_missing": (["--ckpt_path={missing}/last.ckpt"], "ckpt_path: checkpoint not found"),
    "unknown_trainer_key": (["--trainer.max_stepz=3"], "unknown option 'trainer.max_stepz'; did you mean 'max_steps'?"),
    "unknown_dataclass_key": (["--model.init_args.distill.nme=x"],
                              "unknown option 'model.init_args.distill.nme'; did you mean 'name'? valid options of "
                              "DistillLoss: name, weight, temperature"),
    "unknown_name": (["--model.init_args.distill.name=kl"],
                     "model.init_args.distill.name: expected one of 'forward_kl'"),
    "bad_type": (["--trainer.max_steps=many"], "trainer.max_steps: expected int, got 'many'"),
    # not read as max_steps, as it would not be in a config file
    "abbreviated_key": (["--trainer.max_step=3"], "unknown option 'trainer.max_step'; did you mean 'max_steps'?"),
}


@pytest.mark.parametrize("case", FIT_CASES)
def test_fit_rejects_bad_configuration_in_one_line(case, tiny_assets, tmp_path, capsys):
    extra, expected = FIT_CASES[case]
    extra = [arg.format(missing=tmp_path / "missing") for arg in extra]
    line = error_line(fit_args(tiny_assets, tmp_path / "run", *extra), capsys)
    assert expected in line
    assert not (tmp_path / "run").exists()


def test_vocabulary_mismatch_and_corrupt_checkpoint_are_found_before_loading(tiny_assets, tmp_path, capsys):
    from tiny_models import build_tiny_model

    build_tiny_model("gpt2", 100).save_pretrained(tmp_path / "small")
    small = f'--model.init_args.student={{"name_or_path": "{tmp_path / "small"}"}}'
    line = error_line(fit_args(tiny_assets, tmp_path / "run", small), capsys)
    assert "the student has 100 output rows but the tokenizer has 300 tokens" in line
    corrupt = tmp_path / "last.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 cut short by a full disk")
    line = error_line(fit_args(tiny_assets, tmp_path / "run", f"--ckpt_path={corrupt}"), capsys)
    assert f"ckpt_path: checkpoint {corrupt} is corrupt or truncated" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command, extra, expected", [
    ("test", ["--data.test_data={missing}/test.jsonl"], "data.test_data: data file not found"),
    ("validate", ["--data.max_prompt_length=0"], "data.max_prompt_length must be >= 1"),
    ("predict", ["--ckpt_path={missing}/best.ckpt"], "checkpoint not found"),
])
def test_other_lightning_commands_check_first_too(command, extra, expected, tiny_assets, tmp_path, capsys):
    extra = [arg.format(missing=tmp_path / "missing") for arg in extra]
    args = [command, "--config", KD_CONFIG, *cli_overrides(tiny_assets, "gpt2", tmp_path / "run"), *extra]
    assert expected in error_line(args, capsys)
    assert not (tmp_path / "run").exists()


def test_a_path_of_the_wrong_kind_is_named_for_what_it_is(tiny_assets, tmp_path, capsys, monkeypatch):
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    line = error_line(fit_args(tiny_assets, tmp_path / "run", f"--data.train_data={loop}"), capsys)
    assert f"data.train_data: data file {loop} is (or goes through) a symbolic link loop" in line
    run = tmp_path / "old_run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    expected = (f"{run} is a folder; give one checkpoint file written by `fit` "
                f"(e.g. {run / 'checkpoints' / 'last.ckpt'})")
    assert f"ckpt_path: {expected}" in error_line(fit_args(tiny_assets, tmp_path / "run", f"--ckpt_path={run}"), capsys)
    line = error_line(["export", "--checkpoint", str(run), "--out", str(tmp_path / "exported")], capsys)
    assert f"checkpoint: {expected}" in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "exported").exists()
    not_a_folder = tmp_path / "tiny_root.txt"
    not_a_folder.write_text("")
    monkeypatch.setenv("MGSR_TINY_DIR", str(not_a_folder))
    line = error_line(["fit", "--config", KD_CONFIG], capsys)
    assert (f"data.tokenizer: tokenizer folder {not_a_folder}/tokenizer cannot exist: {not_a_folder} is a file, not a "
            f"folder (MGSR_TINY_DIR={not_a_folder} names that file") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.jsonl", "old_run", "tiny_root.txt"]


def test_command_line_mistakes(capsys):
    assert ("commands: fit, validate, test, predict, prepare, prepare-tiny, prepare-smollm2, train-tokenizer, demo, "
            "evaluate, table, export, select, reproduce") in error_line(["fitt"], capsys)
    assert "`fit` needs a config: pass --config configs/<pair>/<method>.yaml" in error_line(["fit"], capsys)
    assert "config file not found: " in error_line(["fit", "--config", "nope.yaml"], capsys)
    assert "missing required options: --checkpoint, --out" in error_line(["export"], capsys)
    line = error_line(["export", "--checkpointt", "x"], capsys)
    assert "unknown option 'checkpointt'; did you mean 'checkpoint'?" in line
    line = error_line(["evaluate", "--model", "m", "--seed", "[1]"], capsys)
    assert "unknown option 'seed'; did you mean 'seeds'?" in line
    main(["--help"])
    assert "usage: python -m mgsr_lightning <command>" in capsys.readouterr().out


def test_unknown_top_level_key_in_a_config_file(tmp_path, capsys):
    config = tmp_path / "typo.yaml"
    config.write_text(f"_base_: {KD_CONFIG}\ntrainr: {{max_steps: 3}}\n")
    assert "unknown option 'trainr'; did you mean 'trainer'?" in error_line(["fit", "--config", str(config)], capsys)
    config.write_text(f"_base_: {KD_CONFIG}\nmodel:\n  init_args:\n    optimizer: {{warmup_step: 5}}\n")
    line = error_line(["fit", "--config", str(config)], capsys)
    assert ("unknown option 'model.init_args.optimizer.warmup_step'; did you mean 'warmup_steps'? valid options of "
            "OptimizerConfig: lr, weight_decay, betas, warmup_steps, schedule") in line
    assert len(line) < 300, line  # the key and its options, not the whole model config
    config.write_text("trainer: {max_steps: [\n")
    line = error_line(["fit", "--config", str(config)], capsys)
    assert f"{config} is not valid YAML (line 2, column 1): expected the node content" in line


def test_a_value_of_the_wrong_type_names_the_key_and_the_types_it_takes(capsys):
    base = ["fit", "--config", str(KD_CONFIG), "--print_config"]
    line = error_line(base + ["--model.init_args.student.config=3"], capsys)
    assert "model.init_args.student.config: expected dict[str, Any] or null, got '3'" in line
    line = error_line(base + ["--model.init_args.student.config=null"], capsys)
    assert """give its parent one JSON value: --model.init_args.student='{"config": null, ...}'""" in line


# ---- rows ----------------------------------------------------------------------------------------

GOOD_ROW = json.dumps({"instruction": "Add 1 and 2.", "input": "", "output": "3"}) + "\n"
ROW_CASES = {
    "null_field": ('{"instruction": null, "output": "3"}\n', "train.jsonl:2: 'instruction' must be a string, got null"),
    "list_field": ('{"instruction": ["a", "b"], "output": "3"}\n',
                   "train.jsonl:2: 'instruction' must be a string, got a list"),
    "number_field": ('{"instruction": "a", "input": 7, "output": "3"}\n',
                     "train.jsonl:2: 'input' must be a string, got a number"),
    "null_output": ('{"instruction": "a", "output": null}\n', "train.jsonl:2: 'output' must be a string, got null"),
    "empty_output": ('{"instruction": "a", "output": "  "}\n', "train.jsonl:2: 'output' is empty"),
    "not_utf8": (b'{"instruction": "caf\xe9", "output": "3"}\n',
                 "train.jsonl:2: not UTF-8 text (byte 0xe9 at column 21)"),
    "empty_file": (None, "train.jsonl: the data file is empty"),
    "bom_then_bad_row": (b'\xef\xbb\xbf' + GOOD_ROW.encode() + b'{"instruction": "a", "output": ""}\n',
                         "train.jsonl:2: 'output' is empty"),  # the byte order mark is read past, not refused
}


@pytest.mark.parametrize("case", ROW_CASES)
def test_bad_rows_are_named_by_file_and_line(case, tiny_assets, tmp_path, capsys):
    row, expected = ROW_CASES[case]
    data = tmp_path / "train.jsonl"
    if row is None:
        data.write_text("\n")
    elif case == "bom_then_bad_row":
        data.write_bytes(row)
    else:
        data.write_bytes(GOOD_ROW.encode() + (row if isinstance(row, bytes) else row.encode()))
    # read before Lightning starts: no start-up lines, no empty version folder
    line = error_line(fit_args(tiny_assets, tmp_path / "run", f"--data.train_data={data}"), capsys)
    assert expected in line
    assert not (tmp_path / "run").exists()


def test_a_student_given_both_weights_and_a_config_is_refused(tiny_assets, tmp_path, capsys):
    student = tiny_assets["models"]["gpt2"]["student"]
    config = '--model.init_args.student.config={"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4}'
    line = error_line(fit_args(tiny_assets, tmp_path / "run", config), capsys)
    assert (f"model.init_args.student has both name_or_path ({student}) and config: a config builds a randomly "
            f"initialised model, so the weights of {student} would not be loaded. To load them, unset config: "
            f"""--model.init_args.student='{{"name_or_path": "{student}", "config": null}}'""") in line
    assert not (tmp_path / "run").exists()


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    from mgsr_lightning.data.records import read_jsonl

    data = tmp_path / "excel.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + GOOD_ROW.encode() + GOOD_ROW.encode())  # as Notepad and Excel save UTF-8
    assert read_jsonl(data) == [{"instruction": "Add 1 and 2.", "input": "", "output": "3"}] * 2


# ---- evaluate, export, reproduce, demo, prepare-tiny -------------------------------------------

def _read_only(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("tempfile.mkstemp", refuse)


def model_folder(tiny_assets, folder: Path, tokenizer: bool = True) -> Path:
    """A copy of the tiny student, with its tokenizer saved beside it (as `fit` and `export` write it) or not."""
    shutil.copytree(tiny_assets["models"]["gpt2"]["student"], folder)
    if tokenizer:
        shutil.copytree(tiny_assets["tokenizer"], folder, dirs_exist_ok=True)
    return folder


EVALUATE_CASES = {
    "missing_model": "model not found: {tmp}/runs/mgsr/hf",
    "not_a_model": "has no config.json: not a folder written by `save_pretrained`",
    "no_tokenizer": "model folder {tmp}/bare has no tokenizer (tokenizer.json, tokenizer_config.json, tokenizer.model, "
                    "vocab.json); evaluate reads the tokenizer saved with the model",
    "checkpoint": "model: {tmp}/last.ckpt is a training checkpoint, not a model folder; turn it into one first: "
                  "python -m mgsr_lightning export --checkpoint {tmp}/last.ckpt --out <folder>",
    "link_loop": "model {tmp}/loop is (or goes through) a symbolic link loop",
    "positions": "the model has 128 positions but max_prompt_length + max_new_tokens = 156 tokens",
    "default_lengths": "max_prompt_length + max_new_tokens = 512 tokens; lower them to at most 128; max_prompt_length "
                       "and max_new_tokens are MiniLLM's default, as neither the command line nor "
                       "{tmp}/student/mgsr_training.json set them: pass --preset <pair>",
    "empty_seeds": "seeds: give at least one sampling seed",
    "missing_set": "evaluation set not found: '{tmp}/nope.jsonl'",
    "batch_size": "batch_size must be >= 1, got 0",
    "read_only": "out: cannot write in",
}


@pytest.mark.parametrize("case", EVALUATE_CASES)
def test_evaluate_checks_before_loading(case, tiny_assets, tmp_path, capsys, monkeypatch):
    student = str(model_folder(tiny_assets, tmp_path / "student"))
    test_set = str(tiny_assets["data"] / "test.jsonl")
    out = tmp_path / "eval"
    args = {"model": student, "sets": f"[{test_set}]", "out": str(out), "max_new_tokens": "8",
            "max_prompt_length": "56"}
    expected = EVALUATE_CASES[case].format(tmp=tmp_path)
    if case == "missing_model":
        args["model"] = str(tmp_path / "runs" / "mgsr" / "hf")
    elif case == "not_a_model":
        (tmp_path / "empty").mkdir()
        args["model"] = str(tmp_path / "empty")
    elif case == "no_tokenizer":  # before: loaded, sampled, then a ValueError about prompts without real tokens
        args["model"] = str(model_folder(tiny_assets, tmp_path / "bare", tokenizer=False))
    elif case == "checkpoint":  # before: "model not found" for a file that exists
        (tmp_path / "last.ckpt").write_bytes(b"PK")
        args["model"] = str(tmp_path / "last.ckpt")
    elif case == "link_loop":  # before: "model not found"
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        args["model"] = str(tmp_path / "loop")
    elif case == "positions":
        args["max_new_tokens"] = "100"
    elif case == "default_lengths":  # no mgsr_training.json beside the model: MiniLLM's 256 + 256 tokens
        del args["max_new_tokens"], args["max_prompt_length"]
    elif case == "empty_seeds":  # before: seeds 10-50 were used without a word
        args["seeds"] = "[]"
    elif case == "missing_set":
        args["sets"] = f"[{tmp_path / 'nope.jsonl'}]"
    elif case == "batch_size":
        args["batch_size"] = "0"
    else:
        _read_only(monkeypatch)
    line = error_line(["evaluate", *[f"--{key}={value}" for key, value in args.items()]], capsys)
    assert expected in line
    assert not out.exists()


def test_export_and_resume_refuse_missing_corrupt_and_foreign_checkpoints(tmp_path, capsys):
    truncated = tmp_path / "truncated.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 3}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    foreign = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(3)}, foreign)
    out = tmp_path / "exported"
    for checkpoint, expected in [
        (tmp_path / "nope.ckpt", f"checkpoint: checkpoint not found: {tmp_path / 'nope.ckpt'}"),
        (truncated, f"checkpoint: checkpoint {truncated} is corrupt or truncated"),
        (foreign, f"checkpoint: {foreign} is not a training checkpoint written by `fit`"),
    ]:
        assert expected in error_line(["export", "--checkpoint", str(checkpoint), "--out", str(out)], capsys)
        assert not out.exists()


@pytest.mark.parametrize("args, expected", [
    (["reproduce", "--pair", "gpt3"],
     "unknown pair 'gpt3'; pairs: facts, gpt2, llama2, openllama2, opt, reason, smollm2, tiny"),
    (["reproduce", "--pair", "tiny", "--methods", "[kd, mgsr_full]"],
     "unknown method 'mgsr_full' for pair 'tiny'; methods: "),
    (["reproduce", "--pair", "tiny", "--max_eval_examples", "0"], "max_eval_examples must be >= 1, got 0"),
    (["demo", "--method", "mgsr2"], "unknown method 'mgsr2' for pair 'tiny'"),
    (["prepare-tiny", "--train_size", "0"], "train_size must be >= 1, got 0"),
    (["prepare-tiny", "--vocab_size", "100"], "vocab_size must be >= 258, got 100"),
    (["table", "--runs", "[]", "--out", "table"], "runs: give at least one `evaluate` output folder or metrics.json"),
])
def test_pipeline_commands_check_names_and_values_before_any_work(args, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = ["--results_dir", str(tmp_path / "results")] if args[0] == "reproduce" else []
    extra += ["--out", str(tmp_path / "tiny")] if args[0] == "prepare-tiny" else []
    assert expected in error_line(args + extra, capsys)
    assert files_under(tmp_path) == []


# ---- prepare -----------------------------------------------------------------------------------

def test_prepare_names_a_corrupt_manifest(tiny_assets, tmp_path, capsys):
    root = tmp_path / "root"
    root.mkdir()
    (root / "prepared.json").write_text('{"files": {\n')  # cut short
    line = error_line(["prepare", "--data", str(tiny_assets["data"]), "--out", str(root), "--vocab_size", "300"],
                      capsys)
    assert (f"{root / 'prepared.json'} is not valid JSON "
            "(Expecting property name enclosed in double quotes at line 2, "
            f"column 1); it records which files of {root} a prepare command wrote") in line
    assert [p.name for p in root.iterdir()] == ["prepared.json"]


def write_rows(folder: Path, rows: dict[str, list[dict[str, str]]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, split_rows in rows.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in split_rows))
    return folder


def test_prepare_finds_that_no_row_fits_before_writing_anything(tmp_path, capsys):
    long = [{"instruction": "Repeat: " + " ".join(f"word{j}x{i}" for j in range(80)), "input": "", "output": "ok"}
            for i in range(12)]
    data = write_rows(tmp_path / "long", {"train": long, "validation": long[:4], "test": long[:4]})
    line = error_line(["prepare", "--data", str(data), "--out", str(tmp_path / "root"), "--vocab_size", "300"], capsys)
    assert (f"none of the 12 train rows of {data / 'train.jsonl'} fits the tiny pair's length limits "
            "with this tokenizer (prompts <= 48 tokens, prompt + response <= 72; configs/tiny/base.yaml): "
            "12 have a longer prompt") in line
    assert "--pair reason (prompts <= 56, prompt + response <= 136)" in line and "a larger --vocab_size" in line
    assert "--data." not in line and "raise max_length" not in line  # options of fit, which prepare does not have
    assert not (tmp_path / "root").exists()


def test_prepare_warns_of_test_rows_that_are_training_rows_and_of_duplicated_rows(tmp_path, capsys, monkeypatch):
    from mgsr_lightning.pipeline import own_data, own_data_checks

    def stub(*args):  # the teacher's and the initial student's SFT, not what this test is about
        return {"steps": 1, "parameters": 1000, "best_val_rougeL": None, "seconds": 0.0}

    monkeypatch.setattr(own_data, "_train_teacher", stub)
    monkeypatch.setattr(own_data, "_train_init_student", stub)
    rows = [{"instruction": f"What is {a} plus {a}?", "input": "", "output": f"{2 * a}"} for a in range(10)]
    clean = write_rows(tmp_path / "clean", {"train": rows[:6], "validation": rows[6:8], "test": rows[8:]})
    assert own_data_checks.overlap_warnings({s: clean / f"{s}.jsonl" for s in ("train", "validation", "test")},
                                             {"train": rows[:6], "validation": rows[6:8], "test": rows[8:]}) == []
    leaky = write_rows(tmp_path / "leaky", {"train": rows[:6] + rows[:2], "validation": rows[6:8], "test": rows[:4]})
    own_data.prepare(data=str(leaky), out=str(tmp_path / "root"), vocab_size=300)
    printed = capsys.readouterr().out
    assert (f"warning: 4 of the 4 test rows ask the prompt of a training row ({leaky / 'test.jsonl'}): their scores "
            "measure recall of the training data") in printed
    assert f"warning: {leaky / 'train.jsonl'} holds 2 duplicated rows" in printed
    assert "validation rows ask" not in printed


# ---- runs that train: full disk, NaN loss, resume, export elsewhere -------------------------------

@pytest.fixture(scope="module")
def trained_run(tiny_assets, tmp_path_factory):
    """A kd run of 2 steps (checkpoints at step 2), shared by the tests that read its files."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    cli = run_cli(fit_args(tiny_assets, run_dir))
    return {"dir": run_dir, "checkpoint": Path(last_checkpoint(cli.trainer))}


def test_full_disk_leaves_no_truncated_checkpoint(tiny_assets, tmp_path, capsys, monkeypatch):
    def full_disk(checkpoint, path):
        Path(path).write_bytes(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("lightning.fabric.plugins.io.torch_io._atomic_save", full_disk)
    line = error_line(fit_args(tiny_assets, tmp_path / "run"), capsys, only_line=False)
    assert "error: cannot write " in line and ".ckpt: No space left on device" in line
    written = files_under(tmp_path / "run")
    assert not [p for p in written if ".ckpt" in p.name], written
    assert not (tmp_path / "run" / "hf").exists()


def test_non_finite_loss_stops_with_step_and_batch_and_keeps_the_last_good_checkpoint(tiny_assets, tmp_path, capsys,
                                                                                      monkeypatch):
    from mgsr_lightning.module import DistillLightningModule

    log_step = DistillLightningModule._log_step
    calls = []

    def nan_from_step_2(self, loss, *args):  # once per training step, whole logits or the fused head
        calls.append(None)
        return log_step(self, loss * float("nan") if len(calls) > 2 else loss, *args)

    monkeypatch.setattr(DistillLightningModule, "_log_step", nan_from_step_2)
    line = error_line(fit_args(tiny_assets, tmp_path / "run", "--trainer.max_steps=4"), capsys, only_line=False)
    assert "the training loss is nan at step 2 (batch 2 of epoch 0); training stopped before that update" in line
    last = tmp_path / "run" / "kd" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"last good checkpoint: {last}" in line
    assert torch.load(last, weights_only=False)["global_step"] == 2
    assert not (tmp_path / "run" / "hf").exists()


def test_a_second_fit_on_the_same_export_folder_is_refused(tiny_assets, tmp_path, capsys, monkeypatch):
    from lightning.pytorch import Trainer

    from mgsr_lightning.cli.run_lock import lock_path

    export_dir = tmp_path / "students" / "kd"
    lock = lock_path(export_dir)
    lock.parent.mkdir(parents=True)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the first fit, still running
    try:
        lock.write_text(json.dumps({"pid": running.pid, "host": __import__("socket").gethostname(),
                                    "started": "2026-01-01 10:00:00", "command": "fit"}))
        args = fit_args(tiny_assets, tmp_path / "run", f"--model.init_args.export_dir={export_dir}")
        line = error_line(args, capsys)
        assert (f"model.init_args.export_dir: another fit (pid {running.pid} on ") in line
        assert f"is writing its student to {export_dir}, and a second one would replace it" in line
        assert not (tmp_path / "run").exists() and sorted(p.name for p in lock.parent.iterdir()) == [lock.name]
    finally:
        running.kill()
        running.wait()
    held = []  # the first run ended without removing its lock (killed): the next one takes it over, holds it, frees it
    fit = Trainer.fit

    def fit_holding_the_lock(self, *args, **kwargs):
        held.append(json.loads(lock.read_text())["pid"])
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", fit_holding_the_lock)
    run_cli(fit_args(tiny_assets, tmp_path / "run", f"--model.init_args.export_dir={export_dir}"))
    assert held == [os.getpid()] and not lock.exists() and (export_dir / "config.json").is_file()


def test_ctrl_c_during_fit_says_how_to_resume(tiny_assets, tmp_path, capsys, monkeypatch):
    import signal

    from mgsr_lightning.module import DistillLightningModule

    step = DistillLightningModule.training_step

    def ctrl_c_at_step_3(self, batch, batch_idx):
        if self.global_step == 3:
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)

    monkeypatch.setattr(DistillLightningModule, "training_step", ctrl_c_at_step_3)
    handler = signal.getsignal(signal.SIGINT)
    try:
        line = error_line(fit_args(tiny_assets, tmp_path / "run", "--trainer.max_steps=6"), capsys, only_line=False)
    finally:
        signal.signal(signal.SIGINT, handler)
    last = tmp_path / "run" / "kd" / "version_0" / "checkpoints" / "last.ckpt"
    assert ("fit interrupted (Ctrl-C) at step 3; to continue from its latest checkpoint (step 2), "
            f"run the same command with --ckpt_path={last}") in line
    assert not (tmp_path / "run" / "hf").exists()
    monkeypatch.setattr(DistillLightningModule, "training_step", step)
    cli = run_cli(fit_args(tiny_assets, tmp_path / "run", "--trainer.max_steps=4", f"--ckpt_path={last}"))
    assert cli.trainer.global_step == 4


def test_resumed_run_continues_its_logger_version(trained_run, tiny_assets, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run["dir"], run_dir)
    checkpoint = run_dir / trained_run["checkpoint"].relative_to(trained_run["dir"])
    run_cli(fit_args(tiny_assets, run_dir, "--trainer.max_steps=4", f"--ckpt_path={checkpoint}"))
    assert sorted(p.name for p in (run_dir / "kd").iterdir()) == ["version_0"]
    with (run_dir / "kd" / "version_0" / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    train_steps = [int(row["step"]) for row in rows if row["train/loss"]]
    assert train_steps == [0, 1, 2, 3]  # both parts of the run, once each


def test_export_never_writes_into_a_folder_of_other_files(trained_run, tiny_assets, tmp_path, capsys):
    theirs = tmp_path / "my_documents"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    (theirs / "tokenizer.json").write_text("{}")  # a name export would write over
    before = {p.name: p.read_text() for p in theirs.iterdir()}
    expected = f"{theirs} holds other files (notes.txt, tokenizer.json) and no model; give a new or empty folder"
    line = error_line(["export", "--checkpoint", str(trained_run["checkpoint"]), "--out", str(theirs)], capsys)
    assert f"out: {expected}" in line
    line = error_line(fit_args(tiny_assets, tmp_path / "run", f"--model.init_args.export_dir={theirs}"), capsys)
    assert f"model.init_args.export_dir: {expected}" in line
    assert {p.name: p.read_text() for p in theirs.iterdir()} == before and not (tmp_path / "run").exists()
    main(["export", "--checkpoint", str(trained_run["checkpoint"]), "--out", str(tmp_path / "exported")])
    main(["export", "--checkpoint", str(trained_run["checkpoint"]), "--out", str(tmp_path / "exported")])  # replaced


def test_export_from_another_folder_builds_the_student_only(trained_run, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from mgsr_lightning.module import DistillLightningModule

    def refuse(self):
        raise AssertionError("export loaded the teacher")

    monkeypatch.setattr(DistillLightningModule, "load_teacher", refuse)
    monkeypatch.chdir(tmp_path)
    main(["export", "--checkpoint", str(trained_run["checkpoint"]), "--out", "exported"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    state = torch.load(trained_run["checkpoint"], weights_only=False)["state_dict"]
    torch.testing.assert_close(model.state_dict()["transformer.wte.weight"], state["student.transformer.wte.weight"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"


# ---- caches and files --------------------------------------------------------------------------

def test_evaluation_cache_is_reused_only_for_the_same_configuration(tiny_assets, tmp_path, monkeypatch):
    from mgsr_lightning.evaluation.evaluate import EvalConfig
    from mgsr_lightning.pipeline import steps

    calls = []

    def fake_evaluate(model, tokenizer, eval_sets, config, out, method):
        calls.append(config.max_examples)
        return {"method": method, "sets": {}, "config": {"max_examples": config.max_examples}}

    monkeypatch.setattr(steps, "load_model", lambda folder, dtype: (torch.nn.Linear(1, 1), None))
    monkeypatch.setattr(steps, "evaluate_model", fake_evaluate)
    student = tiny_assets["models"]["gpt2"]["student"]
    sets = {"tiny": [{"instruction": "a", "input": "", "output": "b"}]}
    quick, full = EvalConfig(max_examples=2), EvalConfig()
    steps.evaluate(student, tmp_path / "eval", "KD", sets, quick)
    steps.evaluate(student, tmp_path / "eval", "KD", sets, full)  # not the quick run's numbers
    steps.evaluate(student, tmp_path / "eval", "KD", sets, full)  # reused
    assert calls == [2, None]
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["config"]["max_examples"] is None


def test_training_step_is_reused_only_for_the_same_configuration(tmp_path):
    from mgsr_lightning.errors import ConfigError
    from mgsr_lightning.pipeline.checks import check_fit_fingerprint, fit_fingerprint

    (tmp_path / "base.yaml").write_text("model: {lr: 1}\n")
    (tmp_path / "kd.yaml").write_text("_base_: base.yaml\n")
    first = fit_fingerprint(tmp_path / "kd.yaml", 0, {})
    run_dir = tmp_path / "runs" / "kd" / "seed0"
    check_fit_fingerprint(run_dir, first)
    check_fit_fingerprint(run_dir, first)  # the same run continues
    (tmp_path / "base.yaml").write_text("model: {lr: 2}\n")
    changed = fit_fingerprint(tmp_path / "kd.yaml", 0, {})
    assert len({first, changed, fit_fingerprint(tmp_path / "kd.yaml", 1, {})}) == 3
    # a run started from another initialised student is another run; no overrides keeps old fingerprints
    assert fit_fingerprint(tmp_path / "kd.yaml", 0, {}, ("--model.init_args.student.name_or_path=a",)) != changed
    assert fit_fingerprint(tmp_path / "kd.yaml", 0, {}, ()) == changed
    with pytest.raises(ConfigError, match="holds a run trained with another configuration"):
        check_fit_fingerprint(run_dir, changed)


def test_atomic_write_keeps_the_old_file_when_the_new_one_fails(tmp_path):
    from mgsr_lightning.atomic import atomic_path

    target = tmp_path / "metrics.json"
    target.write_text("old")
    with pytest.raises(OSError) as error, atomic_path(target) as temporary:
        temporary.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", str(target))
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
    assert user_message(error.value) == f"cannot write {target}: No space left on device"


# ---- the real command line ---------------------------------------------------------------------

def run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mgsr_lightning", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_command_line_exit_status_one_line_and_debug(tmp_path):
    result = run_module("export", "--checkpoint", "missing.ckpt", "--out", "exported", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: checkpoint: checkpoint not found: missing.ckpt (run with --debug for the traceback)"
    ]
    debug = run_module("export", "--checkpoint", "missing.ckpt", "--out", "exported", "--debug", cwd=tmp_path)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "CheckpointError" in debug.stderr
    assert list(tmp_path.iterdir()) == []


def test_info_messages_are_printed(tmp_path):
    code = ("import logging, sys; sys.argv = ['mgsr_lightning', '--help']; from mgsr_lightning.__main__ import main; "
            "main(); logging.getLogger('mgsr_lightning.models.export').info('student saved to x')")
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert "INFO mgsr_lightning.models.export: student saved to x" in result.stderr
