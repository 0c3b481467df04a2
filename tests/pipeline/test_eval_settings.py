"""``evaluate`` prompts a model as it was trained: settings from the command line, a preset, the model's
``mgsr_training.json``, or MiniLLM's protocol, in that order."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mgsr_lightning.errors import ConfigError
from mgsr_lightning.models.export import TRAINING_SETTINGS
from mgsr_lightning.pipeline import commands, eval_settings, steps

TINY_TRAINING = {"template": "plain", "max_prompt_length": 48, "max_length": 72, "max_new_tokens": 24,
                 "eos_token": None}


def model_with_settings(tiny_assets, folder, settings):
    shutil.copytree(tiny_assets["models"]["gpt2"]["student"], folder)
    shutil.copytree(tiny_assets["tokenizer"], folder, dirs_exist_ok=True)  # a model folder carries its tokenizer
    if settings is not None:
        (folder / TRAINING_SETTINGS).write_text(json.dumps(settings))
    return folder


def test_settings_come_from_the_command_line_then_the_preset_then_the_model_then_minillm(tmp_path):
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / TRAINING_SETTINGS).write_text(json.dumps(TINY_TRAINING))
    bare = tmp_path / "bare"
    bare.mkdir()
    unset = {"template": None, "max_new_tokens": None, "max_prompt_length": None, "eos_token": None}

    settings, sources = eval_settings.resolve(trained, None, unset)
    assert settings == {"template": "plain", "max_new_tokens": 24, "max_prompt_length": 48, "eos_token": None}
    assert sources["template"].startswith("its training settings")
    settings, sources = eval_settings.resolve(trained, None, {**unset, "template": "alpaca"})
    assert settings["template"] == "alpaca" and settings["max_new_tokens"] == 24
    assert sources["template"] == "the command line"
    settings, _ = eval_settings.resolve(trained, "reason", unset)
    assert (settings["template"], settings["max_new_tokens"], settings["max_prompt_length"]) == ("plain", 72, 56)
    settings, sources = eval_settings.resolve(bare, None, unset)
    assert settings == eval_settings.PAPER_PROTOCOL and sources["template"].startswith("default")
    described = eval_settings.describe(settings, sources)
    assert "template=alpaca, max_new_tokens=256, max_prompt_length=256 from default" in described


@pytest.mark.parametrize("pair", ["facts", "reason", "smollm2", "tiny"])
def test_reproduce_evaluates_an_embedded_pair_as_its_preset_says(pair, tmp_path, monkeypatch):
    from mgsr_lightning.pipeline import smollm2

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.jsonl").write_text('{"instruction": "a", "input": "", "output": "b"}\n')
    monkeypatch.setattr(steps, "prepare_tiny", lambda out, pair: tmp_path)
    monkeypatch.setattr(smollm2, "prepare_smollm2", lambda: tmp_path)
    _, eval_sets, config, teacher = steps.pair_setup(pair, None, None, None)
    preset = eval_settings.preset_settings(pair)
    assert (config.sampling.max_new_tokens, config.max_prompt_length, config.template) == (
        preset["max_new_tokens"], preset["max_prompt_length"], preset["template"])
    assert preset["template"] == ("chat" if pair == "smollm2" else "plain")
    assert list(eval_sets) == [f"{pair}-test"] and teacher == tmp_path / "teacher"
    assert eval_settings.preset_settings("gpt2")["template"] == "alpaca"
    with pytest.raises(ConfigError, match="unknown preset 'gpt3'; presets \\(model pairs\\): facts, gpt2, "):
        eval_settings.preset_settings("gpt3")


@pytest.fixture
def evaluated(monkeypatch):
    """The EvalConfig of each model ``evaluate`` scores (generation replaced by a stub)."""
    calls = []

    def fake_evaluate_model(model, tokenizer, eval_sets, config, out, method):
        calls.append((method, config))
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(f"| {method} |\n")
        return {}

    monkeypatch.setattr(commands, "load_model", lambda folder, dtype: (torch.nn.Linear(1, 1), None))
    monkeypatch.setattr(commands, "evaluate_model", fake_evaluate_model)
    return calls


def test_evaluate_uses_each_model_s_training_settings(tiny_assets, tmp_path, evaluated, capsys):
    sft = model_with_settings(tiny_assets, tmp_path / "sft", TINY_TRAINING)
    teacher = model_with_settings(tiny_assets, tmp_path / "teacher", TINY_TRAINING)
    test_set = str(tiny_assets["data"] / "test.jsonl")
    commands.evaluate(model=[str(teacher), str(sft)], sets=[test_set], out=str(tmp_path / "eval"), seeds=[10])
    assert [method for method, _ in evaluated] == ["Teacher", "SFT"]
    for _, config in evaluated:  # the trained 24 new tokens raised to the test set's longest answer (28 tokens + EOS)
        assert (config.template, config.sampling.max_new_tokens, config.max_prompt_length) == ("plain", 29, 48)
    printed = capsys.readouterr().out
    assert f"evaluating {sft}: template=plain, max_prompt_length=48 from its training settings" in printed
    assert "max_new_tokens=29 from the longest reference answer (raised from 24)" in printed
    assert "table --runs" in printed
    commands.evaluate(model=str(sft), sets=[test_set], out=str(tmp_path / "eval1"), template="alpaca", max_new_tokens=8)
    assert (evaluated[-1][1].template, evaluated[-1][1].sampling.max_new_tokens) == ("alpaca", 8)


def test_evaluate_refuses_models_it_would_prompt_differently(tiny_assets, tmp_path, evaluated):
    tiny = model_with_settings(tiny_assets, tmp_path / "a", TINY_TRAINING)
    alpaca = model_with_settings(tiny_assets, tmp_path / "b", {**TINY_TRAINING, "template": "alpaca"})
    test_set = str(tiny_assets["data"] / "test.jsonl")
    with pytest.raises(ConfigError, match="their training settings differ.*pass --preset"):
        commands.evaluate(model=[str(tiny), str(alpaca)], sets=[test_set], out=str(tmp_path / "eval"))
    assert evaluated == [] and not (tmp_path / "eval").exists()
    bare = model_with_settings(tiny_assets, tmp_path / "c", None)  # MiniLLM's 256 + 256 tokens: too long for it
    with pytest.raises(ConfigError, match="max_prompt_length \\+ max_new_tokens = 512 tokens"):
        commands.evaluate(model=str(bare), sets=[test_set], out=str(tmp_path / "eval"))
    commands.evaluate(model=[str(tiny), str(alpaca)], sets=[test_set], out=str(tmp_path / "eval"), preset="tiny")
    assert [(c.template, c.sampling.max_new_tokens) for _, c in evaluated] == [("plain", 29), ("plain", 29)]  # sized
