"""What our commands print besides their results: no warnings they cause themselves, no Lightning
advertisements or deprecations a user cannot act on, and a progress bar that reads right under max_steps."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

from tiny_models import cli_overrides

from mgsr_lightning.cli.lightning_cli import StepLimitedRichProgressBar, run_cli

REPO = Path(__file__).resolve().parents[2]
KD_CONFIG = str(REPO / "configs" / "tiny" / "kd.yaml")


def test_progress_bar_under_max_steps_shows_the_step_limit_not_epoch_minus_two():
    bar = StepLimitedRichProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1, max_steps=400)
    description = bar._get_train_description(5)
    assert description.strip() == "Epoch 5 (max_steps 400)" and "/-" not in description
    bar._trainer = SimpleNamespace(max_epochs=3, max_steps=-1)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


def test_fit_from_python_with_a_command_line_present_does_not_warn(tiny_assets, tmp_path, monkeypatch):
    # a pipeline command (prepare, demo, reproduce) runs fit with its own arguments while sys.argv holds its own
    monkeypatch.setattr(sys, "argv", ["mgsr_lightning", "prepare", "--data", "my_data"])
    args = ["--config", KD_CONFIG, *cli_overrides(tiny_assets, run_dir=tmp_path / "run"),
            "--trainer.enable_progress_bar=true"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = run_cli(args, run=False)
    assert not [str(w.message) for w in caught if "args parameter" in str(w.message)]
    assert sys.argv == ["mgsr_lightning", "prepare", "--data", "my_data"]  # given back
    assert isinstance(cli.trainer.progress_bar_callback, StepLimitedRichProgressBar)


def test_lightning_advertisements_are_dropped_and_other_lines_kept(caplog):
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from mgsr_lightning.cli.lightning_cli import quiet_lightning

    quiet_lightning()  # what run_cli does first
    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging, try installing litlogger")
        rank_zero_info("GPU available: False, used: False")
    assert "Tip" not in caplog.text and "GPU available" in caplog.text


def test_lightning_s_leafspec_deprecation_is_silenced_and_nothing_else():
    from lightning.pytorch.utilities._pytree import _tree_flatten

    from mgsr_lightning.cli.lightning_cli import quiet_lightning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _tree_flatten(1)
        assert any("LeafSpec" in str(w.message) for w in caught)  # what Lightning emits on its own
        caught.clear()
        quiet_lightning()  # what run_cli does first
        _tree_flatten(1)
        warnings.warn("kept", FutureWarning)
    assert [str(w.message) for w in caught] == ["kept"]  # narrow: other FutureWarnings still show
