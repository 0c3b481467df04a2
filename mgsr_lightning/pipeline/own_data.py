"""Your own instruction data through the embedded pipeline: ``prepare``.

``prepare`` does for a user's JSONL files what ``prepare-tiny`` does for the generated task: it
fills one folder (the *root*, which ``configs/tiny`` reads through ``MGSR_TINY_DIR``) with

- ``data/{train,validation,test}.jsonl``: copies of the given files, checked row by row (the
  given files are only read);
- ``tokenizer/``: a byte-level BPE trained on the training rows (or a copy of ``--tokenizer``);
- ``teacher/``: the teacher of ``configs/<pair>/teacher.yaml`` trained by SFT on the training rows;
- ``init/``: the SFT-initialised student every method starts from (``configs/<pair>/init.yaml``, or
  ``sft.yaml`` where the pair has no init stage), as DistiLLM, MiniLLM and ABKD distil, and
  ``init_student.yaml``, the config that points a ``fit`` at it
  (``fit --config configs/<pair>/<method>.yaml --config <root>/init_student.yaml``);

and says what it did: rows per split and how many fit the config's length limits, the tokenizer's
vocabulary, the teacher's and the initial student's steps and validation ROUGE-L. Each step records
the fingerprint of its inputs in ``prepared.json`` (:mod:`mgsr_lightning.pipeline.manifest`) and is
reused only when they match; a file or folder in the root that the command did not write is never
replaced.

Its checks of the given rows are in :mod:`mgsr_lightning.pipeline.own_data_checks`, its tokenizer step (and the
``train-tokenizer`` command) in :mod:`mgsr_lightning.pipeline.own_tokenizer`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from mgsr_lightning import atomic
from mgsr_lightning.cli.config_files import config_texts
from mgsr_lightning.cli.validation import at_least, writable_folder
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.missing import ROOT_ENVS
from mgsr_lightning.pipeline.checks import TOKENIZER_FILES
from mgsr_lightning.pipeline.manifest import Manifest, file_sha256, fingerprint
from mgsr_lightning.pipeline.own_data_checks import (
    ADVICE,
    SPLITS,
    check_some_rows_fit,
    input_files,
    overlap_warnings,
    rows_within_limits,
    same_file,
)
from mgsr_lightning.pipeline.own_tokenizer import planned_tokenizer, tokenizer_step
from mgsr_lightning.pipeline.paths import CONFIGS, composed_config, config_path, configured_root, environment

log = logging.getLogger(__name__)

DEFAULT_VOCAB = {"tiny": 1024, "reason": 2048, "facts": 2048}


def _copy(source: Path, target: Path) -> None:
    with atomic.atomic_path(target) as temporary:
        shutil.copyfile(source, temporary)


def step_overrides(config: dict[str, Any], steps: int | None) -> list[str]:
    if steps is None:
        return []
    interval = config["trainer"].get("val_check_interval") or steps
    return [f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={min(int(interval), steps)}"]


def _train_teacher(pair: str, root: Path, steps: int | None, teacher_config: dict[str, Any]) -> dict[str, Any]:
    """SFT of ``configs/<pair>/teacher.yaml`` on the root's data; returns what was trained."""
    return _sft(pair, "teacher", root, step_overrides(teacher_config, steps))


INIT_STUDENT_CONFIG = "init_student.yaml"


def init_config_name(pair: str) -> str:
    """The config of the pair's SFT-initialised student: ``init.yaml`` where the pair has one, else ``sft.yaml``."""
    return "init" if (CONFIGS / pair / "init.yaml").is_file() else "sft"


def _train_init_student(pair: str, root: Path, steps: int | None) -> dict[str, Any]:
    """SFT of the pair's student (:func:`init_config_name`) into ``root/init``, logged under ``root/runs/init``."""
    name = init_config_name(pair)
    overrides = [*step_overrides(composed_config(pair, name), steps),
                 f"--trainer.default_root_dir={root / 'runs' / 'init'}",
                 f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.logger.init_args.name=init",
                 f"--model.init_args.export_dir={root / 'init'}"]
    return _sft(pair, name, root, overrides)


