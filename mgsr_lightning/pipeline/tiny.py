"""The embedded pairs: generated data, a locally trained tokenizer and an SFT-trained teacher.

``tiny`` is the quick default (short answers); ``reason`` is the benchmark where distillation
matters (worked multi-step answers, several valid phrasings; see
:mod:`mgsr_lightning.data.tasks.reasoning`); ``facts`` asks about a generated world that the teacher
learns from ten times the students' labelled data (:mod:`mgsr_lightning.data.tasks.knowledge`).
Everything is cached under one folder per pair (``artifacts/<pair>`` by default); a step whose output
exists is skipped, so a second run reuses the teacher.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mgsr_lightning.cli import validation
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.data.tasks.knowledge import write_facts_dataset
from mgsr_lightning.data.tasks.reasoning import write_reason_dataset
from mgsr_lightning.data.tasks.tiny import write_tiny_dataset
from mgsr_lightning.data.templates import render_prompt
from mgsr_lightning.missing import ROOT_ENVS, TINY_ROOT_ENV
from mgsr_lightning.models.tokenizer import train_bpe_tokenizer
from mgsr_lightning.pipeline.manifest import Manifest
from mgsr_lightning.pipeline.paths import config_path, configured_root, environment

log = logging.getLogger(__name__)

DEFAULT_SIZES = {"train": 20000, "validation": 200, "test": 400}
# per embedded pair: its data writer, default sizes, BPE vocabulary and the tokenizer's model_max_length
EMBEDDED = {
    "tiny": (write_tiny_dataset, DEFAULT_SIZES, 1024, 128),
    "reason": (write_reason_dataset, {"train": 30000, "validation": 200, "test": 240}, 2048, 256),
    "facts": (write_facts_dataset, {"train": 30000, "validation": 240, "test": 240}, 2048, 256),
}
# pairs whose students see only the first N training rows (data/student_train.jsonl) while the teacher
# sees them all: the labelled data of the students is small, as in DistiLLM's and MiniLLM's setting
# (Dolly's 14k rows, many epochs), which is where a teacher's soft targets add to the ground truth
STUDENT_TRAIN_ROWS = {"reason": 3000, "facts": 3000}


def fit_config(pair: str, method: str, root: Path, *overrides: str) -> None:
    """``python -m mgsr_lightning fit --config configs/<pair>/<method>.yaml [overrides]``, in process."""
    from mgsr_lightning.cli.lightning_cli import run_cli

    with environment(**{ROOT_ENVS.get(pair, TINY_ROOT_ENV): str(root)}):
        run_cli(["fit", "--config", str(config_path(pair, method)), *overrides])


def prepare_tiny(
    out: str | None = None,
    train_size: int | None = None,
    validation_size: int | None = None,
    test_size: int | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
    force: bool = False,
    pair: str = "tiny",
) -> Path:
    """Prepare an embedded pair: data, tokenizer and the SFT-trained teacher.

    Args:
        out: Folder of the artifacts (``data/``, ``tokenizer/``, ``teacher/``; default: ``$MGSR_TINY_DIR``
            (``$MGSR_REASON_DIR`` for ``reason``, ``$MGSR_FACTS_DIR`` for ``facts``) when set, else
            ``artifacts/<pair>``), the folder that configs/tiny read through
            ``${oc.env:MGSR_TINY_DIR,artifacts/tiny}`` (configs/reason and configs/facts through
            ``MGSR_REASON_DIR`` and ``MGSR_FACTS_DIR``), so that a ``fit`` after this command finds what
            it prepared.
        train_size: Generated training rows (default: the pair's, 20000 for tiny, 30000 for reason and
            facts).
        validation_size: Generated validation rows (default 200; 240 for facts).
        test_size: Generated test rows (default: 400 for tiny, 240 for reason and facts).
        vocab_size: Byte-level BPE vocabulary size (default: 1024 for tiny, 2048 for reason and facts).
        seed: Seed of the data generator.
        force: Redo every step even if its output exists.
        pair: ``tiny`` (the quick default), ``reason`` (the multi-step benchmark) or ``facts`` (the
            knowledge benchmark).
    """
    write_dataset, sizes, default_vocab, model_max_length = EMBEDDED[pair]
    for name, size in (("train_size", train_size), ("validation_size", validation_size), ("test_size", test_size)):
        if size is not None:
            validation.at_least(name, size, 1)
    if vocab_size is not None:
        validation.at_least("vocab_size", vocab_size, 258)  # the 256 byte symbols and two special tokens
    root = Path(configured_root(pair, out) or f"artifacts/{pair}").resolve()
    validation.writable_folder("out", root)
    data_dir, tokenizer_dir, teacher_dir = root / "data", root / "tokenizer", root / "teacher"
    if force or not (data_dir / "test.jsonl").is_file():
        write_generated_data(root, pair, write_dataset, {"train": train_size, "validation": validation_size,
                                                          "test": test_size}, sizes, seed)
    else:
        log.info("reusing the %s dataset in %s (--force generates it again)", pair, data_dir)
    if pair in STUDENT_TRAIN_ROWS and (force or not (data_dir / "student_train.jsonl").is_file()):
        with open(data_dir / "train.jsonl", encoding="utf-8") as rows:
            head = [line for _, line in zip(range(STUDENT_TRAIN_ROWS[pair]), rows)]
        (data_dir / "student_train.jsonl").write_text("".join(head), encoding="utf-8")
        log.info("wrote the students' %d training rows to %s", len(head), data_dir / "student_train.jsonl")
    if force or not (tokenizer_dir / "tokenizer.json").is_file():
        records = read_jsonl(data_dir / "train.jsonl")
        texts = [render_prompt(r, "alpaca") + r["output"] for r in records]
        vocab_size = vocab_size or default_vocab
        train_bpe_tokenizer(texts, vocab_size=vocab_size, save_dir=tokenizer_dir, model_max_length=model_max_length)
        log.info("trained a %d-token BPE tokenizer into %s", vocab_size, tokenizer_dir)
    else:
        log.info("reusing the tokenizer in %s", tokenizer_dir)
    if force or not (teacher_dir / "config.json").is_file():
        log.info("training the %s teacher (SFT); cached in %s for later runs", pair, teacher_dir)
        fit_config(pair, "teacher", root)
    else:
        log.info("reusing the teacher in %s (--force trains it again)", teacher_dir)
    return root


def write_generated_data(root: Path, pair: str, write_dataset, requested: dict, sizes: dict, seed: int) -> None:
    """Generate the pair's dataset into ``root/data``, never over files that an earlier run of this
    command did not write itself (a user's own data put there is left alone, and the command stops)."""
    manifest = Manifest(root)
    paths = [root / "data" / f"{split}.jsonl" for split in sizes]
    manifest.check_overwritable(*paths, command="prepare-tiny", advice=(
        f"to distil on your own data use `python -m mgsr_lightning prepare --data DIR --out {root}-own`; "
        f"to generate the {pair} dataset here, move those files away first"))
    write_dataset(root / "data", {split: requested[split] or sizes[split] for split in sizes}, seed)
    manifest.record_files(*paths)
    manifest.save()
    log.info("wrote the %s dataset to %s", pair, root / "data")
