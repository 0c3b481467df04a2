"""Checks of a run's configuration made before any model is loaded or any file is written.

Each check raises a :class:`~mgsr_lightning.errors.UserError` whose message names the option, the
value and what would work, so a mistake costs seconds instead of a model load or a training run.
The LightningCLI runs :func:`check_run_config` on the parsed config; the pipeline commands call the
individual checks on their arguments.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgsr_lightning.errors import CheckpointError, ConfigError, MissingFileError, UserError
from mgsr_lightning.missing import describe_missing, looks_like_path
from mgsr_lightning.models.checks import check_positions, check_vocabulary, get_dotted

# checkpoint names Lightning resolves itself instead of a path
CKPT_KEYWORDS = {"last", "best", "hpc", "registry"}
# divergence and DAC-KL parameters that are probabilities or mixing weights
UNIT_INTERVAL_PARAMS = ("alpha", "beta", "lam", "rho_min")


def positive(name: str, value: Any) -> None:
    if value is not None and not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


def at_least(name: str, value: Any, minimum: int) -> None:
    if value is not None and not value >= minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def in_unit_interval(name: str, value: Any) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1], got {value}")


def existing_input(name: str, value: str | None, what: str) -> None:
    """A path that must exist (hub ids and dataset names pass unchecked)."""
    if value is None or Path(value).expanduser().exists():
        return
    if (not looks_like_path(value) and Path(value).suffix not in (".jsonl", ".json")
            and not os.path.lexists(Path(value).expanduser())):
        return  # a hub id or dataset name
    raise MissingFileError(f"{name}: {what} {describe_missing(value)}")


def writable_folder(name: str, folder: str | Path | None) -> None:
    """``folder`` (or the nearest existing folder above it) accepts new files."""
    if folder is None or "://" in str(folder):
        return
    existing = Path(folder).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{name}: {existing} is a file, not a folder (from {folder})")
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".mgsr-write-check-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise UserError(
            f"{name}: cannot write in {existing} ({error.strerror or error}); choose a writable folder"
        ) from None


def model_output_folder(name: str, folder: str | Path | None) -> None:
    """``folder`` can take an exported model: it is new, empty, or a model folder (whose files are replaced);
    a folder of other files is never written into."""
    writable_folder(name, folder)
    if folder is None or "://" in str(folder):
        return
    path = Path(folder).expanduser()
    if path.is_file():
        raise ConfigError(f"{name}: {path} is a file; give a new or empty folder (a model folder is replaced)")
    if path.is_dir() and not (path / "config.json").is_file():
        others = sorted(entry.name for entry in path.iterdir())
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise ConfigError(f"{name}: {path} holds other files ({shown}) and no model; give a new or empty folder "
                              "(a model folder, with its config.json, is replaced)")


def check_checkpoint(path: str | Path, name: str = "ckpt_path") -> dict[str, Any]:
    """Load a checkpoint's structure (tensors memory-mapped, not read); fail clearly if missing or corrupt."""
    import torch

    path = Path(path).expanduser()
    if path.is_dir():
        found = [ckpt for depth in range(4) for ckpt in path.glob("*/" * depth + "*.ckpt") if ckpt.is_file()]
        found.sort(key=lambda ckpt: (ckpt.name != "last.ckpt", -ckpt.stat().st_mtime))
        example = f"e.g. {found[0]}" if found else "there is none in it"
        raise CheckpointError(f"{name}: {path} is a folder; give one checkpoint file written by `fit` ({example})")
    if not path.is_file():
        raise CheckpointError(f"{name}: checkpoint {describe_missing(path)}")
    try:
        try:
            checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        except RuntimeError as error:
            if "zip" not in str(error).lower() or path.stat().st_size == 0:
                raise
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)  # the legacy, non-zip format
    except Exception as error:  # noqa: BLE001 - any failure to unpickle means an unusable file
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(
            f"{name}: checkpoint {path} is corrupt or truncated ({reason}); resume from another one, e.g. an "
            "earlier latest-*.ckpt"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{name}: {path} is not a training checkpoint written by `fit` (no state_dict)")
    return checkpoint


def check_config_dataclass(name: str, config_class: type, values: Any) -> None:
    """Build ``config_class`` from ``values`` (a parsed namespace or a mapping) so that its ``__post_init__``,
    the one home of its value ranges, checks them; its ``ValueError`` is reported under the option ``name``."""
    if values is None or dataclasses.is_dataclass(values):
        return
    fields = {field.name for field in dataclasses.fields(config_class)}
    given = values if isinstance(values, Mapping) else vars(values)
    try:
        config_class(**{key: value for key, value in given.items() if key in fields})
    except ValueError as error:
        raise ConfigError(f"{name}.{error}") from None


def check_model_args(init: Any, prefix: str = "model.init_args") -> None:
    """Values of ``DistillLightningModule``'s arguments (and of their dataclasses)."""
    optimizer = get_dotted(init, "optimizer")
    positive(f"{prefix}.optimizer.lr", get_dotted(optimizer, "lr"))
    at_least(f"{prefix}.optimizer.weight_decay", get_dotted(optimizer, "weight_decay"), 0)
    at_least(f"{prefix}.optimizer.warmup_steps", get_dotted(optimizer, "warmup_steps"), 0)
    for index, beta in enumerate(get_dotted(optimizer, "betas") or ()):
        in_unit_interval(f"{prefix}.optimizer.betas[{index}]", beta)
    at_least(f"{prefix}.sft_weight", get_dotted(init, "sft_weight"), 0)
    at_least(f"{prefix}.span.weight", get_dotted(init, "span.weight"), 0)
    at_least(f"{prefix}.max_length", get_dotted(init, "max_length"), 2)
    distill = get_dotted(init, "distill")
    if distill is not None:
        positive(f"{prefix}.distill.temperature", get_dotted(distill, "temperature"))
        at_least(f"{prefix}.distill.weight", get_dotted(distill, "weight"), 0)
        positive(f"{prefix}.distill.clip_net_lr", get_dotted(distill, "clip_net_lr"))
        params = get_dotted(distill, "params") or {}
        for key in UNIT_INTERVAL_PARAMS:
            if key in params:
                in_unit_interval(f"{prefix}.distill.params.{key}", params[key])
    from mgsr_lightning.generation.sampling import SamplingConfig
    from mgsr_lightning.scrg.revise import ScrgConfig
    from mgsr_lightning.training.regimes import RegimeConfig

    check_config_dataclass(f"{prefix}.regime", RegimeConfig, get_dotted(init, "regime"))
    check_config_dataclass(f"{prefix}.scrg", ScrgConfig, get_dotted(init, "scrg"))
    check_config_dataclass(f"{prefix}.sampling", SamplingConfig, get_dotted(init, "sampling"))
    at_least(f"{prefix}.validation.rouge_examples", get_dotted(init, "validation.rouge_examples"), 0)
    at_least(f"{prefix}.validation.max_new_tokens", get_dotted(init, "validation.max_new_tokens"), 1)
    for role in ("student", "teacher"):
        name_or_path, config = get_dotted(init, f"{role}.name_or_path"), get_dotted(init, f"{role}.config")
        if name_or_path and config:
            raise ConfigError(
                f"{prefix}.{role} has both name_or_path ({name_or_path}) and config: "
                "a config builds a randomly initialised "
                f"model, so the weights of {name_or_path} would not be loaded. To load them, unset config: "
                f"""--{prefix}.{role}='{{"name_or_path": "{name_or_path}", "config": null}}' (in a config file: """
                "`config: null`); to build from the config, unset name_or_path")
        dtype = get_dotted(init, f"{role}.dtype")
        if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"{prefix}.{role}.dtype must be float32, bfloat16 or float16, got {dtype!r}")


