"""The end of fit: the validation curve in one line, and a warning when it collapsed or its samples never ended."""

from __future__ import annotations

import warnings

import torch
from tiny_models import cli_overrides

from mgsr_lightning.cli.lightning_cli import run_cli
from mgsr_lightning.pipeline.paths import CONFIGS
from mgsr_lightning.training.callbacks import (
    GenerationMetrics,
    SamplesNeverEndWarning,
    ValidationCollapseWarning,
    collapse_message,
    curve_summary,
    unended_message,
)


def test_curve_summary_is_one_line_with_the_best_step():
    curve = [(100, 31.2), (200, 35.0), (300, 36.1), (400, 34.0)]
    assert curve_summary(curve) == ("val/rougeL by step: 100: 31.2, 200: 35.0, 300: 36.1, 400: 34.0; "
                                    "best 36.1 at step 300")
    rising = curve_summary([(100, 31.2), (200, 35.0), (300, 36.1), (400, 36.4)])
    assert rising.endswith("best 36.4 at step 400 (still rising at the last validation: more steps may help, "
                           "--trainer.max_steps)")
    long = curve_summary([(step, float(step) / 100) for step in range(100, 2100, 100)])
    assert "\n" not in long and long.startswith("val/rougeL by step: 100: 1.0, 200: 2.0, 300: 3.0, ..., 1300: 13.0, ")


def test_collapse_is_a_last_score_far_below_the_first_or_best():
    message = collapse_message([(100, 20.0), (200, 24.0), (300, 6.0), (400, 0.2)])
    assert message == (
        "validation ROUGE-L fell to 0.2 at step 400, from 20.0 at its first validation (step 100) and 24.0 at its best "
        "(step 200): the student collapsed during training (the export keeps the best checkpoint where one monitors "
        "val/rougeL). To train it soundly, start from a student fine-tuned on the task (on data prepared by `prepare`: "
        "add --config <its folder>/init_student.yaml to fit), lower model.init_args.optimizer.lr, or add a "
        "cross-entropy term (model.init_args.sft_weight > 0)")
    assert collapse_message([(100, 20.0), (200, 12.0)]) is None  # 60% of the best: noise, not a collapse
    assert collapse_message([(100, 2.0), (200, 0.5)]) is None  # never learnt anything to lose
    assert collapse_message([(100, 20.0)]) is None


def test_unended_samples_are_reported_when_most_never_end():
    message = unended_message(0.82, 400, 24)
    assert message.startswith("82% of the validation samples at step 400 did not end within 24 new tokens (no EOS)")
    assert "raise model.init_args.sampling.max_new_tokens" in message and "init_student.yaml" in message
    assert unended_message(0.5, 400, 24) is None


def test_the_curve_survives_a_resume_through_the_callback_state():
    callback = GenerationMetrics(8)
    callback.curve = {2: (12.5, 0.25), 4: (14.0, 0.0)}
    restored = GenerationMetrics(8)
    restored.load_state_dict(callback.state_dict())
    assert restored.curve == callback.curve


def test_fit_ends_with_the_curve_and_says_when_samples_never_end(tiny_assets, tmp_path, capsys):
    """A random tiny student sampling 6 tokens never ends its answers: fit says so, after the curve."""
    args = ["fit", "--config", str(CONFIGS / "tiny" / "sft.yaml"),
            *cli_overrides(tiny_assets, "gpt2", tmp_path / "run", with_teacher=False),
            "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--model.init_args.validation.max_new_tokens=6"]
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        cli = run_cli(args)
    out = capsys.readouterr().out
    summary = [line for line in out.splitlines() if line.startswith("val/rougeL by step: ")]
    assert len(summary) == 1 and summary[0].startswith("val/rougeL by step: 2: ") and ", 4: " in summary[0]
    never_end = [w for w in recorded if w.category is SamplesNeverEndWarning]
    assert len(never_end) == 1
    assert "of the validation samples at step 4 did not end within 6 new tokens" in str(never_end[0].message)
    assert not [w for w in recorded if w.category is ValidationCollapseWarning]
    # the checkpoint carries the curve, so a resumed run's summary covers the whole run
    last = next(callback.last_model_path for callback in cli.trainer.checkpoint_callbacks if callback.last_model_path)
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    curves = [state["curve"] for key, state in checkpoint["callbacks"].items() if key.startswith("GenerationMetrics")]
    assert [step for step, _, _ in curves[0]] == [2, 4]
