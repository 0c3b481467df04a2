"""The LightningCLI of the package: ``python -m mgsr_lightning {fit,validate,test,predict} --config ...``.

Configs are LightningCLI YAML read in an OmegaConf-based parser mode with one addition: a top-level
``_base_`` (a path or a list of paths, relative to the config's folder) names configs that are
merged first, in order, and then overridden by the file's own keys. That is how every method of a
model pair shares one base (``configs/<pair>/base.yaml``) and one method definition
(``configs/methods/<method>.yaml``) instead of copies. ``${...}`` interpolations are resolved after
the merge, so a key may refer to any other key of the composed config. Top-level keys that start
with an underscore (``_name_``, ``_root_``) are variables for interpolation only and are removed
before LightningCLI sees the config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import set_loader
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from omegaconf import DictConfig, OmegaConf

from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.module import DistillLightningModule

PARSER_MODE = "omegaconf_base"
BASE_KEY = "_base_"


def _compose(data: dict[str, Any], folder: Path, seen: tuple[Path, ...]) -> DictConfig:
    """Merge ``data``'s ``_base_`` configs (recursively) under ``data`` itself, unresolved."""
    bases = data.pop(BASE_KEY, [])
    merged = OmegaConf.create()
    for base in [bases] if isinstance(bases, str) else bases:
        path = (folder / base).resolve()
        if path in seen:
            raise ValueError(f"config cycle through {path}")
        if not path.is_file():
            raise FileNotFoundError(f"{BASE_KEY} config not found: {path} (paths are relative to the including file)")
        base_data = yaml.safe_load(path.read_text()) or {}
        merged = OmegaConf.merge(merged, _compose(base_data, path.parent, seen + (path,)))
    return OmegaConf.merge(merged, OmegaConf.create(data))


def load_config_text(text: str) -> Any:
    """jsonargparse loader: YAML with ``_base_`` composition and OmegaConf interpolation.

    jsonargparse runs loaders with the working directory set to the folder of the config file being
    read, so relative ``_base_`` paths resolve against the including file. Plain values (command
    line scalars) pass through unchanged.
    """
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not (BASE_KEY in data or "${" in text or any(k.startswith("_") for k in data)):
        return data
    resolved = OmegaConf.to_container(_compose(data, Path(os.getcwd()), ()), resolve=True)
    return {key: value for key, value in resolved.items() if not key.startswith("_")}


set_loader(PARSER_MODE, load_config_text, exceptions=(yaml.YAMLError,))


def training_seed(seed_everything: bool | int | None) -> int:
    """``seed_everything`` as an int seed (``true``/``false``/unset give 0)."""
    return seed_everything if isinstance(seed_everything, int) and not isinstance(seed_everything, bool) else 0


class DistillCLI(LightningCLI):
    """LightningCLI with the data module's tokenizer, EOS and length limits linked into the model, and
    ``seed_everything`` linked into the data order and the module's own seed: one training seed
    varies initialisation, data order, the regime's choices and the rollouts."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.tokenizer", "model.init_args.tokenizer")
        parser.link_arguments("data.eos_token", "model.init_args.eos_token")
        parser.link_arguments("data.max_length", "model.init_args.max_length")
        parser.link_arguments("seed_everything", "data.seed", compute_fn=training_seed)
        parser.link_arguments("seed_everything", "model.init_args.seed", compute_fn=training_seed)


def run_cli(args: list[str] | None = None, run: bool = True) -> DistillCLI:
    """Run (or with ``run=False`` only build) the LightningCLI on ``args``."""
    return DistillCLI(
        DistillLightningModule,
        InstructionDataModule,
        subclass_mode_model=True,
        parser_kwargs={"parser_mode": PARSER_MODE},
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )
