"""mgsr-lightning: distil large causal LMs into small ones with MGSR and the standard KD baselines.

Importing the package loads nothing else: the names below are imported on first use (PEP 562), so
``import mgsr_lightning.losses`` needs only torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mgsr_lightning.data.datamodule import InstructionDataModule
    from mgsr_lightning.module import DistillLightningModule

__all__ = ["DistillLightningModule", "InstructionDataModule"]
__version__ = "0.1.0"

_HOMES = {"DistillLightningModule": "mgsr_lightning.module", "InstructionDataModule": "mgsr_lightning.data.datamodule"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