def check_data_args(data: Any, stage: str) -> None:
    """Values and input paths of ``InstructionDataModule``'s arguments for ``stage``."""
    at_least("data.batch_size", get_dotted(data, "batch_size"), 1)
    at_least("data.eval_batch_size", get_dotted(data, "eval_batch_size"), 1)
    at_least("data.max_prompt_length", get_dotted(data, "max_prompt_length"), 1)
    at_least("data.val_size", get_dotted(data, "val_size"), 0)
    at_least("data.num_workers", get_dotted(data, "num_workers"), 0)
    at_least("data.max_train_examples", get_dotted(data, "max_train_examples"), 1)
    at_least("data.max_val_examples", get_dotted(data, "max_val_examples"), 1)
    max_length, max_prompt_length = get_dotted(data, "max_length"), get_dotted(data, "max_prompt_length")
    if max_length is not None and max_prompt_length is not None and max_prompt_length >= max_length:
        raise ConfigError(
            f"data.max_prompt_length ({max_prompt_length}) must be smaller than data.max_length ({max_length})"
        )
    existing_input("data.tokenizer", get_dotted(data, "tokenizer"), "tokenizer folder")
    needed = {"fit": ("train_data", "val_data"), "validate": ("train_data", "val_data")}.get(stage, ("test_data",))
    for key in needed:
        existing_input(f"data.{key}", get_dotted(data, key), "data file")
    from mgsr_lightning.data.records import read_jsonl

    for key in needed:  # every row, as the data module will read them, before Lightning prints or writes anything
        value = get_dotted(data, key)
        if isinstance(value, str) and Path(value).expanduser().is_file():
            read_jsonl(Path(value).expanduser())


def _accelerator_available(name: str) -> bool:
    import torch

    if name in ("gpu", "cuda"):
        return torch.cuda.is_available() or (name == "gpu" and torch.backends.mps.is_available())
    if name == "mps":
        return torch.backends.mps.is_available()
    return True  # cpu, auto, and accelerators Lightning checks itself


