"""Training speed against TRL on the same tiny pair: steps/s, seconds per sample and peak RSS per method.

    make bench                                                    # creates .venv-bench with TRL, then runs this
    python experiments/benchmarks/bench_vs_trl.py --trl_python .venv-bench/bin/python --out experiments/results/speed
    python experiments/benchmarks/bench_vs_trl.py --rounds 1 --steps 4 --warmup 1 --only gkd,mgsr   # a quick look

Both sides train the same models from the same folders: a GPT-2 teacher (4 layers, d=256) and a
GPT-2 student (2 layers, d=128), both initialised once, trained ``--pretrain_steps`` steps on a
made-up language (each word has 4 possible successors) and saved, vocabulary 4,096 (a
word-level tokenizer over 4,094 made-up words plus EOS and pad, so prompt text maps to the same ids on
both sides), fp32, batch 8, prompts of 16-32 tokens, ground-truth responses of 64 tokens, 64 new
tokens sampled (T = 1, no top-k/top-p), AdamW at lr 1e-4, no gradient checkpointing, no
evaluation, no logging to disk. TRL runs from its own interpreter (``--trl_python``: a venv with
``pip install .[bench]``, i.e. ``trl==1.16.0``), so the project's environment is never touched.

Rows (DistiLLM's efficiency table: seconds per training sample; a sample is one sequence):

- SFT: cross-entropy on ground truth. TRL: ``SFTTrainer``.
- KD: forward KL on ground truth. TRL: ``GKDTrainer`` with ``lmbda=0, beta=0`` (off-policy).
- SeqKD: cross-entropy on teacher responses. Ours samples them once before training (its cost per
  sample is the ``one-off`` column) and trains on them; TRL's ``GKDTrainer(seq_kd=True, lmbda=0)``
  samples the teacher at every step.
- GKD: generalised JSD (β = 0.5) on student samples every step. TRL: ``GKDTrainer(lmbda=1)`` and
  the top-level ``DistillationTrainer`` (always on-policy).
- DistiLLM, ABKD, MGSR: their ``configs/methods`` losses with the regime forced to ``on_policy``, so
  every step samples (the worst case: their default adaptive schedule samples in a share of
  steps). MGSR revises each sample with SCRG (one correction). TRL has no counterpart.
- MiniLLM: ``configs/methods/minillm.yaml`` as it is (on-policy already): teacher-mixed samples
  (α = 0.2, both models decoding), the policy-gradient and single-step terms, and the SFT term on
  the ground truth standing for its pre-training loss. TRL has no counterpart.

Targets printed under the table: our GKD against ``DistillationTrainer`` (≥ 1.5× its steps/s), and
MGSR's step against its floor (≤ 1.15×): DistiLLM's step, plus the ground-truth CE's student forward and
backward (MGSR's objective has the SFT term on the ground truth, which DistiLLM's has not; measured on the
first batch), plus the response tokens SCRG re-generated per step (``scrg/regenerated_tokens``) at the
rollout's own cost per sampled token and the teacher's forward over them (its measured cost per column).
When a target is missed the step's profile is printed under it. ``make bench`` then runs ``bench_decode.py``
(our decode loop against ``generate``) and ``bench_dac_kl_cost.py`` (DAC-KL against forward KL).

Every (side, method) runs in a fresh process, ``--rounds`` times, the processes alternating
between the sides; a run times ``--steps`` steps after ``--warmup`` (the time between consecutive
step ends, data loading included). The table reports medians and [min-max] over rounds; compare
rows of one run only (the machine's load moves absolute figures by tens of percent).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from proc_memory import status_kib  # the folder of these scripts (see proc_memory.py)

REPO = Path(__file__).resolve().parents[2]
VOCAB_WORDS = 4094  # plus EOS and pad: 4,096 ids
# Every third word carries GPT-2's word-start marker, so MGSR's span prior finds multi-token words.
WORDS = [("Ġ" if i % 3 == 0 else "") + f"w{i}" for i in range(VOCAB_WORDS)]
EOS, PAD = "<eos>", "<pad>"
TEACHER = {"n_layer": 4, "n_embd": 256, "n_head": 4}
STUDENT = {"n_layer": 2, "n_embd": 128, "n_head": 4}
CHAT_TEMPLATE = (  # plain concatenation, for TRL's ChatML collator (GKDTrainer)
    "{% for message in messages %}{{ message['content'] }}{% if not loop.last %} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %} {% endif %}"
)

# (row, side, method): the order of the table.
JOBS = [
    ("SFT", "ours", "sft"), ("SFT", "trl", "sft"),
    ("KD", "ours", "kd"), ("KD", "trl", "gkd_off_policy"),
    ("SeqKD", "ours", "seqkd"), ("SeqKD", "trl", "seqkd"),
    ("GKD", "ours", "gkd"), ("GKD", "trl", "gkd_on_policy"), ("GKD", "trl", "distillation"),
    ("DistiLLM", "ours", "distillm"), ("ABKD", "ours", "abkd"), ("MGSR", "ours", "mgsr"),
    ("MiniLLM", "ours", "minillm"),
]
TRL_NAMES = {
    "sft": "SFTTrainer", "gkd_off_policy": "GKDTrainer lmbda=0", "seqkd": "GKDTrainer seq_kd",
    "gkd_on_policy": "GKDTrainer lmbda=1", "distillation": "DistillationTrainer",
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl_python", default=None, help="python of a venv with trl==1.16.0 (none: our rows only)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per (side, method)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--progress", action="store_true", help="one line per run on stderr")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in every run (default: torch's)")
    parser.add_argument("--only", default=None, help="comma-separated methods (ours' names, e.g. gkd,mgsr)")
    parser.add_argument("--pretrain_steps", type=int, default=200,
                        help="next-token training of both models on the made-up language before timing (0: untrained)")
    parser.add_argument("--work", default="runs/bench_vs_trl", help="models, tokenizer and data go here")
    parser.add_argument("--out", default=None, help="folder for table.md and runs.json")
    parser.add_argument("--unfused", action="store_true",
                        help="our runs compute whole logits (fused_head: false) instead of the fused head")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # side:method, run in this process
    return parser.parse_args(argv)


# ---- the shared assets: tokenizer, models, prompts ----------------------------------------------


def prepare(work: Path, batch_size: int, steps: int, pretrain_steps: int) -> None:
    """Tokenizer, teacher and student folders and the prompts/responses, written once under ``work``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    if (work / "data.json").is_file():
        return
    work.mkdir(parents=True, exist_ok=True)
    vocab = {EOS: 0, PAD: 1} | {word: i + 2 for i, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=EOS, eos_token=EOS, pad_token=PAD,
                                        model_max_length=256)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(work / "tokenizer"))
    for name, shape, seed in (("teacher", TEACHER, 1), ("student", STUDENT, 2)):
        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=len(vocab), n_positions=256, bos_token_id=0, eos_token_id=0, pad_token_id=1,
                            **shape)
        GPT2LMHeadModel(config).save_pretrained(str(work / name))
    rng = random.Random(0)
    # A made-up language: each word has 4 possible successors. Both models learn it briefly, so the
    # student's samples are mostly plausible to the teacher and SCRG finds errors along the response,
    # not at its first token as it would with untrained models.
    successors = [[rng.randrange(2, len(vocab)) for _ in range(4)] for _ in range(len(vocab))]

    def chain(length: int) -> list[int]:
        ids = [rng.randrange(2, len(vocab))]
        while len(ids) < length:
            ids.append(rng.choice(successors[ids[-1]]))
        return ids

    examples = []
    for _ in range(batch_size * (steps + 8)):
        text = chain(rng.randint(16, 32) + 63)
        examples.append({"prompt": text[:-63], "response": text[-63:] + [0]})
    train = [chain(rng.randint(16, 32) + 63) + [0] for _ in range(pretrain_steps * 16)]
    for name in ("teacher", "student"):
        if train:
            pretrain(work / name, train)
    (work / "data.json").write_text(json.dumps(examples))


def pretrain(folder: Path, sequences: list[list[int]]) -> None:
    """A few hundred steps of next-token training (AdamW, lr 1e-3 after 20 warm-up steps, batch 16) on
    ``sequences``; saved in place."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(folder)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    for start in range(0, len(sequences), 16):
        batch = sequences[start : start + 16]
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([ids + [1] * (width - len(ids)) for ids in batch])
        labels = ids.masked_fill(ids == 1, -100)
        loss = model(input_ids=ids, attention_mask=(ids != 1).long(), labels=labels).loss
        loss.backward()
        optimizer.step()
        warmup.step()
        optimizer.zero_grad()
    print(f"{folder.name}: next-token loss {loss.item():.2f} after {len(sequences) // 16} steps", file=sys.stderr)
    model.save_pretrained(str(folder))


def texts(ids: list[int]) -> str:
    return " ".join(WORDS[i - 2] for i in ids)


# ---- one run: ours --------------------------------------------------------------------------------


def method_kwargs(method: str) -> dict:
    """The module's init args of ``configs/methods/<method>.yaml``, regime on-policy where it samples."""
    import yaml
    from omegaconf import OmegaConf

    from mgsr_lightning.cli.config_files import compose
    from mgsr_lightning.generation.sampling import SamplingConfig  # noqa: F401  (imported for the dataclasses below)
    from mgsr_lightning.losses.minillm import MiniLLMConfig
    from mgsr_lightning.losses.objective import DistillLoss, SpanLoss
    from mgsr_lightning.scrg.revise import ScrgConfig
    from mgsr_lightning.training.regimes import RegimeConfig

    name = {"seqkd": "sft"}.get(method, method)  # SeqKD = SFT on the teacher's responses, sampled beforehand
    path = REPO / "configs" / "methods" / f"{name}.yaml"
    init = OmegaConf.to_container(compose(yaml.safe_load(path.read_text()), path.parent, ()), resolve=True)
    init = dict(init["model"]["init_args"])
    if method in ("gkd", "distillm", "abkd", "mgsr"):
        init["regime"] = {**init.get("regime", {}), "name": "on_policy"}
    if method == "gkd":
        init["distill"] = {**init["distill"], "params": {"beta": 0.5}}  # TRL's runs below use beta 0.5
    kwargs = {"sft_weight": init.get("sft_weight", 1.0), "sft_on": init.get("sft_on", "ground_truth")}
    kwargs["distill"] = DistillLoss(**init["distill"]) if init.get("distill") else None
    kwargs["span"] = SpanLoss(**init.get("span", {}))
    kwargs["regime"] = RegimeConfig(**init.get("regime", {}))
    kwargs["scrg"] = ScrgConfig(**init["scrg"]) if init.get("scrg") else None
    kwargs["minillm"] = MiniLLMConfig(**init["minillm"]) if init.get("minillm") else None
    kwargs["uses_teacher"] = "teacher" not in init or init["teacher"] is not None
    return kwargs


