"""The teacher cache: built once by ``cache-teacher``, read by row id, refused when stale, and KD trained
from it without the teacher ever being loaded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny_models import cli_overrides

from mgsr_lightning.batch import TEACHER_CACHE_KEYS, Rollout
from mgsr_lightning.data.collate import EncodedExample
from mgsr_lightning.data.teacher_cache import (
    CachedTeacherCollator,
    TeacherCache,
    check_teacher,
    data_fingerprint,
)
from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.losses.sparse_teacher import densify
from mgsr_lightning.models.loading import ModelSource
from mgsr_lightning.pipeline.cache_teacher import write_teacher_cache

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"template": "plain", "max_length": 40}


def _examples(vocab: int, rows: int = 7) -> list[EncodedExample]:
    generator = torch.Generator().manual_seed(3)
    def ids(length: int) -> list[int]:
        return torch.randint(3, vocab, (length,), generator=generator).tolist()

    return [EncodedExample(10 + i, ids(2 + i % 3), ids(1 + (5 * i) % 7)) for i in range(rows)]


@pytest.fixture
def built_cache(tiny_gpt2_pair, tiny_tokenizer, tmp_path):
    teacher = tiny_gpt2_pair[0].eval()
    vocab = len(tiny_tokenizer)
    examples = _examples(vocab)
    meta = {"data": data_fingerprint(examples, SETTINGS), "teacher": "t", "teacher_source": "tiny"}
    write_teacher_cache(teacher, examples, str(tmp_path / "cache"), top_k=vocab, vocab_size=vocab,
                        pad_token_id=tiny_tokenizer.pad_token_id, batch_size=3, meta=meta)
    return teacher, examples, tmp_path / "cache", vocab, tiny_tokenizer.pad_token_id


def test_batches_in_any_order_read_their_own_rows_and_equal_the_live_teacher_at_k_equal_v(built_cache):
    teacher, examples, folder, vocab, pad = built_cache
    cache = TeacherCache(folder, examples, SETTINGS)
    shard = [examples[i] for i in (5, 0, 3)]  # a shuffled share of the rows, as one DDP rank reads it
    batch = CachedTeacherCollator(pad, cache)(shard)
    cached = densify(*(batch[key] for key in TEACHER_CACHE_KEYS), vocab)
    with torch.no_grad():
        live = torch.log_softmax(response_logits(teacher, Rollout.from_batch(batch), vocab).float(), -1)
    mask = batch["response_mask"]
    assert mask.sum() > 5 and (~mask).any()  # real and padding positions both present
    torch.testing.assert_close(cached[mask], live[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached[~mask].exp().sum(-1), torch.ones(int((~mask).sum())))  # padding: a distribution
    assert batch["example_index"].tolist() == [15, 10, 13]


def test_a_cache_for_other_rows_or_settings_is_refused_in_one_line(built_cache):
    _, examples, folder, _, _ = built_cache
    with pytest.raises(ConfigError, match="other training rows, template or lengths"):
        TeacherCache(folder, examples[:-1], SETTINGS)
    with pytest.raises(ConfigError, match="other training rows, template or lengths"):
        TeacherCache(folder, examples, SETTINGS | {"max_length": 41})
    with pytest.raises(MissingFileError, match="cache-teacher --config"):
        TeacherCache(folder.parent / "absent", examples, SETTINGS)


def test_a_cache_made_by_another_teacher_or_over_another_vocabulary_is_refused(tiny_assets, tmp_path):
    import json

    from mgsr_lightning.data.teacher_cache import META_FILE, teacher_fingerprint

    gpt2, opt = (ModelSource(str(tiny_assets["models"][family]["teacher"])) for family in ("gpt2", "opt"))
    tmp_path.joinpath(META_FILE).write_text(json.dumps(
        {"format": 1, "teacher": teacher_fingerprint(gpt2), "teacher_source": "gpt2", "vocab_size": 300}))
    check_teacher(tmp_path, gpt2, 300)
    with pytest.raises(ConfigError, match="made by another teacher"):
        check_teacher(tmp_path, opt, 300)
    with pytest.raises(ConfigError, match="made by another teacher"):  # the same folder in another dtype
        check_teacher(tmp_path, ModelSource(gpt2.name_or_path, dtype="bfloat16"), 300)
    with pytest.raises(ConfigError, match="is over 300 tokens but the pair shares 299"):
        check_teacher(tmp_path, gpt2, 299)


def test_only_ground_truth_methods_without_scrg_go_without_a_live_teacher():
    from mgsr_lightning.losses.objective import DistillLoss
    from mgsr_lightning.module import DistillLightningModule
    from mgsr_lightning.scrg.revise import ScrgConfig
    from mgsr_lightning.training.regimes import RegimeConfig

    def needs_live_teacher(regime: str, scrg: bool, teacher_cache: str | None) -> bool:
        module = DistillLightningModule(ModelSource(config={"model_type": "gpt2"}), ModelSource("teacher"),
                                        tokenizer="tokenizer", distill=DistillLoss(), regime=RegimeConfig(regime),
                                        scrg=ScrgConfig() if scrg else None, teacher_cache=teacher_cache)
        return module.needs_live_teacher()

    assert not needs_live_teacher("ground_truth", False, "cache")
    assert needs_live_teacher("ground_truth", False, None)
    assert needs_live_teacher("adaptive_off_policy", False, "cache")
    assert needs_live_teacher("ground_truth", True, "cache")
    assert needs_live_teacher("teacher_generated", False, "cache")


def test_kd_on_the_embedded_default_trains_from_a_cache_with_the_teacher_never_loaded(tiny_assets, tmp_path,
                                                                                   monkeypatch):
    from mgsr_lightning.cli.lightning_cli import run_cli
    from mgsr_lightning.module import DistillLightningModule
    from mgsr_lightning.pipeline.cache_teacher import cache_teacher, command_arguments

    config = str(REPO / "configs" / "tiny" / "kd.yaml")
    overrides = cli_overrides(tiny_assets, run_dir=tmp_path / "run")
    assert command_arguments(["--config", config, "--top_k", "8"]) == [f'--fit_config=["{config}"]', "--top_k", "8"]
    written = cache_teacher([config], top_k=8, out=str(tmp_path / "cache"), overrides=overrides)
    assert written["top_k"] == 8 and written["rows"] > 50 and written["positions"] > written["rows"]

    def refuse(self):
        raise AssertionError("the teacher was loaded")

    monkeypatch.setattr(DistillLightningModule, "load_teacher", refuse)
    seen = []
    original = DistillLightningModule.training_step

    def spy(self, batch, batch_idx):
        seen.append(batch[TEACHER_CACHE_KEYS[0]].shape)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(DistillLightningModule, "training_step", spy)
    monkeypatch.chdir(tmp_path)  # a relative cache path, as a user types it: data's and the module's copies agree
    cli = run_cli(["fit", "--config", config, *overrides, "--data.teacher_cache=cache"])
    assert cli.model.hparams.teacher_cache == cli.datamodule.hparams.teacher_cache == str(tmp_path / "cache")
    assert cli.model.teacher is None and not any(name.startswith("teacher.") for name, _ in cli.model.named_modules())
    assert cli.trainer.global_step == 2 and len(seen) == 2 and seen[0][-1] == 8
    distill = float(cli.trainer.logged_metrics["train/distill"])
    assert math.isfinite(distill) and distill > 0
    # a stale cache (other training rows) is refused before any step
    with pytest.raises(ConfigError, match="other training rows"):
        run_cli(["fit", "--config", config, *overrides, f"--data.teacher_cache={tmp_path / 'cache'}",
                 "--data.max_train_examples=40"])
