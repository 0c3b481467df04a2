"""Resume across a validation step: a run stopped right after the checkpoint of a step whose validation
is due, then resumed from its ``last.ckpt``, ends exactly as the uninterrupted run does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import cli_overrides

from mgsr_lightning.atomic import AtomicCheckpointIO
from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.training.resume import CheckpointAfterValidation

# MGSR on the adaptive regime: its replay buffer and threshold are part of the state to resume
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "mgsr_scrg_adaptive.yaml"
# validation at steps 2 and 4, a latest-state checkpoint after every step
CALLBACKS = ('[{"class_path": "mgsr_lightning.training.resume.CheckpointAfterValidation", "init_args": '
             '{"monitor": "val/rougeL", "mode": "max", "save_top_k": 1, "filename": "best-{step}"}}, '
             '{"class_path": "mgsr_lightning.training.resume.CheckpointAfterValidation", "init_args": '
             '{"every_n_train_steps": 1, "save_top_k": 1, "save_last": true, "filename": "latest-{step}"}}]')
STEPS = ["--trainer.val_check_interval=2", "--model.init_args.regime.init_threshold=0.6",
         f"--trainer.callbacks={CALLBACKS}"]
# what a checkpoint holds besides the callbacks' paths: every tensor and number of the training state
COMPARED = ("state_dict", "optimizer_states", "lr_schedulers", "regime", "rng_states", "global_step", "epoch", "loops")


class Killed(Exception):
    """Stands for a SIGKILL: raised right after a given checkpoint file is complete."""


def fit(assets, run_dir: Path, *extra: str):
    return run_cli(["fit", "--config", str(CONFIG), *cli_overrides(assets, "gpt2", run_dir), *STEPS, *extra])


def checkpoints(run_dir: Path) -> Path:
    return run_dir / "mgsr_scrg_adaptive" / "version_0" / "checkpoints"


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def straight(tiny_assets, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    return run_dir, fit(tiny_assets, run_dir, "--trainer.max_steps=4")


@pytest.mark.parametrize("killed_after", ["last.ckpt", "best-step=2.ckpt"])
def test_resume_after_a_validation_step_checkpoint_matches_an_uninterrupted_run(
        straight, killed_after, tiny_assets, tmp_path, monkeypatch):
    """Stopped right after step 2's ``last.ckpt`` (or, earlier, after its ``best-*.ckpt`` while
    ``last.ckpt`` still holds step 1), resumed for the remaining steps: the final checkpoint's every
    tensor, the regime (previous validation loss, threshold, replay buffer), the best checkpoint and
    the exported student equal the uninterrupted run's, and the folder keeps one best checkpoint."""
    save = AtomicCheckpointIO.save_checkpoint

    def save_then_die(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        if Path(path).name == killed_after and checkpoint["global_step"] == 2:
            raise Killed(path)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_die)
        with pytest.raises(Killed):
            fit(tiny_assets, run_dir, "--trainer.max_steps=4")
    last = checkpoints(run_dir) / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == (2 if killed_after == "last.ckpt" else 1)
    resumed = fit(tiny_assets, run_dir, "--trainer.max_steps=4", f"--ckpt_path={last}")

    straight_dir, straight_cli = straight
    for callback in resumed.trainer.checkpoint_callbacks:  # written after validation; state under ModelCheckpoint's key
        assert type(callback) is CheckpointAfterValidation and callback.state_key.startswith("ModelCheckpoint{")
    assert resumed.trainer.global_step == straight_cli.trainer.global_step == 4
    regimes = [cli.model.regime.state_dict() for cli in (straight_cli, resumed)]
    assert regimes[0]["previous_val_loss"] is not None and len(regimes[0]["buffer"]) > 0
    assert_same(regimes[0], regimes[1], "regime")
    finals = [torch.load(checkpoints(d) / "last.ckpt", weights_only=False) for d in (straight_dir, run_dir)]
    for key in COMPARED:
        assert_same(finals[0][key], finals[1][key], key)

    files = [sorted(p.name for p in checkpoints(d).iterdir()) for d in (straight_dir, run_dir)]
    assert files[0] == files[1] and len([name for name in files[1] if name.startswith("best-")]) == 1, files
    best = [torch.load(next(checkpoints(d).glob("best-*.ckpt")), weights_only=False) for d in (straight_dir, run_dir)]
    assert_same(best[0]["state_dict"], best[1]["state_dict"], "best")
    exported = [load_file(d / "hf" / "model.safetensors") for d in (straight_dir, run_dir)]
    assert_same(exported[0], exported[1], "exported student")


def test_a_plain_step_checkpoint_is_warned_of_and_left_as_it_is(tmp_path):
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from mgsr_lightning.training.resume import ResumeState, StepCheckpointBeforeValidationWarning

    plain, after = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1), CheckpointAfterValidation(dirpath=tmp_path)
    with pytest.warns(StepCheckpointBeforeValidationWarning, match="CheckpointAfterValidation"):
        ResumeState().setup(SimpleNamespace(checkpoint_callbacks=[plain, after]), None, "fit")
    assert type(plain) is ModelCheckpoint  # the class a user gives is the class that runs
