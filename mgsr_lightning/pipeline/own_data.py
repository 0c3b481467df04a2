"""Your own instruction data through the embedded pipeline: ``prepare`` and ``train-tokenizer``.

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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from mgsr_lightning import atomic
from mgsr_lightning.config_files import config_texts
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.data.templates import PromptTemplate, render_prompt
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.pipeline.checks import TOKENIZER_FILES
from mgsr_lightning.pipeline.manifest import Manifest, file_sha256, fingerprint, folder_sha256
from mgsr_lightning.pipeline.paths import CONFIGS, ROOT_ENVS, composed_config, config_path, configured_root, environment
from mgsr_lightning.validation import at_least, writable_folder

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
SPLIT_FILE_NAMES = {"train": ("train.jsonl",), "validation": ("validation.jsonl", "valid.jsonl", "val.jsonl"),
                    "test": ("test.jsonl",)}
DEFAULT_VOCAB = {"tiny": 1024, "reason": 2048, "facts": 2048}


def tokenizer_texts(records: list[dict[str, Any]], template: PromptTemplate) -> list[str]:
    """The text a tokenizer for these rows should compress: each prompt as training renders it, then each reference."""
    texts = []
    for record in records:
        outputs = record["output"] if isinstance(record["output"], list) else [record["output"]]
        texts += [(record.get("prompt") or render_prompt(record, template)) + output for output in outputs]
    return texts


def _train_bpe(records: list[dict[str, Any]], vocab_size: int, template: PromptTemplate, model_max_length: int,
               out: Path) -> int:
    """Train a byte-level BPE on ``records`` into ``out``; returns its vocabulary size."""
    from mgsr_lightning.tokenizer import train_bpe_tokenizer

    with atomic.atomic_folder(out, last="tokenizer.json") as temporary:
        tokenizer = train_bpe_tokenizer(tokenizer_texts(records, template), vocab_size=vocab_size, save_dir=temporary,
                                        model_max_length=model_max_length)
    return len(tokenizer)


def train_tokenizer(
    data: str,
    out: str,
    vocab_size: int = 1024,
    template: PromptTemplate = "alpaca",
    model_max_length: int = 512,
) -> None:
    """Train a GPT-2-style byte-level BPE tokenizer on instruction data (for students and teachers built from configs).

    Args:
        data: A JSONL file of rows (instruction/input/output, instruction/context/response or
            prompt/response), or a folder holding ``train.jsonl``.
        out: Folder to save the tokenizer in (``save_pretrained`` layout); it must be new, empty, or a
            tokenizer folder (which is replaced).
        vocab_size: Vocabulary size, the 256 byte symbols and the two special tokens included.
        template: The prompt template training will use (``plain``, ``alpaca``; ``chat`` needs a tokenizer).
        model_max_length: The tokenizer's ``model_max_length`` (the positions of the models it serves).
    """
    at_least("vocab_size", vocab_size, 258)  # the 256 byte symbols and two special tokens
    at_least("model_max_length", model_max_length, 1)
    if template == "chat":
        raise ConfigError(
            "template: 'chat' renders prompts with a tokenizer's chat template; train with 'plain' or 'alpaca'"
        )
    source = Path(data)
    if source.is_dir():
        source = source / "train.jsonl"
    if not source.is_file():
        raise MissingFileError(f"data: not found: {source} (give a JSONL file or a folder holding train.jsonl)")
    folder = Path(out)
    if folder.is_file() or (folder.is_dir() and any(folder.iterdir())
                            and not any((folder / name).is_file() for name in TOKENIZER_FILES)):
        raise ConfigError(
            f"out: {folder} holds other files; give a new or empty folder (a tokenizer folder is replaced)"
        )
    writable_folder("out", folder)
    records = read_jsonl(source)
    size = _train_bpe(records, vocab_size, template, model_max_length, folder)
    print(f"trained a byte-level BPE of {size} tokens on {len(records)} rows of {source} ({template} prompts); "
          f"saved to {folder}")


def _input_files(data: str | None, train: str | None, validation_file: str | None, test: str | None) -> dict[str, Path]:
    """The train, validation and test files, from ``--data DIR`` or given one by one (which take precedence)."""
    given = {"train": train, "validation": validation_file, "test": test}
    if data is None and None in given.values():
        missing = ", ".join(f"--{split}" for split, path in given.items() if path is None)
        raise ConfigError("prepare needs your train, validation and test JSONL files: "
                          "--data DIR (holding train.jsonl, "
                          f"validation.jsonl and test.jsonl) or --train/--validation/--test; missing: {missing}")
    files = {}
    for split in SPLITS:
        if given[split] is not None:
            path = Path(given[split])
        else:
            folder = Path(data)
            if not folder.is_dir():
                raise MissingFileError(f"data: no such folder: {folder}")
            candidates = [folder / name for name in SPLIT_FILE_NAMES[split]]
            path = next((candidate for candidate in candidates if candidate.is_file()), candidates[0])
        if not path.is_file():
            raise MissingFileError(f"{split} data not found: {path}" + (
                f" (--data needs {' or '.join(SPLIT_FILE_NAMES[split])} in {data}, or give --{split})"
                if given[split] is None else ""))
        files[split] = path.resolve()
    return files


def _copy(source: Path, target: Path) -> None:
    with atomic.atomic_path(target) as temporary:
        shutil.copyfile(source, temporary)


def _same(a: Path, b: Path) -> bool:
    return b.exists() and os.path.samefile(a, b)


def _fits(records: list[dict[str, Any]], tokenizer, data_config: dict[str, Any], max_length: int | None,
          name: str) -> tuple[int, dict[str, int]]:
    """How many rows the pair's length limits keep (as training and evaluation encode them), and why the others go."""
    from mgsr_lightning.data.datamodule import encode_records
    from mgsr_lightning.tokenizer import token_id

    datamodule_log = logging.getLogger("mgsr_lightning.data.datamodule")
    tokenizer_log = logging.getLogger("transformers.tokenization_utils_base")  # "longer than model_max_length"
    levels = datamodule_log.level, tokenizer_log.level
    datamodule_log.setLevel(logging.ERROR)  # the summary states the counts; training logs the drops again anyway
    tokenizer_log.setLevel(logging.ERROR)  # rows over the limits are counted here, not fed to a model
    try:
        examples, stats = encode_records(records, tokenizer, template=data_config.get("template", "alpaca"),
                                     eos_token_id=token_id(tokenizer, data_config.get("eos_token")),
                                     max_length=max_length,
                                     max_prompt_length=data_config["max_prompt_length"], name=name)
    finally:
        datamodule_log.setLevel(levels[0])
        tokenizer_log.setLevel(levels[1])
    return len(examples), stats