def run_ours(method: str, work: Path, args: argparse.Namespace) -> dict:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    from mgsr_lightning.batch import Rollout
    from mgsr_lightning.generation.decode import Decoding, sample
    from mgsr_lightning.generation.sampling import SamplingConfig
    from mgsr_lightning.models.loading import ModelSource
    from mgsr_lightning.module import DistillLightningModule
    from mgsr_lightning.seeding import example_seeds
    from mgsr_lightning.training.optim import OptimizerConfig

    kwargs = method_kwargs(method)
    uses_teacher = kwargs.pop("uses_teacher")
    kwargs["fused_head"] = not args.unfused
    examples = json.loads((work / "data.json").read_text())
    n_batches = args.warmup + args.steps
    batches = []
    for b in range(n_batches):
        chunk = examples[b * args.batch_size : (b + 1) * args.batch_size]
        rollout = Rollout.from_token_lists([e["prompt"] for e in chunk], [e["response"] for e in chunk],
                                           pad_token_id=1)
        example_index = torch.arange(b * args.batch_size, (b + 1) * args.batch_size)
        batches.append(rollout.tensors() | {"example_index": example_index})

    sampling = SamplingConfig(max_new_tokens=args.new_tokens)
    one_off_seconds = 0.0
    if method == "seqkd":  # the teacher's responses, sampled once before training (what the SeqKD cache holds)
        from transformers import AutoModelForCausalLM

        teacher = AutoModelForCausalLM.from_pretrained(str(work / "teacher"))
        decoding = Decoding(sampling, eos_token_id=0, pad_token_id=1, vocab_size=4096)
        started = time.perf_counter()
        for batch in batches:
            answer = sample(teacher, batch["prompt_ids"], batch["prompt_mask"], decoding,
                            seeds=example_seeds(0, batch["example_index"]))
            batch["response_ids"], batch["response_mask"] = answer.response_ids, answer.response_mask
        one_off_seconds = (time.perf_counter() - started) / (n_batches * args.batch_size)
        del teacher

    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(work / "student")),
        teacher=ModelSource(name_or_path=str(work / "teacher")) if uses_teacher else None,
        tokenizer=str(work / "tokenizer"), max_length=32 + args.new_tokens, sampling=sampling,
        optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, warmup_steps=0, schedule="constant"),
        **kwargs,
    )
    ends: list[float] = []
    step_metrics: list[dict] = []

    class StepEnds(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ends.append(time.perf_counter())
            step_metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()
                                 if k.startswith(("scrg/", "rollout/"))})

    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=n_batches, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[StepEnds()],
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    trainer.fit(module, train_dataloaders=loader)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("scrg/", "rollout/"))}
    result = {"step_ends": ends, "one_off_seconds_per_sample": one_off_seconds, "last_metrics": metrics,
              "step_metrics": step_metrics[args.warmup:]}
    if kwargs["scrg"] is not None:
        result["teacher_seconds_per_token"] = teacher_seconds_per_token(module, batches[0], sampling)
    if module.objective.sft_on_ground_truth and module.scrg is not None:
        result["ground_truth_ce_seconds"] = ground_truth_ce_seconds(module, batches[0])
    return result


