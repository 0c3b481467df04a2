"""Where Lightning's own behaviour is adjusted: what it prints that a user of our commands cannot act on, its log
lines printed once, its progress bar under ``max_steps``, its CSV log on resume, and its reading of ``sys.argv``.

Each piece is narrow (one message, one logger, one method) so that everything else Lightning says still shows.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers import CSVLogger


class _NoAdvertisements(logging.Filter):
    """Drops Lightning's "💡 Tip: try installing ..." lines (advertisements for other packages)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


# loggers on which Lightning installs a handler of its own when it is imported
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning")


def log_lines_once() -> None:
    """Leave Lightning's log lines to the root logger's handler when there is one (the command line sets it up).

    Imported after that handler exists, ``lightning`` adds a handler of its own to its top logger and still
    propagates to the root, so every INFO line would print twice (``INFO: ...`` and ``INFO lightning...: ...``).
    Without a root handler (a library user's program) Lightning's handlers are left as they are."""
    if not logging.getLogger().handlers:
        return
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
        logger.propagate = True


def quiet_lightning() -> None:
    """Silence what Lightning prints that a user of our commands cannot act on, and nothing else: its own
    use of torch's deprecated ``LeafSpec`` (a FutureWarning from one module) and its "Tip" lines; and print
    each of its log lines once (:func:`log_lines_once`)."""
    log_lines_once()
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning_fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, _NoAdvertisements) for existing in logger.filters):
            logger.addFilter(_NoAdvertisements())


def allow_resuming_mid_epoch() -> None:
    """Silence Lightning's warning that a run resumed mid-epoch has a loader that cannot resume: the data
    module, not the DataLoader, holds the position in the epoch (``InstructionDataModule.state_dict``), so the
    warning does not apply. Called when the data module restores that position, before Lightning would warn."""
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")


class StepLimitedRichProgressBar(RichProgressBar):
    """Lightning's rich progress bar, whose training description reads "Epoch 5/-2" when the run is
    limited by ``max_steps`` (``max_epochs`` is then -1): it shows the epoch and the step limit instead."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch}" + (f" (max_steps {trainer.max_steps})" if trainer.max_steps > 0 else "")
        return f"{description:{len(self.validation_description)}}"


def keep_logged_rows(logger: CSVLogger, resume_step: int) -> None:
    """Carry the rows a resumed run's first part logged before ``resume_step`` into its CSV logger.

    Lightning's CSV writer deletes an existing ``metrics.csv`` when it opens the folder; the rows are
    read first and handed back to it, so the version's file holds both parts of the run.
    """
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        header = list(reader.fieldnames or [])
    experiment = logger.experiment  # opening the folder removes the old file
    kept = [{k: v for k, v in row.items() if v != ""} for row in rows
            if row.get("step", "").isdigit() and int(row["step"]) < resume_step]
    experiment.metrics = kept + experiment.metrics
    experiment.metrics_keys = sorted(set(header) | set(experiment.metrics_keys))


@contextlib.contextmanager
def program_name_only() -> Iterator[None]:
    """Hide the command line from LightningCLI while it parses ``args`` given in Python (a pipeline
    command's own ``fit``): it warns when it sees both, although only ``args`` is read."""
    argv = sys.argv
    sys.argv = argv[:1]
    try:
        yield
    finally:
        sys.argv = argv
