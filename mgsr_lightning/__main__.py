"""``python -m mgsr_lightning <command>``.

LightningCLI subcommands: ``fit``, ``validate``, ``test``, ``predict`` (``--config configs/...yaml``).
Pipeline commands: ``prepare-tiny``, ``demo``, ``evaluate``, ``export``, ``reproduce``.
"""

from __future__ import annotations

import logging
import sys

from jsonargparse import CLI

USAGE = """usage: python -m mgsr_lightning <command> [options]

Training and evaluation through LightningCLI (every option documented in `<command> --help`):
  fit           train a student:        fit --config configs/tiny/mgsr.yaml
  validate      run the validation loop on a checkpoint or config
  test          run the test loop (loss and ROUGE-L on the test split)
  predict       run the predict loop

Pipelines:
  prepare-tiny  generate the embedded dataset, train its tokenizer and the tiny teacher (cached)
  demo          prepare-tiny, then train an SFT and an MGSR student and print a ROUGE-L table
  evaluate      ROUGE-L over sampling seeds for a saved model on evaluation sets
  export        turn a training checkpoint into a Hugging Face model folder
  reproduce     the paper's pipeline: distil each method, evaluate, write Table 1 and a chart

Run `python -m mgsr_lightning <command> --help` for the options of a command.
"""


def _pipeline_commands():
    from mgsr_lightning.pipeline.commands import demo, evaluate, export, reproduce
    from mgsr_lightning.pipeline.tiny import prepare_tiny

    return {"prepare-tiny": prepare_tiny, "demo": demo, "evaluate": evaluate, "export": export, "reproduce": reproduce}


def main(argv: list[str] | None = None) -> None:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    pipelines = _pipeline_commands()
    if argv[0] in pipelines:
        CLI(pipelines[argv[0]], args=argv[1:], as_positional=False)
        return
    from mgsr_lightning.cli import run_cli

    run_cli(None if from_command_line else argv)  # None: LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
