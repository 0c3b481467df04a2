import json

import pytest

from mgsr_lightning.data.records import DataFormatError, load_records, normalize_row, read_jsonl


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_accepts_alpaca_dolly_and_prompt_response_layouts(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [
        json.dumps({"instruction": "Add 1 and 2.", "input": "", "output": "3"}),
        json.dumps({"instruction": "Summarise.", "context": "A long text.", "response": "Short."}),
        "",
        json.dumps({"prompt": "Q: hi\nA:", "response": "hello"}),
        json.dumps({"instruction": "Name colours.", "output": ["red", "blue"]}),
    ])
    records = read_jsonl(path)
    assert [r["instruction"] for r in records] == ["Add 1 and 2.", "Summarise.", "Q: hi\nA:", "Name colours."]
    assert records[1]["input"] == "A long text." and records[1]["output"] == "Short."
    assert records[2]["prompt"] == "Q: hi\nA:" and "prompt" not in records[0]
    assert records[3]["output"] == ["red", "blue"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"instruction": "x", "output": "y"', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"question": "x", "answer": "y"}', "unrecognised row"),
        ('{"instruction": "x"}', "no 'output'"),
        ('{"instruction": "x", "output": 3}', "must be a string"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, line, message):
    good = json.dumps({"instruction": "a", "output": "b"})
    path = write_lines(tmp_path / "bad.jsonl", [good, good, line])
    with pytest.raises(DataFormatError, match=message) as error:
        read_jsonl(path)
    assert f"{path}:3" in str(error.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_records(str(tmp_path / "nope.jsonl"))


def test_load_records_from_folder_and_saved_dataset(tmp_path):
    import datasets

    folder = tmp_path / "data"
    folder.mkdir()
    write_lines(folder / "train.jsonl", [json.dumps({"instruction": "a", "output": "b"})])
    assert load_records(str(folder), split="train")[0]["output"] == "b"
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([{"instruction": "q", "input": "", "output": "r"}]).save_to_disk(str(saved))
    assert load_records(str(saved))[0] == {"instruction": "q", "input": "", "output": "r"}


def test_normalize_row_where_is_in_message():
    with pytest.raises(DataFormatError, match=r"hub\[3\]"):
        normalize_row({"foo": 1}, "hub[3]")
