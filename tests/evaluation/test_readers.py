"""Readers of MiniLLM's evaluation sets and of Dolly-15k, on small fixture files in MiniLLM's layout."""

import json
from pathlib import Path

import pytest

from mgsr_lightning.data.records import DataFormatError
from mgsr_lightning.data.templates import render_prompt
from mgsr_lightning.evaluation import readers
from mgsr_lightning.evaluation.readers import EVAL_SETS, load_dolly15k, load_eval_set, split_dolly15k
from mgsr_lightning.evaluation.rouge import as_references

DATA_ROOT = Path(__file__).parent / "fixtures" / "minillm_data"
DATABRICKS_DOLLY = Path(__file__).parent / "fixtures" / "databricks-dolly-15k.jsonl"


def test_registry_matches_minillm_eval_scripts():
    assert list(EVAL_SETS) == ["dolly", "self_inst", "vicuna", "sinst", "uinst"]
    assert [s.display_name for s in EVAL_SETS.values()] == ["DollyEval", "SelfInst", "Vicuna", "S-NI", "UnNI"]
    assert [s.hub_repo for s in EVAL_SETS.values()] == [
        "MiniLLM/dolly", "MiniLLM/self-inst", "MiniLLM/Vicuna", "MiniLLM/sinst", "MiniLLM/uinst"]
    assert EVAL_SETS["sinst"].split_dir == EVAL_SETS["uinst"].split_dir == "11_"
    assert EVAL_SETS["uinst"].max_examples == 10_000
    assert EVAL_SETS["dolly"].max_examples is None


@pytest.mark.parametrize(
    "name, expected_rows", [("dolly", 3), ("self_inst", 2), ("vicuna", 2), ("sinst", 3), ("uinst", 3)]
)
def test_each_set_reads_from_minillm_data_root(name, expected_rows):
    records = load_eval_set(name, DATA_ROOT)
    assert len(records) == expected_rows
    for record in records:
        assert set(record) == {"instruction", "input", "output", "prompt"}
        assert record["prompt"].endswith("### Response:\n")
        # MiniLLM's prompt is its Alpaca template of instruction/input, which our template reproduces.
        assert record["prompt"] == render_prompt(record, "alpaca")


def test_eleven_token_split_is_selected_for_sni_and_unni():
    for name in ("sinst", "uinst"):
        records = load_eval_set(name, DATA_ROOT)
        shortest = min(len(ref.split()) for r in records for ref in as_references(r["output"]))
        assert shortest >= 11
        short_split = load_eval_set(name, DATA_ROOT, split_dir="0_2")
        assert all(len(ref.split()) <= 2 for r in short_split for ref in as_references(r["output"]))
        assert {r["instruction"] for r in records}.isdisjoint(r["instruction"] for r in short_split)


def test_source_can_be_the_set_folder_or_the_file():
    from_root = load_eval_set("sinst", DATA_ROOT)
    assert load_eval_set("sinst", DATA_ROOT / "sinst") == from_root  # a download of the hub repo
    assert load_eval_set("sinst", DATA_ROOT / "sinst" / "11_") == from_root
    assert load_eval_set("sinst", DATA_ROOT / "sinst" / "11_" / "valid.jsonl") == from_root


def test_multiple_references_are_kept_as_a_list():
    records = load_eval_set("sinst", DATA_ROOT)
    assert isinstance(records[0]["output"], list) and len(records[0]["output"]) == 2
    assert isinstance(load_eval_set("dolly", DATA_ROOT)[0]["output"], str)


def test_newline_markers_in_prompts_become_newlines():
    raw_prompt = json.loads((DATA_ROOT / "dolly" / "valid.jsonl").read_text().splitlines()[1])["prompt"]
    assert "<n>" in raw_prompt and "\n" not in raw_prompt
    record = load_eval_set("dolly", DATA_ROOT)[1]
    assert record["prompt"] == raw_prompt.replace("<n>", "\n")
    assert "<n>" not in record["prompt"] and "### Input:\n9 3 7 1\n\n" in record["prompt"]


