"""mgsr-lightning: distil large causal LMs into small ones with MGSR and the standard KD baselines.

Importing the package loads nothing else: the names below are imported on first use (PEP 562), so
``import mgsr_lightning.losses`` needs only torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mgsr_lightning.lazy import lazy_exports

if TYPE_CHECKING:
    from mgsr_lightning.data.datamodule import InstructionDataModule
    from mgsr_lightning.module import DistillLightningModule

__all__ = ["DistillLightningModule", "InstructionDataModule"]
__version__ = "0.1.0"

_HOMES = {"DistillLightningModule": "mgsr_lightning.module", "InstructionDataModule": "mgsr_lightning.data.datamodule"}

__getattr__, __dir__ = lazy_exports(globals(), _HOMES)
