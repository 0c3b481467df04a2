"""``InstructionDataModule``: instruction data → tokenised, filtered, batched prompt/response pairs."""

from __future__ import annotations

import logging
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from mgsr_lightning.cross_tokenizer.alignment import pad_token_id_of
from mgsr_lightning.data.collate import EncodedExample, InstructionCollator
from mgsr_lightning.data.paired_tokens import PairedCollator, encode_paired_records
from mgsr_lightning.data.records import load_records
from mgsr_lightning.data.teacher_cache import CachedTeacherCollator, TeacherCache
from mgsr_lightning.data.templates import PromptTemplate, render_prompt
from mgsr_lightning.errors import ConfigError
from mgsr_lightning.lightning_workarounds import allow_resuming_mid_epoch
from mgsr_lightning.models.tokenizer import load_tokenizer, token_id

log = logging.getLogger(__name__)


class EncodedDataset(Dataset):
    """Encoded examples with the records they came from (references for evaluation)."""

    def __init__(self, examples: list[EncodedExample], records: list[dict[str, Any]]):
        self.examples = examples
        self.records = records

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, position: int) -> EncodedExample:
        return self.examples[position]


def encode_records(
    records: list[dict[str, Any]],
    tokenizer,
    *,
    template: PromptTemplate,
    eos_token_id: int,
    max_length: int | None,
    max_prompt_length: int,
    overlong: Literal["drop", "truncate"] = "drop",
    name: str = "data",
) -> tuple[list[EncodedExample], dict[str, int]]:
    """Tokenise prompt and response separately (the response followed by EOS) and apply the length policy.

    Policy, counted in the returned stats and logged:
    - a prompt longer than ``max_prompt_length`` tokens is dropped (``dropped_long_prompt``): a cut
      prompt changes the task, so it is never truncated;
    - a prompt + response + EOS longer than ``max_length`` (None: no cap) is dropped (``overlong="drop"``, the default,
      ``dropped_long_response``) or its response is cut to fit, keeping the EOS (``overlong="truncate"``,
      ``truncated_response``, with a warning).
    Evaluation references with several outputs use the first for the training response.
    """
    add_special = template != "chat"  # chat templates already contain BOS and role markers
    stats = {"kept": 0, "dropped_long_prompt": 0, "dropped_long_response": 0, "truncated_response": 0}
    examples = []
    prompts = [record.get("prompt") or render_prompt(record, template, tokenizer) for record in records]
    responses = [record["output"] if isinstance(record["output"], str) else record["output"][0] for record in records]
    prompt_ids = tokenizer(prompts, add_special_tokens=add_special)["input_ids"] if prompts else []
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"] if responses else []
    for index, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        if len(prompt) > max_prompt_length:
            stats["dropped_long_prompt"] += 1
            continue
        response = list(response) + [eos_token_id]
        if max_length is not None and len(prompt) + len(response) > max_length:
            if overlong == "drop":
                stats["dropped_long_response"] += 1
                continue
            response = response[: max_length - len(prompt) - 1] + [eos_token_id]
            stats["truncated_response"] += 1
        output = records[index]["output"]
        references = [output] if isinstance(output, str) else list(output)
        examples.append(EncodedExample(index, list(prompt), response, references))
        stats["kept"] += 1
    dropped = stats["dropped_long_prompt"] + stats["dropped_long_response"]
    if dropped:
        log.warning(
            "%s: dropped %d of %d rows (%d prompts > max_prompt_length=%d, %d prompt+response > max_length=%s)",
            name, dropped, len(records), stats["dropped_long_prompt"], max_prompt_length,
            stats["dropped_long_response"], max_length,
        )
    if stats["truncated_response"]:
        log.warning("%s: truncated %d responses to fit max_length=%d", name, stats["truncated_response"], max_length)
    return examples, stats