def _sft(pair: str, name: str, root: Path, overrides: list[str]) -> dict[str, Any]:
    """``fit --config configs/<pair>/<name>.yaml`` on the root's data; returns what was trained."""
    from mgsr_lightning.cli.lightning_cli import run_cli

    started = time.perf_counter()
    with environment(**{ROOT_ENVS[pair]: str(root)}):
        cli = run_cli(["fit", "--config", str(config_path(pair, name)), *overrides])
    score = cli.trainer.checkpoint_callback.best_model_score if cli.trainer.checkpoint_callback else None
    return {
        "steps": int(cli.trainer.global_step),
        "parameters": sum(p.numel() for p in cli.model.student.parameters()),
        "best_val_rougeL": None if score is None else round(float(score), 2),
        "seconds": round(time.perf_counter() - started, 1),
    }


def prepare(
    data: str | None = None,
    train: str | None = None,
    validation: str | None = None,
    test: str | None = None,
    out: str | None = None,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    teacher_steps: int | None = None,
    init_steps: int | None = None,
    pair: str = "tiny",
) -> Path:
    """Prepare your own instruction data for distillation: copy and check it, train a tokenizer, the teacher
    and the SFT-initialised student every method starts from.

    Fills the folder the pair's configs read (``MGSR_TINY_DIR`` for ``tiny``), so that
    ``fit --config configs/tiny/<method>.yaml --config $MGSR_TINY_DIR/init_student.yaml`` then distils
    the initial student on your data (every method, SFT included, continues from it for the config's
    steps, so all get the same total). Your files are only read. Running it again reuses each step
    whose inputs (data, vocabulary, configs and steps) are unchanged, and redoes the others.

    Args:
        data: Folder with ``train.jsonl``, ``validation.jsonl`` (or ``valid.jsonl``/``val.jsonl``) and
            ``test.jsonl``; rows with instruction/input/output, instruction/context/response or prompt/response.
        train: The training file (instead of, or overriding, ``data``'s).
        validation: The validation file.
        test: The test file.
        out: Folder to fill (default: ``$MGSR_TINY_DIR``, or ``$MGSR_REASON_DIR`` or ``$MGSR_FACTS_DIR``
            for ``--pair reason`` or ``facts``).
        tokenizer: A tokenizer folder to use instead of training one (copied into the folder).
        vocab_size: Vocabulary of the trained byte-level BPE (default 1024 for tiny, 2048 for reason and facts).
        teacher_steps: SFT steps of the teacher (default: ``configs/<pair>/teacher.yaml``'s).
        init_steps: SFT steps of the initial student (default: those of ``configs/<pair>/init.yaml``, or of
            ``sft.yaml`` where the pair has no init stage).
        pair: ``tiny`` (4-layer teacher, 2-layer student, short answers), ``reason`` or ``facts`` (longer answers).
    """
    if pair not in ROOT_ENVS:
        raise ConfigError(
            f"pair: prepare fills the folder of an embedded pair's configs; pairs: {', '.join(ROOT_ENVS)}"
        )
    at_least("vocab_size", vocab_size, 258)
    at_least("teacher_steps", teacher_steps, 1)
    at_least("init_steps", init_steps, 1)
    if tokenizer is not None and vocab_size is not None:
        raise ConfigError("give --tokenizer (a tokenizer to use) or --vocab_size (of the one to train), not both")
    if tokenizer is not None and not any((Path(tokenizer) / name).is_file() for name in TOKENIZER_FILES):
        raise MissingFileError(f"tokenizer: {tokenizer} is not a tokenizer folder (no {' or '.join(TOKENIZER_FILES)})")
    files = input_files(data, train, validation, test)
    root_value = configured_root(pair, out)
    if not root_value:
        raise ConfigError(f"prepare needs a folder to fill: --out DIR, or {ROOT_ENVS[pair]}=DIR in the environment "
                          f"(the folder configs/{pair} read)")
    root = Path(root_value).expanduser().resolve()
    records = {split: read_jsonl(path) for split, path in files.items()}  # a bad row fails here, naming file and line
    writable_folder("out", root)
    base = composed_config(pair)
    manifest = Manifest(root)
    data_config = base["data"]
    tokenizer_args = (root, manifest, records["train"], file_sha256(files["train"]), tokenizer,
                      vocab_size or DEFAULT_VOCAB[pair], base["data"].get("template", "alpaca"),
                      base["model"]["init_args"]["student"]["config"]["n_positions"])
    planned = planned_tokenizer(*tokenizer_args)  # in memory: nothing is written before the rows are known to fit
    counted = {split: rows_within_limits(records[split], planned, data_config,
                            data_config["max_length"] if split != "test" else None, split)
               for split in SPLITS}
    check_some_rows_fit(pair, files, records, {split: stats for split, (_, stats) in counted.items()}, data_config,
                         tokenizer is None)
    fits = {split: kept for split, (kept, _) in counted.items()}
    data_hashes = _copy_data(files, root, manifest)
    tokenizer_fingerprint, tokenizer_summary, tokenizer_note = tokenizer_step(*tokenizer_args, planned=planned)
    teacher_summary, teacher_note = _teacher_step(root, manifest, pair, tokenizer_fingerprint, data_hashes,
                                                  teacher_steps)
    init_summary, init_note = _init_step(root, manifest, pair, tokenizer_fingerprint, data_hashes, init_steps)
    warnings = overlap_warnings(files, records)
    if not (teacher_note.startswith("reused") and init_note.startswith("reused")):
        warnings += stale_students_warning(root)
    _print_summary(pair, root, files, records, fits, data_config, tokenizer_summary, tokenizer_note, teacher_summary,
                   teacher_note, init_summary, init_note, warnings)
    return root


