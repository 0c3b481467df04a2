"""mgsr-lightning: distil large causal LMs into small ones with MGSR and the standard KD baselines."""

from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.module import DistillLightningModule

__all__ = ["DistillLightningModule", "InstructionDataModule"]
__version__ = "0.1.0"
