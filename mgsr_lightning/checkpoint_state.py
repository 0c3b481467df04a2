"""What the LightningModule's checkpoints hold: everything but the frozen teacher.

``TeacherOutOfCheckpoints`` is a mixin of :class:`mgsr_lightning.module.DistillLightningModule`: the
teacher's weights are dropped from every saved ``state_dict`` (they come from its own folder and
never change), and put back from the loaded teacher when a checkpoint's state is loaded, so strict
loading still works. The regime's and the random generators' states are saved by
:class:`mgsr_lightning.training.resume.ResumeState`. The host provides ``teacher`` and ``_build_student_side()``.
"""

from __future__ import annotations

from typing import Any


class TeacherOutOfCheckpoints:
    """Checkpoint hooks that keep the frozen teacher out (mixed into the LightningModule)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("teacher.")}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._build_student_side()  # `load_from_checkpoint` builds the module without the Trainer

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if self.teacher is not None:
            state_dict = dict(state_dict)
            for key, value in self.teacher.state_dict().items():
                state_dict.setdefault(f"teacher.{key}", value)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)
