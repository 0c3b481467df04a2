"""``DistillLightningModule``: one LightningModule for SFT, the KD baselines and MGSR.

A training step wires named pieces together and holds no loss math or generation loop itself:

1. the **regime** (:mod:`mgsr_lightning.regimes`) picks the step's training sequences: the
   ground-truth batch, fresh student outputs, a replay of earlier ones, or cached teacher outputs;
2. fresh student outputs are sampled (:func:`mgsr_lightning.generation.sample`) and, when SCRG is
   on, revised by the teacher (:func:`mgsr_lightning.scrg.revise`);
3. the losses (:mod:`mgsr_lightning.losses`) are summed with their weights and each is logged:
   ``sft`` (cross-entropy on the ground-truth response by default: never on the student's own
   text), ``distill`` (a divergence or DAC-KL on the training sequences) and ``span`` (span-level
   correlation on the training sequences).

Every method of the paper's tables is a choice of these pieces (see ``configs/``). For a new model
pair, subclass and override :meth:`load_student` / :meth:`load_teacher` (and :meth:`load_tokenizer`
when needed); nothing else has to change.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from transformers import PreTrainedModel, get_scheduler

from mgsr_lightning.evaluation.evaluate import decode_responses, example_seeds
from mgsr_lightning.evaluation.metrics import ExactMatch, RougeL
from mgsr_lightning.export import export_student
from mgsr_lightning.generation import Rollout, SamplingConfig, response_logits, sample
from mgsr_lightning.losses import DIVERGENCES, ClipNet, dac_kl, span_correlation_loss
from mgsr_lightning.models import ModelSource, check_vocabularies, load_causal_lm
from mgsr_lightning.regimes import RegimeConfig, TeacherGenerated, build_regime
from mgsr_lightning.scrg import ScrgConfig, revise
from mgsr_lightning.spans import TextChunkSpanPrior, TokenSpanPrior, spacy_chunker
from mgsr_lightning.tokenizer import load_tokenizer, token_id, tokenizer_of

log = logging.getLogger(__name__)

# The teacher is in eval mode on purpose (no dropout); Lightning warns about any module in eval mode.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")

DistillLossName = Literal[
    "forward_kl", "reverse_kl", "symmetric_kl", "skew_forward_kl", "skew_reverse_kl",
    "generalized_jsd", "total_variation", "dac_kl",
]


@dataclass
class DistillLoss:
    """The token-level distillation term, computed on the training sequences' response tokens.

    Args:
        name: ``forward_kl``, ``reverse_kl``, ``symmetric_kl``, ``skew_forward_kl``, ``skew_reverse_kl``,
            ``generalized_jsd``, ``total_variation`` or ``dac_kl`` (see :mod:`mgsr_lightning.losses`).
        weight: Weight of the term in the total loss.
        temperature: Both logits are divided by it before the softmax.
        params: Extra keyword arguments of the loss function, e.g. ``{alpha: 0.1}`` for the skew KLs,
            ``{beta: 0.5}`` for ``generalized_jsd``, ``{lam: 0.9}`` for ``symmetric_kl``, or DAC-KL's
            ``{mode: learned, normalize: true, beta: 0.02, rho_min: 0.5, lam_cov: 10.0}``.
        chunk_size: Tokens per chunk, bounding the loss's extra memory to O(chunk × V).
        clip_net: DAC-KL only: keyword arguments of :class:`mgsr_lightning.losses.ClipNet`, the
            learnable sub-network that predicts the clipping bounds.
        clip_net_lr: DAC-KL only: learning rate of ClipNet's own optimizer parameter group.
    """

    name: DistillLossName = "forward_kl"
    weight: float = 1.0
    temperature: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    chunk_size: int | None = None
    clip_net: dict[str, Any] = field(default_factory=dict)
    clip_net_lr: float = 1e-3


@dataclass
class SpanLoss:
    """The span-level correlation term (0 weight = off).

    Args:
        weight: Weight of the term in the total loss.
        prior: ``tokens`` (data-free segmentation on token ids, the default) or ``spacy``
            (a linguistic chunker on decoded text; needs spaCy with an English model installed).
        chunk_size: Adjacent pairs per chunk, bounding the extra memory.
    """

    weight: float = 0.0
    prior: Literal["tokens", "spacy"] = "tokens"
    chunk_size: int | None = None


@dataclass
class OptimizerConfig:
    """AdamW with a warm-up and a decay schedule (DistiLLM: weight decay 1e-2, cosine, no warm-up).

    Args:
        lr: Peak learning rate of the student.
        weight_decay: Decoupled weight decay (not applied to biases and norms).
        betas: Adam betas.
        warmup_steps: Linear warm-up steps.
        schedule: ``cosine``, ``linear`` or ``constant`` (any name of ``transformers.get_scheduler``).
    """

    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "cosine"


@dataclass
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


def response_cross_entropy(logits: Tensor, sequences: Rollout) -> Tensor:
    """Mean cross-entropy over the real response tokens of ``sequences``.

    ``logits`` [B, R, V] are response-aligned (``response_logits``): [:, r] predicts ``response_ids[:, r]``.
    Prompt and padding never count; with no response token at all the result is 0, not NaN.
    """
    per_token = F.cross_entropy(logits.float().flatten(0, 1), sequences.response_ids.flatten(), reduction="none")
    mask = sequences.response_mask.flatten()
    return (per_token * mask).sum() / mask.sum().clamp_min(1)


class DistillLightningModule(L.LightningModule):
    """Distil ``teacher`` into ``student`` with SFT, a KD baseline or MGSR, chosen by configuration.

    Args:
        student: The model trained: a hub id / folder, or a config for a randomly initialised model.
        teacher: The frozen teacher (eval mode, no grad, kept out of checkpoints). None for SFT.
        tokenizer: Tokenizer hub id or folder (linked to the data module's in the CLI).
        eos_token: Token that ends a response (default: the tokenizer's EOS; linked to the data's).
        max_length: Cap on prompt + response tokens of student rollouts (linked to the data's).
        sft_weight: Weight of the cross-entropy term (0 = off).
        sft_on: ``ground_truth`` (the dataset response, default) or ``training_sequence`` (the
            regime's sequences: SeqKD trains on the teacher's responses this way).
        distill: The token-level distillation term; None = no teacher term (SFT).
        span: The span-level correlation term.
        regime: Where the training sequences come from.
        scrg: Sequence correction and re-generation applied to every fresh student output; None = off.
        sampling: Sampling of student rollouts (DistiLLM/MiniLLM: T=1, top_k=0, top_p=1).
        optimizer: Optimizer and schedule.
        validation: Validation generation metrics.
        export_dir: Folder the student is saved to in Hugging Face format at the end of fit (the
            checkpoint with the best monitored metric when a ``ModelCheckpoint`` monitors one).
        seed: Seed of the module's own random draws: config-built models' initialisation (unless
            their source sets one), the regime's choices and the rollouts' sampling. The CLI links
            it to ``seed_everything``, so one training seed varies all of them.
    """

    def __init__(
        self,
        student: ModelSource,
        teacher: ModelSource | None = None,
        tokenizer: str | None = None,
        eos_token: str | None = None,
        max_length: int = 512,
        sft_weight: float = 1.0,
        sft_on: Literal["ground_truth", "training_sequence"] = "ground_truth",
        distill: DistillLoss | None = None,
        span: SpanLoss = SpanLoss(),
        regime: RegimeConfig = RegimeConfig(),
        scrg: ScrgConfig | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(),
        validation: ValidationConfig = ValidationConfig(),
        export_dir: str | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        needs_teacher = distill is not None or span.weight > 0 or scrg is not None or regime.name == "teacher_generated"
        if needs_teacher and teacher is None:
            raise ValueError("this configuration uses the teacher (distill, span, SCRG or teacher_generated) but `teacher` is unset")
        self.student_source, self.teacher_source = student, teacher
        self.tokenizer_name = tokenizer or student.name_or_path or (teacher.name_or_path if teacher else None)
        if self.tokenizer_name is None:
            raise ValueError("set `tokenizer`: neither the student nor the teacher is loaded from a folder or hub id")
        self.eos_token, self.max_length = eos_token, max_length
        self.sft_weight, self.sft_on = sft_weight, sft_on
        self.distill, self.span, self.regime_config, self.scrg = distill, span, regime, scrg
        self.sampling, self.optimizer_config, self.validation_config = sampling, optimizer, validation
        self.export_dir, self.seed = export_dir, seed
        self.clip_net = self._build_clip_net()
        self.student: PreTrainedModel | None = None
        self.teacher: PreTrainedModel | None = None
        self.tokenizer = None
        self.regime = None
        self.span_prior = None
        self.val_loss = MeanMetric()
        self.val_rouge_l = RougeL()
        self.val_exact_match = ExactMatch()
        self.test_loss = MeanMetric()
        self.test_rouge_l = RougeL()
        self.test_exact_match = ExactMatch()
        self._teacher_logits_for: tuple[Rollout, Tensor] | None = None
        self._rng_states_to_restore: dict[str, Any] | None = None
        self.rollout_stats: dict[str, float] = {}

    # ---- model-loading hooks: override these for a new model pair ---------------------------------

    def load_tokenizer(self):
        """The tokenizer shared by teacher, student and data."""
        return load_tokenizer(self.tokenizer_name)

    def load_student(self) -> PreTrainedModel:
        """The student, trainable. Override to add LoRA, gradient checkpointing, a custom class, ..."""
        return load_causal_lm(self._seeded(self.student_source), len(self.tokenizer), self.special_token_ids())

    def load_teacher(self) -> PreTrainedModel | None:
        """The teacher; it is frozen and put in eval mode after this returns."""
        if self.teacher_source is None:
            return None
        return load_causal_lm(self._seeded(self.teacher_source), len(self.tokenizer), self.special_token_ids())

    def _seeded(self, source: ModelSource) -> ModelSource:
        return source if source.seed is not None else dataclasses.replace(source, seed=self.seed)

    def special_token_ids(self) -> dict[str, int | None]:
        t = self.tokenizer
        return {"bos_token_id": t.bos_token_id, "eos_token_id": self.eos_token_id, "pad_token_id": t.pad_token_id}

    # ---- building --------------------------------------------------------------------------------

    def _build_clip_net(self) -> ClipNet | None:
        if self.distill is None or self.distill.name != "dac_kl":
            return None
        if self.distill.params.get("mode", "learned") != "learned":
            return None
        return ClipNet(**self.distill.clip_net)

    def _build_student_side(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = self.load_tokenizer()
            self.eos_token_id = token_id(self.tokenizer, self.eos_token)
        if self.student is None:
            self.student = self.load_student()
            self.student.train()  # `from_pretrained` returns eval mode; Lightning keeps modules' modes

    def configure_model(self) -> None:
        """Load tokenizer, student and teacher once (called by the Trainer; sharded under FSDP)."""
        self._build_student_side()
        if self.teacher is None and self.teacher_source is not None:
            teacher = self.load_teacher()
            teacher.eval()
            teacher.requires_grad_(False)
            self.teacher = teacher
        models = {"student": self.student} | ({"teacher": self.teacher} if self.teacher is not None else {})
        own_tokenizers = {"data": self.tokenizer} | {
            role: tokenizer_of(source.name_or_path, source.gguf_file)
            for role, source in (("student", self.student_source), ("teacher", self.teacher_source))
            if source is not None and source.name_or_path
        }
        self.vocab_size = check_vocabularies(len(self.tokenizer), models, own_tokenizers)
        # Parameter names are read before any sharding wrapper flattens the parameters.
        self._no_decay_names = {name for name, p in self.student.named_parameters() if p.ndim < 2 or "norm" in name.lower()}
        if self.regime is None:
            self.regime = build_regime(self.regime_config, self.tokenizer.pad_token_id, self.seed)
        if self.span_prior is None and self.span.weight > 0:
            if self.span.prior == "tokens":
                self.span_prior = TokenSpanPrior.from_tokenizer(self.tokenizer)
            else:
                self.span_prior = TextChunkSpanPrior.from_tokenizer(self.tokenizer, spacy_chunker())

    def train(self, mode: bool = True):
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()  # the teacher never trains: no dropout even in training mode
        return self

    # ---- checkpoints: the frozen teacher stays out -----------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("teacher.")}
        if self.regime is not None:
            # one state per rank: each rank's replay buffer holds its own sequences
            checkpoint["regime"] = _gather_per_rank(self.regime.state_dict())
        # dropout and any global-RNG draw continue as in an uninterrupted run, on every rank
        rng_states = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng_states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["rng_states"] = _gather_per_rank(rng_states)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._build_student_side()  # `load_from_checkpoint` builds the module without the Trainer
        if self.regime is None:
            self.regime = build_regime(self.regime_config, self.tokenizer.pad_token_id, self.seed)
        if "regime" in checkpoint:
            self.regime.load_state_dict(self._own_state(checkpoint["regime"]))
        if "rng_states" in checkpoint:
            self._rng_states_to_restore = self._own_state(checkpoint["rng_states"])

    def _own_state(self, per_rank: list[Any]) -> Any:
        """This rank's entry of a per-rank list saved in a checkpoint (rank 0's on another world size)."""
        rank = self.global_rank if self._trainer is not None else 0
        return per_rank[rank] if rank < len(per_rank) else per_rank[0]

    def on_train_start(self) -> None:
        # restored here rather than at load time: set-up between the two draws from the global RNG
        states, self._rng_states_to_restore = self._rng_states_to_restore, None
        if states is not None:
            torch.set_rng_state(states["torch"])
            random.setstate(states["python"])
            if "cuda" in states and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if self.teacher is not None:
            state_dict = dict(state_dict)
            for key, value in self.teacher.state_dict().items():
                state_dict.setdefault(f"teacher.{key}", value)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # ---- the pieces a step is made of ------------------------------------------------------------

    def _logits(self, model: PreTrainedModel, sequences: Rollout) -> Tensor:
        """[B, R, V] logits predicting each response token, cut to the shared vocabulary."""
        return response_logits(model, sequences, self.vocab_size)

    def _teacher_logits(self, sequences: Rollout) -> Tensor:
        if self._teacher_logits_for is not None and self._teacher_logits_for[0] is sequences:
            return self._teacher_logits_for[1]  # computed by SCRG on exactly these sequences
        with torch.no_grad():
            return self._logits(self.teacher, sequences)

    def _rollout_seeds(self, batch_size: int) -> Tensor:
        # A function of (seed, batch, rank, row) only, so a resumed run samples what the uninterrupted
        # one would; batches rather than optimizer steps, so accumulated micro-batches differ.
        batch_index = self.trainer.fit_loop.total_batch_idx if self._trainer is not None else 0
        world, rank = (self.trainer.world_size, self.global_rank) if self._trainer is not None else (1, 0)
        first_row = ((self.seed * 1_000_003 + batch_index) * world + rank) * batch_size
        return torch.arange(first_row, first_row + batch_size, dtype=torch.long)

    @property
    def _synced(self) -> bool:
        # Every forward is a collective when parameters are sharded: ranks decode in lockstep.
        return self._trainer is not None and self.trainer.world_size > 1

    def _sample(self, model: PreTrainedModel, prompts: Rollout, config: SamplingConfig, seeds: Tensor) -> Rollout:
        return sample(
            model, prompts.prompt_ids, prompts.prompt_mask, config, **self._sampling_ids(), seeds=seeds,
            vocab_size=self.vocab_size, max_length=self.max_length, synced=self._synced,
        )

    def _sampling_ids(self) -> dict[str, int]:
        return {"eos_token_id": self.eos_token_id, "pad_token_id": self.tokenizer.pad_token_id}

    def student_outputs(self, ground_truth: Rollout) -> Rollout:
        """Fresh student responses to the batch's prompts, revised by SCRG when it is on.

        Timings and SCRG's correction statistics of the call are kept in ``rollout_stats`` and logged.
        """
        started = time.perf_counter()
        seeds = self._rollout_seeds(ground_truth.batch_size)
        rollout = self._sample(self.student, ground_truth, self.sampling, seeds)
        self.rollout_stats = {
            "rollout/seconds": time.perf_counter() - started,
            "rollout/response_tokens": float(rollout.response_mask.sum(-1).float().mean()),
        }
        if self.scrg is not None:
            result = revise(
                self.student, self.teacher, rollout, self.scrg, self.sampling, **self._sampling_ids(), seeds=seeds,
                vocab_size=self.vocab_size, max_length=self.max_length, synced=self._synced,
            )
            if result.teacher_logits is not None:
                self._teacher_logits_for = (result.rollout, result.teacher_logits)
            self.rollout_stats |= {f"scrg/{k}": v for k, v in result.stats.items()}
            rollout = result.rollout
        self._log_dict(self.rollout_stats)
        return rollout

    def distill_loss(self, student_logits: Tensor, teacher_logits: Tensor, mask: Tensor) -> Tensor:
        """The configured token-level term over ``mask``ed positions of [B, R, V] logits."""
        d = self.distill
        common = dict(temperature=d.temperature, chunk_size=d.chunk_size)
        if d.name == "dac_kl":
            loss, diagnostics = dac_kl(student_logits, teacher_logits, mask, clip_net=self.clip_net, **common, **d.params)
            self._log_dict({f"dac_kl/{k}": v for k, v in diagnostics.items()})
            return loss
        return DIVERGENCES[d.name](student_logits, teacher_logits, mask, **common, **d.params)

    def losses(self, ground_truth: Rollout, sequences: Rollout) -> dict[str, Tensor]:
        """Each named loss term, unweighted."""
        student_logits = self._logits(self.student, sequences)
        mask = sequences.response_mask
        terms: dict[str, Tensor] = {}
        if self.sft_weight > 0:
            if self.sft_on == "ground_truth" and sequences is not ground_truth:
                terms["sft"] = response_cross_entropy(self._logits(self.student, ground_truth), ground_truth)
            else:
                terms["sft"] = response_cross_entropy(student_logits, sequences)
        if self.distill is not None or self.span.weight > 0:
            teacher_logits = self._teacher_logits(sequences)
            if self.distill is not None:
                terms["distill"] = self.distill_loss(student_logits, teacher_logits, mask)
            if self.span.weight > 0:
                spans = self.span_prior(sequences.response_ids, mask)
                terms["span"] = span_correlation_loss(
                    student_logits, teacher_logits, mask, spans=spans, chunk_size=self.span.chunk_size
                )
                pairs = (spans[:, 1:] == spans[:, :-1]) & (spans[:, 1:] >= 0) & mask[:, 1:] & mask[:, :-1]
                self._log_dict({"span/pairs_per_row": pairs.sum(-1).float().mean()})
        return terms

    def loss_weights(self) -> dict[str, float]:
        return {
            "sft": self.sft_weight,
            "distill": self.distill.weight if self.distill is not None else 0.0,
            "span": self.span.weight,
        }

    # ---- Lightning hooks -------------------------------------------------------------------------

    def _log_dict(self, values: dict[str, Any]) -> None:
        if self._trainer is not None and self.trainer.training:
            values = {k: v.detach().float() if isinstance(v, Tensor) else float(v) for k, v in values.items()}
            self.log_dict(values, on_step=True, on_epoch=False)

    @staticmethod
    def ground_truth(batch: dict[str, Any]) -> Rollout:
        return Rollout(batch["prompt_ids"], batch["prompt_mask"], batch["response_ids"], batch["response_mask"])

    @property
    def progress(self) -> float:
        total = self.trainer.estimated_stepping_batches if self._trainer else 0
        return min(1.0, self.global_step / total) if total and math.isfinite(total) else 0.0

    def on_fit_start(self) -> None:
        t = self.trainer
        global_batch = t.datamodule.hparams.batch_size * t.accumulate_grad_batches * t.world_size if t.datamodule else None
        if t.logger is not None and global_batch:
            t.logger.log_hyperparams({"effective_global_batch_size": global_batch, **{f"weight/{k}": v for k, v in self.loss_weights().items()}})
        if isinstance(self.regime, TeacherGenerated):
            self._prepare_teacher_responses()

    def _prepare_teacher_responses(self) -> None:
        """SeqKD: the teacher answers every training prompt once (each rank a share), cached to disk."""
        from mgsr_lightning.data.collate import InstructionCollator

        datamodule = self.trainer.datamodule
        collate = InstructionCollator(self.tokenizer.pad_token_id)

        def generate(examples) -> list[list[int]]:
            batch = Rollout(**{k: v.to(self.device) for k, v in collate(examples).items() if k.endswith(("_ids", "_mask"))})
            seeds = torch.tensor([e.index for e in examples], dtype=torch.long) + self.seed * 1_000_003
            return self._sample(self.teacher, batch, self.sampling, seeds).to_token_lists()[1]

        path = self.regime.config.cache_path or f"{self.trainer.default_root_dir}/teacher_responses.pt"
        identity = {"teacher": self.teacher_source.describe(), "sampling": dataclasses.asdict(self.sampling),
                    "max_length": self.max_length, "seed": self.seed}
        self.regime.ensure_cache(
            path, datamodule.datasets["train"].examples, generate,
            datamodule.hparams.eval_batch_size or datamodule.hparams.batch_size, identity,
            rank=self.global_rank, world_size=self.trainer.world_size,
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        ground_truth = self.ground_truth(batch)
        self._teacher_logits_for = None
        sequences, source = self.regime.training_sequences(batch, ground_truth, lambda: self.student_outputs(ground_truth), self.progress)
        terms = self.losses(ground_truth, sequences)
        weights = self.loss_weights()
        total = sum(weights[name] * value for name, value in terms.items())
        self._teacher_logits_for = None
        self.log("train/loss", total, prog_bar=True, batch_size=ground_truth.batch_size)
        self._log_dict({f"train/{name}": value for name, value in terms.items()})
        self._log_dict({f"source/{s}": float(s == source) for s in ("ground_truth", "fresh", "replay", "teacher")})
        self._log_dict({f"regime/{k}": v for k, v in self.regime.metrics().items()})
        self._log_dict({"train/tokens_compared": sequences.response_mask.sum(), "train/lr": self.optimizers().param_groups[0]["lr"]})
        return total

    def configure_optimizers(self):
        c = self.optimizer_config
        decay, no_decay = [], []
        for name, parameter in self.student.named_parameters():
            if parameter.requires_grad:
                (no_decay if _unwrapped(name) in self._no_decay_names else decay).append(parameter)
        groups = [{"params": decay, "weight_decay": c.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.clip_net is not None:
            groups.append({"params": list(self.clip_net.parameters()), "weight_decay": 0.0, "lr": self.distill.clip_net_lr})
        optimizer = torch.optim.AdamW(groups, lr=c.lr, betas=tuple(c.betas))
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = get_scheduler(c.schedule, optimizer, num_warmup_steps=c.warmup_steps, num_training_steps=total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- validation and test: loss and generation metrics ----------------------------------------

    def _generate_texts(self, batch: dict[str, Any], seed: int) -> list[str]:
        config = self.sampling
        if self.validation_config.max_new_tokens is not None:
            config = dataclasses.replace(config, max_new_tokens=self.validation_config.max_new_tokens)
        seeds = example_seeds(seed, batch["example_index"].cpu())
        return decode_responses(self.tokenizer, self._sample(self.student, self.ground_truth(batch), config, seeds))

    def _score_loss(self, batch: dict[str, Any], metric: MeanMetric, name: str, **log_kwargs) -> Rollout:
        """Update and log ``metric`` with the batch's response cross-entropy; returns the batch's rollout."""
        ground_truth = self.ground_truth(batch)
        loss = response_cross_entropy(self._logits(self.student, ground_truth), ground_truth)
        metric.update(loss, weight=ground_truth.response_mask.sum())
        self.log(name, metric, batch_size=ground_truth.batch_size, **log_kwargs)
        return ground_truth

    def _score_generations(self, batch: dict[str, Any], rouge_l: RougeL, exact: ExactMatch, prefix: str, **log_kwargs):
        """Sample responses (``validation.seed``), update and log ROUGE-L and exact match against the references."""
        predictions = self._generate_texts(batch, self.validation_config.seed)
        rouge_l.update(predictions, batch["references"])
        exact.update(predictions, batch["references"])
        self.log(f"{prefix}/rougeL", rouge_l, batch_size=len(predictions), **log_kwargs)
        self.log(f"{prefix}/exact_match", exact, batch_size=len(predictions))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        ground_truth = self._score_loss(batch, self.val_loss, "val/loss", prog_bar=True)
        # The first batches of every rank, decided alike on all ranks (generation is in lockstep).
        examples_before = batch_idx * ground_truth.batch_size * self.trainer.world_size
        if self.trainer.sanity_checking or examples_before >= self.validation_config.rouge_examples:
            return
        self._score_generations(batch, self.val_rouge_l, self.val_exact_match, "val", prog_bar=True)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Loss, ROUGE-L and exact match over the whole test split (one sampling seed, ``validation.seed``).

        For the paper's protocol (five sampling seeds, several evaluation sets) use ``evaluate``.
        """
        self._score_loss(batch, self.test_loss, "test/loss")
        self._score_generations(batch, self.test_rouge_l, self.test_exact_match, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """The student's sampled response to each prompt of the batch, with its example index."""
        predictions = self._generate_texts(batch, self.validation_config.seed)
        return [
            {"example_index": int(index), "prediction": text, "references": references}
            for index, text, references in zip(batch["example_index"].tolist(), predictions, batch["references"])
        ]

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking and self.regime is not None and self.val_loss.update_count:
            self.regime.on_validation_loss(float(self.val_loss.compute()))

    def on_fit_end(self) -> None:
        """Export the student (the best checkpoint's when one is monitored) in Hugging Face format."""
        if self.export_dir is None:
            return
        checkpoint = self.trainer.checkpoint_callback
        best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None and checkpoint.monitor else ""
        if best:
            log.info("exporting the best checkpoint %s", best)
            state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        else:
            state = self.trainer.strategy.lightning_module_state_dict()  # a collective under FSDP: all ranks
        if self.trainer.is_global_zero:
            student_state = {k[len("student."):]: v for k, v in state.items() if k.startswith("student.")}
            export_student(self.student, self.tokenizer, self.export_dir, self.eos_token_id, student_state)
        self.trainer.strategy.barrier("export")


def _unwrapped(name: str) -> str:
    """A parameter name without the prefixes sharding wrappers insert."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _gather_per_rank(state: Any) -> list[Any]:
    """``[state of rank 0, state of rank 1, ...]`` on every rank (``[state]`` without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [state]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    return gathered