def stale_students(root: Path) -> list[str]:
    """The students under ``root/students`` (folders that ``fit`` exported), by name."""
    folder = root / "students"
    return sorted(path.parent.name for path in folder.glob("*/config.json")) if folder.is_dir() else []


def stale_students_warning(root: Path) -> list[str]:
    """A summary line naming the students exported before this prepare retrained the teacher or the starting
    student: they were trained on the previous data, tokenizer or starting point, and no longer match ``root``."""
    names = stale_students(root)
    if not names:
        return []
    return [f"{root / 'students'} holds students trained before this prepare, on the previous data, tokenizer or "
            f"starting student: {', '.join(names)}; they no longer match {root}: fit them again (each fit replaces "
            "its own), or move them away"]


def _copy_data(files: dict[str, Path], root: Path, manifest: Manifest) -> dict[str, str]:
    """Copy the splits to ``root/data`` (where the configs read them) unless already there; returns their hashes."""
    copies = {split: root / "data" / f"{split}.jsonl" for split in SPLITS}
    to_copy = [split for split in SPLITS if not same_file(files[split], copies[split])
               and not (copies[split].is_file() and file_sha256(copies[split]) == file_sha256(files[split]))]
    manifest.check_overwritable(*(copies[split] for split in to_copy), command="prepare", advice=ADVICE)
    for split in to_copy:
        _copy(files[split], copies[split])
        manifest.record_files(copies[split])
    manifest.save()
    return {split: file_sha256(copies[split]) for split in SPLITS}


def _teacher_step(root: Path, manifest: Manifest, pair: str, tokenizer_fingerprint: str, data_hashes: dict[str, str],
                  steps: int | None):
    """``root/teacher``: SFT of ``configs/<pair>/teacher.yaml``; reused for the same data, tokenizer, config and
    steps. Returns (summary, note)."""
    teacher_dir = root / "teacher"
    step_fingerprint = fingerprint({"tokenizer": tokenizer_fingerprint, "train": data_hashes["train"],
                                    "validation": data_hashes["validation"], "steps": steps,
                                    "config": config_texts(config_path(pair, "teacher"))})
    if manifest.step_matches("teacher", step_fingerprint, teacher_dir / "config.json"):
        return manifest.steps["teacher"]["summary"], "reused: same data, tokenizer, config and steps"
    manifest.check_step_output("teacher", teacher_dir, ADVICE)
    log.info("training the teacher (SFT, configs/%s/teacher.yaml) on %s", pair, root / "data" / "train.jsonl")
    summary = _train_teacher(pair, root, steps, composed_config(pair, "teacher"))
    manifest.record_step("teacher", step_fingerprint, summary)
    manifest.save()
    return summary, f"trained in {summary['seconds']:.0f} s"