def available_device(name: str, device: str | None) -> None:
    """``device`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...) is one PyTorch knows and this machine has."""
    import torch

    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{name}: {device!r} is not a device PyTorch knows (cpu, cuda, cuda:1, mps, ...)") from None
    count = torch.cuda.device_count() if parsed.type == "cuda" else 1 if _accelerator_available(parsed.type) else 0
    if count == 0 or (parsed.index is not None and parsed.index >= count):
        found = f"{count} CUDA GPU{'s' if count != 1 else ''}" if parsed.type == "cuda" else f"no {parsed.type}"
        raise ConfigError(f"{name}: {device} is not on this machine (PyTorch finds {found}); use --{name} cpu, or "
                          f"leave --{name} out to take a GPU where there is one")


def check_trainer_args(trainer: Any, stage: str) -> None:
    """The ``Trainer`` values Lightning would reject only once it starts (its ``MisconfigurationException``),
    and a ``fit`` that could not train: refused here, naming the option."""
    max_steps = get_dotted(trainer, "max_steps")
    if max_steps is not None and (max_steps < -1 or (stage == "fit" and max_steps == 0)):
        raise ConfigError(f"trainer.max_steps must be -1 (no step limit) or >= 1, got {max_steps}"
                          + (": a fit of 0 steps trains nothing, and exports nothing" if max_steps == 0 else ""))
    max_epochs = get_dotted(trainer, "max_epochs")
    if max_epochs is not None and (max_epochs < -1 or (stage == "fit" and max_epochs == 0)):
        raise ConfigError(f"trainer.max_epochs must be -1 (no epoch limit) or >= 1, got {max_epochs}")
    at_least("trainer.min_steps", get_dotted(trainer, "min_steps"), 0)
    at_least("trainer.min_epochs", get_dotted(trainer, "min_epochs"), 0)
    fast_dev_run = get_dotted(trainer, "fast_dev_run")
    if fast_dev_run is not None and not isinstance(fast_dev_run, bool) and fast_dev_run < 0:
        raise ConfigError(f"trainer.fast_dev_run must be true, false or a number of batches >= 0, got {fast_dev_run}")
    interval = get_dotted(trainer, "val_check_interval")
    if isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval <= 0:
        raise ConfigError(f"trainer.val_check_interval must be > 0 (steps between validations, or a share of an epoch "
                          f"in (0, 1]), got {interval}; to validate never, set --trainer.limit_val_batches=0")
    accelerator = get_dotted(trainer, "accelerator")
    if isinstance(accelerator, str) and not _accelerator_available(accelerator.lower()):
        raise ConfigError(f"trainer.accelerator={accelerator}: this machine has no such device (PyTorch finds no "
                          f"{'CUDA GPU' if accelerator.lower() in ('gpu', 'cuda') else accelerator}); "
                          "use --trainer.accelerator=cpu, or auto to take a GPU where there is one")


def check_run_config(config: Any, stage: str) -> None:
    """Everything a LightningCLI run (``fit``, ``validate``, ``test``, ``predict``) can be checked for
    before it loads a model: values, input paths, sequence lengths against the models' positions,
    vocabularies, the checkpoint to start from, and that the output folders are writable."""
    init = get_dotted(config, "model.init_args")
    data = get_dotted(config, "data")
    trainer = get_dotted(config, "trainer")
    seed = get_dotted(config, "seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= 2**32 - 1:
        raise ConfigError(f"seed_everything must be in [0, 2**32 - 1] (what numpy accepts), got {seed}")
    if trainer is not None:
        check_trainer_args(trainer, stage)
    if init is not None:
        check_model_args(init)
    if data is not None:
        check_data_args(data, stage)
    max_length = get_dotted(data, "max_length") or get_dotted(init, "max_length")
    for role in ("student", "teacher"):
        source = get_dotted(init, role)
        if source is not None and max_length is not None:
            check_positions(role, source, max_length, "data.max_length (prompt + response, rollouts included)")
    tokenizer = get_dotted(init, "tokenizer") or get_dotted(data, "tokenizer")
    teacher_tokenizer = get_dotted(init, "teacher_tokenizer") or get_dotted(data, "teacher_tokenizer")
    if teacher_tokenizer is None:
        check_vocabulary(tokenizer, {role: get_dotted(init, role) for role in ("student", "teacher")})
    else:  # across tokenizers each model is read through its own side's tokenizer
        check_vocabulary(tokenizer, {"student": get_dotted(init, "student")})
        check_vocabulary(teacher_tokenizer, {"teacher": get_dotted(init, "teacher")})
    ckpt_path = get_dotted(config, "ckpt_path")
    if ckpt_path is not None and str(ckpt_path) not in CKPT_KEYWORDS and "://" not in str(ckpt_path):
        check_checkpoint(ckpt_path)
    writable_folder("trainer.default_root_dir", get_dotted(config, "trainer.default_root_dir"))
    logger = get_dotted(config, "trainer.logger")
    for logger_config in logger if isinstance(logger, list) else [logger]:
        if logger_config is not None and not isinstance(logger_config, bool):
            writable_folder("trainer.logger save_dir", get_dotted(logger_config, "init_args.save_dir"))
    if stage == "fit":
        model_output_folder("model.init_args.export_dir", get_dotted(init, "export_dir"))
