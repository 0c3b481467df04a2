"""Writing files so that a reader sees the old content or the new one, never half of the new.

Each file is written under a hidden temporary name in its destination folder and renamed onto its
name once complete (``os.replace`` is atomic within a file system). A full disk or a crash
mid-write leaves at most a ``.<name>.tmp-<pid>`` file, which no glob for ``best-*.ckpt`` or
``metrics.json`` picks up, and the error names the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; it becomes ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(temporary)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        _remove(temporary)


def write_text(path: str | Path, text: str) -> Path:
    """``Path.write_text`` (UTF-8), atomically."""
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(path)


@contextlib.contextmanager
def atomic_folder(folder: str | Path, last: str = "config.json") -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success its files are moved into ``folder``.

    Each file replaces its namesake atomically and ``last`` (a model folder's ``config.json``, which
    marks it complete for loaders and for ``reproduce``) is moved last, so ``folder`` never holds a
    complete-looking mix of old and new. Files of ``folder`` not written again are kept.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    _remove(temporary)
    try:
        temporary.mkdir()
        yield temporary
        folder.mkdir(exist_ok=True)
        written = sorted(p for p in temporary.rglob("*") if p.is_file())
        for source in sorted(written, key=lambda p: p.relative_to(temporary).as_posix() == last):
            target = folder / source.relative_to(temporary)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
    finally:
        _remove(temporary)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoint I/O, writing each checkpoint under a temporary name first.

    Without it a full disk leaves a truncated ``best-*.ckpt`` or ``last.ckpt`` that a resumed run
    would pick up. Remote paths (``s3://...``) are written as Lightning writes them.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            with atomic_path(path) as temporary:
                super().save_checkpoint(checkpoint, temporary, storage_options)
        except OSError as error:
            error.filename = str(path)  # the checkpoint's name, not the temporary one
            raise
