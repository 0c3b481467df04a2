"""Readers for the evaluation sets of MiniLLM/DistiLLM/MGSR and for Dolly-15k with MiniLLM's split.

MiniLLM distributes each evaluation set as a Hugging Face dataset repo of raw files (read with
``hf_hub_download``, not ``datasets.load_dataset``), and its scripts expect the same layout under a
local ``data/`` root::

    name       Table 1   hub repo            file                 rows used (eval_main_*.sh)
    dolly      DollyEval MiniLLM/dolly       valid.jsonl          all
    self_inst  SelfInst  MiniLLM/self-inst   valid.jsonl          all
    vicuna     Vicuna    MiniLLM/Vicuna      valid.jsonl          all
    sinst      S-NI      MiniLLM/sinst       11_/valid.jsonl      all
    uinst      UnNI      MiniLLM/uinst       11_/valid.jsonl      the first 10,000 (``--dev-num 10000``)

S-NI and UnNI are split by reference length into folders ``0_2``, ``3_6`` (``3_5`` for uinst),
``6_10`` and ``11_``; the papers evaluate on ``11_``, the references of at least 11 tokens.

An evaluation row has ``instruction``, ``input``, ``output`` (a string or a list of references)
and ``prompt``: the prompt MiniLLM feeds the model, already rendered with its Alpaca template and
with newlines possibly written as ``<n>``. MiniLLM uses that ``prompt`` verbatim (``<n>`` → newline),
so by default the records keep it under ``prompt`` and it is used as is; ``use_prompt_field=False``
drops it so that the prompt is rendered from instruction/input with the configured template
(e.g. a chat template). ``records.normalize_row`` ignores ``prompt`` when ``instruction`` is
present and rejects ``prompt`` + ``output`` rows, hence :func:`eval_row_to_record`.

Training data: ``MiniLLM/dolly`` also holds ``raw.jsonl``, Dolly-15k with the fields renamed to
instruction/input/output. ``tools/process_data_dolly.py`` takes its **first 1,000 lines as the
validation split** and the rest for training (before dropping prompts longer than 256 tokens, which
happens at tokenisation: ``data.datamodule.encode_records``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgsr_lightning.data.records import normalize_row, read_jsonl
from mgsr_lightning.errors import MissingFileError

EVAL_FILE_NAME = "valid.jsonl"
DOLLY_HUB_REPO = "MiniLLM/dolly"
DOLLY_TRAIN_FILE_NAME = "raw.jsonl"
DOLLY_DEV_NUM = 1000


@dataclass(frozen=True)
class EvalSetSpec:
    """Where and how MiniLLM distributes one evaluation set.

    Args:
        display_name: column header in Table 1.
        hub_repo: Hugging Face dataset repo holding the files.
        folder: the set's folder under MiniLLM's local ``data/`` root.
        split_dir: subfolder of the split the papers use ("" when the set has no splits).
        max_examples: rows used (the first N), MiniLLM's ``--dev-num``; None = all rows.
    """

    display_name: str
    hub_repo: str
    folder: str
    split_dir: str = ""
    max_examples: int | None = None


EVAL_SETS: dict[str, EvalSetSpec] = {
    "dolly": EvalSetSpec("DollyEval", "MiniLLM/dolly", "dolly"),
    "self_inst": EvalSetSpec("SelfInst", "MiniLLM/self-inst", "self-inst"),
    "vicuna": EvalSetSpec("Vicuna", "MiniLLM/Vicuna", "vicuna"),
    "sinst": EvalSetSpec("S-NI", "MiniLLM/sinst", "sinst", split_dir="11_"),
    "uinst": EvalSetSpec("UnNI", "MiniLLM/uinst", "uinst", split_dir="11_", max_examples=10_000),
}


def eval_row_to_record(row: Any, where: str, use_prompt_field: bool = True) -> dict[str, Any]:
    """Map one MiniLLM evaluation row to a record (``where`` = ``file:line`` for errors).

    With ``use_prompt_field`` and a ``prompt`` in the row, the record carries ``prompt`` (``<n>``
    replaced by a newline, as MiniLLM's ``PromptDataset`` does) and is fed to the model verbatim.
    """
    if isinstance(row, dict) and "prompt" in row and "output" in row and "instruction" not in row:
        record = normalize_row({"prompt": row["prompt"], "response": row["output"]}, where)
        record["input"] = str(row.get("input") or "")
    else:
        record = normalize_row(row, where)
    if use_prompt_field and row.get("prompt"):
        record["prompt"] = str(row["prompt"]).replace("<n>", "\n")
    else:
        record.pop("prompt", None)
    return record


def read_eval_jsonl(path: str | Path, use_prompt_field: bool = True) -> list[dict[str, Any]]:
    """Records from a MiniLLM evaluation JSONL file; errors name ``file:line``."""
    return read_jsonl(path, functools.partial(eval_row_to_record, use_prompt_field=use_prompt_field), "evaluation")


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_file(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """A file of a Hugging Face dataset repo (downloaded or from the local cache); a
    :class:`~mgsr_lightning.errors.MissingFileError` in one line when it can be neither."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, filename, repo_type="dataset", revision=revision))
    except (OSError, ValueError) as error:  # offline mode, missing file, HTTP errors
        offline = [f"{name}={os.environ[name]}" for name in OFFLINE_VARIABLES
                   if os.environ.get(name, "") not in ("", "0")]
        why = (f"offline ({', '.join(offline)}) and not in the local cache" if offline
               else str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise MissingFileError(
            f"could not get {filename} from the hub dataset repo {repo_id}: {why}. Download it on a connected "
            f"machine (`huggingface-cli download {repo_id} --repo-type dataset --local-dir DIR`) and pass DIR as "
            "the source"
        ) from error


def eval_set_file(name: str, source: str | Path | None = None, *, split_dir: str | None = None,
                  revision: str | None = None) -> Path:
    """The JSONL file of evaluation set ``name``.

    ``source`` may be the file itself; a folder holding ``<split_dir>/valid.jsonl`` (a download of
    the hub repo) or ``valid.jsonl``; or MiniLLM's ``data/`` root holding
    ``<folder>/<split_dir>/valid.jsonl``. None: the hub repo (``revision`` pins a commit).
    ``split_dir`` overrides the spec's split (e.g. ``"0_2"`` for S-NI's shortest references).
    """
    spec = eval_set_spec(name)
    split_dir = spec.split_dir if split_dir is None else split_dir
    relative = f"{split_dir}/{EVAL_FILE_NAME}" if split_dir else EVAL_FILE_NAME
    if source is None:
        return hub_file(spec.hub_repo, relative, revision)
    source = Path(source)
    if source.is_file():
        return source
    candidates = [source / relative, source / EVAL_FILE_NAME, source / spec.folder / relative]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise MissingFileError(f"evaluation set {name!r}: no {EVAL_FILE_NAME} under {source} (tried {tried})")


def eval_set_spec(name: str) -> EvalSetSpec:
    if name not in EVAL_SETS:
        raise KeyError(f"unknown evaluation set {name!r}; known: {', '.join(EVAL_SETS)}")
    return EVAL_SETS[name]


def load_eval_set(
    name: str,
    source: str | Path | None = None,
    *,
    split_dir: str | None = None,
    max_examples: int | None = None,
    use_prompt_field: bool = True,
    revision: str | None = None,
) -> list[dict[str, Any]]:
    """Records of evaluation set ``name`` (a key of :data:`EVAL_SETS`), in file order.

    ``source``/``split_dir``/``revision``: see :func:`eval_set_file`. ``max_examples``: keep the
    first N rows; None applies the set's protocol cap (10,000 for UnNI, none otherwise).
    """
    spec = eval_set_spec(name)
    records = read_eval_jsonl(eval_set_file(name, source, split_dir=split_dir, revision=revision), use_prompt_field)
    limit = spec.max_examples if max_examples is None else max_examples
    return records if limit is None else records[:limit]


def split_dolly15k(records: list[dict[str, Any]], dev_num: int = DOLLY_DEV_NUM) -> dict[str, list[dict[str, Any]]]:
    """MiniLLM's split: the first ``dev_num`` rows are ``valid``, the rest ``train`` (file order, no shuffle)."""
    if not 0 <= dev_num < len(records):
        raise ValueError(f"dev_num={dev_num} must be in [0, {len(records)}) so that training rows remain")
    return {"train": records[dev_num:], "valid": records[:dev_num]}


def load_dolly15k(source: str | Path | None = None, *, dev_num: int = DOLLY_DEV_NUM,
                  revision: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Dolly-15k as ``{"train": records, "valid": records}`` with MiniLLM's first-``dev_num`` split.

    ``source``: a JSONL file (MiniLLM's ``raw.jsonl`` with instruction/input/output, or Databricks'
    release with instruction/context/response), a folder holding ``raw.jsonl``, or None for
    ``raw.jsonl`` of the ``MiniLLM/dolly`` hub repo.
    """
    if source is None:
        path = hub_file(DOLLY_HUB_REPO, DOLLY_TRAIN_FILE_NAME, revision)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / DOLLY_TRAIN_FILE_NAME
    return split_dolly15k(read_jsonl(path), dev_num)
