"""``python -m mgsr_lightning <command>``: the LightningCLI subcommands (``fit``, ``validate``, ``test``,
``predict``, with ``--config configs/...yaml``) and the pipeline commands, all listed in :data:`COMMANDS`,
from which the usage text is made.

A mistake in what was given (a path, a row, a value, a name, a checkpoint) or a full or read-only
disk ends every command with one ``error: ...`` line and exit status 2; ``--debug`` (anywhere on
the command line) or ``MGSR_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from argparse import ArgumentError
from typing import NamedTuple

from jsonargparse import CLI

from mgsr_lightning.errors import DEBUG_FLAG, ConfigError, condense_parser_error, debug_requested, exit_with, report


class Command(NamedTuple):
    summary: str  # its line in the usage text
    function: str | None = None  # "module:function" of a pipeline command; None: a LightningCLI subcommand
    arguments: str | None = None  # "module:function" rewriting a pipeline command's arguments before parsing


COMMANDS = {
    "fit": Command("train a student:        fit --config configs/tiny/mgsr.yaml"),
    "validate": Command("run the validation loop on a checkpoint or config"),
    "test": Command("run the test loop (loss and ROUGE-L on the test split)"),
    "predict": Command("run the predict loop"),
    "prepare": Command("your own JSONL data: check and copy it, train a tokenizer and the teacher (cached)",
                       "mgsr_lightning.pipeline.own_data:prepare"),
    "prepare-tiny": Command("generate the embedded dataset, train its tokenizer and the tiny teacher (cached)",
                            "mgsr_lightning.pipeline.tiny:prepare_tiny"),
    "prepare-smollm2": Command("convert SmolLM2-135M-Instruct's GGUF to a model folder and write the task's data "
                               "(cached)", "mgsr_lightning.pipeline.smollm2:prepare_smollm2"),
    "train-tokenizer": Command("train a byte-level BPE tokenizer on a JSONL file",
                               "mgsr_lightning.pipeline.own_tokenizer:train_tokenizer"),
    "demo": Command("prepare-tiny, then train an SFT and an MGSR student and print a ROUGE-L table",
                    "mgsr_lightning.pipeline.reproduce:demo"),
    "evaluate": Command("ROUGE-L over sampling seeds for saved models on evaluation sets",
                        "mgsr_lightning.pipeline.commands:evaluate"),
    "table": Command("merge `evaluate` outputs into one Table-1-style table and chart",
                     "mgsr_lightning.pipeline.table:table"),
    "export": Command("turn a training checkpoint into a Hugging Face model folder",
                      "mgsr_lightning.pipeline.commands:export"),
    "select": Command("train several methods on a prepared folder, score them on validation, export the best",
                      "mgsr_lightning.pipeline.select:select"),
    "reproduce": Command("the paper's pipeline: distil each method, evaluate, write Table 1 and a chart",
                         "mgsr_lightning.pipeline.reproduce:reproduce"),
    "cache-teacher": Command("run a fit config's teacher once over its training split, store its top-k per token",
                             "mgsr_lightning.pipeline.cache_teacher:cache_teacher",
                             "mgsr_lightning.pipeline.cache_teacher:command_arguments"),
}


def _usage_lines(lightning: bool) -> str:
    return "\n".join(f"  {name:<13} {command.summary}" if len(name) <= 13 else f"  {name}  {command.summary}"
                     for name, command in COMMANDS.items() if (command.function is None) == lightning)


USAGE = f"""usage: python -m mgsr_lightning <command> [options] [--debug]

Training and evaluation through LightningCLI (every option documented in `<command> --help`):
{_usage_lines(lightning=True)}

Pipelines:
{_usage_lines(lightning=False)}

Run `python -m mgsr_lightning <command> --help` for the options of a command. Errors in what was
given are reported in one line; --debug (or MGSR_DEBUG=1) shows the traceback.
"""


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _run_pipeline(command: Command, name: str, args: list[str]) -> None:
    function = _load(command.function)
    if command.arguments is not None:
        args = _load(command.arguments)(args)
    try:
        CLI(function, args=args, as_positional=False, exit_on_error=False, allow_abbrev=False,
            prog=f"python -m mgsr_lightning {name}")
    except ArgumentError as error:
        options = sorted(inspect.signature(function).parameters)
        raise ConfigError(condense_parser_error(str(error), lambda prefix: [] if prefix else options)) from None


def main(argv: list[str] | None = None) -> None:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    argv = [arg for arg in argv if arg != DEBUG_FLAG]
    if from_command_line:
        # force: importing rouge-score (absl) installs a WARNING-level root handler first, hiding INFO lines
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
        logging.getLogger("absl").setLevel(logging.WARNING)  # rouge-score's "Using default tokenizer." on import
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    name = argv[0]
    if name not in COMMANDS:
        exit_with(f"unknown command {name!r}; commands: {', '.join(COMMANDS)}")
    command = COMMANDS[name]
    try:
        if command.function is not None:
            _run_pipeline(command, name, argv[1:])
            return
        from mgsr_lightning.cli.lightning_cli import run_cli

        if from_command_line:
            sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (given both, it warns)
        run_cli(None if from_command_line else argv)
    except KeyboardInterrupt:  # Ctrl-C outside a fit (which Lightning turns into FitInterrupted)
        if debug:
            raise
        exit_with(f"{name} interrupted (Ctrl-C); its files are written whole or marked unfinished, so none left "
                  "half-written passes for a finished one: run the same command again to finish")
    except Exception as error:  # noqa: BLE001 - expected errors end here in one line; bugs are re-raised
        report(error, debug)
        raise


if __name__ == "__main__":
    main()
