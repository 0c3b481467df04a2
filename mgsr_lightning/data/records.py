"""Reading instruction data into one record shape, with errors that name the file and line.

A record is a dict with ``instruction`` (str), ``input`` (str, may be empty) and ``output`` (the
reference response: a str, or a list of str when an evaluation set has several references).
Accepted row layouts:

- Alpaca / MiniLLM: ``instruction``, optional ``input``, ``output``;
- Dolly-15k as released by Databricks: ``instruction``, ``context``, ``response``;
- pre-rendered: ``prompt``, ``response`` (the prompt is used verbatim, no template applied: the
  record then carries ``prompt`` too).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class DataFormatError(ValueError):
    """A data row that cannot be read; the message names the source and the row."""


def normalize_row(row: Any, where: str) -> dict[str, Any]:
    """Map one row of any accepted layout to a record; ``where`` (``file:line``) goes in errors."""
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "prompt" in row and "response" in row:
        record = {"instruction": str(row["prompt"]), "input": "", "output": row["response"], "prompt": str(row["prompt"])}
    elif "instruction" in row:
        context = row.get("input", row.get("context", "")) or ""
        output = row.get("output", row.get("response"))
        if output is None:
            raise DataFormatError(f"{where}: row has 'instruction' but no 'output' (or 'response') field")
        record = {"instruction": str(row["instruction"]), "input": str(context), "output": output}
    else:
        raise DataFormatError(
            f"{where}: unrecognised row with fields {sorted(row)}; expected instruction/input/output, "
            "instruction/context/response or prompt/response"
        )
    output = record["output"]
    if isinstance(output, list):
        if not output or not all(isinstance(o, str) for o in output):
            raise DataFormatError(f"{where}: 'output' must be a string or a non-empty list of strings")
    elif not isinstance(output, str):
        raise DataFormatError(f"{where}: 'output' must be a string, got {type(output).__name__}")
    return record


def read_jsonl(
    path: str | Path, to_record: Callable[[Any, str], dict[str, Any]] = normalize_row, kind: str = "data"
) -> list[dict[str, Any]]:
    """Read a JSONL file of rows (blank lines skipped), each mapped by ``to_record(row, "file:line")``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind} file not found: {path}")
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
            records.append(to_record(row, where))
    return records


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def load_records(source: str, split: str = "train") -> list[dict[str, Any]]:
    """Records from a JSONL/JSON-lines file, a folder holding ``<split>.jsonl``, a dataset saved with
    ``save_to_disk``, or a Hugging Face dataset name (``datasets.load_dataset(source, split=split)``)."""
    path = Path(source)
    if path.is_file():
        return read_jsonl(path)
    if path.is_dir():
        candidate = path / f"{split}.jsonl"
        if candidate.is_file():
            return read_jsonl(candidate)
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            import datasets

            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                loaded = loaded[split]
            return [normalize_row(row, f"{source}[{i}]") for i, row in enumerate(loaded)]
        raise FileNotFoundError(f"{source} is a folder without {split}.jsonl or a saved dataset")
    if path.suffix in {".jsonl", ".json"} or source.startswith((".", "/")):
        raise FileNotFoundError(f"data file not found: {source}")
    import datasets

    loaded = datasets.load_dataset(source, split=split)
    return [normalize_row(row, f"{source}[{split}][{i}]") for i, row in enumerate(loaded)]
