"""``evaluate`` sizes generation from the reference answers, or says plainly how many it cuts."""

from __future__ import annotations

import json
import shutil

from mgsr_lightning.pipeline.answer_lengths import reference_lengths, size_generation

TRAINED = "its training settings (students/sft/mgsr_training.json)"
SETTINGS = {"template": "plain", "max_prompt_length": 48, "max_new_tokens": 24, "eos_token": None}


def sources(max_new_tokens: str) -> dict[str, str]:
    return {"template": TRAINED, "max_prompt_length": TRAINED, "max_new_tokens": max_new_tokens, "eos_token": TRAINED}


def test_a_trained_length_is_raised_to_the_longest_answer():
    lengths = [10, 20, 30, 55]  # tokens with the EOS
    settings, where, note = size_generation("students/sft", SETTINGS, sources(TRAINED), lengths, positions=128)
    assert settings["max_new_tokens"] == 55
    assert where["max_new_tokens"] == "the longest reference answer (raised from 24)"
    assert note == (f"students/sft: max_new_tokens raised from 24 ({TRAINED}) to 55: "
                    "the longest reference answer has 54 tokens and its EOS")
    unchanged, _, silent = size_generation("students/sft", SETTINGS, sources(TRAINED), [10, 24], positions=128)
    assert unchanged["max_new_tokens"] == 24 and silent is None


def test_the_raise_stops_at_the_model_s_positions_and_the_cut_answers_are_counted():
    settings, _, note = size_generation("students/sft", SETTINGS, sources(TRAINED), [10, 70, 90, 100], positions=128)
    assert settings["max_new_tokens"] == 80  # 128 positions - 48 prompt tokens
    assert note.endswith("; 2 of 4 reference answers (50%) are longer than the 80 new tokens sampled "
                         "(the model's 128 positions leave 80 after prompts of up to 48 tokens), "
                         "so their samples are cut and score lower")


def test_a_length_from_the_command_line_or_the_paper_s_protocol_is_kept_and_its_cuts_counted():
    for given in ("the command line", "default (MiniLLM's protocol)"):
        settings, _, note = size_generation("m", SETTINGS, sources(given), [10, 30, 40], positions=None)
        assert settings["max_new_tokens"] == 24
        assert note == (f"m: 2 of 3 reference answers (67%) are longer than the 24 new tokens sampled ({given} sets "
                        "max_new_tokens=24), so their samples are cut and score lower; "
                        "pass --max_new_tokens to sample more")


def test_reference_lengths_count_the_longest_reference_and_its_eos(tiny_tokenizer):
    rows = [{"instruction": "a", "output": "one two"}, {"instruction": "b", "output": ["one", "one two three four"]}]
    tokens = [len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
              for text in ("one two", "one two three four")]
    assert reference_lengths(tiny_tokenizer, {"set": rows}) == [tokens[0] + 1, tokens[1] + 1]


def test_evaluate_samples_enough_tokens_for_long_answers(tiny_assets, tmp_path, capsys):
    """A model trained with 24 new tokens (``--preset tiny``) evaluated on answers of 40 words samples enough for
    them, and says so."""
    from mgsr_lightning.__main__ import main
    from mgsr_lightning.models.tokenizer import load_tokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_assets["models"]["gpt2"]["student"], model)
    tokenizer = load_tokenizer(str(tiny_assets["tokenizer"]))
    tokenizer.save_pretrained(model)
    rows = [{"instruction": "Count.", "input": "", "output": " ".join(["one"] * 40)},
            {"instruction": "Say hi.", "input": "", "output": "hi"}]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    longest = len(tokenizer(rows[0]["output"], add_special_tokens=False)["input_ids"]) + 1
    main(["evaluate", "--model", str(model), "--sets", f"[{tmp_path / 'long.jsonl'}]", "--preset", "tiny",
          "--seeds", "[10]", "--out", str(tmp_path / "eval")])
    printed = capsys.readouterr().out
    assert f"max_new_tokens raised from 24 (--preset tiny (configs/tiny/base.yaml)) to {min(longest, 80)}" in printed
    config = json.loads((tmp_path / "eval" / "metrics.json").read_text())["config"]
    assert config["sampling"]["max_new_tokens"] == min(longest, 80)
