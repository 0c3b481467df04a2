"""Where the pipeline finds configs and writes artifacts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from mgsr_lightning.cli.config_files import composed_file
from mgsr_lightning.missing import ROOT_ENVS

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "configs"


def configured_root(pair: str, out: str | None = None) -> str | None:
    """The folder ``configs/<pair>`` read for an embedded pair: ``out`` when given, else the pair's
    environment variable (``MGSR_TINY_DIR``, ``MGSR_REASON_DIR``), else None."""
    return out or os.environ.get(ROOT_ENVS[pair])


def config_path(pair: str, method: str) -> Path:
    path = CONFIGS / pair / f"{method}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in (CONFIGS / pair).glob("*.yaml") if p.stem != "base")
        raise FileNotFoundError(f"no config {path}; methods of {pair!r}: {', '.join(available) or 'none'}")
    return path


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables (read by config interpolations such as ``${oc.env:MGSR_TINY_DIR}``)."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def composed_config(pair: str, name: str = "base") -> dict:
    """``configs/<pair>/<name>.yaml`` with its ``_base_`` files merged and interpolations resolved."""
    return composed_file(config_path(pair, name))
