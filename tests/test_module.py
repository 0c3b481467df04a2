"""DistillLightningModule: vocabulary checks, frozen teacher, losses wired per method, export, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model, cli_overrides, last_checkpoint

from mgsr_lightning.batch import Rollout
from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.losses.objective import DistillLoss, SpanLoss, response_cross_entropy
from mgsr_lightning.models.loading import ModelSource, VocabularyMismatchError, check_vocabularies
from mgsr_lightning.module import DistillLightningModule
from mgsr_lightning.scrg.revise import ScrgConfig
from mgsr_lightning.training.regimes import RegimeConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def fit(method: str, assets, run_dir, *extra: str, family: str = "gpt2"):
    overrides = cli_overrides(assets, family, run_dir, with_teacher=method != "sft")
    return run_cli(["fit", "--config", str(CONFIGS / "tiny" / f"{method}.yaml"), *overrides, *extra])


def test_vocabulary_check_rejects_a_model_smaller_than_the_tokenizer():
    small = build_tiny_model("gpt2", 200)
    with pytest.raises(VocabularyMismatchError, match=r"student has 200 output rows but the tokenizer has 300 tokens"):
        check_vocabularies(300, {"student": small})


def test_vocabulary_check_accepts_padded_rows_and_returns_the_tokenizer_size():
    padded = build_tiny_model("opt", 320)
    assert check_vocabularies(300, {"teacher": padded, "student": build_tiny_model("gpt2", 300)}) == 300


def test_vocabulary_check_compares_tokenizers(tiny_tokenizer, tiny_assets):
    from mgsr_lightning.models.tokenizer import load_tokenizer

    other = load_tokenizer(str(tiny_assets["tokenizer"]))
    model = build_tiny_model("gpt2", 400)
    with pytest.raises(VocabularyMismatchError, match="tokenizers differ"):
        check_vocabularies(len(tiny_tokenizer), {"student": model}, {"teacher": tiny_tokenizer, "student": other})


def test_module_fails_clearly_on_an_incompatible_student(tiny_assets, tmp_path):
    student_dir = tmp_path / "small"
    build_tiny_model("gpt2", 100).save_pretrained(student_dir)
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(student_dir)), tokenizer=str(tiny_assets["tokenizer"])
    )
    with pytest.raises(VocabularyMismatchError, match="resize_token_embeddings"):
        module.configure_model()


def test_module_compares_each_model_s_own_tokenizer_with_the_data_s(tiny_assets, tiny_tokenizer, tmp_path):
    """A student saved with another tokenizer is refused even when its embedding matrix is big enough."""
    student_dir = tmp_path / "other_family"
    build_tiny_model("gpt2", len(tiny_tokenizer)).save_pretrained(student_dir)
    tiny_tokenizer.save_pretrained(student_dir)
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(student_dir)), tokenizer=str(tiny_assets["tokenizer"])
    )
    with pytest.raises(VocabularyMismatchError, match="the data and student tokenizers differ"):
        module.configure_model()


def test_padded_student_vocabulary_trains_and_never_samples_padding(tiny_assets, tmp_path):
    from mgsr_lightning.models.tokenizer import load_tokenizer

    vocab = len(load_tokenizer(str(tiny_assets["tokenizer"])))
    padded_dir = tmp_path / "padded"
    build_tiny_model("opt", vocab + 13, seed=3).save_pretrained(padded_dir)
    cli = fit(
        "imitkd", tiny_assets, tmp_path / "run", "--model.init_args.student.name_or_path=" + str(padded_dir),
        family="opt",
    )
    module = cli.model
    assert module.vocab_size == vocab
    batch = next(iter(cli.datamodule.train_dataloader()))
    rollout = module.student_outputs(Rollout.from_batch(batch)).sequences
    assert int(rollout.response_ids[rollout.response_mask].max()) < vocab


def test_teacher_is_frozen_in_eval_mode_and_left_out_of_checkpoints(tiny_assets, tmp_path):
    cli = fit("kd", tiny_assets, tmp_path / "run")
    module = cli.model
    module.train()
    assert not module.teacher.training and module.student.training
    assert not any(p.requires_grad for p in module.teacher.parameters())
    checkpoint = torch.load(last_checkpoint(cli.trainer), weights_only=False)
    assert not any(key.startswith("teacher.") for key in checkpoint["state_dict"])
    assert any(key.startswith("student.") for key in checkpoint["state_dict"])
    optimized = {id(p) for group in cli.trainer.optimizers[0].param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in module.teacher.parameters()}


def test_clip_net_trains_in_its_own_parameter_group(tiny_assets, tmp_path):
    from mgsr_lightning.losses import ClipNet

    torch.manual_seed(0)
    initial = {k: v.clone() for k, v in ClipNet().state_dict().items()}
    cli = fit("mgsr_scrg_dac", tiny_assets, tmp_path / "run", "--model.init_args.distill.clip_net_lr=0.05")
    module = cli.model
    groups = cli.trainer.optimizers[0].param_groups
    clip_group = [g for g in groups if any(p is q for p in g["params"] for q in module.clip_net.parameters())]
    assert len(clip_group) == 1 and clip_group[0]["initial_lr"] == 0.05
    changed = [not torch.equal(initial[k], v) for k, v in module.clip_net.state_dict().items()]
    assert any(changed), "ClipNet's weights did not move: it is not being optimised"
    logged = cli.trainer.logged_metrics
    assert {"dac_kl/lower", "dac_kl/upper", "dac_kl/kept_mass"} <= set(logged)


def test_sft_term_uses_ground_truth_while_distilling_on_student_outputs(tiny_assets, tmp_path):
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["student"])),
        teacher=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["teacher"])),
        tokenizer=str(tiny_assets["tokenizer"]), max_length=80,
        distill=DistillLoss(name="reverse_kl"), span=SpanLoss(weight=1.0),
        regime=RegimeConfig(name="on_policy"), scrg=ScrgConfig(),
    )
    module.configure_model()
    module.eval()  # no dropout, so the two computations of the SFT term can be compared
    from mgsr_lightning.data.datamodule import InstructionDataModule

    data = InstructionDataModule(
        tokenizer=str(tiny_assets["tokenizer"]), train_data=str(tiny_assets["data"] / "train.jsonl"),
        val_data=str(tiny_assets["data"] / "validation.jsonl"), template="plain", max_length=80, max_prompt_length=56,
        batch_size=4,
    )
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    ground_truth = Rollout.from_batch(batch)
    with torch.no_grad():
        step = module.student_outputs(ground_truth)
        fresh = step.sequences
        teacher_logits = module.teacher_logits(fresh)
        torch.testing.assert_close(step.teacher_logits, teacher_logits)  # SCRG's: over exactly the revised sequences
        teacher_nll = float(response_cross_entropy(teacher_logits, fresh))
        assert step.metrics["scrg/teacher_nll_after"] == pytest.approx(teacher_nll, rel=1e-5)
        terms, _ = module.objective.terms(
            fresh, module.logits(module.student, fresh), teacher_logits, ground_truth,
            module.logits(module.student, ground_truth),
        )
        expected_sft = response_cross_entropy(module.logits(module.student, ground_truth), ground_truth)
        on_fresh = response_cross_entropy(module.logits(module.student, fresh), fresh)
    assert set(terms) == {"sft", "distill", "span"}
    torch.testing.assert_close(terms["sft"], expected_sft)
    assert not torch.allclose(terms["sft"], on_fresh)


def test_export_round_trip_gives_the_same_logits_and_a_working_pipeline(tiny_assets, tmp_path):
    from transformers import AutoModelForCausalLM, pipeline

    cli = fit("sft", tiny_assets, tmp_path / "run", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false")
    student = cli.model.student.eval()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()
    ids = torch.randint(0, cli.model.vocab_size, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, student(ids).logits)
    generator = pipeline("text-generation", model=str(tmp_path / "run" / "hf"), device="cpu")
    output = generator("Add 3 and 4.\n", max_new_tokens=5, do_sample=False)
    assert output[0]["generated_text"].startswith("Add 3 and 4.\n")


def test_export_command_from_checkpoint(tiny_assets, tmp_path):
    from transformers import AutoModelForCausalLM

    from mgsr_lightning.pipeline.commands import export

    cli = fit("kd", tiny_assets, tmp_path / "run")
    export(last_checkpoint(cli.trainer), str(tmp_path / "exported"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    ids = torch.randint(0, cli.model.vocab_size, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, cli.model.student.eval()(ids).logits)


def test_resume_matches_an_uninterrupted_run(tiny_assets, tmp_path):
    """4 steps straight == 2 steps, stop, resume for 2 more: weights, replay buffer and threshold."""
    common = ["--trainer.max_steps=4", "--trainer.val_check_interval=2", "--model.init_args.regime.init_threshold=0.6",
              "--trainer.limit_val_batches=1"]
    straight = fit("mgsr_scrg_adaptive", tiny_assets, tmp_path / "straight", *common)  # the regime with a buffer
    first = fit("mgsr_scrg_adaptive", tiny_assets, tmp_path / "resumed", *common[1:], "--trainer.max_steps=2")
    ckpt = last_checkpoint(first.trainer)
    resumed = fit("mgsr_scrg_adaptive", tiny_assets, tmp_path / "resumed2", *common, f"--ckpt_path={ckpt}")
    assert resumed.trainer.global_step == 4
    final = [dict(cli.model.state_dict()) for cli in (straight, resumed)]
    for name, value in final[0].items():
        torch.testing.assert_close(value, final[1][name], rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    assert any(name.startswith("clip_net.") for name in final[0])
    assert list(straight.model.regime.buffer) == list(resumed.model.regime.buffer)
    assert len(straight.model.regime.buffer) > 0, "the scheduler never generated: the test would not cover replay"
    assert straight.model.regime.state_dict()["threshold"] == resumed.model.regime.state_dict()["threshold"]


def test_test_and_predict_commands_score_the_whole_test_split_alike(tiny_assets, tmp_path):
    """`test` logs loss, ROUGE-L and EM over every test row; `predict` returns the same generations."""
    from mgsr_lightning.evaluation.rouge import exact_match, rouge_l

    trained = fit("sft", tiny_assets, tmp_path / "run")
    ckpt = last_checkpoint(trained.trainer)
    overrides = cli_overrides(tiny_assets, "gpt2", tmp_path / "eval", with_teacher=False)
    config = str(CONFIGS / "tiny" / "sft.yaml")
    tested = run_cli(["test", "--config", config, *overrides, f"--ckpt_path={ckpt}"])
    metrics = tested.trainer.callback_metrics
    assert {"test/loss", "test/rougeL", "test/exact_match"} <= set(metrics)
    run_cli(["predict", "--config", config, *overrides, f"--ckpt_path={ckpt}"])  # the command runs

    batches = tested.trainer.predict(tested.model, datamodule=tested.datamodule)
    rows = [row for batch in batches for row in batch]
    indices = [row["example_index"] for row in rows]
    assert len(set(indices)) == len(indices) == len(tested.datamodule.datasets["test"])
    expected_rouge = sum(rouge_l(r["prediction"], r["references"]) for r in rows) / len(rows)
    expected_em = sum(exact_match(r["prediction"], r["references"]) for r in rows) / len(rows)
    assert float(metrics["test/rougeL"]) == pytest.approx(expected_rouge, rel=1e-5)
    assert float(metrics["test/exact_match"]) == pytest.approx(expected_em, rel=1e-5)
    assert 0.0 < float(metrics["test/loss"]) < 20.0


def test_a_run_that_never_trained_on_student_outputs_says_so(tiny_assets, tmp_path):
    """Threshold 0: the adaptive scheduler never samples, so SCRG never runs; the end of fit says so
    with the threshold used. Threshold 1: every step samples and nothing is said."""
    from mgsr_lightning.training.regimes import NoStudentOutputsWarning

    with pytest.warns(NoStudentOutputsWarning, match=r"in 2 steps \(regime adaptive_off_policy, threshold 0 at the "
                      r"start and 0 at the end\); SCRG never ran") as caught:
        cli = fit("mgsr_scrg_adaptive", tiny_assets, tmp_path / "never", "--model.init_args.regime.init_threshold=0.0")
    assert cli.model.regime.source_counts["fresh"] == 0 and cli.model.regime.source_counts["ground_truth"] == 2
    assert len([w for w in caught if w.category is NoStudentOutputsWarning]) == 1
    import warnings

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        sampled = fit("mgsr_scrg_adaptive", tiny_assets, tmp_path / "always",
                      "--model.init_args.regime.init_threshold=1.0")
    assert sampled.model.regime.source_counts["fresh"] == 2
    assert not [w for w in recorded if issubclass(w.category, NoStudentOutputsWarning)]


def test_kd_on_ground_truth_never_warns_about_student_outputs(tiny_assets, tmp_path):
    import warnings

    from mgsr_lightning.training.regimes import NoStudentOutputsWarning

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        fit("kd", tiny_assets, tmp_path / "kd")
    assert not [w for w in recorded if issubclass(w.category, NoStudentOutputsWarning)]


def test_distillm_from_a_student_far_from_the_teacher_says_so_on_its_first_step(tiny_assets, tmp_path):
    """A teacher sure of its tokens and a random student: DistiLLM's skew KL starts at its ceiling
    log(1/alpha), where its gradient nearly vanishes; the first step says so and how to fix it. The
    same random pair with the near-uniform tiny teacher is far below the ceiling: nothing is said."""
    import warnings

    from transformers import AutoModelForCausalLM

    from mgsr_lightning.losses.saturation import FarFromTeacherWarning

    teacher = AutoModelForCausalLM.from_pretrained(tiny_assets["models"]["gpt2"]["teacher"])
    with torch.no_grad():
        teacher.lm_head.weight.mul_(200.0)  # tied to the embeddings: every output distribution turns peaked
    teacher.save_pretrained(tmp_path / "sure_teacher")
    sure = f'--model.init_args.teacher={{"name_or_path": "{tmp_path / "sure_teacher"}", "dtype": "float32"}}'
    with pytest.warns(FarFromTeacherWarning, match=r"skew forward KL is 2\.\d\d nats per token at step 0, 9\d% of "
                      r"its bound log\(1/alpha\) = 2\.30.*an SFT student") as caught:
        fit("distillm", tiny_assets, tmp_path / "far", sure)
    assert len([w for w in caught if w.category is FarFromTeacherWarning]) == 1  # the first step only

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        fit("distillm", tiny_assets, tmp_path / "near")
    assert not [w for w in recorded if issubclass(w.category, FarFromTeacherWarning)]


def test_abkd_from_a_student_far_from_the_teacher_says_so_on_its_first_step(tiny_assets, tmp_path):
    """ABKD's alpha-beta divergence (alpha 0.2, beta 0.7) with a sure teacher and a random student starts at or
    above 1/(alpha*beta), where its gradient on the teacher's tokens scales with q^beta; the first step says so.
    With the near-uniform tiny teacher it is far below: nothing is said."""
    import warnings

    from transformers import AutoModelForCausalLM

    from mgsr_lightning.losses.saturation import FarFromTeacherWarning

    teacher = AutoModelForCausalLM.from_pretrained(tiny_assets["models"]["gpt2"]["teacher"])
    with torch.no_grad():
        teacher.lm_head.weight.mul_(200.0)
    teacher.save_pretrained(tmp_path / "sure_teacher")
    sure = f'--model.init_args.teacher={{"name_or_path": "{tmp_path / "sure_teacher"}", "dtype": "float32"}}'
    with pytest.warns(FarFromTeacherWarning, match=r"the alpha-beta divergence \(ABKD\) is \d+\.\d\d nats per token at "
                      r"step 0, \d+% of its value for a student far from the teacher, 1/\(alpha\*beta\) = 7\.14.*"
                      r"q\^beta/alpha.*init_student\.yaml") as caught:
        fit("abkd", tiny_assets, tmp_path / "far", sure)
    assert len([w for w in caught if w.category is FarFromTeacherWarning]) == 1

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        fit("abkd", tiny_assets, tmp_path / "near")
    assert not [w for w in recorded if issubclass(w.category, FarFromTeacherWarning)]
