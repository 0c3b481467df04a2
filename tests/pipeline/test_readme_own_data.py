"""The README's "Distil on your own data" commands, run as written on data the test writes.

Only sizes are added to each command (a 300-token vocabulary, 2 training steps, 2 sampling seeds),
so the test stays small; the commands, their order and their options are read from the README.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml
from user_data import write_user_data

from mgsr_lightning.__main__ import main
from mgsr_lightning.pipeline.manifest import file_sha256

REPO = Path(__file__).resolve().parents[2]
SMALL = {
    "prepare": ["--vocab_size", "300", "--teacher_steps", "2", "--init_steps", "2"],
    "fit": ["--trainer.max_steps=2", "--trainer.val_check_interval=2", "--data.batch_size=8",
            "--model.init_args.validation.rouge_examples=8", "--trainer.enable_progress_bar=false"],
    "evaluate": ["--seeds", "[10, 20]"],
}


def readme_commands() -> list[list[str]]:
    """The section's shell lines, split as a shell would (comments dropped, variables left to expand)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Distil on your own data"):]
    block = section[section.index("```bash\n") + len("```bash\n"):]
    block = block[: block.index("```")].replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def run_line(words: list[str], monkeypatch) -> None:
    if words[0] == "export":
        name, value = words[1].split("=", 1)
        monkeypatch.setenv(name, os.path.expandvars(value))
        return
    assert words[:3] == ["python", "-m", "mgsr_lightning"], words
    args = [os.path.expandvars(word) for word in words[3:]]
    args = [str(REPO / arg) if arg.startswith("configs/") else arg for arg in args]  # run from another folder
    main(args + SMALL.get(args[0], []))


def test_readme_distil_on_your_own_data_runs_as_written(tmp_path, monkeypatch, capsys):
    lines = readme_commands()
    # five commands
    assert [words[0] for words in lines] == ["export", "python", "python", "python", "python", "python"]
    assert [words[3] for words in lines[1:]] == ["prepare", "fit", "fit", "evaluate", "table"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    data = write_user_data(tmp_path / "my_data")
    before = {split: file_sha256(path) for split, path in data.items()}

    for words in lines:
        run_line(words, monkeypatch)
    printed = capsys.readouterr().out

    root = Path(os.environ["MGSR_TINY_DIR"])
    assert root == tmp_path / "my-distillation"
    assert {split: file_sha256(path) for split, path in data.items()} == before  # only read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-distillation", "my_data"]  # nothing in the working folder
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["init", "mgsr", "sft", "teacher"]
    assert re.search(r"train +48 rows", printed) and "tokenizer: vocabulary 300" in printed
    assert "teacher: 3.27 M parameters, 2 SFT steps" in printed
    assert "initial student: 0.45 M parameters, 2 SFT steps of configs/tiny/sft.yaml" in printed
    for method in ("sft", "mgsr"):  # every method starts from the SFT-initialised student prepare made
        saved = yaml.safe_load(next((root / "runs" / method).glob("version_*/config.yaml")).read_text())
        assert saved["model"]["init_args"]["student"]["name_or_path"] == str(root / "init")
        assert saved["model"]["init_args"]["student"]["config"] is None

    for name in ("teacher", "sft", "mgsr"):
        config = json.loads((root / "eval" / name / "metrics.json").read_text())["config"]
        # as configs/tiny trains: plain prompts of <= 48 tokens, 24 new tokens (not alpaca, 256/256)
        used = (config["template"], config["max_prompt_length"], config["sampling"]["max_new_tokens"])
        assert used == ("plain", 48, 24)
    table = (root / "results" / "table.md").read_text()
    assert [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ") and "---" not in line] == [
        "| Method", "| Teacher", "| SFT", "| MGSR"]
    assert (root / "results" / "chart.png").read_bytes()[:4] == b"\x89PNG"

    teacher_written = (root / "teacher" / "config.json").stat().st_mtime_ns
    run_line(lines[1], monkeypatch)  # prepare again: every step reused
    again = capsys.readouterr().out
    assert "(reused: same inputs)" in again and "(reused: same data, tokenizer, config and steps)" in again
    assert (root / "teacher" / "config.json").stat().st_mtime_ns == teacher_written


@pytest.mark.parametrize("command", ["prepare", "fit", "evaluate", "table"])
def test_readme_commands_are_documented_options(command, capsys):
    """Every option the README passes is one the command knows (a renamed option fails here quickly)."""
    lines = [words for words in readme_commands() if words[0] == "python" and words[3] == command]
    with pytest.raises(SystemExit):
        main([command, "--help"] if command != "fit" else ["fit", "--help"])
    help_text = capsys.readouterr().out
    for words in lines:
        for option in (word.split("=")[0] for word in words[4:] if word.startswith("--")):
            assert option in help_text, (command, option)