def ground_truth_ce_seconds(module, batch: dict) -> float:
    """The SFT term's own work in a step that trains on other sequences: the student's forward over the batch's
    ground truth, its cross-entropy and the backward through the student (median of 5)."""
    from mgsr_lightning.batch import Rollout
    from mgsr_lightning.generation.scoring import response_logits
    from mgsr_lightning.losses.objective import response_cross_entropy

    ground_truth = Rollout.from_batch(batch)
    seconds = []
    for _ in range(5):
        module.student.zero_grad(set_to_none=True)
        started = time.perf_counter()
        logits = response_logits(module.student, ground_truth, module.vocab_size)
        response_cross_entropy(logits, ground_truth).backward()
        seconds.append(time.perf_counter() - started)
    module.student.zero_grad(set_to_none=True)
    return statistics.median(seconds)


def teacher_seconds_per_token(module, batch: dict, sampling) -> float:
    """The teacher's forward time per column of a rollout (prompt + response, batch rows), median of 5."""
    import torch

    from mgsr_lightning.generation.decode import sample
    from mgsr_lightning.generation.scoring import response_logits
    from mgsr_lightning.seeding import example_seeds

    rollout = sample(module.student, batch["prompt_ids"], batch["prompt_mask"], module.decoding,
                     seeds=example_seeds(0, batch["example_index"]))
    seconds = []
    with torch.no_grad():
        for _ in range(5):
            started = time.perf_counter()
            response_logits(module.teacher, rollout, module.vocab_size)
            seconds.append(time.perf_counter() - started)
    columns = rollout.batch_size * (rollout.prompt_ids.size(1) + rollout.response_ids.size(1))
    return statistics.median(seconds) / columns


# ---- one run: TRL ---------------------------------------------------------------------------------


