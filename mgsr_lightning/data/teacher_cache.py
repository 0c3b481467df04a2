"""A teacher cache on disk: per training example, the teacher's top-k over each ground-truth response position.

Layout of a cache folder (written by ``python -m mgsr_lightning cache-teacher``):

    teacher_cache.json   what the cache was made from: fingerprints of the teacher's files, of the
                         encoded training rows (template and length policy included), k and V
    entries.arrow        one Arrow row per training example (read memory-mapped through ``datasets``):
                         index      int64            the example's index (``EncodedExample.index``)
                         top_ids    list<int32>      [R·k] the top-k token ids of its R response positions
                         top_logp   list<float32>    [R·k] their log-probabilities
                         rest_logp  list<float32>    [R]   log of the mass of the other V − k tokens

Rows are looked up by example index, never by position in the file, so any order of reading (a
shuffled sampler, DDP ranks each reading their own share, a resumed run) gets the right entries.
What the entries mean and how losses read them: :mod:`mgsr_lightning.losses.sparse_teacher`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pyarrow as pa
import torch

from mgsr_lightning.batch import TEACHER_CACHE_KEYS
from mgsr_lightning.data.collate import EncodedExample, InstructionCollator
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.models.loading import ModelSource

META_FILE, ENTRIES_FILE, FORMAT = "teacher_cache.json", "entries.arrow", 1

SCHEMA = pa.schema([("index", pa.int64()), ("top_ids", pa.list_(pa.int32())), ("top_logp", pa.list_(pa.float32())),
                    ("rest_logp", pa.list_(pa.float32()))])
_SAMPLED = 1 << 20  # bytes read at each of 16 offsets of a weight file larger than 64 MiB
REBUILD = "rebuild it: python -m mgsr_lightning cache-teacher --config <this fit config> --out {path}"


def data_fingerprint(examples: Iterable[EncodedExample], settings: dict[str, Any]) -> str:
    """Hash of the encoded training rows (index, prompt and response ids) and the encoding ``settings``
    (template, lengths, EOS): what decides which positions the teacher is asked about."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for example in examples:
        digest.update(repr((example.index, example.prompt_ids, example.response_ids)).encode())
    return digest.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    """sha256 of a file's size and content; files over 64 MiB are read at 16 spread offsets (1 MiB each)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        if size <= 64 * _SAMPLED:
            digest.update(handle.read())
        else:
            for offset in np.linspace(0, size - _SAMPLED, 16).astype(np.int64):
                handle.seek(int(offset))
                digest.update(handle.read(_SAMPLED))
    return digest.hexdigest()


def teacher_fingerprint(source: ModelSource) -> str:
    """Hash of the teacher's settings (dtype, GGUF file, config, seed, ...) and, for a local folder, of
    its files (names, sizes, contents). A hub id is taken by its name and revision."""
    settings = {k: v for k, v in dataclasses.asdict(source).items() if k != "name_or_path"}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    folder = Path(source.name_or_path) if source.name_or_path else None
    if folder is not None and folder.is_dir():
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(f"{path.relative_to(folder)}:{_file_digest(path)}".encode())
    elif source.name_or_path:
        digest.update(source.name_or_path.encode())
    return digest.hexdigest()[:16]


class TeacherCacheWriter:
    """Appends examples' sparse teacher entries to ``folder/entries.arrow``; ``close(meta)`` writes the
    metadata last, so a folder without ``teacher_cache.json`` is an unfinished cache."""

    def __init__(self, folder: str | Path):
        from datasets.arrow_writer import ArrowWriter

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / META_FILE).unlink(missing_ok=True)
        self.writer = ArrowWriter(schema=SCHEMA, path=str(self.folder / ENTRIES_FILE))
        self.rows = self.positions = 0

    def write(self, indices: Sequence[int], lengths: Sequence[int], top_ids: torch.Tensor,
              top_logprobs: torch.Tensor, rest_logprob: torch.Tensor) -> None:
        """Entries of B examples: ``top_ids``/``top_logprobs`` [B, R, k], ``rest_logprob`` [B, R]; row b keeps
        its first ``lengths[b]`` positions."""
        k = top_ids.size(-1)
        keep = torch.arange(top_ids.size(1)) < torch.as_tensor(list(lengths)).unsqueeze(1)  # [B, R]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = top_ids.cpu()[keep].to(torch.int32).numpy().reshape(-1)
        logp = top_logprobs.cpu()[keep].float().numpy().reshape(-1)
        rest = rest_logprob.cpu()[keep].float().numpy()
        table = pa.table({
            "index": pa.array(indices, pa.int64()),
            "top_ids": pa.ListArray.from_arrays(offsets * k, ids),
            "top_logp": pa.ListArray.from_arrays(offsets * k, logp),
            "rest_logp": pa.ListArray.from_arrays(offsets, rest),
        }, schema=SCHEMA)
        self.writer.write_table(table)
        self.rows += len(indices)
        self.positions += int(offsets[-1])

    def close(self, meta: dict[str, Any]) -> dict[str, Any]:
        self.writer.finalize()
        self.writer.close()
        meta = {"format": FORMAT, "rows": self.rows, "positions": self.positions,
                "bytes": (self.folder / ENTRIES_FILE).stat().st_size} | meta
        (self.folder / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        return meta


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The cache's metadata; a missing or unfinished cache is a ``MissingFileError`` with the command that builds it."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise MissingFileError(f"no finished teacher cache in {folder} ({META_FILE} missing); " + REBUILD.format(
            path=folder))
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ConfigError(f"teacher cache {folder} has format {meta.get('format')}, this version reads {FORMAT}; "
                          + REBUILD.format(path=folder))
    return meta


class TeacherCacheCheck(L.Callback):
    """Refuses, once the module has loaded its pair (``configure_model``) and before any training step, a cache
    made by another teacher or over another vocabulary size than the module's (:func:`check_teacher`). The CLI
    adds it to every run given ``data.teacher_cache``."""

    def __init__(self, folder: str | Path):
        self.folder = folder

    def on_fit_start(self, trainer, pl_module) -> None:
        if pl_module.teacher_source is not None:
            check_teacher(self.folder, pl_module.teacher_source, pl_module.vocab_size)


def check_teacher(folder: str | Path, source: ModelSource, vocab_size: int) -> None:
    """Refuse (``ConfigError``, one line) a cache made by another teacher or over another vocabulary size."""
    meta = read_meta(folder)
    if meta["teacher"] != teacher_fingerprint(source):
        raise ConfigError(f"teacher cache {folder} was made by another teacher ({meta['teacher_source']}, or its files "
                          f"changed) than {source.describe()}; " + REBUILD.format(path=folder))
    if meta["vocab_size"] != vocab_size:
        raise ConfigError(f"teacher cache {folder} is over {meta['vocab_size']} tokens but the pair shares "
                          f"{vocab_size}; " + REBUILD.format(path=folder))


class TeacherCache:
    """A finished cache opened for training, checked against the encoded training rows.

    ``entries(index)`` → (top_ids [R, k] long, top_logprobs [R, k] fp32, rest_logprob [R] fp32) of that example.
    """

    def __init__(self, folder: str | Path, examples: list[EncodedExample], settings: dict[str, Any]):
        from datasets import Dataset

        self.folder = Path(folder)
        meta = read_meta(folder)
        if meta["data"] != data_fingerprint(examples, settings):
            raise ConfigError(f"teacher cache {folder} was made for other training rows, template or lengths than "
                              "this run's; " + REBUILD.format(path=folder))
        self.top_k, self.vocab_size = meta["top_k"], meta["vocab_size"]
        self.rows = Dataset.from_file(str(self.folder / ENTRIES_FILE)).with_format("numpy")  # memory-mapped
        self.position = {int(index): row for row, index in enumerate(self.rows["index"])}

    def entries(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        row = self.rows[self.position[index]]
        k = self.top_k
        return (torch.from_numpy(row["top_ids"].astype(np.int64)).view(-1, k),
                torch.from_numpy(row["top_logp"].astype(np.float32)).view(-1, k),
                torch.from_numpy(row["rest_logp"].astype(np.float32)))

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers re-open the memory map rather than copy it
        return {"folder": self.folder, "top_k": self.top_k, "vocab_size": self.vocab_size, "position": self.position}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from datasets import Dataset

        self.__dict__.update(state)
        self.rows = Dataset.from_file(str(self.folder / ENTRIES_FILE)).with_format("numpy")


class CachedTeacherCollator(InstructionCollator):
    """``InstructionCollator``'s batch plus the cached teacher entries of its rows, response-aligned:
    ``teacher_top_ids`` [B, R, k] long, ``teacher_top_logprobs`` [B, R, k] and ``teacher_rest_logprob`` [B, R].
    Padding positions hold the uniform distribution (finite everywhere; the losses mask them)."""

    def __init__(self, pad_token_id: int, cache: TeacherCache):
        super().__init__(pad_token_id)
        self.cache = cache

    def __call__(self, examples: Sequence[EncodedExample]) -> dict[str, Any]:
        batch = super().__call__(examples)
        width, k, vocab = batch["response_ids"].size(1), self.cache.top_k, self.cache.vocab_size
        top_ids = torch.arange(k).expand(len(examples), width, k).clone()
        top_logprobs = torch.full((len(examples), width, k), -math.log(vocab))
        rest = torch.full((len(examples), width), math.log1p(-k / vocab) if k < vocab else -math.inf)
        for row, example in enumerate(examples):
            ids, logprobs, rest_logprob = self.cache.entries(example.index)
            if ids.size(0) != len(example.response_ids):
                raise ConfigError(f"teacher cache {self.cache.folder} holds {ids.size(0)} positions for example "
                                  f"{example.index}, which has {len(example.response_ids)}; "
                                  + REBUILD.format(path=self.cache.folder))
            top_ids[row, : ids.size(0)], top_logprobs[row, : ids.size(0)], rest[row, : ids.size(0)] = (
                ids, logprobs, rest_logprob)
        return batch | dict(zip(TEACHER_CACHE_KEYS, (top_ids, top_logprobs, rest)))
