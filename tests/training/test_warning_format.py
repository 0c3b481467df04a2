"""Warnings of the package print with their class names once a LightningModule is built, although
Lightning's formatter drops the category of any file whose path contains "lightning" (every file of
mgsr_lightning)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import warnings
import lightning.pytorch  # Lightning's formatter first, as in every run
import mgsr_lightning.module as module
from lightning.pytorch.utilities import rank_zero_warn
from mgsr_lightning.losses.saturation import FarFromTeacherWarning
from mgsr_lightning.models.loading import ModelSource
from mgsr_lightning.training.regimes import NoStudentOutputsWarning

module.DistillLightningModule(ModelSource(config={"model_type": "gpt2"}), tokenizer="unused")  # loads nothing

warnings.simplefilter("always")
warnings.warn_explicit("the skew forward KL is 2.28 nats per token", FarFromTeacherWarning, module.__file__, 249)
warnings.warn_explicit("a plain user warning from our file", UserWarning, module.__file__, 12)
rank_zero_warn("no training step used student-generated sequences", category=NoStudentOutputsWarning)
warnings.warn_explicit("a warning of Lightning's own", UserWarning, lightning.pytorch.__file__, 3)
"""


def test_our_warnings_print_their_class_names_once_the_module_is_built():
    env = {**os.environ, "PYTHONWARNINGS": ""}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any(line.endswith("module.py:249: FarFromTeacherWarning: the skew forward KL is 2.28 nats per token")
               for line in lines), lines
    assert any(line.endswith("module.py:12: UserWarning: a plain user warning from our file") for line in lines), lines
    assert any("NoStudentOutputsWarning: no training step used student-generated sequences" in line
               for line in lines), lines
    # Lightning's own warnings are left to Lightning's formatter
    assert any(line.endswith("__init__.py:3: a warning of Lightning's own") for line in lines), lines
