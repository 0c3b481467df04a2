"""``cache-teacher``: run a fit config's teacher once over its training split and store its top-k per position.

On ground-truth rows the teacher only ever produces the same logits, so it runs once over the training split
(:func:`write_teacher_cache`) and a run given the cache (``--data.teacher_cache=<out>``) reads them back with
each batch. A method whose training sequences are always the ground truth (KD, SFT+KD, RKL, ...) then never
loads the teacher (``DistillLightningModule.needs_live_teacher``); a sampling method still loads it for its
fresh and replayed rows and reads the cache on its ground-truth steps. Storage:
:mod:`mgsr_lightning.data.teacher_cache`; the sparse format: :mod:`mgsr_lightning.losses.sparse_teacher`;
see ``docs/teacher_cache.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mgsr_lightning.batch import Rollout
from mgsr_lightning.cli.validation import at_least, available_device, writable_folder
from mgsr_lightning.data.collate import EncodedExample, InstructionCollator
from mgsr_lightning.data.teacher_cache import (
    ENTRIES_FILE,
    META_FILE,
    TeacherCacheWriter,
    data_fingerprint,
    teacher_fingerprint,
)
from mgsr_lightning.errors import ConfigError
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.losses.sparse_teacher import top_k_entries
from mgsr_lightning.models.loading import check_vocabularies
from mgsr_lightning.models.tokenizer import token_id

log = logging.getLogger(__name__)


def command_arguments(args: list[str]) -> list[str]:
    """The command line with its ``--config`` options (fit configs, as ``fit`` takes them, possibly several)
    passed as one ``--fit_config`` list: jsonargparse reads ``--config`` as a config of the command itself."""
    configs, rest, position = [], [], 0
    while position < len(args):
        arg = args[position]
        if arg == "--config" and position + 1 < len(args):
            configs.append(args[position + 1])
            position += 2
            continue
        if arg.startswith("--config="):
            configs.append(arg.removeprefix("--config="))
        else:
            rest.append(arg)
        position += 1
    return ([f"--fit_config={json.dumps(configs)}"] if configs else []) + rest


def _check_cache_folder(folder: Path) -> None:
    """``folder`` is new, empty, or a teacher cache (finished or not): a folder of other files is never written into."""
    if not folder.is_dir():
        return
    others = sorted(entry.name for entry in folder.iterdir() if entry.name not in (META_FILE, ENTRIES_FILE))
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ConfigError(f"out: {folder} holds other files ({shown}) and is not a teacher cache; give a new or "
                          "empty folder (a teacher cache is rebuilt in place)")


def cache_teacher(
    fit_config: list[str], top_k: int = 64, out: str | None = None, overrides: list[str] | None = None,
    batch_size: int | None = None, device: str | None = None,
) -> dict:
    """Run the teacher of a fit config once over the training split, as its data module encodes it, and write
    each response position's top-k token ids and log-probabilities and the log of the remaining mass.

    Args:
        fit_config: The fit config(s), given as ``--config <file>`` like to ``fit`` (e.g.
            ``configs/facts/kd.yaml``); every method of a pair with the same teacher, data, template and
            lengths can share one cache.
        top_k: Entries kept per position (the vocabulary size keeps all of them: exact).
        out: Cache folder (default: ``teacher_cache-k<top_k>`` beside the config's run folder).
        overrides: Further fit options, e.g. ``["--data.max_train_examples=1000"]``.
        batch_size: Rows per teacher forward (default: the data's evaluation batch size).
        device: ``cpu``, ``cuda``, ... (default: ``cuda`` when available).
    """
    from mgsr_lightning.cli.lightning_cli import run_cli

    available_device("device", device)
    at_least("batch_size", batch_size, 1)
    if top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
    configs = list(fit_config)
    cli = run_cli([arg for path in configs for arg in ("--config", path)] + list(overrides or []), run=False)
    module, datamodule = cli.model, cli.datamodule
    if module.teacher_source is None:
        raise ConfigError(f"{configs[-1]} has no teacher to cache")
    out = out or str(Path(cli.trainer.default_root_dir).parent / f"teacher_cache-k{top_k}")
    writable_folder("out", out)
    _check_cache_folder(Path(out))
    datamodule.setup("fit")
    examples = datamodule.train_examples()
    module.tokenizer = module.load_tokenizer()  # what `configure_model` sets before loading the teacher
    module.eos_token_id = token_id(module.tokenizer, module.eos_token)
    meta = {"data": data_fingerprint(examples, datamodule.encoding_settings()),
            "teacher": teacher_fingerprint(module.teacher_source), "teacher_source": module.teacher_source.describe()}
    meta_path = Path(out) / META_FILE
    if meta_path.is_file():
        existing = json.loads(meta_path.read_text())
        if all(existing.get(key) == value for key, value in meta.items()) and existing.get("top_k") == top_k:
            print(f"teacher cache {out} is up to date (k={top_k}, {existing['rows']} rows)")
            return existing
        log.warning("%s was made for another teacher, data or k: building it again", out)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    teacher = module.load_teacher().to(device).eval().requires_grad_(False)
    vocab_size = check_vocabularies(len(module.tokenizer), {"teacher": teacher})
    key = hashlib.sha256(json.dumps([meta["data"], meta["teacher"], top_k, vocab_size]).encode()).hexdigest()[:16]
    written = write_teacher_cache(
        teacher, examples, out, top_k=min(top_k, vocab_size), vocab_size=vocab_size,
        pad_token_id=module.tokenizer.pad_token_id, batch_size=batch_size or datamodule.generation_batch_size,
        meta=meta | {"key": key},
    )
    mib_per_million = written["bytes"] / written["positions"] * 1e6 / 2**20
    print(f"teacher cache {out}: {written['rows']} rows, {written['positions']} positions, k={written['top_k']}, "
          f"{written['bytes'] / 2**20:.1f} MiB ({mib_per_million:.0f} MiB per million tokens)")
    print(f"train from it: python -m mgsr_lightning fit --config {configs[-1]} --data.teacher_cache={out}")
    return written


@torch.no_grad()
def write_teacher_cache(
    teacher: nn.Module,
    examples: Sequence[EncodedExample],
    folder: str,
    *,
    top_k: int,
    vocab_size: int,
    pad_token_id: int,
    batch_size: int,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Run ``teacher`` once over ``examples``' ground-truth responses and write each position's top-k,
    with a progress bar; returns the metadata written (``meta`` plus k, V, rows, positions, bytes)."""
    from tqdm.auto import tqdm

    device = next(teacher.parameters()).device
    collate = InstructionCollator(pad_token_id)
    writer = TeacherCacheWriter(folder)
    with tqdm(total=sum(len(e.response_ids) for e in examples), desc="teacher cache", unit="tok") as progress:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            rollout = Rollout.from_batch(collate(chunk)).to(device)
            entries = top_k_entries(response_logits(teacher, rollout, vocab_size), top_k)
            lengths = [len(e.response_ids) for e in chunk]
            writer.write([e.index for e in chunk], lengths, *entries)
            progress.update(sum(lengths))
    return writer.close(meta | {"top_k": top_k, "vocab_size": vocab_size})
