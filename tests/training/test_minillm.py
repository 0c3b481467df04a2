"""MiniLLM's teacher-mixed rollouts and a MiniLLM run: the mixture's draw, the teacher logits the rollout
returns, and a resumed run that ends bit for bit as the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_resume import CALLBACKS, COMPARED, Killed, assert_same
from tiny_models import cli_overrides

from mgsr_lightning.atomic import AtomicCheckpointIO
from mgsr_lightning.batch import Rollout
from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.generation.decode import Decoding
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.training.minillm_rollout import mixed_next_tokens, teacher_mixed_sample

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "minillm.yaml"


def test_mixed_draw_takes_the_teachers_token_with_probability_alpha():
    """Student certain of token 1, teacher of token 3, α = 0.2: over 20k seeds token 3 comes a fifth of the time."""
    n = 20_000
    student = torch.full((n, 5), -1e4).index_fill_(1, torch.tensor([1]), 0.0)
    teacher = torch.full((n, 5), -1e4).index_fill_(1, torch.tensor([3]), 0.0)
    decoding = Decoding(SamplingConfig(), eos_token_id=0, pad_token_id=0)
    tokens = mixed_next_tokens(student, teacher, 0.2, decoding, torch.arange(n), step=0)
    assert set(tokens.tolist()) == {1, 3}
    assert abs(float((tokens == 3).float().mean()) - 0.2) < 0.015


def test_teacher_mixed_rollout_returns_the_teachers_logits_over_its_responses(tiny_gpt2_pair, tiny_tokenizer):
    """The teacher logits kept from decoding equal a teacher forward over the final rollout (real tokens),
    and the same seeds give the same rollout."""
    teacher, student = tiny_gpt2_pair
    prompts = Rollout.from_token_lists([[5, 6, 7], [8, 9], [10, 11, 12, 13]], [[], [], []], pad_token_id=1)
    decoding = Decoding(SamplingConfig(max_new_tokens=10), eos_token_id=0, pad_token_id=1,
                        vocab_size=len(tiny_tokenizer))
    seeds = torch.tensor([3, 4, 5])
    rollout, teacher_logits = teacher_mixed_sample(student, teacher, prompts, decoding, 0.3, seeds)
    again, _ = teacher_mixed_sample(student, teacher, prompts, decoding, 0.3, seeds)
    assert torch.equal(rollout.response_ids, again.response_ids) and rollout.response_mask.any()
    full = response_logits(teacher, rollout, len(tiny_tokenizer))
    mask = rollout.response_mask
    torch.testing.assert_close(teacher_logits[mask], full[mask], atol=1e-4, rtol=1e-4)


def fit(assets, run_dir: Path, *extra: str):
    steps = ["--trainer.val_check_interval=2", f"--trainer.callbacks={CALLBACKS}"]
    return run_cli(["fit", "--config", str(CONFIG), *cli_overrides(assets, "gpt2", run_dir), *steps, *extra])


def test_minillm_resumed_mid_run_matches_an_uninterrupted_run(tiny_assets, tmp_path, monkeypatch):
    """Killed right after step 2's ``last.ckpt`` and resumed: the final checkpoint's every tensor (student,
    optimizer, regime generator, RNG states) equals the uninterrupted 4-step run's; every step sampled."""
    straight = fit(tiny_assets, tmp_path / "straight", "--trainer.max_steps=4")
    assert straight.model.regime.source_counts["fresh"] == 4
    assert {"train/minillm", "minillm/single_step", "minillm/importance_weight"} <= set(straight.trainer.logged_metrics)
    save = AtomicCheckpointIO.save_checkpoint

    def save_then_die(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        if Path(path).name == "last.ckpt" and checkpoint["global_step"] == 2:
            raise Killed(path)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(AtomicCheckpointIO, "save_checkpoint", save_then_die)
        with pytest.raises(Killed):
            fit(tiny_assets, run_dir, "--trainer.max_steps=4")
    last = run_dir / "minillm" / "version_0" / "checkpoints" / "last.ckpt"
    fit(tiny_assets, run_dir, "--trainer.max_steps=4", f"--ckpt_path={last}")
    finals = [torch.load(d / "minillm" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
              for d in (tmp_path / "straight", run_dir)]
    for key in COMPARED:
        assert_same(finals[0][key], finals[1][key], key)
