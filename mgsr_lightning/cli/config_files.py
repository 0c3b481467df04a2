"""Config files: YAML with ``_base_`` composition and OmegaConf interpolation, as ``fit`` and the pipeline read them.

A top-level ``_base_`` (a path or a list of paths, relative to the config's folder) names configs that are
merged first, in order, and then overridden by the file's own keys. That is how every method of a model
pair shares one base (``configs/<pair>/base.yaml``) and one method definition
(``configs/methods/<method>.yaml``) instead of copies. ``${...}`` interpolations are resolved after the
merge, so a key may refer to any other key of the composed config. Top-level keys that start with an
underscore (``_name_``, ``_root_``, ``_label_``) are variables: LightningCLI never sees them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from mgsr_lightning.errors import MissingFileError

BASE_KEY = "_base_"


def _bases(data: dict[str, Any]) -> list[str]:
    bases = data.get(BASE_KEY, [])
    return [bases] if isinstance(bases, str) else list(bases)


def compose(data: dict[str, Any], folder: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """Merge ``data``'s ``_base_`` configs (recursively, relative to ``folder``) under ``data`` itself, unresolved."""
    merged = OmegaConf.create()
    for base in _bases(data):
        path = (folder / base).resolve()
        if path in seen:
            raise ValueError(f"config cycle through {path}")
        if not path.is_file():
            raise MissingFileError(f"{BASE_KEY} config not found: {path} (paths are relative to the including file)")
        base_data = yaml.safe_load(path.read_text()) or {}
        merged = OmegaConf.merge(merged, compose(base_data, path.parent, seen + (path,)))
    return OmegaConf.merge(merged, OmegaConf.create({k: v for k, v in data.items() if k != BASE_KEY}))


def composed_file(path: Path) -> dict[str, Any]:
    """The config file ``path`` composed and resolved, its variables (``_name_``, ``_label_``, ...) included."""
    return OmegaConf.to_container(compose(yaml.safe_load(path.read_text()) or {}, path.parent), resolve=True)


def load_config_text(text: str) -> Any:
    """jsonargparse loader: YAML with ``_base_`` composition and OmegaConf interpolation.

    jsonargparse runs loaders with the working directory set to the folder of the config file being
    read, so relative ``_base_`` paths resolve against the including file. Plain values (command
    line scalars) pass through unchanged.
    """
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not (BASE_KEY in data or "${" in text or any(k.startswith("_") for k in data)):
        return data
    resolved = OmegaConf.to_container(compose(data, Path(os.getcwd())), resolve=True)
    return {key: value for key, value in resolved.items() if not key.startswith("_")}


def config_texts(path: Path, seen: tuple[Path, ...] = ()) -> list[str]:
    """The text of a config and of every ``_base_`` it composes, in order."""
    path = path.resolve()
    text = path.read_text()
    texts = []
    for base in _bases(yaml.safe_load(text) or {}) if path not in seen else []:
        texts += config_texts(path.parent / base, seen + (path,))
    return texts + [text]