class ResumableSampler(DistributedSampler):
    """A seeded permutation per epoch, sharded over ranks, that can resume in the middle of an epoch.

    The global order of epoch ``e`` is ``randperm(n, seed + e)``, padded as ``DistributedSampler``
    pads it; rank ``r`` of ``W`` takes every W-th index from position ``r``. A checkpoint stores
    ``(epoch, examples consumed by all ranks)`` through the data module's ``state_dict``, and the
    resumed run continues the same order past what was already trained on, so an interrupted run
    sees exactly the batches an uninterrupted one would, on one device or several. Being a
    ``DistributedSampler``, Lightning uses it as it is instead of wrapping it.
    """

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True, num_replicas: int = 1, rank: int = 0):
        super().__init__(range(size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self._skip = 0  # examples of the global order already consumed in this epoch

    def order(self) -> list[int]:
        """The epoch's global order, padded to a multiple of the number of ranks."""
        size = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(size, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(size))
        padding = self.total_size - size
        return order + (order * (1 + padding // max(size, 1)))[:padding]

    def __iter__(self):
        skip, self._skip = self._skip, 0
        return iter(self.order()[skip:][self.rank :: self.num_replicas])


class InstructionDataModule(L.LightningDataModule):
    """Instruction-following data for distillation.

    Args:
        tokenizer: Tokenizer hub id or folder (``AutoTokenizer.from_pretrained``); shared with the model.
        train_data: Training data: a JSONL file, a folder with ``train.jsonl``, a ``save_to_disk`` dataset,
            or a Hugging Face dataset name. Rows: ``instruction``/``input``/``output`` (Alpaca, MiniLLM),
            ``instruction``/``context``/``response`` (Dolly-15k) or ``prompt``/``response``.
        val_data: Validation data in the same forms. When unset, the first ``val_size`` rows of the
            training data are held out (MiniLLM's Dolly split uses the first 1,000).
        test_data: Test data in the same forms (used by ``test``/``predict``).
        val_size: Rows held out from ``train_data`` for validation when ``val_data`` is unset.
        template: Prompt template: ``alpaca`` (MiniLLM/DistiLLM), ``chat`` (the tokenizer's chat
            template) or ``plain``.
        eos_token: Token appended to every response and that ends generation; default the
            tokenizer's EOS (set ``<|im_end|>`` for ChatML models).
        max_length: Maximum prompt + response tokens per training row.
        max_prompt_length: Maximum prompt tokens; longer prompts are dropped and counted.
        overlong: What to do with rows whose prompt + response exceeds ``max_length``: ``drop``
            (counted and logged) or ``truncate`` the response (warned).
        batch_size: Training batch size per device.
        eval_batch_size: Validation/test batch size per device (default: ``batch_size``).
        max_train_examples: Use only the first N training rows (quick experiments).
        max_val_examples: Use only the first N validation rows.
        num_workers: DataLoader worker processes.
        seed: Seed of the training order (resumable mid-epoch); linked to ``seed_everything`` in the CLI.
        hf_split: Split name when ``train_data`` is a Hugging Face dataset or a saved ``DatasetDict``.
        teacher_cache: A folder written by ``python -m mgsr_lightning cache-teacher`` for this data: each
            training batch then carries the teacher's cached top-k over its ground-truth responses
            (:mod:`mgsr_lightning.data.teacher_cache`). Refused if made for other rows, template or lengths.
        teacher_tokenizer: The teacher's own tokenizer (hub id or folder; linked to the model's): when its
            vocabulary differs from ``tokenizer``'s, each training row is rendered once and tokenised per side,
            and its batches carry the teacher's tokens and their alignment with the student's
            (:mod:`mgsr_lightning.data.paired_tokens`); validation and test batches stay the student's.
    """

    def __init__(
        self,
        tokenizer: str,
        train_data: str | None = None,
        val_data: str | None = None,
        test_data: str | None = None,
        val_size: int = 0,
        template: PromptTemplate = "alpaca",
        eos_token: str | None = None,
        max_length: int = 512,
        max_prompt_length: int = 256,
        overlong: Literal["drop", "truncate"] = "drop",
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        max_train_examples: int | None = None,
        max_val_examples: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        hf_split: str = "train",
        teacher_cache: str | None = None,
        teacher_tokenizer: str | None = None,
    ):
        super().__init__()
        if max_prompt_length >= max_length:
            raise ConfigError(f"max_prompt_length ({max_prompt_length}) must be smaller than max_length ({max_length})")
        self.save_hyperparameters()
        self.tokenizer = load_tokenizer(tokenizer)
        self.eos_token_id = token_id(self.tokenizer, eos_token)
        self.teacher_tokenizer = None  # set only when the teacher's vocabulary differs: training batches are paired
        if teacher_tokenizer is not None:
            other = load_tokenizer(teacher_tokenizer)
            if other.get_vocab() != self.tokenizer.get_vocab():
                self.teacher_tokenizer = other
        if self.teacher_tokenizer is not None and (teacher_cache is not None or overlong != "drop"):
            raise ConfigError("distilling across tokenizers (data.teacher_tokenizer) drops overlong rows and reads no "
                              "teacher cache yet: set overlong: drop and unset teacher_cache")
        self.datasets: dict[str, EncodedDataset] = {}
        self.length_stats: dict[str, dict[str, int]] = {}
        self._resume_position: dict[str, int] | None = None
        self.teacher_cache: TeacherCache | None = None

    def encoding_settings(self) -> dict[str, Any]:
        """What, besides the rows, decides the encoded training examples (a teacher cache's data key)."""
        h = self.hparams
        return {"template": h.template, "max_length": h.max_length, "max_prompt_length": h.max_prompt_length,
                "overlong": h.overlong, "eos_token_id": self.eos_token_id}

    def _encode(self, name: str, records: list[dict[str, Any]]) -> EncodedDataset:
        h = self.hparams
        if name == "train" and self.teacher_tokenizer is not None:
            examples, stats = encode_paired_records(
                records, self.tokenizer, self.teacher_tokenizer, template=h.template, max_length=h.max_length,
                max_prompt_length=h.max_prompt_length, student_eos_id=self.eos_token_id,
            )
            dropped = stats["dropped_long_prompt"] + stats["dropped_long_response"]
            if dropped:
                log.warning("%s: dropped %d of %d rows too long on the student's or the teacher's side (%s)", name,
                            dropped, len(records), stats)
        else:
            examples, stats = encode_records(
                records, self.tokenizer, template=h.template, eos_token_id=self.eos_token_id,
                max_length=h.max_length, max_prompt_length=h.max_prompt_length, overlong=h.overlong, name=name,
            )
        if not examples:
            raise ConfigError(
                f"no {name} rows left after the length policy ({stats}); raise max_length/max_prompt_length"
            )
        self.length_stats[name] = stats
        return EncodedDataset(examples, records)

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if stage in (None, "fit", "validate") and "train" not in self.datasets:
            if h.train_data is None:
                raise ConfigError("`train_data` is required to fit")
            train_records = load_records(h.train_data, split=h.hf_split)
            if h.val_data is not None:
                val_records = load_records(h.val_data, split="validation")
            else:
                if h.val_size <= 0 or h.val_size >= len(train_records):
                    raise ConfigError(
                        f"set `val_data`, or `val_size` between 1 and {len(train_records) - 1} "
                        "to hold out training rows"
                    )
                val_records, train_records = train_records[: h.val_size], train_records[h.val_size :]
            if h.max_train_examples:
                train_records = train_records[: h.max_train_examples]
            if h.max_val_examples:
                val_records = val_records[: h.max_val_examples]
            self.datasets["train"] = self._encode("train", train_records)
            self.datasets["val"] = self._encode("validation", val_records)
            if h.teacher_cache is not None:
                self.teacher_cache = TeacherCache(h.teacher_cache, self.train_examples(), self.encoding_settings())
        if stage in (None, "test", "predict") and "test" not in self.datasets:
            if h.test_data is None:
                raise ConfigError("`test_data` is required to test or predict")
            self.datasets["test"] = self._encode("test", load_records(h.test_data, split="test"))

    def state_dict(self) -> dict[str, int]:
        """Position in the training order, saved in checkpoints: (epoch, examples consumed in it).

        Asked of the trainer (batches trained on in this epoch) rather than of the loader, which runs
        ahead of training by the prefetched batch.
        """
        if self.trainer is None:
            return {}
        trainer = self.trainer
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"epoch": trainer.current_epoch, "consumed": batches * self.hparams.batch_size * trainer.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        allow_resuming_mid_epoch()  # this position makes the loader resumable, whatever Lightning says
        self._resume_position = state or None

    def train_dataloader(self) -> DataLoader:
        dataset = self.datasets["train"]
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        sampler = ResumableSampler(len(dataset), self.hparams.seed, num_replicas=world, rank=rank)
        if self._resume_position is not None:
            sampler.set_epoch(self._resume_position["epoch"])
            sampler._skip = min(self._resume_position["consumed"], sampler.total_size)
            self._resume_position = None
        pad_id = self.tokenizer.pad_token_id
        if self.teacher_tokenizer is not None:
            collate = PairedCollator(pad_id, pad_token_id_of(self.teacher_tokenizer))
        elif self.teacher_cache is None:
            collate = InstructionCollator(pad_id)
        else:
            collate = CachedTeacherCollator(pad_id, self.teacher_cache)
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler, collate_fn=collate,
                          num_workers=self.hparams.num_workers)

    def _eval_loader(self, name: str) -> DataLoader:
        return DataLoader(
            self.datasets[name], batch_size=self.hparams.eval_batch_size or self.hparams.batch_size, shuffle=False,
            collate_fn=InstructionCollator(self.tokenizer.pad_token_id), num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def train_examples(self) -> list[EncodedExample]:
        """The encoded training examples in dataset order (SeqKD's teacher answers each once)."""
        return self.datasets["train"].examples

    @property
    def generation_batch_size(self) -> int:
        """Prompts per batch when generating outside the training loop."""
        return self.hparams.eval_batch_size or self.hparams.batch_size
