"""What a prepare command wrote into its folder: the files it owns and the inputs of each step.

``prepare`` and ``prepare-tiny`` keep ``<root>/prepared.json``::

    {"files": {"data/train.jsonl": "<sha256 of the file as written>", ...},
     "steps": {"tokenizer": {"fingerprint": "<sha256 of the step's inputs>", "summary": {...}}, ...}}

Two rules follow from it. A file is overwritten only if the manifest says this pipeline wrote it
and it has not changed since (anything else is someone's own file, and the command stops and says
so). A step's output is reused only when the fingerprint of its inputs is the recorded one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mgsr_lightning import atomic
from mgsr_lightning.errors import ConfigError

MANIFEST_NAME = "prepared.json"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_sha256(folder: str | Path) -> str:
    """Hash of every file's name and contents under ``folder``."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return fingerprint({p.relative_to(folder).as_posix(): file_sha256(p) for p in files})


def fingerprint(payload: Any) -> str:
    """sha256 of a JSON-serialisable description of a step's inputs."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class Manifest:
    """``<root>/prepared.json``, read when created and written by :meth:`save`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.path = self.root / MANIFEST_NAME
        data = self._read() if self.path.is_file() else {}
        self.files: dict[str, str] = data.get("files", {})
        self.steps: dict[str, dict[str, Any]] = data.get("steps", {})

    def _read(self) -> dict[str, Any]:
        advice = (f"it records which files of {self.root} a prepare command wrote, so nothing there can be reused or "
                  f"replaced safely: move {self.root} away (or delete it) and prepare again")
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ConfigError(f"{self.path} is not valid JSON ({error.msg} at line {error.lineno}, "
                              f"column {error.colno}); {advice}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{self.path} is not UTF-8 text; {advice}") from None
        if not isinstance(data, dict) or not all(isinstance(data.get(key, {}), dict) for key in ("files", "steps")):
            raise ConfigError(f"{self.path} is not a manifest written by prepare "
                              f"(expected an object of files and steps); {advice}")
        return data

    def _key(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is absent, or was written by this pipeline and is unchanged since."""
        path = Path(path)
        return not path.exists() or (path.is_file() and self.files.get(self._key(path)) == file_sha256(path))

    def check_overwritable(self, *paths: Path, command: str, advice: str) -> None:
        """Fail before writing if any of ``paths`` exists and is not this pipeline's own unchanged file."""
        foreign = [str(path) for path in paths if not self.owns(path)]
        if foreign:
            raise ConfigError(f"{command} would overwrite {', '.join(foreign)}, which it did not write "
                              f"(or which changed since); it never replaces files it did not write: {advice}")

    def record_files(self, *paths: Path) -> None:
        for path in paths:
            self.files[self._key(path)] = file_sha256(path)

    def step_matches(self, name: str, step_fingerprint: str, output: Path) -> bool:
        """Whether ``output`` exists and was made by step ``name`` from inputs with this fingerprint."""
        return output.exists() and self.steps.get(name, {}).get("fingerprint") == step_fingerprint

    def check_step_output(self, name: str, output: Path, advice: str) -> None:
        """Fail if ``output`` exists but no step of this pipeline recorded making it (someone's own folder)."""
        if output.exists() and name not in self.steps:
            raise ConfigError(f"{output} exists but was not made by this command, "
                              f"so it is neither reused nor replaced: {advice}")

    def record_step(self, name: str, step_fingerprint: str, summary: dict[str, Any]) -> None:
        self.steps[name] = {"fingerprint": step_fingerprint, "summary": summary}

    def save(self) -> None:
        atomic.write_text(self.path, json.dumps({"files": self.files, "steps": self.steps}, indent=2,
                                                ensure_ascii=False) + "\n")
