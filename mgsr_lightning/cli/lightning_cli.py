"""The LightningCLI of the package: ``python -m mgsr_lightning {fit,validate,test,predict} --config ...``.

Configs are LightningCLI YAML read in an OmegaConf-based parser mode whose loader composes ``_base_`` files
and resolves interpolations (:mod:`mgsr_lightning.cli.config_files`); Lightning's own behaviour is adjusted in
:mod:`mgsr_lightning.lightning_workarounds`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from argparse import ArgumentError
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import set_loader
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from mgsr_lightning.atomic import AtomicCheckpointIO
from mgsr_lightning.cli.config_files import load_config_text
from mgsr_lightning.cli.run_lock import ExportLock, export_lock
from mgsr_lightning.cli.validation import CKPT_KEYWORDS, check_checkpoint, check_run_config
from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.data.teacher_cache import TeacherCacheCheck
from mgsr_lightning.errors import ConfigError, UserError, condense_parser_error
from mgsr_lightning.lightning_workarounds import (
    StepLimitedRichProgressBar,
    keep_logged_rows,
    program_name_only,
    quiet_lightning,
)
from mgsr_lightning.module import DistillLightningModule
from mgsr_lightning.training.guards import NonFiniteLossGuard

PARSER_MODE = "omegaconf_base"
PROG = "python -m mgsr_lightning"
# inputs stored in checkpoints as given; made absolute so a checkpoint works from any working directory
INPUT_PATH_KEYS = ("data.tokenizer", "data.train_data", "data.val_data", "data.test_data", "data.teacher_cache",
                   "model.init_args.teacher_cache", "model.init_args.tokenizer", "model.init_args.student.name_or_path",
                   "model.init_args.teacher.name_or_path")
OUTPUT_PATH_KEYS = ("model.init_args.export_dir", "model.init_args.regime.cache_path")
# the model's options that decide where its student is exported, not how it trains
EXPORT_KEYS = ("export_dir", "export_weights")


def use_config_loader() -> None:
    """Make ``load_config_text`` jsonargparse's loader for ``PARSER_MODE`` (idempotent); a parser in that
    mode can be made only after this, so ``DistillCLI`` calls it before making its parsers."""
    set_loader(PARSER_MODE, load_config_text, exceptions=(yaml.YAMLError,))


def training_seed(seed_everything: bool | int | None) -> int:
    """``seed_everything`` as an int seed (``true``/``false``/unset give 0)."""
    return seed_everything if isinstance(seed_everything, int) and not isinstance(seed_everything, bool) else 0


def _namespace_get(namespace: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        namespace = getattr(namespace, part, None) if namespace is not None else None
    return namespace


def _namespace_set(namespace: Any, dotted: str, value: Any) -> None:
    parent, _, name = dotted.rpartition(".")
    holder = _namespace_get(namespace, parent) if parent else namespace
    if holder is not None and getattr(holder, name, None) is not None:
        setattr(holder, name, value)


def _config_files(argv: list[str]) -> list[Path]:
    files = []
    for index, arg in enumerate(argv):
        if arg in ("--config", "-c") and index + 1 < len(argv):
            files.append(Path(argv[index + 1]))
        elif arg.startswith("--config="):
            files.append(Path(arg.split("=", 1)[1]))
    return files


def _readable_configs(files: list[Path]) -> Iterator[tuple[Path, Any]]:
    """(path, composed contents) of each config file that reads (composed from its own folder, as jsonargparse
    reads it); a file that does not read is left to the parser, which reports it."""
    for path in files:
        cwd = os.getcwd()
        try:
            os.chdir(path.resolve().parent)
            data = load_config_text(path.read_text())
        except (OSError, yaml.YAMLError, ValueError):
            continue
        finally:
            os.chdir(cwd)
        yield path, data


def _unknown_config_keys(files: list[Path], known: set[str]) -> list[str]:
    """Top-level keys of the (composed) config files that the parser does not know."""
    unknown = []
    for path, data in _readable_configs(files):
        unknown += [key for key in (data or {}) if key not in known and key not in unknown]
    return unknown


# top-level options that are groups of options, never one value
OPTION_GROUPS = ("trainer", "data")


def _config_shape_problem(files: list[Path]) -> str | None:
    """What is wrong with the shape of a config file that is not a mapping of options (an empty file, a list), or
    that gives a group of options (``trainer``, ``data``) one value; None when every file is a mapping."""
    for path, data in _readable_configs(files):
        if not isinstance(data, dict):
            what = "it is empty" if data is None else f"it holds a {type(data).__name__}"
            return f"{path}: a config file is a mapping of options (trainer:, model:, data:, ...); {what}"
        for key in OPTION_GROUPS:
            if key in data and data[key] is not None and not isinstance(data[key], dict):
                return f"{path}: {key} is a group of options ({key}: {{...}}), got the value {data[key]!r}"
    return None


class FitInterrupted(UserError):
    """``fit`` stopped by Ctrl-C; the message names the checkpoint to resume from."""


class DistillCLI(LightningCLI):
    """LightningCLI with the data module's tokenizer, EOS and length limits linked into the model, and
    ``seed_everything`` linked into the data order and the module's own seed: one training seed
    varies initialisation, data order, the regime's choices and the rollouts.

    Around LightningCLI's own steps it reports parser errors in one line, checks the parsed config
    (:func:`mgsr_lightning.cli.validation.check_run_config`) before anything is instantiated, stores
    local paths absolute, writes checkpoints atomically, stops on a non-finite loss, and continues
    a resumed run's CSV log instead of starting a new version.
    """

    _resume_step: int | None = None
    _export_lock: ExportLock | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)  # parses, checks, instantiates and runs
        finally:
            if self._export_lock is not None:  # however the run ended
                self._export_lock.release()
                self._export_lock = None

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit:  # Lightning ends a run stopped by Ctrl-C with exit(1)
            if subcommand != "fit" or not self.trainer.interrupted:
                raise
            raise FitInterrupted(_interrupted_line(self.trainer)) from None
        except ValueError as error:  # the one Trainer value checked only once the data is known
            if "`val_check_interval`" not in str(error):
                raise
            raise ConfigError(f"trainer.val_check_interval: {' '.join(str(error).split())}") from None

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        use_config_loader()
        return super().init_parser(**kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            argv = list(sys.argv[1:] if args is None else args)
            raise ConfigError(self._parser_error_line(parser, argv, str(error))) from None
        # checked here, before LightningCLI seeds, prints or instantiates anything
        subcommand = self.config.get("subcommand")
        check_run_config(self.config[subcommand] if subcommand else self.config, subcommand or "fit")

    def _parse_ckpt_path(self) -> None:
        """LightningCLI replaces the model's options with those stored in ``ckpt_path``, so that a resumed run trains
        as the interrupted one did; where its student goes (``export_dir``, ``export_weights``) does not change the
        training, and is kept as this command gives it rather than silently taken from the checkpoint."""
        subcommand = self.config.get("subcommand")
        init = _namespace_get(self.config[subcommand], "model.init_args") if subcommand else None
        given = {key: getattr(init, key, None) for key in EXPORT_KEYS} if init is not None else {}
        super()._parse_ckpt_path()
        init = _namespace_get(self.config[subcommand], "model.init_args") if subcommand else None
        for key, value in given.items():
            if init is not None and getattr(init, key, None) != value:
                setattr(init, key, value)

    def _parser_error_line(self, parser: LightningArgumentParser, argv: list[str], message: str) -> str:
        subcommands = getattr(self, "_subcommand_parsers", {})
        subcommand = next((arg for arg in argv if arg in subcommands), None)
        target = subcommands.get(subcommand, parser)
        dests = [action.dest for action in target._actions if not action.dest.endswith(".help")]
        dests = [dest for dest in dests if dest not in ("help", "print_shtab")]

        def options_under(prefix: str) -> list[str]:
            inner = [dest[len(prefix) + 1 :] if prefix else dest for dest in dests
                     if not prefix or dest.startswith(prefix + ".")]
            return sorted({dest.split(".")[0] for dest in inner if dest})

        files = _config_files(argv)
        shape = _config_shape_problem(files)
        if shape is not None:
            return shape
        if subcommand is not None and message.strip() == f"unrecognized arguments: {subcommand}":
            unknown = _unknown_config_keys(files, set(options_under("")))
            if unknown:
                return condense_parser_error(f"unrecognized arguments: --{unknown[0]}", options_under).replace(
                    "unknown option", f"unknown key in {', '.join(map(str, files))}:"
                )
        line = condense_parser_error(message, options_under)
        if files and line.startswith("config is not valid YAML"):
            line = ", ".join(map(str, files)) + line[len("config") :]
        if subcommand is not None and not files and "--help" not in argv and "-h" not in argv:
            return (f"`{subcommand}` needs a config: pass --config configs/<pair>/<method>.yaml "
                    f"(e.g. --config configs/tiny/sft.yaml); {line}")
        return line

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        for key in INPUT_PATH_KEYS:
            value = _namespace_get(config, key)
            if isinstance(value, str) and "://" not in value and Path(value).expanduser().exists():
                _namespace_set(config, key, str(Path(value).expanduser().resolve()))
        for key in OUTPUT_PATH_KEYS:
            value = _namespace_get(config, key)
            if isinstance(value, str) and "://" not in value:
                _namespace_set(config, key, str(Path(value).expanduser().absolute()))
        if self.subcommand == "fit":  # one writer per export folder, from here until the run ends
            self._export_lock = export_lock(_namespace_get(config, "model.init_args.export_dir"))
            if self._export_lock is not None:
                try:
                    self._export_lock.acquire()
                except UserError:
                    self._export_lock = None
                    raise
        ckpt_path = getattr(config, "ckpt_path", None)
        if self.subcommand == "fit" and ckpt_path and str(ckpt_path) not in CKPT_KEYWORDS:
            self._continue_logger_version(config, Path(ckpt_path))

    def _continue_logger_version(self, config: Any, ckpt_path: Path) -> None:
        """Point a logger without an explicit version at the version folder ``ckpt_path`` was written in
        (``<save_dir>/<name>/version_N/checkpoints/*.ckpt``), so the resumed run logs into the same one."""
        version_dir = ckpt_path.resolve().parent.parent
        if ckpt_path.resolve().parent.name != "checkpoints" or not version_dir.name.startswith("version_"):
            return
        loggers = config.trainer.logger if isinstance(config.trainer.logger, list) else [config.trainer.logger]
        for logger in loggers:
            init = getattr(logger, "init_args", None)
            if init is None or getattr(init, "version", "unset") is not None:
                continue
            save_dir = getattr(init, "save_dir", None) or config.trainer.default_root_dir or "."
            root = Path(save_dir) / (getattr(init, "name", "") or "")
            if root.resolve() == version_dir.parent:
                init.version = version_dir.name
                self._resume_step = int(check_checkpoint(ckpt_path).get("global_step", 0))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._get(self.config_init, "trainer", default={})
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        if (config.get("enable_progress_bar") is not False and _RICH_AVAILABLE
                and not any(isinstance(callback, ProgressBar) for callback in configured)):
            # where Lightning would add its default RichProgressBar: ours, whose description reads right
            kwargs["callbacks"] = [*configured, StepLimitedRichProgressBar()]
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        try:
            trainer = super().instantiate_trainer(**kwargs)
        # the Trainer's own checks of its arguments (a device count, a strategy on this accelerator, a missing
        # package a strategy needs): values the checks before did not foresee
        except (MisconfigurationException, ValueError, ImportError) as error:
            raise ConfigError(f"trainer: {str(error).strip() or type(error).__name__}") from None
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        teacher_cache = getattr(self.datamodule, "hparams", {}).get("teacher_cache") if self.datamodule else None
        if teacher_cache is not None:  # refused when made by another teacher or vocabulary, before any step
            trainer.callbacks.append(TeacherCacheCheck(teacher_cache))
        if self._resume_step is not None and trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, CSVLogger):
                    keep_logged_rows(logger, self._resume_step)
        return trainer

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.tokenizer", "model.init_args.tokenizer")
        parser.link_arguments("data.eos_token", "model.init_args.eos_token")
        parser.link_arguments("data.max_length", "model.init_args.max_length")
        parser.link_arguments("data.teacher_cache", "model.init_args.teacher_cache")
        parser.link_arguments("data.teacher_tokenizer", "model.init_args.teacher_tokenizer")
        parser.link_arguments("seed_everything", "data.seed", compute_fn=training_seed)
        parser.link_arguments("seed_everything", "model.init_args.seed", compute_fn=training_seed)


def _interrupted_line(trainer: Trainer) -> str:
    """What a fit stopped by Ctrl-C says: the step it reached and how to continue from its latest checkpoint."""
    import signal

    with contextlib.suppress(ValueError):  # Lightning ignores further Ctrl-C while it shuts down; restore it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    folders = {Path(callback.dirpath) for callback in trainer.checkpoint_callbacks
               if getattr(callback, "dirpath", None)}
    saved = [path for folder in folders for path in folder.glob("*.ckpt") if not path.name.startswith(".")]
    line = f"fit interrupted (Ctrl-C) at step {trainer.global_step}"
    if not saved:
        return f"{line}; no checkpoint was written yet, so running the same command starts it over"
    latest = max(saved, key=lambda path: (path.name == "last.ckpt", path.stat().st_mtime))
    step = int(check_checkpoint(latest).get("global_step", 0))
    return (f"{line}; to continue from its latest checkpoint (step {step}), run the same command with "
            f"--ckpt_path={latest} (`reproduce` continues on its own when run again)")


def run_cli(args: list[str] | None = None, run: bool = True) -> DistillCLI:
    """Run (or with ``run=False`` only build) the LightningCLI on ``args`` (None: the command line)."""
    quiet_lightning()
    with program_name_only() if args is not None else contextlib.nullcontext():
        return DistillCLI(
            DistillLightningModule,
            InstructionDataModule,
            subclass_mode_model=True,
            # allow_abbrev: a misspelt `--trainer.max_step` is refused as in a config file, not read as max_steps
            parser_kwargs={"parser_mode": PARSER_MODE, "exit_on_error": False, "prog": PROG, "allow_abbrev": False},
            trainer_defaults={"callbacks": [NonFiniteLossGuard()]},
            save_config_kwargs={"overwrite": True},
            args=args,
            run=run,
        )