def _init_step(root: Path, manifest: Manifest, pair: str, tokenizer_fingerprint: str, data_hashes: dict[str, str],
               steps: int | None):
    """``root/init``: the SFT-initialised student, and ``root/init_student.yaml`` pointing a fit at it; reused for the
    same data, tokenizer, config and steps. Returns (summary, note)."""
    init_dir, pointer = root / "init", root / INIT_STUDENT_CONFIG
    name = init_config_name(pair)
    step_fingerprint = fingerprint({"tokenizer": tokenizer_fingerprint, "train": data_hashes["train"],
                                    "validation": data_hashes["validation"], "steps": steps,
                                    "config": config_texts(config_path(pair, name))})
    manifest.check_overwritable(pointer, command="prepare", advice=ADVICE)
    if manifest.step_matches("init", step_fingerprint, init_dir / "config.json") and pointer.is_file():
        return manifest.steps["init"]["summary"], "reused: same data, tokenizer, config and steps"
    manifest.check_step_output("init", init_dir, ADVICE)
    if init_dir.exists():
        shutil.rmtree(init_dir)
    log.info("training the initial student (SFT, configs/%s/%s.yaml) on %s", pair, name, root / "data" / "train.jsonl")
    summary = {**_train_init_student(pair, root, steps), "config": f"configs/{pair}/{name}.yaml"}
    atomic.write_text(pointer, (
        f"# Written by `prepare`: start the student from the SFT-initialised one in {init_dir}\n"
        f"# ({summary['steps']} steps of {summary['config']} on {root / 'data' / 'train.jsonl'}), "
        "as DistiLLM, MiniLLM\n"
        f"# and ABKD distil. Give it after the method's config:\n"
        f"#   python -m mgsr_lightning fit --config configs/{pair}/<method>.yaml --config {pointer}\n"
        f"model:\n  init_args:\n    student: {{name_or_path: {json.dumps(str(init_dir))}, config: null}}\n"))
    manifest.record_files(pointer)
    manifest.record_step("init", step_fingerprint, summary)
    manifest.save()
    return summary, f"trained in {summary['seconds']:.0f} s"


def _print_summary(pair, root, files, records, fits, data_config, tokenizer_summary, tokenizer_note, teacher_summary,
                   teacher_note, init_summary, init_note, warnings=()) -> None:
    limits = (f"prompts <= {data_config['max_prompt_length']} tokens, prompt + response <= {data_config['max_length']} "
              f"(configs/{pair}/base.yaml)")
    lines = [f"prepared {root} for distillation on your data ({pair} pair):", "  data (your files are only read):"]
    for split in SPLITS:
        lines.append(f"    {split:<10} {len(records[split]):>6} rows, {fits[split]:>6} within the length limits  "
                     f"<- {files[split]}")
    lines.append(f"    length limits: {limits}")
    if any(fits[split] < len(records[split]) for split in SPLITS):
        lines.append("    rows over the limits are left out of training and evaluation; to keep them raise "
                     "--data.max_prompt_length/--data.max_length (and the models' n_positions) when you fit")
    lines += [f"    warning: {warning}" for warning in warnings]
    lines.append(f"  tokenizer: vocabulary {tokenizer_summary['vocab_size']}, {tokenizer_summary['source']} "
                 f"({tokenizer_note})")
    rouge = teacher_summary.get("best_val_rougeL")
    lines.append(f"  teacher: {teacher_summary['parameters'] / 1e6:.2f} M parameters, "
                 f"{teacher_summary['steps']} SFT steps"
                 f"{'' if rouge is None else f', best validation ROUGE-L {rouge:.2f}'} ({teacher_note})")
    rouge = init_summary.get("best_val_rougeL")
    lines.append(f"  initial student: {init_summary['parameters'] / 1e6:.2f} M parameters, "
                 f"{init_summary['steps']} SFT steps "
                 f"of {init_summary['config']}{'' if rouge is None else f', best validation ROUGE-L {rouge:.2f}'} "
                 f"({init_note}); every method starts from it with --config {root / INIT_STUDENT_CONFIG}")
    lines += ["next:", f"  export {ROOT_ENVS[pair]}={root}",
              f"  python -m mgsr_lightning fit --config configs/{pair}/mgsr.yaml --config {root / INIT_STUDENT_CONFIG}"
              f"   # and configs/{pair}/sft.yaml, ..."]
    print("\n".join(lines), flush=True)