def _check_some_rows_fit(pair: str, files: dict[str, Path], records: dict[str, list[dict[str, Any]]],
                         stats: dict[str, dict[str, int]], data_config: dict[str, Any], trains_tokenizer: bool) -> None:
    """Fail, before anything is written, when no row of a split fits the pair's length limits."""
    empty = [split for split in SPLITS if stats[split]["kept"] == 0]
    if not empty:
        return
    split = empty[0]
    limit_text = (f"prompts <= {data_config['max_prompt_length']} tokens"
                  + (f", prompt + response <= {data_config['max_length']}" if split != "test" else ""))
    reasons = f"{stats[split]['dropped_long_prompt']} have a longer prompt" + (
        f", {stats[split]['dropped_long_response']} a longer prompt + response" if split != "test" else "")
    longer = []
    for other in ROOT_ENVS:
        other_data = composed_config(other)["data"]
        if (other_data["max_prompt_length"], other_data["max_length"]) > (data_config["max_prompt_length"],
                                                                            data_config["max_length"]):
            longer.append(f"--pair {other} (prompts <= {other_data['max_prompt_length']}, prompt + response <= "
                          f"{other_data['max_length']})")
    options = ([f"a pair with longer limits: {' or '.join(longer)}"] if longer else []) + (
        ["a larger --vocab_size (fewer tokens per row)"] if trains_tokenizer else [])
    raise ConfigError(
        f"none of the {len(records[split])} {split} rows of {files[split]} fits the {pair} pair's length limits with "
        f"this tokenizer ({limit_text}; configs/{pair}/base.yaml): {reasons}; shorten the rows"
        + (f", or prepare them with {', or '.join(options)}" if options else ""))


