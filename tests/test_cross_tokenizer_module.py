"""DistillLightningModule across tokenizers: a teacher with its own tokenizer (other vocabulary size and merges)
distilled into the tiny student through the CLI, on ground truth and on the student's rollouts; and the
cross-tokenizer path with one tokenizer on both sides giving the same-tokenizer KD loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model, cli_overrides

from mgsr_lightning.batch import Rollout
from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.cross_tokenizer import shared_vocabulary
from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.errors import ConfigError
from mgsr_lightning.losses.objective import DistillLoss
from mgsr_lightning.models.loading import ModelSource, VocabularyMismatchError
from mgsr_lightning.models.tokenizer import load_tokenizer, train_bpe_tokenizer
from mgsr_lightning.module import DistillLightningModule
from mgsr_lightning.training.regimes import RegimeConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def teacher_side(tiny_assets, tmp_path_factory):
    """A byte-level BPE of another size (so other merges and ids) trained on the same data, and a tiny
    GPT-2 teacher for it saved with its tokenizer."""
    root = tmp_path_factory.mktemp("teacher_side")
    rows = read_jsonl(tiny_assets["data"] / "train.jsonl")
    texts = [r["instruction"] + "\n" + r["input"] + "\n" + r["output"] for r in rows]
    tokenizer = train_bpe_tokenizer(texts[::-1] * 3, vocab_size=380, save_dir=root / "tokenizer")
    model_dir = root / "teacher"
    build_tiny_model("gpt2", len(tokenizer), seed=3, n_layer=2, hidden=48).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return {"tokenizer": root / "tokenizer", "teacher": model_dir}


def fit_across(assets, teacher_side, run_dir, method: str, *extra: str):
    overrides = cli_overrides(assets, "gpt2", run_dir)
    overrides.append(f'--model.init_args.teacher={{"name_or_path": "{teacher_side["teacher"]}", "dtype": "float32"}}')
    return run_cli(["fit", "--config", str(CONFIGS / "tiny" / f"{method}.yaml"), *overrides,
                    f"--data.teacher_tokenizer={teacher_side['tokenizer']}", *extra])


def module_across(assets, teacher_side, **kwargs) -> DistillLightningModule:
    """The tiny student and the teacher with its own tokenizer, unconfigured; ``kwargs`` the module's other args."""
    return DistillLightningModule(
        student=ModelSource(name_or_path=str(assets["models"]["gpt2"]["student"])),
        teacher=ModelSource(name_or_path=str(teacher_side["teacher"])),
        tokenizer=str(assets["tokenizer"]), teacher_tokenizer=str(teacher_side["tokenizer"]), **kwargs)


def student_weights(assets) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(assets["models"]["gpt2"]["student"]).state_dict()


@pytest.mark.parametrize(("cross_tokenizer", "divergence"), [("exact_match", "generalized_jsd"), ("uld", "forward_kl")])
def test_kd_on_ground_truth_across_tokenizers_trains(tiny_assets, teacher_side, tmp_path, cross_tokenizer, divergence):
    """The student's 300 tokens are all among the teacher's 380: exact match with a divergence that stays
    finite when the student's rest entry is empty (forward KL is refused, see below)."""
    cli = fit_across(tiny_assets, teacher_side, tmp_path / "run", "kd",
                     f"--model.init_args.distill.cross_tokenizer={cross_tokenizer}",
                     f"--model.init_args.distill.name={divergence}")
    module = cli.model
    assert module.across_tokenizers and module.teacher_vocab_size == len(load_tokenizer(str(teacher_side["tokenizer"])))
    assert module.teacher.get_output_embeddings().weight.shape[0] == module.teacher_vocab_size
    assert cli.trainer.global_step == 2
    logged = cli.trainer.logged_metrics
    assert torch.isfinite(logged["train/loss"]) and float(logged["train/distill"]) > 0
    before = student_weights(tiny_assets)
    after = module.student.state_dict()
    assert any(not torch.equal(before[name], after[name].cpu()) for name in before if name in after)


def test_kd_on_student_rollouts_across_tokenizers_trains(tiny_assets, teacher_side, tmp_path):
    cli = fit_across(tiny_assets, teacher_side, tmp_path / "run", "kd", "--model.init_args.regime.name=on_policy",
                     "--model.init_args.distill.name=generalized_jsd")
    logged = cli.trainer.logged_metrics
    assert cli.trainer.global_step == 2 and float(logged["source/fresh"]) == 1.0
    assert torch.isfinite(logged["train/loss"]) and float(logged["train/distill"]) > 0


