"""``python -m mgsr_lightning <command>``.

LightningCLI subcommands: ``fit``, ``validate``, ``test``, ``predict`` (``--config configs/...yaml``).
Pipeline commands: ``prepare``, ``prepare-tiny``, ``prepare-smollm2``, ``train-tokenizer``, ``demo``, ``evaluate``,
``table``, ``export``, ``reproduce``, ``cache-teacher``.

A mistake in what was given (a path, a row, a value, a name, a checkpoint) or a full or read-only
disk ends every command with one ``error: ...`` line and exit status 2; ``--debug`` (anywhere on
the command line) or ``MGSR_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import inspect
import logging
import sys
from argparse import ArgumentError

from jsonargparse import CLI

from mgsr_lightning.errors import DEBUG_FLAG, ConfigError, condense_parser_error, debug_requested, exit_with, report

USAGE = """usage: python -m mgsr_lightning <command> [options] [--debug]

Training and evaluation through LightningCLI (every option documented in `<command> --help`):
  fit           train a student:        fit --config configs/tiny/mgsr.yaml
  validate      run the validation loop on a checkpoint or config
  test          run the test loop (loss and ROUGE-L on the test split)
  predict       run the predict loop

Pipelines:
  prepare       your own JSONL data: check and copy it, train a tokenizer and the teacher (cached)
  prepare-tiny  generate the embedded dataset, train its tokenizer and the tiny teacher (cached)
  prepare-smollm2  convert SmolLM2-135M-Instruct's GGUF to a model folder and write the task's data (cached)
  train-tokenizer  train a byte-level BPE tokenizer on a JSONL file
  demo          prepare-tiny, then train an SFT and an MGSR student and print a ROUGE-L table
  evaluate      ROUGE-L over sampling seeds for saved models on evaluation sets
  table         merge `evaluate` outputs into one Table-1-style table and chart
  export        turn a training checkpoint into a Hugging Face model folder
  reproduce     the paper's pipeline: distil each method, evaluate, write Table 1 and a chart
  cache-teacher run a fit config's teacher once over its training split, store its top-k per token

Run `python -m mgsr_lightning <command> --help` for the options of a command. Errors in what was
given are reported in one line; --debug (or MGSR_DEBUG=1) shows the traceback.
"""
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
PIPELINE_COMMANDS = ("prepare", "prepare-tiny", "prepare-smollm2", "train-tokenizer", "demo", "evaluate", "table",
                     "export", "reproduce", "cache-teacher")


def _pipeline_commands():
    from mgsr_lightning.pipeline.cache_teacher import cache_teacher
    from mgsr_lightning.pipeline.commands import demo, evaluate, export, reproduce
    from mgsr_lightning.pipeline.own_data import prepare, train_tokenizer
    from mgsr_lightning.pipeline.smollm2 import prepare_smollm2
    from mgsr_lightning.pipeline.table import table
    from mgsr_lightning.pipeline.tiny import prepare_tiny

    return {"prepare": prepare, "prepare-tiny": prepare_tiny, "prepare-smollm2": prepare_smollm2,
            "train-tokenizer": train_tokenizer, "demo": demo, "evaluate": evaluate, "table": table, "export": export,
            "reproduce": reproduce, "cache-teacher": cache_teacher}


def _run_pipeline(command: str, args: list[str]) -> None:
    function = _pipeline_commands()[command]
    if command == "cache-teacher":
        from mgsr_lightning.pipeline.cache_teacher import command_arguments

        args = command_arguments(args)
    try:
        CLI(function, args=args, as_positional=False, exit_on_error=False, allow_abbrev=False,
            prog=f"python -m mgsr_lightning {command}")
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
    command = argv[0]
    if command not in LIGHTNING_COMMANDS + PIPELINE_COMMANDS:
        exit_with(f"unknown command {command!r}; commands: {', '.join(LIGHTNING_COMMANDS + PIPELINE_COMMANDS)}")
    try:
        if command in PIPELINE_COMMANDS:
            _run_pipeline(command, argv[1:])
            return
        from mgsr_lightning.cli import run_cli

        if from_command_line:
            sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (given both, it warns)
        run_cli(None if from_command_line else argv)
    except Exception as error:  # noqa: BLE001 - expected errors end here in one line; bugs are re-raised
        report(error, debug)
        raise


if __name__ == "__main__":
    main()
