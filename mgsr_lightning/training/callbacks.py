"""The module's own callbacks and their config (added by ``DistillLightningModule.configure_callbacks`` from its
init args).

- ``GenerationMetrics``: ROUGE-L and exact match of sampled responses, on the first
  ``validation.rouge_examples`` validation examples and on the whole test split; at the end of fit, the
  validation curve in one line and a warning when it collapsed or its samples never ended;
- ``TeacherResponses``: SeqKD's teacher answers to every training prompt, generated once and cached;
- ``ExportStudent``: the student in Hugging Face format at the end of a fit that trained and validated;
- ``RunHyperparameters``: the effective global batch size and the loss weights, logged once per fit;
- ``SaturationCheck``: a warning when the first step's distillation term already sits at its ceiling.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from mgsr_lightning.batch import Rollout
from mgsr_lightning.evaluation.metrics import ExactMatch, MeanScore, RougeL
from mgsr_lightning.generation.decode import decode_responses, sample
from mgsr_lightning.generation.sampling import token_id_tensor
from mgsr_lightning.losses.saturation import FarFromTeacherWarning, saturation_message
from mgsr_lightning.models.export import TRAINING_SETTINGS, export_student, training_settings
from mgsr_lightning.seeding import example_seeds

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ValidationConfig:
    """What validation measures besides the loss.

    Args:
        rouge_examples: Generate for the first N validation examples and log ``val/rougeL`` and
            ``val/exact_match`` (0 = off). Checkpoints can be selected by ``val/rougeL``.
        seed: Sampling seed of the validation generations (per example: seed and example index).
        max_new_tokens: Cap on generated tokens (default: the sampling config's).
    """

    rouge_examples: int = 64
    seed: int = 10
    max_new_tokens: int | None = None


class ValidationCollapseWarning(UserWarning):
    """Validation ROUGE-L ended far below its best: the student fell apart during training."""


class SamplesNeverEndWarning(UserWarning):
    """Most validation samples reached the generation limit without an EOS."""


#: the last validation below this share of the best one (of at least COLLAPSE_MIN_BEST points) is a collapse
COLLAPSE_SHARE = 0.5
COLLAPSE_MIN_BEST = 5.0
#: more than this share of the last validation's samples without an EOS is reported
UNENDED_SHARE = 0.5
START_ADVICE = ("start from a student fine-tuned on the task (on data prepared by `prepare`: add --config "
                "<its folder>/init_student.yaml to fit)")


def curve_summary(curve: list[tuple[int, float]], name: str = "val/rougeL") -> str:
    """One line: ``val/rougeL by step: 100: 31.2, 200: 35.0, ...; best 36.1 at step 400`` (the middle of a long
    curve elided), and whether it was still rising at its last validation."""
    points = [f"{step}: {value:.1f}" for step, value in curve]
    if len(points) > 12:
        points = points[:3] + ["..."] + points[-8:]
    best_step, best = max(curve, key=lambda point: (point[1], -point[0]))
    line = f"{name} by step: {', '.join(points)}; best {best:.1f} at step {best_step}"
    if len(curve) > 1 and curve[-1][0] == best_step and best > curve[-2][1]:
        line += " (still rising at the last validation: more steps may help, --trainer.max_steps)"
    return line


def collapse_message(curve: list[tuple[int, float]]) -> str | None:
    """What to say when the last validation ROUGE-L fell far below the best (and so the first) one, else None."""
    if len(curve) < 2:
        return None
    (first_step, first), (last_step, last) = curve[0], curve[-1]
    best_step, best = max(curve, key=lambda point: (point[1], -point[0]))
    if best < COLLAPSE_MIN_BEST or last >= COLLAPSE_SHARE * best:
        return None
    return (f"validation ROUGE-L fell to {last:.1f} at step {last_step}, from {first:.1f} at its first validation "
            f"(step {first_step}) and {best:.1f} at its best (step {best_step}): the student collapsed during training "
            f"(the export keeps the best checkpoint where one monitors val/rougeL). To train it soundly, "
            f"{START_ADVICE}, lower model.init_args.optimizer.lr, or add a cross-entropy term "
            f"(model.init_args.sft_weight > 0)")


def unended_message(share: float, step: int, max_new_tokens: int) -> str | None:
    """What to say when most of the last validation's samples never produced an EOS, else None."""
    if share <= UNENDED_SHARE:
        return None
    return (f"{share:.0%} of the validation samples at step {step} did not end within {max_new_tokens} new tokens "
            f"(no EOS), so their ROUGE-L is of cut answers: either the answers are longer than {max_new_tokens} "
            f"tokens (raise model.init_args.sampling.max_new_tokens, within the model's positions minus the prompt), "
            f"or the student has not learnt to stop: train longer, or {START_ADVICE}")


class GenerationMetrics(L.Callback):
    """Sample a response per example (seed ``validation.seed``) and log ``<stage>/rougeL`` and
    ``<stage>/exact_match`` against the references.

    Validation scores the first ``rouge_examples`` examples (the first batches of every rank,
    decided alike on all ranks, since generation is in lockstep) and skips the sanity check; test
    scores every example.

    Each validation's ROUGE-L and share of samples without an EOS are kept (and checkpointed); at the
    end of fit the curve is printed in one line (:func:`curve_summary`), with a
    ``ValidationCollapseWarning`` when the last score fell far below the best one and a
    ``SamplesNeverEndWarning`` when most of the last validation's samples never ended.
    """

    def __init__(self, rouge_examples: int):
        self.rouge_examples = rouge_examples
        self.metrics = {stage: (RougeL(), ExactMatch()) for stage in ("val", "test")}
        self.unended = MeanScore()
        self.curve: dict[int, tuple[float, float]] = {}  # global step -> (val/rougeL, share of samples without EOS)

    def _score(self, stage: str, pl_module, batch: dict[str, Any]) -> None:
        rouge_l, exact = self.metrics[stage]
        rollout = pl_module.sample_responses(batch)
        predictions = decode_responses(pl_module.tokenizer, rollout)
        rouge_l.to(pl_module.device).update(predictions, batch["references"])
        exact.to(pl_module.device).update(predictions, batch["references"])
        if stage == "val":
            eos = token_id_tensor(pl_module.decoding.eos_token_id, rollout.response_ids.device)
            ended = (torch.isin(rollout.response_ids, eos) & rollout.response_mask).any(-1)
            self.unended.to(pl_module.device).update((~ended).double())

    def _log(self, stage: str, pl_module) -> None:
        rouge_l, exact = self.metrics[stage]
        if rouge_l.update_count:
            rouge = rouge_l.compute()
            pl_module.log(f"{stage}/rougeL", rouge, prog_bar=stage == "val")
            pl_module.log(f"{stage}/exact_match", exact.compute())
            if stage == "val":
                self.curve[int(pl_module.global_step)] = (float(rouge), float(self.unended.compute()))
        rouge_l.reset()
        exact.reset()
        if stage == "val":
            self.unended.reset()

    def state_dict(self) -> dict[str, Any]:
        return {"curve": [[step, rouge, unended] for step, (rouge, unended) in sorted(self.curve.items())]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.curve = {int(step): (float(rouge), float(unended)) for step, rouge, unended in state_dict.get("curve", [])}

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.ckpt_path is None:
            self.curve = {}  # a new run (a resumed one gets its curve back from the checkpoint)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        if not self.curve:
            if self.rouge_examples > 0:
                print(f"val/rougeL by step: none, this fit never validated ({never_validated_reason(trainer)})",
                      flush=True)
            return
        curve = sorted(self.curve.items())
        print(curve_summary([(step, rouge) for step, (rouge, _) in curve]), flush=True)
        message = collapse_message([(step, rouge) for step, (rouge, _) in curve])
        if message is not None:
            rank_zero_warn(message, category=ValidationCollapseWarning)
        last_step, (_, unended) = curve[-1]
        decoding = pl_module.decoding.with_max_new_tokens(pl_module.validation_config.max_new_tokens)
        budget = decoding.sampling.max_new_tokens
        message = unended_message(unended, last_step, budget)
        if message is not None:
            rank_zero_warn(message, category=SamplesNeverEndWarning)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        examples_before = batch_idx * len(batch["references"]) * trainer.world_size
        if not trainer.sanity_checking and examples_before < self.rouge_examples:
            self._score("val", pl_module, batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._log("val", pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._score("test", pl_module, batch)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._log("test", pl_module)


class TeacherResponses(L.Callback):
    """SeqKD: before fit, the teacher answers every training prompt once (each rank a share), cached
    by the ``teacher_generated`` regime (``regime.cache_path``, default ``teacher_responses.pt`` in
    the run's folder). Example ``i`` is sampled with ``example_seeds(seed, i)``."""

    def on_fit_start(self, trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        regime, decoding = pl_module.regime, pl_module.decoding

        def generate(examples) -> list[list[int]]:
            prompts = Rollout.from_token_lists(
                [e.prompt_ids for e in examples], [[] for _ in examples], pad_token_id=decoding.pad_token_id,
                device=pl_module.device,
            )
            seeds = example_seeds(pl_module.seed, torch.tensor([e.index for e in examples], dtype=torch.long))
            answers = sample(pl_module.teacher, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds)
            return answers.to_token_lists()[1]

        path = regime.config.cache_path or f"{trainer.default_root_dir}/teacher_responses.pt"
        identity = {"teacher": pl_module.teacher_source.describe(), "sampling": dataclasses.asdict(decoding.sampling),
                    "max_length": decoding.max_length, "seed": pl_module.seed}
        regime.ensure_cache(
            path, datamodule.train_examples(), generate, datamodule.generation_batch_size, identity,
            rank=trainer.global_rank, world_size=trainer.world_size,
        )


class ExportSkippedWarning(UserWarning):
    """``fit`` exported nothing (a ``fast_dev_run``, no training step, or never validated); the folder is unchanged."""


class ExportReplacesBetterWarning(UserWarning):
    """``fit`` replaced an export whose recorded validation ROUGE-L was higher than its own student's."""


def never_validated_reason(trainer) -> str:
    """Why a fit ran no validation, in the options that decide it."""
    if not trainer.limit_val_batches:
        return f"trainer.limit_val_batches={trainer.limit_val_batches}"
    interval = trainer.val_check_interval
    if isinstance(interval, int) and interval > trainer.global_step:
        return (f"it validates every {interval} steps (trainer.val_check_interval) and stopped at step "
                f"{trainer.global_step}")
    return "no validation loop ran"


def _curve(trainer) -> dict[int, float]:
    """Validation ROUGE-L by global step, as :class:`GenerationMetrics` kept it (resumed parts included)."""
    metrics = next((callback for callback in trainer.callbacks if isinstance(callback, GenerationMetrics)), None)
    return {} if metrics is None else {step: rouge for step, (rouge, _) in metrics.curve.items()}


def _recorded_validation(folder: Path) -> dict[str, Any]:
    """The validation score recorded with an earlier export (``mgsr_training.json``), or {}."""
    try:
        recorded = json.loads((folder / TRAINING_SETTINGS).read_text()).get("validation") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


class ExportStudent(L.Callback):
    """At the end of fit, save the student to ``folder`` in Hugging Face format: with ``weights="best"``, the best
    checkpoint's weights when a ``ModelCheckpoint`` monitors a metric, else the final ones; with ``"last"``, the
    final ones.

    Only a run that trained and validated exports: a ``fast_dev_run``, a fit that took no step, or (unless
    ``weights="last"``) one that never validated leaves the folder as it was, with an ``ExportSkippedWarning``
    saying why. The exported student's validation ROUGE-L is recorded in its ``mgsr_training.json``; replacing an
    export that recorded a higher one says so (``ExportReplacesBetterWarning``).
    """

    def __init__(self, folder: str, weights: str = "best"):
        self.folder = folder
        self.weights = weights
        self.validated = False

    def on_fit_start(self, trainer, pl_module) -> None:
        self.validated = False

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validated = True

    def _skip_reason(self, trainer, best: str) -> str | None:
        if trainer.fast_dev_run:
            return f"fast_dev_run={trainer.fast_dev_run} is a trial of the code, not a training run"
        if trainer.global_step == 0:
            return "the fit took no training step"
        if self.weights == "best" and not best and not self.validated:
            return (f"the fit never validated ({never_validated_reason(trainer)}), so nothing shows its student is "
                    "sound; to export its final weights anyway, add --model.init_args.export_weights=last")
        return None

    def on_fit_end(self, trainer, pl_module) -> None:
        checkpoint = trainer.checkpoint_callback
        best = ""
        if self.weights == "best" and checkpoint is not None and checkpoint.monitor:
            best = getattr(checkpoint, "best_model_path", "") or ""
        reason = self._skip_reason(trainer, best)
        if reason is not None:
            folder = Path(self.folder)
            kept = "keeps its earlier student" if (folder / "config.json").is_file() else "was not written"
            rank_zero_warn(f"nothing exported: {folder} {kept}, as {reason}", category=ExportSkippedWarning)
            return
        if best:
            log.info("exporting the best checkpoint %s", best)
            saved = torch.load(best, map_location="cpu", weights_only=False)
            state, step = saved["state_dict"], int(saved.get("global_step", trainer.global_step))
        else:
            state = trainer.strategy.lightning_module_state_dict()  # a collective under FSDP: all ranks
            step = int(trainer.global_step)
        if trainer.is_global_zero:
            score = _curve(trainer).get(step)
            self._say_if_replacing_better(score, step)
            student_state = {k[len("student."):]: v for k, v in state.items() if k.startswith("student.")}
            datamodule = trainer.datamodule
            settings = training_settings(dict(datamodule.hparams) if datamodule is not None else None,
                                         pl_module.sampling.max_new_tokens)
            if settings is not None:
                settings["validation"] = {"step": step, "val/rougeL": score}
            export_student(pl_module.student, pl_module.tokenizer, self.folder, pl_module.eos_token_id, student_state,
                           settings)
        trainer.strategy.barrier("export")

    def _say_if_replacing_better(self, score: float | None, step: int) -> None:
        earlier = _recorded_validation(Path(self.folder))
        earlier_score = earlier.get("val/rougeL")
        if not isinstance(earlier_score, (int, float)) or (score is not None and earlier_score <= score):
            return
        scored = f"which scored {score:.1f}" if score is not None else "which was not validated"
        rank_zero_warn(f"{self.folder} held a student with validation ROUGE-L {earlier_score:.1f} (step "
                       f"{earlier.get('step')} of its run); it is replaced by this run's, {scored} (step {step}). "
                       "To keep both, give each run its own --model.init_args.export_dir",
                       category=ExportReplacesBetterWarning)


class RunHyperparameters(L.Callback):
    """Log the effective global batch size (batch × accumulation × ranks) and each loss weight once."""

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        if trainer.logger is None or datamodule is None:
            return
        global_batch = datamodule.hparams.batch_size * trainer.accumulate_grad_batches * trainer.world_size
        weights = {f"weight/{name}": value for name, value in pl_module.objective.weights.items()}
        trainer.logger.log_hyperparams({"effective_global_batch_size": global_batch, **weights})


class SaturationCheck(L.Callback):
    """After the run's first training step (step 0), warn with ``FarFromTeacherWarning`` when its logged
    ``train/distill`` is a bounded divergence already near its ceiling, where its gradient nearly vanishes
    (:func:`mgsr_lightning.losses.saturation.saturation_message` says how far and what to do)."""

    def __init__(self) -> None:
        self._first_step = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._first_step = trainer.global_step == 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._first_step or "train/distill" not in trainer.callback_metrics:
            return
        distill = pl_module.distill
        message = saturation_message(distill.name, distill.params, float(trainer.callback_metrics["train/distill"]))
        if message is not None:
            rank_zero_warn(message, category=FarFromTeacherWarning)