def test_the_cross_tokenizer_path_with_one_tokenizer_gives_the_same_tokenizer_kd_loss(tiny_assets):
    """The paired batch, the teacher over its own ids and the exact-match loss over groups, with the same
    tokenizer on both sides, against the same-tokenizer KD step on the same batch."""
    tokenizer = str(tiny_assets["tokenizer"])
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["student"])),
        teacher=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["teacher"])),
        tokenizer=tokenizer, teacher_tokenizer=tokenizer, max_length=80, sft_weight=0.0,
        distill=DistillLoss(name="forward_kl", temperature=2.0),
    )
    module.configure_model()
    assert not module.across_tokenizers  # one vocabulary: the same-tokenizer path
    module.eval()
    data = InstructionDataModule(tokenizer=tokenizer, train_data=str(tiny_assets["data"] / "train.jsonl"),
                                 val_data=str(tiny_assets["data"] / "validation.jsonl"), template="plain",
                                 max_length=80, max_prompt_length=56, batch_size=4)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    from mgsr_lightning.data.paired_tokens import PairedCollator, encode_paired_records

    records = [data.datasets["train"].records[int(i)] for i in batch["example_index"]]
    paired, _ = encode_paired_records(records, data.tokenizer, data.tokenizer, template="plain")
    paired_batch = PairedCollator(data.tokenizer.pad_token_id, data.tokenizer.pad_token_id)(paired)
    torch.testing.assert_close(paired_batch["response_ids"], batch["response_ids"])
    assert bool(paired_batch["one_to_one"][paired_batch["group_mask"]].all())

    ground_truth = Rollout.from_batch(batch)
    with torch.no_grad():
        student_logits = module.logits(module.student, ground_truth)
        same, _ = module.objective(ground_truth, student_logits, module.teacher_logits(ground_truth))
        # the same module read across tokenizers: the shared vocabulary of the one tokenizer with itself
        module.teacher_tokenizer = module.tokenizer
        module.shared_vocabulary = shared_vocabulary(module.tokenizer, module.tokenizer)
        module.objective.shared_ids = (module.shared_vocabulary.student_ids, module.shared_vocabulary.teacher_ids)
        module.teacher_vocab_size = module.vocab_size
        step = module.regime.training_sequences(paired_batch, ground_truth, None, 0.0)
        teacher_logits, groups = module.teacher_logits_across(paired_batch, step)
        across, _ = module.objective(ground_truth, student_logits, teacher_logits, groups=groups)
    assert float(same) > 0
    torch.testing.assert_close(across, same, rtol=1e-5, atol=1e-6)


def test_a_teacher_with_another_vocabulary_and_no_teacher_tokenizer_says_how_to_distil_across(
        tiny_assets, teacher_side):
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["student"])),
        teacher=ModelSource(name_or_path=str(teacher_side["teacher"])),
        tokenizer=str(tiny_assets["tokenizer"]), distill=DistillLoss(),
    )
    with pytest.raises(VocabularyMismatchError, match="teacher_tokenizer"):
        module.configure_model()


def test_what_does_not_work_across_tokenizers_yet_is_refused_in_one_line(tiny_assets, teacher_side):
    from mgsr_lightning.losses.objective import SpanLoss

    module = module_across(tiny_assets, teacher_side, distill=DistillLoss(), span=SpanLoss(weight=1.0),
                           regime=RegimeConfig(name="on_policy"))
    with pytest.raises(ConfigError, match=r"does not support span \(weight > 0\) yet"):
        module.configure_model()


def test_forward_kl_to_an_empty_rest_entry_is_refused_in_one_line(tiny_assets, teacher_side):
    module = module_across(tiny_assets, teacher_side, distill=DistillLoss(name="forward_kl"))
    with pytest.raises(ConfigError, match="every student token is in the other vocabulary"):
        module.configure_model()


@pytest.mark.parametrize("sft_weight", [0.0, 1.0])
def test_uld_without_the_cross_entropy_term_warns(tiny_assets, teacher_side, sft_weight, recwarn):
    module = module_across(tiny_assets, teacher_side, distill=DistillLoss(cross_tokenizer="uld"), sft_weight=sft_weight)
    module.configure_model()
    warned = [str(w.message) for w in recwarn if "ULD compares" in str(w.message)]
    assert len(warned) == (1 if sft_weight == 0 else 0)
    assert not warned or "set model.init_args.sft_weight" in warned[0]


def test_mgsr_with_scrg_through_text_trains_on_student_rollouts(tiny_assets, teacher_side, tmp_path):
    """SCRG across tokenizers: with the teacher finding an error in nearly every row of an untrained student's
    samples (first_unlikely below 0.5), rows are corrected through text and re-generated, and two steps train."""
    cli = fit_across(tiny_assets, teacher_side, tmp_path / "run", "kd", "--model.init_args.regime.name=on_policy",
                     "--model.init_args.distill.name=generalized_jsd",
                     '--model.init_args.scrg={"n_corrections": 2, "criterion": "first_unlikely", '
                     '"unlikely_below": 0.5}')
    logged = cli.trainer.logged_metrics
    assert cli.trainer.global_step == 2 and float(logged["source/fresh"]) == 1.0
    assert float(logged["scrg/corrected_fraction"]) > 0 and float(logged["scrg/regenerated_tokens"]) >= 0
    assert torch.isfinite(logged["train/loss"]) and float(logged["train/distill"]) > 0