def _overlap_warnings(files: dict[str, Path], records: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Warnings about rows of the evaluation splits that are training rows, and about duplicated rows."""
    import json

    def prompt(record: dict[str, Any]) -> str:
        return record.get("prompt") or json.dumps([record["instruction"], record["input"]])

    warnings = []
    training_prompts = {prompt(record) for record in records["train"]}
    for split in ("validation", "test"):
        shared = sum(prompt(record) in training_prompts for record in records[split])
        if shared:
            warnings.append(f"{shared} of the {len(records[split])} {split} rows ask the prompt of a training row "
                            f"({files[split]}): their scores measure recall of the training data, not what the "
                            f"student learnt; remove them from the {split} file")
    for split in SPLITS:
        duplicated = len(records[split]) - len({json.dumps(record, sort_keys=True) for record in records[split]})
        if duplicated:
            warnings.append(f"{files[split]} holds {duplicated} duplicated rows (a prompt and answer given again), "
                            "each copy counted again; remove them")
    return warnings


def _step_overrides(config: dict[str, Any], steps: int | None) -> list[str]:
    if steps is None:
        return []
    interval = config["trainer"].get("val_check_interval") or steps
    return [f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={min(int(interval), steps)}"]


def _train_teacher(pair: str, root: Path, steps: int | None, teacher_config: dict[str, Any]) -> dict[str, Any]:
    """SFT of ``configs/<pair>/teacher.yaml`` on the root's data; returns what was trained."""
    return _sft(pair, "teacher", root, _step_overrides(teacher_config, steps))


INIT_STUDENT_CONFIG = "init_student.yaml"


def init_config_name(pair: str) -> str:
    """The config of the pair's SFT-initialised student: ``init.yaml`` where the pair has one, else ``sft.yaml``."""
    return "init" if (CONFIGS / pair / "init.yaml").is_file() else "sft"


def _train_init_student(pair: str, root: Path, steps: int | None) -> dict[str, Any]:
    """SFT of the pair's student (:func:`init_config_name`) into ``root/init``, logged under ``root/runs/init``."""
    name = init_config_name(pair)
    overrides = [*_step_overrides(composed_config(pair, name), steps),
                 f"--trainer.default_root_dir={root / 'runs' / 'init'}",
                 f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.logger.init_args.name=init",
                 f"--model.init_args.export_dir={root / 'init'}"]
    return _sft(pair, name, root, overrides)


def _sft(pair: str, name: str, root: Path, overrides: list[str]) -> dict[str, Any]:
    """``fit --config configs/<pair>/<name>.yaml`` on the root's data; returns what was trained."""
    from mgsr_lightning.cli import run_cli

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
    files = _input_files(data, train, validation, test)
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
    planned = _planned_tokenizer(*tokenizer_args)  # in memory: nothing is written before the rows are known to fit
    counted = {split: _fits(records[split], planned, data_config,
                            data_config["max_length"] if split != "test" else None, split)
               for split in SPLITS}
    _check_some_rows_fit(pair, files, records, {split: stats for split, (_, stats) in counted.items()}, data_config,
                         tokenizer is None)
    fits = {split: kept for split, (kept, _) in counted.items()}
    data_hashes = _copy_data(files, root, manifest)
    tokenizer_fingerprint, tokenizer_summary, tokenizer_note = _tokenizer_step(*tokenizer_args, planned=planned)
    teacher_summary, teacher_note = _teacher_step(root, manifest, pair, tokenizer_fingerprint, data_hashes,
                                                  teacher_steps)
    init_summary, init_note = _init_step(root, manifest, pair, tokenizer_fingerprint, data_hashes, init_steps)
    _print_summary(pair, root, files, records, fits, data_config, tokenizer_summary, tokenizer_note, teacher_summary,
                   teacher_note, init_summary, init_note, _overlap_warnings(files, records))
    return root


ADVICE = "choose another --out, or move it away"


def _copy_data(files: dict[str, Path], root: Path, manifest: Manifest) -> dict[str, str]:
    """Copy the splits to ``root/data`` (where the configs read them) unless already there; returns their hashes."""
    copies = {split: root / "data" / f"{split}.jsonl" for split in SPLITS}
    to_copy = [split for split in SPLITS if not _same(files[split], copies[split])
               and not (copies[split].is_file() and file_sha256(copies[split]) == file_sha256(files[split]))]
    manifest.check_overwritable(*(copies[split] for split in to_copy), command="prepare", advice=ADVICE)
    for split in to_copy:
        _copy(files[split], copies[split])
        manifest.record_files(copies[split])
    manifest.save()
    return {split: file_sha256(copies[split]) for split in SPLITS}


def _tokenizer_fingerprint(train_hash: str, given: str | None, vocab_size: int, template: PromptTemplate,
                           model_max_length: int) -> str:
    if given is not None:
        return fingerprint({"copied_from": folder_sha256(given)})
    return fingerprint({"bpe_vocab_size": vocab_size, "train": train_hash, "template": template,
                        "model_max_length": model_max_length})


def _planned_tokenizer(root: Path, manifest: Manifest, train_records: list[dict[str, Any]], train_hash: str,
                       given: str | None, vocab_size: int, template: PromptTemplate, model_max_length: int):
    """The tokenizer the tokenizer step will leave in ``root/tokenizer``, without writing anything: the one there
    when it is reused, ``given``, or a BPE trained on the training rows in memory."""
    from mgsr_lightning.tokenizer import load_tokenizer, train_bpe_tokenizer

    step_fingerprint = _tokenizer_fingerprint(train_hash, given, vocab_size, template, model_max_length)
    if manifest.step_matches("tokenizer", step_fingerprint, root / "tokenizer"):
        return load_tokenizer(str(root / "tokenizer"))
    if given is not None:
        return load_tokenizer(given)
    return train_bpe_tokenizer(tokenizer_texts(train_records, template), vocab_size=vocab_size,
                               model_max_length=model_max_length)


def _tokenizer_step(root: Path, manifest: Manifest, train_records: list[dict[str, Any]], train_hash: str,
                    given: str | None, vocab_size: int, template: PromptTemplate, model_max_length: int, planned=None):
    """``root/tokenizer``: a copy of ``given``, or a BPE trained on the training rows (``planned``, when
    :func:`_planned_tokenizer` trained it already); reused for the same inputs. Returns (fingerprint, summary, note)."""
    tokenizer_dir = root / "tokenizer"
    step_fingerprint = _tokenizer_fingerprint(train_hash, given, vocab_size, template, model_max_length)
    if manifest.step_matches("tokenizer", step_fingerprint, tokenizer_dir):
        return step_fingerprint, manifest.steps["tokenizer"]["summary"], "reused: same inputs"
    if not (given is not None and _same(Path(given), tokenizer_dir)):
        manifest.check_step_output("tokenizer", tokenizer_dir, ADVICE)
        if tokenizer_dir.exists():
            shutil.rmtree(tokenizer_dir)
        if given is not None:
            shutil.copytree(given, tokenizer_dir)
        elif planned is not None:
            with atomic.atomic_folder(tokenizer_dir, last="tokenizer.json") as temporary:
                planned.save_pretrained(str(temporary))
        else:
            _train_bpe(train_records, vocab_size, template, model_max_length, tokenizer_dir)
    from mgsr_lightning.tokenizer import load_tokenizer

    summary = {"vocab_size": len(load_tokenizer(str(tokenizer_dir))),
               "source": str(Path(given).resolve()) if given
               else f"byte-level BPE trained on the {len(train_records)} training rows"}
    manifest.record_step("tokenizer", step_fingerprint, summary)
    manifest.save()
    return step_fingerprint, summary, "new"


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
    if (root / "students").is_dir():
        log.warning("the students in %s were distilled from the previous teacher; train them again", root / "students")
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
