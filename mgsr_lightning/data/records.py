"""Reading instruction data into one record shape, with errors that name the file and line.

A record is a dict with ``instruction`` (str), ``input`` (str, may be empty) and ``output`` (the
reference response: a str, or a list of str when an evaluation set has several references).
Accepted row layouts:

- Alpaca / MiniLLM: ``instruction``, optional ``input``, ``output``;
- Dolly-15k as released by Databricks: ``instruction``, ``context``, ``response``;
- pre-rendered: ``prompt``, ``response`` (the prompt is used verbatim, no template applied: the
  record then carries ``prompt`` too).

Every text field must be a JSON string (``null``, numbers and lists are rejected rather than turned
into text such as ``"None"``), the reference must not be empty, and the file must be UTF-8 with at
least one row; each error names the file and line. A UTF-8 byte order mark at the start of the
file (as Notepad and Excel write it) is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgsr_lightning.atomic import atomic_path
from mgsr_lightning.errors import MissingFileError, UserError
from mgsr_lightning.missing import describe_missing


class DataFormatError(UserError, ValueError):
    """A data row that cannot be read; the message names the source and the row."""


def normalize_row(row: Any, where: str) -> dict[str, Any]:
    """Map one row of any accepted layout to a record; ``where`` (``file:line``) goes in errors."""
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "prompt" in row and "response" in row:
        prompt = _text(row, "prompt", where)
        record = {"instruction": prompt, "input": "", "output": row["response"], "prompt": prompt}
        output_field = "response"
    elif "instruction" in row:
        context_field = "input" if "input" in row else "context" if "context" in row else None
        output_field = "output" if "output" in row else "response" if "response" in row else None
        if output_field is None:
            raise DataFormatError(f"{where}: row has 'instruction' but no 'output' (or 'response') field")
        context = _text(row, context_field, where) if context_field else ""
        record = {"instruction": _text(row, "instruction", where), "input": context, "output": row[output_field]}
    else:
        raise DataFormatError(
            f"{where}: unrecognised row with fields {sorted(row)}; expected instruction/input/output, "
            "instruction/context/response or prompt/response"
        )
    output = record["output"]
    if isinstance(output, list):
        if not output or not all(isinstance(o, str) for o in output):
            raise DataFormatError(f"{where}: {output_field!r} must be a string or a non-empty list of strings")
        if not any(o.strip() for o in output):
            raise DataFormatError(f"{where}: {output_field!r} has only empty references")
    elif not isinstance(output, str):
        raise DataFormatError(f"{where}: {output_field!r} must be a string, got {_json_type(output)}")
    elif not output.strip():
        raise DataFormatError(f"{where}: {output_field!r} is empty; a row needs a reference response")
    return record


def _json_type(value: Any) -> str:
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "a list",
             dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _text(row: dict[str, Any], field: str, where: str) -> str:
    value = row[field]
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: {field!r} must be a string, got {_json_type(value)}")
    return value


def read_jsonl(
    path: str | Path, to_record: Callable[[Any, str], dict[str, Any]] = normalize_row, kind: str = "data"
) -> list[dict[str, Any]]:
    """Read a JSONL file of rows (blank lines skipped), each mapped by ``to_record(row, "file:line")``."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{kind} file {describe_missing(path)}")
    records = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(
                    f"{where}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
                    "re-save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
            records.append(to_record(row, where))
    if not records:
        raise DataFormatError(f"{path}: the {kind} file is empty (no JSON rows)")
    return records


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> None:
    with atomic_path(path) as temporary, temporary.open("w", encoding="utf-8") as handle:
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
        raise MissingFileError(f"{source} is a folder without {split}.jsonl or a saved dataset")
    if path.suffix in {".jsonl", ".json"} or source.startswith((".", "/")):
        raise MissingFileError(f"data file not found: {source}")
    import datasets

    loaded = datasets.load_dataset(source, split=split)
    return [normalize_row(row, f"{source}[{split}][{i}]") for i, row in enumerate(loaded)]