def test_use_prompt_field_false_leaves_rendering_to_the_template():
    records = load_eval_set("vicuna", DATA_ROOT, use_prompt_field=False)
    assert all("prompt" not in r for r in records)
    assert records[0]["instruction"] == "How can I improve my time management skills?"


def test_max_examples_keeps_the_first_rows_and_uinst_defaults_to_its_cap(monkeypatch):
    assert [r["instruction"] for r in load_eval_set("uinst", DATA_ROOT, max_examples=2)] == [
        r["instruction"] for r in load_eval_set("uinst", DATA_ROOT)[:2]]
    capped = readers.EvalSetSpec("UnNI", "MiniLLM/uinst", "uinst", "11_", max_examples=1)
    monkeypatch.setitem(EVAL_SETS, "uinst", capped)
    assert len(load_eval_set("uinst", DATA_ROOT)) == 1


def test_prompt_and_output_rows_without_instruction(tmp_path):
    path = tmp_path / "valid.jsonl"
    path.write_text(json.dumps({"prompt": "Q:<n>Name a fruit.<n>A:", "output": ["Banana", "Apple"]}) + "\n")
    (record,) = load_eval_set("vicuna", path)
    assert record["prompt"] == "Q:\nName a fruit.\nA:"
    assert record["output"] == ["Banana", "Apple"] and record["input"] == ""


def test_bad_rows_name_file_and_line(tmp_path):
    path = tmp_path / "valid.jsonl"
    path.write_text(json.dumps({"instruction": "ok", "output": "fine"}) + "\n\n{not json\n")
    with pytest.raises(DataFormatError, match=r"valid.jsonl:3: invalid JSON"):
        load_eval_set("dolly", path)
    path.write_text(json.dumps({"instruction": "no output here"}) + "\n")
    with pytest.raises(DataFormatError, match=r"valid.jsonl:1: .*no 'output'"):
        load_eval_set("dolly", path)


def test_missing_local_set_lists_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"11_/valid.jsonl"):
        load_eval_set("sinst", tmp_path)
    with pytest.raises(KeyError, match="unknown evaluation set 'nope'"):
        load_eval_set("nope", DATA_ROOT)


def test_hub_source_downloads_the_split_file_of_the_dataset_repo(monkeypatch):
    calls = []

    def fake_download(repo_id, filename, *, repo_type, revision):
        calls.append((repo_id, filename, repo_type, revision))
        return str(DATA_ROOT / "uinst" / filename)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    records = load_eval_set("uinst", revision="abc123")
    assert calls == [("MiniLLM/uinst", "11_/valid.jsonl", "dataset", "abc123")]
    assert records == load_eval_set("uinst", DATA_ROOT)


def test_hub_failure_explains_how_to_get_the_files(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("offline mode is enabled")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", offline)
    with pytest.raises(FileNotFoundError, match=r"MiniLLM/self-inst: .*huggingface-cli download MiniLLM/self-inst"):
        load_eval_set("self_inst")


def test_dolly15k_first_dev_num_rows_are_validation():
    splits = load_dolly15k(DATA_ROOT / "dolly", dev_num=2)
    assert [r["instruction"] for r in splits["valid"]] == [
        "Question number 0: add 0 and 0.", "Question number 1: add 1 and 1."]
    assert len(splits["train"]) == 4 and splits["train"][0]["instruction"].startswith("Question number 2")
    assert splits["valid"][0]["input"] == "Context 0." and splits["valid"][1]["input"] == ""
    assert load_dolly15k(DATA_ROOT / "dolly" / "raw.jsonl", dev_num=2) == splits
    assert readers.DOLLY_DEV_NUM == 1000


def test_dolly15k_reads_the_databricks_release_fields():
    splits = load_dolly15k(DATABRICKS_DOLLY, dev_num=1)
    assert splits["valid"] == [{
        "instruction": "When did the holiday start?",
        "input": "The market was closed for the holiday.",
        "output": "It started this morning.",
    }]
    assert [r["output"] for r in splits["train"]] == ["Banana.", "42"]


def test_dolly15k_split_must_leave_training_rows():
    with pytest.raises(ValueError, match="dev_num=3"):
        split_dolly15k([{"instruction": "a", "input": "", "output": "b"}] * 3, dev_num=3)