def run_trl(method: str, work: Path, args: argparse.Namespace) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    examples = json.loads((work / "data.json").read_text())[: args.batch_size * (args.warmup + args.steps)]
    tokenizer = AutoTokenizer.from_pretrained(str(work / "tokenizer"))
    student = AutoModelForCausalLM.from_pretrained(str(work / "student"))
    teacher = AutoModelForCausalLM.from_pretrained(str(work / "teacher"))
    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, train_args, state, control, **kwargs):
            ends.append(time.perf_counter())

    common = dict(
        output_dir=str(work / "trl_out" / method), per_device_train_batch_size=args.batch_size, learning_rate=1e-4,
        max_steps=args.warmup + args.steps, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, dataloader_num_workers=0, seed=0,
    )
    if method == "sft":
        from trl import SFTConfig, SFTTrainer

        data = Dataset.from_list([{"prompt": texts(e["prompt"]), "completion": " " + texts(e["response"][:-1])}
                                  for e in examples])
        config = SFTConfig(**common, max_length=None, completion_only_loss=True, shuffle_dataset=False)
        trainer = SFTTrainer(model=student, args=config, train_dataset=data, processing_class=tokenizer,
                             callbacks=[StepEnds()])
    elif method == "distillation":
        from trl import DistillationConfig, DistillationTrainer

        data = Dataset.from_list([{"prompt": texts(e["prompt"])} for e in examples])
        config = DistillationConfig(**common, max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0,
                                    top_k=0, beta=0.5, shuffle_dataset=False, disable_dropout=True)
        trainer = DistillationTrainer(model=student, teacher_model=teacher, args=config, train_dataset=data,
                                      processing_class=tokenizer, callbacks=[StepEnds()])
    else:
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        data = Dataset.from_list([{"messages": [{"role": "user", "content": texts(e["prompt"])},
                                                {"role": "assistant", "content": texts(e["response"][:-1])}]}
                                  for e in examples])
        lmbda, beta, seq_kd = {"gkd_on_policy": (1.0, 0.5, False), "gkd_off_policy": (0.0, 0.0, False),
                               "seqkd": (0.0, 0.0, True)}[method]
        config = GKDConfig(**common, lmbda=lmbda, beta=beta, seq_kd=seq_kd, max_new_tokens=args.new_tokens,
                           temperature=1.0, max_length=256, disable_dropout=True)
        trainer = GKDTrainer(model=student, teacher_model=teacher, args=config, train_dataset=data,
                             processing_class=tokenizer, callbacks=[StepEnds()])
        # GKDTrainer samples with top_k=0 and T=1 like ours; no EOS stop differences: the random pair rarely ends
    trainer.train()
    return {"step_ends": ends, "one_off_seconds_per_sample": 0.0, "last_metrics": {}}


def worker(spec: str, args: argparse.Namespace) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    side, method = spec.split(":")
    work = Path(args.work)
    result = (run_ours if side == "ours" else run_trl)(method, work, args)
    ends = result.pop("step_ends")[args.warmup - 1 :] if args.warmup > 0 else [None]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    result |= {
        "seconds_per_step": statistics.median(gaps) if gaps else float("nan"),
        "timed_steps": len(gaps),
        "peak_rss_mib": _peak_rss_mib(),
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "versions": {"torch": torch.__version__, **_versions()},
    }
    print("RESULT " + json.dumps(result), flush=True)


