"""mgsr-lightning: distil large causal LMs into small ones with MGSR and the standard KD baselines."""

__all__ = ["DistillLightningModule", "InstructionDataModule"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so that `import mgsr_lightning.losses` does not pull in Lightning and transformers.
    if name == "DistillLightningModule":
        from mgsr_lightning.module import DistillLightningModule

        return DistillLightningModule
    if name == "InstructionDataModule":
        from mgsr_lightning.data.datamodule import InstructionDataModule

        return InstructionDataModule
    raise AttributeError(f"module 'mgsr_lightning' has no attribute {name!r}")