def test_scrg_s_max_difference_is_refused_across_tokenizers(tiny_assets, teacher_side):
    from mgsr_lightning.scrg.revise import ScrgConfig

    module = module_across(tiny_assets, teacher_side, distill=DistillLoss(name="generalized_jsd"),
                           regime=RegimeConfig(name="on_policy"), scrg=ScrgConfig(criterion="max_difference"))
    with pytest.raises(ConfigError, match="scrg.criterion max_difference"):
        module.configure_model()


def test_replayed_and_re_tokenised_rows_give_the_teacher_the_paired_batch_s_tokens(tiny_assets, teacher_side):
    """The ground truth read as if it were the student's rollout (fresh: the batch's teacher prompts; replayed:
    the student's prompt text re-tokenised) gives the teacher the same tokens and logits as the paired batch's
    own teacher side, and the same loss (the EOS pair's group is numbered apart, after every row's groups)."""
    from mgsr_lightning.batch import TrainingSequences

    module = module_across(tiny_assets, teacher_side, max_length=80, distill=DistillLoss(name="generalized_jsd"),
                           regime=RegimeConfig(name="adaptive_off_policy"))
    module.configure_model()
    data = InstructionDataModule(tokenizer=str(tiny_assets["tokenizer"]),
                                 teacher_tokenizer=str(teacher_side["tokenizer"]),
                                 train_data=str(tiny_assets["data"] / "train.jsonl"),
                                 val_data=str(tiny_assets["data"] / "validation.jsonl"), template="plain",
                                 max_length=80, max_prompt_length=56, batch_size=4)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    ground_truth = Rollout.from_batch(batch)
    student_logits = module.logits(module.student, ground_truth).detach()
    paired_logits, paired_groups = module.teacher_logits_across(batch, TrainingSequences(ground_truth, "ground_truth"))
    paired_loss, _ = module.objective(ground_truth, student_logits, paired_logits, groups=paired_groups)
    for source in ("fresh", "replay"):
        logits, groups = module.teacher_logits_across(batch, TrainingSequences(ground_truth, source))
        assert groups.teacher_ids.equal(paired_groups.teacher_ids)
        assert groups.student_ids.equal(ground_truth.response_ids)
        assert int(groups.group_mask.sum()) == int(paired_groups.group_mask.sum())
        torch.testing.assert_close(logits, paired_logits)
        loss, _ = module.objective(ground_truth, student_logits, logits, groups=groups)
        torch.testing.assert_close(loss, paired_loss)


CROSS_CONFIGS = sorted((CONFIGS / "cross_tokenizer").glob("*.yaml"))


@pytest.mark.parametrize("path", CROSS_CONFIGS, ids=lambda p: p.stem)
def test_each_cross_tokenizer_example_config_gives_the_teacher_its_own_tokenizer(path):
    import contextlib
    import io

    import yaml

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(buffer.getvalue())
    init = config["model"]["init_args"]
    assert config["data"]["teacher_tokenizer"] and init["distill"]["cross_tokenizer"] in ("exact_match", "uld")
    assert init["span"]["weight"] == 0 and (init["scrg"] is None or init["scrg"]["criterion"] != "max_difference")


def test_the_mgsr_example_runs_two_steps_across_tokenizers_on_tiny_models(tiny_assets, teacher_side, tmp_path):
    """configs/cross_tokenizer/smollm2_to_gpt2_mgsr.yaml (DAC-KL by exact match, on-policy, SCRG through
    text) with the tiny pair in place of the hub models, fresh student outputs forced on."""
    overrides = cli_overrides(tiny_assets, "gpt2", tmp_path / "run")
    overrides.append(f'--model.init_args.teacher={{"name_or_path": "{teacher_side["teacher"]}", "dtype": "float32"}}')
    cli = run_cli(["fit", "--config", str(CONFIGS / "cross_tokenizer" / "smollm2_to_gpt2_mgsr.yaml"), *overrides,
                   f"--data.teacher_tokenizer={teacher_side['tokenizer']}", "--trainer.strategy=auto",
                   "--model.init_args.regime.init_threshold=1.0"])
    logged = cli.trainer.logged_metrics
    assert cli.model.across_tokenizers and cli.trainer.global_step == 2
    assert torch.isfinite(logged["train/loss"]) and "scrg/corrected_fraction" in logged