def _peak_rss_mib() -> float:
    """This process's peak resident memory, MiB: ``VmHWM`` of its own address space.

    Not ``getrusage().ru_maxrss``: Linux carries that figure over ``fork`` and ``execve``, so a worker
    spawned by a parent holding the pretrained models would report at least the parent's peak."""
    try:
        return status_kib("VmHWM") / 1024
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: the portable figure


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("transformers", "trl", "lightning"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


# ---- the driver -----------------------------------------------------------------------------------


def spawn(python: str, spec: str, args: argparse.Namespace) -> dict:
    command = [python, str(Path(__file__).resolve()), "--worker", spec, "--work", args.work,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch_size", str(args.batch_size),
               "--new_tokens", str(args.new_tokens)] + (["--threads", str(args.threads)] if args.threads else []) + (
               ["--unfused"] if args.unfused else [])
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONWARNINGS="ignore")
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{spec} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def summary(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    median = statistics.median(values)
    return f"{median:{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]" if len(values) > 1 else f"{median:{fmt}}"


def table(runs: dict[str, list[dict]], args: argparse.Namespace) -> str:
    def column(spec: str, key: str, scale=lambda x: x) -> list[float]:
        return [scale(run[key]) for run in runs.get(spec, [])]

    per_sample = lambda s: s / args.batch_size  # noqa: E731
    lines = [
        "| Method | Ours: s/sample | steps/s | peak RSS MiB | one-off s/sample | TRL trainer | TRL: s/sample "
        "| steps/s | peak RSS MiB | ours/TRL steps/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in dict.fromkeys(r for r, _, _ in JOBS):
        ours = [m for r, side, m in JOBS if r == row and side == "ours" and f"ours:{m}" in runs]
        trls = [m for r, side, m in JOBS if r == row and side == "trl" and f"trl:{m}" in runs] or [None]
        for i, trl in enumerate(trls):
            cells = [row if i == 0 else ""]
            if ours and i == 0:
                spec = f"ours:{ours[0]}"
                cells += [summary(column(spec, "seconds_per_step", per_sample), ".4f"),
                          summary(column(spec, "seconds_per_step", lambda s: 1 / s), ".2f"),
                          summary(column(spec, "peak_rss_mib"), ".0f"),
                          summary(column(spec, "one_off_seconds_per_sample"), ".4f") if ours[0] == "seqkd" else "—"]
            else:
                cells += ["", "", "", ""] if i else ["—"] * 4
            if trl is None:
                cells += ["—"] * 5
            else:
                spec = f"trl:{trl}"
                cells += [TRL_NAMES[trl], summary(column(spec, "seconds_per_step", per_sample), ".4f"),
                          summary(column(spec, "seconds_per_step", lambda s: 1 / s), ".2f"),
                          summary(column(spec, "peak_rss_mib"), ".0f")]
                if ours:
                    ratio = statistics.median(column(spec, "seconds_per_step")) / statistics.median(
                        column(f"ours:{ours[0]}", "seconds_per_step"))
                    cells.append(f"{ratio:.2f}×")
                else:
                    cells.append("—")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(runs: dict[str, list[dict]]) -> list[str]:
    def median_step(spec: str) -> float | None:
        values = [run["seconds_per_step"] for run in runs.get(spec, [])]
        return statistics.median(values) if values else None

    lines = []
    ours_gkd, trl_distill = median_step("ours:gkd"), median_step("trl:distillation")
    if ours_gkd and trl_distill:
        ratio = trl_distill / ours_gkd
        lines.append(f"- GKD on-policy, ours vs TRL DistillationTrainer: {ratio:.2f}× its steps/s "
                     f"(target ≥ 1.5×: {'met' if ratio >= 1.5 else 'missed'})")
    mgsr, distillm = median_step("ours:mgsr"), median_step("ours:distillm")
    floors = [mgsr_floor_parts(run) for run in runs.get("ours:mgsr", [])]
    floors = [f for f in floors if f is not None]
    if mgsr and distillm and floors:
        extra = statistics.median(f["floor_extra"] for f in floors)
        floor = distillm + extra
        ratio = mgsr / floor
        parts = {k: statistics.median(f[k] for f in floors) for k in floors[0]}
        lines.append(f"- MGSR step / its floor: {ratio:.2f}× ({mgsr:.3f} s against {floor:.3f} s = DistiLLM's step "
                     f"{distillm:.3f} s + the ground-truth CE's student forward and backward "
                     f"{parts['ground_truth_ce']:.3f} s + {parts['regenerated_tokens']:.0f} re-generated tokens "
                     f"per step × "
                     f"({1e3 * parts['rollout_per_token']:.2f} ms rollout + {1e3 * parts['teacher_per_token']:.2f} ms "
                     f"teacher forward per token)) (target ≤ 1.15×: {'met' if ratio <= 1.15 else 'missed'}); "
                     f"MGSR / DistiLLM {mgsr / distillm:.2f}×")
        lines.append(f"- rows SCRG leaves unchanged: {100 * parts['unchanged_fraction']:.0f}% "
                     f"(error at response token {parts['error_position']:.1f} on average)")
        if ratio > 1.15:
            rest = mgsr - parts["rollout_seconds"] - parts["scrg_seconds"]
            lines.append(f"  profile of MGSR's step (medians): rollout {parts['rollout_seconds']:.3f} s, SCRG "
                         f"{parts['scrg_seconds']:.3f} s (of which the floor's re-generation and teacher share "
                         f"{extra - parts['ground_truth_ce']:.3f} s; the rest is the teacher's scoring forward over "
                         f"the rollout, the error search and the re-generation's per-call overhead), "
                         f"losses + backward + optimiser {rest:.3f} s (MGSR's objective: the SFT term's "
                         f"student forward over the ground truth, DAC-KL with ClipNet, the span term) against "
                         f"DistiLLM's whole step {distillm:.3f} s")
    return lines


def mgsr_floor_parts(run: dict) -> dict | None:
    """Per-step medians of an MGSR run's SCRG figures and the floor's extra seconds over DistiLLM's step:
    the ground-truth CE's student forward and backward when MGSR's objective has it, and the re-generated tokens at
    the rollout's own cost per sampled token plus the teacher's forward over them."""
    steps = [m for m in run.get("step_metrics", []) if "scrg/regenerated_tokens" in m and "rollout/seconds" in m]
    if not steps or "teacher_seconds_per_token" not in run:
        return None
    ground_truth_ce = run.get("ground_truth_ce_seconds", 0.0)
    batch = run["batch_size"]
    rollout_per_token = statistics.median(m["rollout/seconds"] / max(m["rollout/response_tokens"] * batch, 1)
                                          for m in steps)
    regenerated = statistics.median(m["scrg/regenerated_tokens"] for m in steps)
    teacher_per_token = run["teacher_seconds_per_token"]
    return {
        "floor_extra": regenerated * (rollout_per_token + teacher_per_token) + ground_truth_ce,
        "ground_truth_ce": ground_truth_ce,
        "regenerated_tokens": regenerated, "rollout_per_token": rollout_per_token,
        "teacher_per_token": teacher_per_token,
        "unchanged_fraction": statistics.median(m["scrg/unchanged_fraction"] for m in steps),
        "error_position": statistics.median(m["scrg/mean_error_position"] for m in steps),
        "rollout_seconds": statistics.median(m["rollout/seconds"] for m in steps),
        "scrg_seconds": statistics.median(m["scrg/seconds"] for m in steps),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args)
        return
    args.work = f"{args.work}_pretrain{args.pretrain_steps}"  # models trained differently never share a folder
    prepare(Path(args.work), args.batch_size, args.warmup + args.steps, args.pretrain_steps)
    only = set(args.only.split(",")) if args.only else None
    jobs = [(row, side, m) for row, side, m in JOBS
            if (side == "ours" or args.trl_python) and (only is None or row.lower() in only or m in only)]
    # Alternate sides within each round: ours, TRL, ours, TRL, ...
    ours_jobs = [j for j in jobs if j[1] == "ours"]
    trl_jobs = [j for j in jobs if j[1] == "trl"]
    order = [j for pair in zip(ours_jobs, trl_jobs) for j in pair]
    order += ours_jobs[len(trl_jobs):] + trl_jobs[len(ours_jobs):]
    runs: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        for row, side, method in (order if round_index % 2 == 0 else order[::-1]):
            spec = f"{side}:{method}"
            result = spawn(args.trl_python if side == "trl" else sys.executable, spec, args)
            runs.setdefault(spec, []).append(result)
            if args.progress:
                print(f"round {round_index + 1}/{args.rounds} {spec:<22} {1 / result['seconds_per_step']:6.2f} steps/s "
                      f"peak RSS {result['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
    threads = next(iter(runs.values()))[0]["threads"]
    header = (f"Pair pretrained {args.pretrain_steps} steps on the made-up language; "
              f"batch {args.batch_size}, {args.new_tokens} new tokens, fp32 CPU, torch threads {threads} "
              f"(os.cpu_count() = {os.cpu_count()}); {args.rounds} alternating rounds of {args.warmup} warm-up + "
              f"{args.steps} timed steps; median [min–max] over rounds.")
    text = "\n".join([header, "", table(runs, args), "", *targets(runs)])
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(text + "\n")
        (out / "runs.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
