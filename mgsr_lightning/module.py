"""``DistillLightningModule``: one LightningModule for SFT, the KD baselines and MGSR.

A training step wires named pieces together and holds no loss math or generation loop itself:
the **regime** (:mod:`.training.regimes`) picks the training sequences (ground truth, replay, cached
teacher outputs, or fresh ones from :func:`.training.rollout.fresh_outputs`: student samples revised
by SCRG, with SCRG's teacher logits, or MiniLLM's teacher-mixed samples); student and teacher logits
over them (the teacher's from the rollout, the teacher cache or a live forward:
:meth:`DistillLightningModule.step_teacher_logits`); the **objective** (:mod:`.losses.objective`) sums
the weighted ``sft``, ``distill`` and ``span`` terms; one log. Validation generation metrics, SeqKD's
teacher answers, the export, the resume state and the first step's saturation check are callbacks
(:mod:`.training.callbacks`, :mod:`.training.resume`) the module adds itself. Its validation, test and
predict steps score and sample the student on held-out ground truth; its checkpoints hold everything
but the frozen teacher.

Every method of the paper's tables is a choice of these pieces (see ``configs/``). For a new model
pair, subclass and override :meth:`load_student` / :meth:`load_teacher` (and :meth:`load_tokenizer`
when needed); nothing else has to change.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torchmetrics import MeanMetric
from transformers import PreTrainedModel

from mgsr_lightning.batch import TEACHER_CACHE_KEYS, Rollout, TrainingSequences
from mgsr_lightning.cross_tokenizer.alignment import pad_token_id_of, require_offsets
from mgsr_lightning.cross_tokenizer.teacher_side import is_paired, paired_teacher_side, retokenized_teacher_side
from mgsr_lightning.cross_tokenizer.vocabulary_map import SharedVocabulary, shared_vocabulary, token_surfaces
from mgsr_lightning.errors import ConfigError
from mgsr_lightning.generation.decode import Decoding, decode_responses, sample
from mgsr_lightning.generation.sampling import DecodingConfig, SamplingConfig
from mgsr_lightning.generation.scoring import response_hidden_states, response_logits
from mgsr_lightning.losses.cross_tokenizer import AlignedGroups
from mgsr_lightning.losses.fused_head import CachedTeacher, LogitsTeacher, Teacher, TeacherHead
from mgsr_lightning.losses.fused_objective import fused_objective, fused_objective_refusal
from mgsr_lightning.losses.minillm import MiniLLMConfig
from mgsr_lightning.losses.objective import DistillLoss, Objective, SpanLoss, build_clip_net, response_cross_entropy
from mgsr_lightning.losses.sparse_teacher import densify
from mgsr_lightning.models.loading import ModelSource, check_pair_vocabularies, check_vocabularies, load_causal_lm
from mgsr_lightning.models.output_head import linear_output_head
from mgsr_lightning.models.tokenizer import load_tokenizer, token_id, tokenizer_of
from mgsr_lightning.scrg.revise import ScrgConfig
from mgsr_lightning.scrg.through_text import TEACHER_ONLY_CRITERIA, revise_through_text
from mgsr_lightning.seeding import example_seeds, rollout_seeds
from mgsr_lightning.spans.token_prior import build_span_prior
from mgsr_lightning.training.callbacks import (
    ExportStudent,
    GenerationMetrics,
    RunHyperparameters,
    SaturationCheck,
    TeacherResponses,
    ValidationConfig,
)
from mgsr_lightning.training.optim import (
    OptimizerConfig,
    build_optimizer,
    clip_gradients,
    no_decay_names,
    parameter_groups,
)
from mgsr_lightning.training.regimes import NoStudentOutputsWarning, RegimeConfig, build_regime
from mgsr_lightning.training.resume import ResumeState
from mgsr_lightning.training.rollout import fresh_outputs
from mgsr_lightning.training.warning_format import show_category_names


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
        minillm: MiniLLM's policy-gradient reverse KL on fresh student (or teacher-mixed) samples;
            needs ``regime.name: on_policy`` and no SCRG. None = off.
        span: The span-level correlation term.
        regime: Where the training sequences come from.
        scrg: Sequence correction and re-generation applied to every fresh student output; None = off.
        sampling: Sampling of student rollouts (DistiLLM/MiniLLM: T=1, top_k=0, top_p=1).
        decoding: How the rollouts' decode loop runs: a growing KV cache (default), ``static_cache: true`` for
            one preallocated at the rollout's final length, and with it ``compile: true`` to run the one-token
            step under torch.compile; the tokens are the same.
        optimizer: Optimizer and schedule.
        validation: Validation generation metrics.
        export_dir: Folder the student is saved to in Hugging Face format at the end of fit (the
            checkpoint with the best monitored metric when a ``ModelCheckpoint`` monitors one). Only a run
            that trained and validated exports (not ``fast_dev_run``, nor a run that never validated).
        export_weights: ``best`` (default): the best checkpoint's weights, else the final ones of a run that
            validated; ``last``: the final weights, validated or not.
        seed: Seed of the module's own random draws: config-built models' initialisation (unless
            their source sets one), the regime's choices and the rollouts' sampling. The CLI links
            it to ``seed_everything``, so one training seed varies all of them.
        teacher_cache: The data's teacher cache (linked to ``data.teacher_cache``): ground-truth steps read the
            teacher from it, and a method that trains on ground truth only never loads the teacher.
        teacher_tokenizer: The teacher's own tokenizer, hub id or folder (linked to ``data.teacher_tokenizer``):
            when its vocabulary differs from ``tokenizer``'s, the teacher reads its own tokens of the same
            text and ``distill`` compares aligned token groups (``distill.cross_tokenizer``; see
            ``docs/cross_tokenizer.md``). None (the default): the teacher shares the student's vocabulary.
        fused_head: Compute the loss terms from the student's (and a live teacher's) last hidden states and
            output head chunk by chunk (:mod:`.losses.fused_head`), never holding whole [B, R, V] logits: the
            default, wherever it applies (not MiniLLM, not across tokenizers, not under FSDP, not a subclass
            that overrides :meth:`logits`, not a head that is more than a linear map; the step then computes
            the logits whole, as with ``false``). Equal to the unfused path to float rounding.
        fused_chunk_size: Positions per chunk of the fused head: each chunk holds O(chunk · V) memory.
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
        minillm: MiniLLMConfig | None = None,
        span: SpanLoss = SpanLoss(),
        regime: RegimeConfig = RegimeConfig(),
        scrg: ScrgConfig | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        decoding: DecodingConfig = DecodingConfig(),
        optimizer: OptimizerConfig = OptimizerConfig(),
        validation: ValidationConfig = ValidationConfig(),
        export_dir: str | None = None,
        export_weights: Literal["best", "last"] = "best",
        seed: int = 0,
        teacher_cache: str | None = None,
        teacher_tokenizer: str | None = None,
        fused_head: bool = True,
        fused_chunk_size: int = 128,
    ):
        super().__init__()
        show_category_names()  # Lightning's formatter drops the category of warnings from files named *lightning*
        # The teacher is in eval mode on purpose (no dropout); Lightning warns about any module in eval mode.
        warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
        self.save_hyperparameters()
        if teacher is not None and teacher.name_or_path is None and teacher.config is None:
            teacher = None  # settings without a model (a preset's dtype under an SFT config): no teacher
        self.objective = Objective(sft_weight, sft_on, distill, span, minillm=minillm)
        self.regime_config, self.scrg, self.teacher_cache = regime, scrg, teacher_cache
        if self.needs_teacher() and teacher is None:
            raise ValueError("this configuration uses the teacher (distill, minillm, span, SCRG or teacher_generated) "
                             "but `teacher` is unset")
        if minillm is not None and (regime.name != "on_policy" or scrg is not None):
            raise ValueError("minillm (a policy gradient on fresh samples) needs regime.name on_policy and no SCRG")
        self.student_source, self.teacher_source = student, teacher
        self.tokenizer_name = tokenizer or student.name_or_path or (teacher.name_or_path if teacher else None)
        if self.tokenizer_name is None:
            raise ValueError("set `tokenizer`: neither the student nor the teacher is loaded from a folder or hub id")
        self.eos_token, self.max_length = eos_token, max_length
        self.teacher_tokenizer_name = teacher_tokenizer
        self.distill, self.minillm, self.span = distill, minillm, span
        self.decoding_config = decoding
        self.sampling, self.optimizer_config, self.validation_config = sampling, optimizer, validation
        self.export_dir, self.export_weights = export_dir, export_weights
        self.seed = seed
        if fused_chunk_size < 1:
            raise ValueError(f"fused_chunk_size must be a positive number of positions, got {fused_chunk_size}")
        self.fused_head, self.fused_chunk_size = fused_head, fused_chunk_size
        self.clip_net = build_clip_net(distill)
        self.objective.clip_net = self.clip_net
        # built by configure_model (the Trainer calls it once, sharded under FSDP) or on checkpoint load
        self.student: PreTrainedModel | None = None
        self.teacher: PreTrainedModel | None = None
        self.tokenizer = None
        self.eos_token_id: int | None = None
        self.vocab_size: int | None = None  # the vocabulary teacher and student share; logits are cut to it
        # across tokenizers (a teacher tokenizer with another vocabulary): the teacher's side, built by configure_model
        self.teacher_tokenizer = None
        self.teacher_vocab_size: int | None = None
        self.shared_vocabulary: SharedVocabulary | None = None
        self.student_surfaces: dict | None = None
        self.teacher_surfaces: dict | None = None
        self.regime = None
        self.decoding: Decoding | None = None
        self._no_decay_names: set[str] = set()
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

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
        if self.across_tokenizers:
            t = self.teacher_tokenizer
            special = {"bos_token_id": t.bos_token_id, "eos_token_id": t.eos_token_id, "pad_token_id": t.pad_token_id}
            return load_causal_lm(self._seeded(self.teacher_source), len(t), special)
        return load_causal_lm(self._seeded(self.teacher_source), len(self.tokenizer), self.special_token_ids())

    def _seeded(self, source: ModelSource) -> ModelSource:
        return source if source.seed is not None else dataclasses.replace(source, seed=self.seed)

    def special_token_ids(self) -> dict[str, int | None]:
        t = self.tokenizer
        return {"bos_token_id": t.bos_token_id, "eos_token_id": self.eos_token_id, "pad_token_id": t.pad_token_id}

    # ---- building --------------------------------------------------------------------------------

    def _build_student_side(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = self.load_tokenizer()
            self.eos_token_id = token_id(self.tokenizer, self.eos_token)
        if self.student is None:
            self.student = self.load_student()
            self.student.train()  # `from_pretrained` returns eval mode; Lightning keeps modules' modes
        if self.regime is None:
            self.regime = build_regime(self.regime_config, self.tokenizer.pad_token_id, self.seed)

    @property
    def across_tokenizers(self) -> bool:
        """Whether the teacher reads its own tokens (a teacher tokenizer with another vocabulary)."""
        return self.shared_vocabulary is not None

    def _build_teacher_tokenizer_side(self) -> None:
        """With ``teacher_tokenizer`` set and a vocabulary other than the student's: the teacher's tokenizer,
        the shared vocabulary (once) and the student's token surfaces; refuses what does not work across
        tokenizers yet."""
        if self.teacher_tokenizer_name is None or self.teacher_tokenizer is not None:
            return
        self.teacher_tokenizer = load_tokenizer(self.teacher_tokenizer_name)
        if self.teacher_tokenizer.get_vocab() == self.tokenizer.get_vocab():
            return  # the same vocabulary: the teacher reads the student's tokens, as without a teacher tokenizer
        require_offsets(self.tokenizer, "student")
        require_offsets(self.teacher_tokenizer, "teacher")
        unsupported = [name for name, used in (
            ("teacher_cache", self.teacher_cache is not None),
            (f"scrg.criterion {getattr(self.scrg, 'criterion', None)} (it compares the two sides' distributions)",
             self.scrg is not None and self.scrg.criterion not in TEACHER_ONLY_CRITERIA),
            ("minillm", self.minillm is not None), ("span (weight > 0)", self.span.weight > 0),
            ("regime teacher_generated", self.regime_config.name == "teacher_generated"),
        ) if used]
        if unsupported:
            raise ConfigError(f"distilling across tokenizers (teacher_tokenizer {self.teacher_tokenizer_name!r}) does "
                              f"not support {', '.join(unsupported)} yet: turn it off, or use one tokenizer for both")
        self.shared_vocabulary = shared_vocabulary(self.tokenizer, self.teacher_tokenizer)
        self._check_rest_entries()
        self._warn_uld_alone()
        self.objective.shared_ids = (self.shared_vocabulary.student_ids, self.shared_vocabulary.teacher_ids)
        self.student_surfaces = token_surfaces(self.tokenizer)
        self.teacher_surfaces = token_surfaces(self.teacher_tokenizer)

    def _check_rest_entries(self) -> None:
        """Exact match compares one "rest" entry per side: the mass of the strings the other vocabulary lacks.
        A side whose whole vocabulary is shared has none, so a divergence that divides by that side's
        probability is infinite wherever the other side has some (forward KL: the student's rest). One line
        instead of a training loss of inf."""
        if self.distill is None or self.distill.cross_tokenizer != "exact_match":
            return
        shared = len(self.shared_vocabulary)
        student_rest, teacher_rest = shared < len(self.tokenizer), shared < len(self.teacher_tokenizer)
        divides_by = {"forward_kl": ("student",), "reverse_kl": ("teacher",), "symmetric_kl": ("student", "teacher")}
        for side in divides_by.get(self.distill.name, ()):
            own, other = (student_rest, teacher_rest) if side == "student" else (teacher_rest, student_rest)
            if other and not own:
                raise ConfigError(
                    f"distill {self.distill.name} with cross_tokenizer exact_match is infinite here: every {side} "
                    f"token is in the other vocabulary ({shared} shared), so the {side} puts no mass on the strings "
                    "only the other side has; use distill.cross_tokenizer: uld, or a divergence that stays finite "
                    "(skew_forward_kl, skew_reverse_kl, generalized_jsd, total_variation)"
                )

    def _warn_uld_alone(self) -> None:
        """ULD compares the two sides' probabilities sorted by size, never which token holds them, so alone it
        does not say which token is right: ULD's paper trains cross-entropy plus ULD. One warning when the
        cross-entropy term is off."""
        if self.distill is None or self.distill.cross_tokenizer != "uld" or self.distill.weight == 0:
            return
        if self.objective.sft_weight == 0:
            rank_zero_warn(
                "distill.cross_tokenizer uld with sft_weight 0: ULD compares the two sides' probabilities sorted by "
                "size, not which token holds them, so alone it does not teach the answer (a facts student trained "
                "on it fell to 30 ROUGE-L, where SFT reaches 52); ULD's paper trains cross-entropy plus ULD: set "
                "model.init_args.sft_weight (1.0 in configs/cross_tokenizer/llama3.2_to_gpt2_uld.yaml)",
                category=UserWarning)

    def _check_vocabularies(self) -> int:
        """The student's logit rows to compare (see ``check_vocabularies``); across tokenizers each model is
        checked against its own side's tokenizer."""
        if not self.across_tokenizers:
            return check_pair_vocabularies(self.tokenizer, self.student, self.teacher, self.student_source,
                                           self.teacher_source)
        sides = (("student", self.student, self.student_source, self.tokenizer),
                 ("teacher", self.teacher, self.teacher_source, self.teacher_tokenizer))
        sizes = {}
        for role, model, source, tokenizer in sides:
            own = tokenizer_of(source.name_or_path, source.gguf_file) if source is not None and source.name_or_path \
                else None
            models = {role: model} if model is not None else {}
            sizes[role] = check_vocabularies(len(tokenizer), models, {"data": tokenizer, role: own})
        self.teacher_vocab_size = sizes["teacher"]
        return sizes["student"]

    def configure_model(self) -> None:
        """Load tokenizer(s), student and teacher once (called by the Trainer; sharded under FSDP); across
        tokenizers, build the shared vocabulary."""
        self._build_student_side()
        self._build_teacher_tokenizer_side()
        if self.teacher is None and self.teacher_source is not None and self.needs_live_teacher():
            teacher = self.load_teacher()
            teacher.eval()
            teacher.requires_grad_(False)
            self.teacher = teacher
        self.vocab_size = self._check_vocabularies()
        self._no_decay_names = no_decay_names(self.student)
        # Every forward is a collective when parameters are sharded: ranks decode in lockstep.
        synced = self._trainer is not None and self.trainer.world_size > 1
        if synced and self.across_tokenizers and self.scrg is not None:
            raise ConfigError("SCRG through text (a teacher with its own tokenizer) runs on one device only: its "
                              "re-generation is not run in lockstep across ranks yet; train on one device or turn "
                              "scrg off")
        self.decoding = Decoding(self.sampling, self.eos_token_id, self.tokenizer.pad_token_id, self.vocab_size,
                                 self.max_length, synced, loop=self.decoding_config)
        if self.objective.span_prior is None and self.span.weight > 0:
            self.objective.span_prior = build_span_prior(self.tokenizer, self.span.prior)

    def configure_callbacks(self) -> list[L.Callback]:
        callbacks: list[L.Callback] = [ResumeState(), RunHyperparameters(),
                                       GenerationMetrics(self.validation_config.rouge_examples)]
        if self.distill is not None:
            callbacks.append(SaturationCheck())
        if self.regime_config.name == "teacher_generated":
            callbacks.append(TeacherResponses())
        if self.export_dir is not None:
            callbacks.append(ExportStudent(self.export_dir, self.export_weights))
        return callbacks

    def train(self, mode: bool = True):
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()  # the teacher never trains: no dropout even in training mode
        return self

    # ---- the teacher: whether a run reads it, whether it loads it, where a step's logits come from ---

    def needs_teacher(self) -> bool:
        """Whether any piece of a training step reads the teacher: a loss term over its logits, SCRG, or
        SeqKD's generated responses."""
        return self.objective.uses_teacher or self.scrg is not None or self.regime_config.name == "teacher_generated"

    def needs_live_teacher(self) -> bool:
        """Whether the run loads the teacher: always without a teacher cache; with one (``teacher_cache``),
        only when some training sequences are not the ground truth (student samples, replay, SeqKD's
        generation) or SCRG is on."""
        return self.teacher_cache is None or self.regime_config.name != "ground_truth" or self.scrg is not None

    def step_teacher_logits(self, batch: dict[str, Any], step: TrainingSequences) -> Tensor | None:
        """The teacher's [B, R, V] logits over the step's sequences, or None when no loss term reads them: those
        the rollout computed (SCRG, MiniLLM's teacher-mixed samples), else on a ground-truth step the teacher
        cache's entries carried by the batch, else a forward of the live teacher."""
        if step.teacher_logits is not None or not self.objective.uses_teacher:
            return step.teacher_logits
        if step.source == "ground_truth" and TEACHER_CACHE_KEYS[0] in batch:
            return densify(*(batch[key] for key in TEACHER_CACHE_KEYS), self.vocab_size)
        return self.teacher_logits(step.sequences)

    @torch.no_grad()
    def teacher_logits(self, sequences: Rollout) -> Tensor:
        return self.logits(self.teacher, sequences)

    @torch.no_grad()
    def teacher_logits_across(self, batch: dict[str, Any], step: TrainingSequences) -> tuple[Tensor, AlignedGroups]:
        """Across tokenizers: the teacher's [B, Rt, Vt] logits over its own tokens of the step's responses and the
        groups aligning them with the student's. Ground truth: the paired batch's teacher side; the student's
        rollouts: its ids spelled out and re-tokenised for the teacher, after the teacher's own prompts (the
        batch's for fresh rows; a replayed row's prompt is the student's prompt text re-tokenised)."""
        if not is_paired(batch):
            raise ConfigError("the teacher has its own tokenizer but the training batch holds no teacher tokens: "
                              "give the data module the same teacher_tokenizer (the CLI links data.teacher_tokenizer "
                              "to it)")
        if step.source == "ground_truth":
            teacher_sequences, groups = paired_teacher_side(batch)
        else:
            if step.source == "fresh":
                prompt_ids, prompt_mask = batch["teacher_prompt_ids"], batch["teacher_prompt_mask"]
            else:
                prompt_ids, prompt_mask = self._teacher_prompts(step.sequences)
            teacher_sequences, groups = retokenized_teacher_side(
                step.sequences, prompt_ids, prompt_mask, self.student_surfaces, self.teacher_tokenizer,
                student_eos_id=self.eos_token_id, student_pad_id=self.tokenizer.pad_token_id,
            )
        return response_logits(self.teacher, teacher_sequences, self.teacher_vocab_size), groups

    def _teacher_prompts(self, sequences: Rollout) -> tuple[Tensor, Tensor]:
        """The student's prompts as text, tokenised by the teacher ([B, Pt] left-padded ids and mask)."""
        prompts, _ = sequences.to_token_lists()
        texts = self.tokenizer.batch_decode(prompts, skip_special_tokens=True)
        ids = self.teacher_tokenizer(texts)["input_ids"]
        teacher_prompts = Rollout.from_token_lists(ids, [[] for _ in ids], pad_token_id=pad_token_id_of(
            self.teacher_tokenizer), device=sequences.device)
        return teacher_prompts.prompt_ids, teacher_prompts.prompt_mask

    # ---- the pieces a step is made of ------------------------------------------------------------

    def logits(self, model: PreTrainedModel, sequences: Rollout) -> Tensor:
        """[B, R, V] logits predicting each response token, cut to the shared vocabulary."""
        return response_logits(model, sequences, self.vocab_size)

    def fused_head_refusal(self) -> str | None:
        """Why this run's steps compute whole logits instead of the fused head, or None when they fuse."""
        if not self.fused_head:
            return "fused_head is false"
        if type(self).logits is not DistillLightningModule.logits:
            return f"{type(self).__name__} overrides logits()"
        if self._trainer is not None and "FSDP" in type(self.trainer.strategy).__name__:
            return "FSDP shards the output head"
        refusal = fused_objective_refusal(self.objective)
        if refusal is None:
            head = linear_output_head(self.student)
            refusal = f"the student: {head}" if isinstance(head, str) else None
        return refusal

    def on_train_start(self) -> None:
        refusal = self.fused_head_refusal()
        if self.fused_head and refusal is not None:  # asked for (the default) but not possible: say so once
            rank_zero_info(f"the loss head is not fused ({refusal}): each step computes whole [B, R, V] logits")

    def fused_teacher(self, batch: dict[str, Any], step: TrainingSequences) -> Teacher | None:
        """The teacher's side of a fused step (as :meth:`step_teacher_logits` picks it): the logits the rollout
        computed, the teacher cache's entries on a ground-truth step, else the live teacher's hidden states and
        head (its whole logits when its head is more than a linear map)."""
        if not self.objective.uses_teacher:
            return None
        own = DistillLightningModule
        if type(self).step_teacher_logits is not own.step_teacher_logits or (
                type(self).teacher_logits is not own.teacher_logits):  # a subclass's own teacher side, as it is
            return LogitsTeacher(self.step_teacher_logits(batch, step))
        if step.teacher_logits is not None:
            return LogitsTeacher(step.teacher_logits)
        if step.source == "ground_truth" and TEACHER_CACHE_KEYS[0] in batch:
            return CachedTeacher(*(batch[key] for key in TEACHER_CACHE_KEYS))
        head = linear_output_head(self.teacher)
        if isinstance(head, str):
            return LogitsTeacher(self.teacher_logits(step.sequences))
        with torch.no_grad():
            return TeacherHead(response_hidden_states(self.teacher, step.sequences), *head)

    def fused_step_loss(self, batch: dict[str, Any], step: TrainingSequences, ground_truth: Rollout,
                        measure: bool) -> tuple[Tensor, dict[str, Any]]:
        """The objective's loss and metrics through the fused head (:func:`.losses.fused_objective.fused_objective`)."""
        sequences = step.sequences
        weight, bias = linear_output_head(self.student)
        ground_truth_hidden = None
        if self.objective.sft_on_ground_truth and sequences is not ground_truth:
            ground_truth_hidden = response_hidden_states(self.student, ground_truth)
        return fused_objective(
            self.objective, sequences, response_hidden_states(self.student, sequences), weight,
            self.fused_teacher(batch, step), student_bias=bias, vocab_size=self.vocab_size, ground_truth=ground_truth,
            ground_truth_hidden=ground_truth_hidden, measure_gradients=measure, chunk_size=self.fused_chunk_size,
        )

    def student_outputs(self, ground_truth: Rollout, batch: dict[str, Any] | None = None) -> TrainingSequences:
        """Fresh responses to the prompts (:func:`~mgsr_lightning.training.rollout.fresh_outputs`): the student's,
        SCRG-revised when it is on, or MiniLLM's teacher-mixed ones. Across tokenizers SCRG runs through text
        (:func:`~mgsr_lightning.scrg.through_text.revise_through_text`, the teacher's prompts from ``batch``)."""
        on_trainer = self._trainer is not None
        seeds = rollout_seeds(
            self.seed, self.trainer.fit_loop.total_batch_idx if on_trainer else 0, ground_truth.batch_size,
            rank=self.global_rank if on_trainer else 0, world_size=self.trainer.world_size if on_trainer else 1,
        )
        if not (self.across_tokenizers and self.scrg is not None):
            return fresh_outputs(self.student, self.teacher, ground_truth, self.decoding, seeds, scrg=self.scrg,
                                 minillm=self.minillm)
        step = fresh_outputs(self.student, self.teacher, ground_truth, self.decoding, seeds, scrg=None, minillm=None)
        revised, stats = revise_through_text(
            self.student, self.teacher, step.sequences, batch["teacher_prompt_ids"], batch["teacher_prompt_mask"],
            self.scrg, self.decoding, student_tokenizer=self.tokenizer, teacher_tokenizer=self.teacher_tokenizer,
            student_surfaces=self.student_surfaces, teacher_surfaces=self.teacher_surfaces,
            teacher_vocab_size=self.teacher_vocab_size, seeds=seeds,
        )
        return TrainingSequences(revised, "fresh", metrics=step.metrics | {f"scrg/{k}": v for k, v in stats.items()})

    def sample_responses(self, batch: dict[str, Any]) -> Rollout:
        """The student's sampled response to each prompt of a batch, each example with its own seed
        (``validation.seed`` and its index) and ``validation.max_new_tokens``: what ``predict`` writes and
        validation and test score (:class:`~mgsr_lightning.training.callbacks.GenerationMetrics`)."""
        decoding = self.decoding.with_max_new_tokens(self.validation_config.max_new_tokens)
        seeds = example_seeds(self.validation_config.seed, batch["example_index"].cpu())
        return sample(self.student, batch["prompt_ids"], batch["prompt_mask"], decoding, seeds=seeds)

    @property
    def progress(self) -> float:
        total = self.trainer.estimated_stepping_batches if self._trainer else 0
        return min(1.0, self.global_step / total) if total and math.isfinite(total) else 0.0

    # ---- training --------------------------------------------------------------------------------

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        ground_truth = Rollout.from_batch(batch)
        # 1. training sequences from the regime: ground truth, replay, teacher outputs, or fresh (sample + SCRG)
        step = self.regime.training_sequences(
            batch, ground_truth, lambda: self.student_outputs(ground_truth, batch), self.progress
        )
        sequences = step.sequences
        measure = self.span.grad_ratio_every > 0 and self.global_step % self.span.grad_ratio_every == 0
        if self.fused_head_refusal() is None:  # 2-3. the loss terms from hidden states, chunk by chunk
            loss, metrics = self.fused_step_loss(batch, step, ground_truth, measure)
            return self._log_step(loss, metrics, step, ground_truth)
        # 2. logits: the student's over the sequences (and over the ground truth for its SFT term), the teacher's
        student_logits = self.logits(self.student, sequences)
        ground_truth_logits = None
        if self.objective.sft_on_ground_truth and sequences is not ground_truth:
            ground_truth_logits = self.logits(self.student, ground_truth)
        groups = None
        if self.across_tokenizers and self.objective.uses_teacher:  # the teacher over its own tokens
            teacher_logits, groups = self.teacher_logits_across(batch, step)
        else:
            teacher_logits = self.step_teacher_logits(batch, step)
        # 3. the loss terms and their weighted sum
        loss, metrics = self.objective(
            sequences, student_logits, teacher_logits, ground_truth, ground_truth_logits, measure, groups=groups
        )
        return self._log_step(loss, metrics, step, ground_truth)

    def _log_step(self, loss: Tensor, metrics: dict[str, Any], step: TrainingSequences,
                  ground_truth: Rollout) -> Tensor:
        """4. one log of the step."""
        self.log("train/loss", loss, prog_bar=True, batch_size=ground_truth.batch_size)
        metrics |= self.regime.step_metrics(step) | {"train/tokens_compared": step.sequences.response_mask.sum()}
        self.log_dict(_as_floats(metrics), on_step=True, on_epoch=False)
        return loss

    def on_train_end(self) -> None:
        message = self.regime.never_sampled_message(self.scrg is not None)
        if message is not None:
            rank_zero_warn(message, category=NoStudentOutputsWarning)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        groups = parameter_groups(self.student, self.optimizer_config, self._no_decay_names, self.clip_net,
                                  self.distill.clip_net_lr if self.clip_net is not None else None)
        return build_optimizer(groups, self.optimizer_config, int(self.trainer.estimated_stepping_batches))

    # ---- validation, test, predict: the student on held-out ground truth ---------------------------

    def _score_loss(self, batch: dict[str, Any], metric: MeanMetric, name: str, **log_kwargs) -> None:
        """Update and log ``metric`` with the batch's response cross-entropy."""
        ground_truth = Rollout.from_batch(batch)
        loss = response_cross_entropy(self.logits(self.student, ground_truth), ground_truth)
        metric.update(loss, weight=ground_truth.response_mask.sum())
        self.log(name, metric, batch_size=ground_truth.batch_size, **log_kwargs)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Validation loss (ROUGE-L and exact match: ``GenerationMetrics``)."""
        self._score_loss(batch, self.val_loss, "val/loss", prog_bar=True)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Loss over the whole test split (ROUGE-L and exact match, one sampling seed: ``GenerationMetrics``).

        For the paper's protocol (five sampling seeds, several evaluation sets) use ``evaluate``.
        """
        self._score_loss(batch, self.test_loss, "test/loss")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """The student's sampled response to each prompt of the batch, with its example index."""
        predictions = decode_responses(self.tokenizer, self.sample_responses(batch))
        return [
            {"example_index": int(index), "prediction": text, "references": references}
            for index, text, references in zip(batch["example_index"].tolist(), predictions, batch["references"])
        ]

    def on_validation_epoch_end(self) -> None:
        """Hand the validation loss to the regime (DistiLLM's adaptive threshold reads it)."""
        if not self.trainer.sanity_checking and self.regime is not None and self.val_loss.update_count:
            self.regime.on_validation_loss(float(self.val_loss.compute()))

    # ---- checkpoints: everything but the frozen teacher --------------------------------------------
    # The teacher's weights come from its own folder and never change: they are dropped from every saved
    # state_dict and put back from the loaded teacher when a checkpoint's state is loaded, so strict loading
    # still works. The regime's and the random generators' states are saved by ``ResumeState``.

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("teacher.")}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._build_student_side()  # `load_from_checkpoint` builds the module without the Trainer

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if self.teacher is not None:
            state_dict = dict(state_dict)
            for key, value in self.teacher.state_dict().items():
                state_dict.setdefault(f"teacher.{key}", value)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def _as_floats(values: dict[str, Any]) -> dict[str, Tensor | float]:
    return {k: v.detach().float() if isinstance(v, Tensor) else float(v) for k, v in values.items()}
