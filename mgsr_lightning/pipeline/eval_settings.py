"""The prompt template and lengths ``evaluate`` uses for a model.

A model is scored the way it was trained to be prompted: a different template or prompt cap
changes its ROUGE-L (the tiny pair's students score far lower under the Alpaca preamble they never
saw). Each setting comes from the first of:

1. the command line (``--template``, ``--max_new_tokens``, ``--max_prompt_length``, ``--eos_token``);
2. ``--preset <pair>``: the data and sampling settings of ``configs/<pair>/base.yaml``;
3. the model's own training settings, ``mgsr_training.json``, written beside every model that
   ``fit`` or ``export`` saves;
4. MiniLLM's protocol: the Alpaca template, prompts of at most 256 tokens, 256 new tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mgsr_lightning.errors import ConfigError
from mgsr_lightning.models.export import TRAINING_SETTINGS
from mgsr_lightning.pipeline.paths import CONFIGS, composed_config

SETTINGS = ("template", "max_new_tokens", "max_prompt_length", "eos_token")
PAPER_PROTOCOL = {"template": "alpaca", "max_new_tokens": 256, "max_prompt_length": 256, "eos_token": None}
DEFAULT_SOURCE = "default (MiniLLM's protocol)"


def preset_settings(pair: str) -> dict[str, Any]:
    """The evaluation settings of a pair's training config (``configs/<pair>/base.yaml``, composed)."""
    if not (CONFIGS / pair / "base.yaml").is_file():
        pairs = sorted(p.name for p in CONFIGS.iterdir() if (p / "base.yaml").is_file())
        raise ConfigError(f"unknown preset {pair!r}; presets (model pairs): {', '.join(pairs)}")
    config = composed_config(pair)
    data, module = config.get("data", {}), config.get("model", {}).get("init_args", {})
    return {"template": data.get("template", "alpaca"), "max_prompt_length": data.get("max_prompt_length", 256),
            "max_new_tokens": (module.get("sampling") or {}).get("max_new_tokens", 256),
            "eos_token": data.get("eos_token")}


def model_settings(model: str | Path) -> dict[str, Any] | None:
    """The training settings saved with a model folder, or None (a hub id, or a folder saved elsewhere)."""
    path = Path(model).expanduser() / TRAINING_SETTINGS
    return json.loads(path.read_text()) if path.is_file() else None


def resolve(model: str | Path, preset: str | None, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(settings, where each came from) for evaluating ``model``; ``given`` holds the command line's values
    (None: unset)."""
    layers = [(DEFAULT_SOURCE, PAPER_PROTOCOL)]
    saved = model_settings(model)
    if saved is not None:
        layers.append((f"its training settings ({Path(model) / TRAINING_SETTINGS})", saved))
    if preset is not None:
        layers.append((f"--preset {preset} (configs/{preset}/base.yaml)", preset_settings(preset)))
    layers.append(("the command line", {key: value for key, value in given.items() if value is not None}))
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        for key in SETTINGS:
            if key in values and (values[key] is not None or key == "eos_token"):
                settings[key], sources[key] = values[key], source
    return settings, sources


def describe(settings: dict[str, Any], sources: dict[str, str]) -> str:
    """One line per source: which settings it gave."""
    by_source: dict[str, list[str]] = {}
    for key in SETTINGS:
        if key == "eos_token" and settings[key] is None:
            continue
        by_source.setdefault(sources[key], []).append(f"{key}={settings[key]}")
    return "; ".join(f"{', '.join(items)} from {source}" for source, items in by_source.items())
