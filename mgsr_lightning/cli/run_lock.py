"""One ``fit`` at a time per export folder.

Two runs exporting to the same folder (two ``fit``s on one root, with a config's default
``export_dir``) would each write their student there and the second would silently replace the first.
While a ``fit`` runs, it holds ``.<folder>.fit-lock`` beside its export folder (created exclusively,
holding its process id, host, start time and command line) and removes it when it ends, however it
ends. A second ``fit`` with that export folder is refused before it loads or writes anything. A lock
left by a killed run (its process is gone on this host) is taken over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from mgsr_lightning.errors import UserError

log = logging.getLogger(__name__)

# set in the processes that a multi-process launcher starts for ranks > 0: only rank 0 takes the lock
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


class ExportFolderBusyError(UserError):
    """Another run is writing to the same export folder."""


def lock_path(export_dir: str | Path) -> Path:
    folder = Path(export_dir).expanduser().absolute()
    return folder.with_name(f".{folder.name}.fit-lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class ExportLock:
    """The lock of one export folder: :meth:`acquire` before the run, :meth:`release` after it."""

    def __init__(self, export_dir: str | Path, option: str = "model.init_args.export_dir"):
        self.export_dir = Path(export_dir).expanduser().absolute()
        self.option = option
        self.path = lock_path(export_dir)
        self._created: list[Path] = []  # folders made to hold the lock, removed again if left empty
        self._held = False

    def acquire(self) -> None:
        missing = [folder for folder in [self.path.parent, *self.path.parent.parents] if not folder.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = missing
        payload = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "command": " ".join(sys.argv)}
        for _ in range(2):
            try:
                handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if (holder.get("host") == payload["host"] and isinstance(holder.get("pid"), int)
                        and not _alive(holder["pid"])):
                    log.info("taking over %s, left by a run that ended without removing it (pid %d)",
                             self.path, holder["pid"])
                    self.path.unlink(missing_ok=True)
                    continue
                self._remove_created()
                who = (f"pid {holder['pid']} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
                       if "pid" in holder else "lock file being written")
                raise ExportFolderBusyError(
                    f"{self.option}: another fit ({who}) is writing its student to {self.export_dir}, and a second one "
                    f"would replace it; wait for that run to end, or give this one another folder "
                    f"(--{self.option}=...). If no such run is going on, delete {self.path}") from None
            with os.fdopen(handle, "w") as file:
                json.dump(payload, file)
            self._held = True
            return

    def _holder(self) -> dict:
        try:
            holder = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def release(self) -> None:
        if self._held and self._holder().get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self._held = False
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []


def export_lock(export_dir: str | Path | None) -> ExportLock | None:
    """The lock to take for a run exporting to ``export_dir``: None for no export, a remote folder, or a process
    of rank > 0 (its rank 0 holds it)."""
    if not export_dir or "://" in str(export_dir):
        return None
    if any(os.environ.get(name, "0") not in ("", "0") for name in RANK_VARIABLES):
        return None
    return ExportLock(export_dir)
