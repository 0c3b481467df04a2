"""Training throughput on one GPU: bf16-mixed, DDP and FSDP, KD (off-policy), DistiLLM and MGSR (generating every step).

    python experiments/benchmarks/bench_gpu.py --out results/gpu           # needs a CUDA device
    python experiments/benchmarks/bench_gpu.py --out results/gpu --compile  # also with the decode loop's step compiled
    python experiments/benchmarks/bench_gpu.py --steps 4 --warmup 1 --small  # a quick CPU smoke run of the same path

Runs real ``fit`` calls of the tiny configs (``configs/tiny/kd.yaml``, ``configs/tiny/mgsr.yaml``)
with GPU-sized, config-built GPT-2 models (teacher 12 layers d=768, student 6 layers d=512 by
default: the GPT-2 base and a half-size student), the embedded task's data and a locally trained
BPE tokenizer, so nothing is downloaded. DistiLLM and MGSR run with the ``on_policy`` regime so that
every step samples a rollout (MGSR then revises it with SCRG): the worst case for speed; the default
adaptive schedule generates in a share of the steps. Rollouts use the decode loop's static KV cache;
``--compile`` adds a run of each sampling method with ``decoding.compile: true`` (the one-token step
under torch.compile, a CUDA graph on a GPU; the first steps pay the compilation, so give it warm-up).
Each (method, strategy, decode step) runs in its own process; the first
``--warmup`` steps are not timed. Prints a markdown table: seconds per step, sequences per second,
peak GPU memory, and for MGSR the rollout's and SCRG's shares of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPT2_BLOCK = "transformers.models.gpt2.modeling_gpt2.GPT2Block"
SAMPLING_METHODS = ("distillm", "mgsr")  # methods that sample a rollout at every step here
STRATEGIES = {
    "ddp": ["--trainer.strategy=ddp"],
    "fsdp": [
        "--trainer.strategy.class_path=mgsr_lightning.training.strategies.DecoderLayerFSDP",
        f"--trainer.strategy.init_args.layer_classes=[{GPT2_BLOCK}]",
    ],
}


def prepare(root: Path, vocab_size: int) -> None:
    """The embedded task's data and a BPE tokenizer under ``root`` (no teacher training)."""
    from mgsr_lightning.data.records import read_jsonl
    from mgsr_lightning.data.tasks.tiny import write_tiny_dataset
    from mgsr_lightning.data.templates import render_prompt
    from mgsr_lightning.models.tokenizer import train_bpe_tokenizer

    if not (root / "tokenizer" / "tokenizer.json").is_file():
        write_tiny_dataset(root / "data", {"train": 4000, "validation": 64, "test": 64}, 0)
        texts = [render_prompt(r, "alpaca") + r["output"] for r in read_jsonl(root / "data" / "train.jsonl")]
        train_bpe_tokenizer(texts, vocab_size=vocab_size, save_dir=root / "tokenizer", model_max_length=256)


def run_one(args: argparse.Namespace) -> None:
    """One fit in this process; writes its timings as JSON to ``args.result``."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from mgsr_lightning.cli.lightning_cli import run_cli

    cuda = torch.cuda.is_available()

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.rollout: list[float] = []
            self.scrg: list[float] = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if cuda:
                torch.cuda.synchronize()
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if cuda:
                torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self.started)
            metrics = trainer.callback_metrics
            self.rollout.append(float(metrics.get("rollout/seconds", 0.0)))
            self.scrg.append(float(metrics.get("scrg/seconds", 0.0)))

    teacher = {"model_type": "gpt2", "n_layer": args.teacher_layers, "n_embd": args.teacher_width,
               "n_head": args.teacher_width // 64, "n_positions": 256}
    student = {"model_type": "gpt2", "n_layer": args.student_layers, "n_embd": args.student_width,
               "n_head": args.student_width // 64, "n_positions": 256}
    overrides = [
        "--config", str(REPO / "configs" / "tiny" / f"{args.method}.yaml"),
        f"--trainer.accelerator={'gpu' if cuda else 'cpu'}", "--trainer.devices=1",
        f"--trainer.precision={'bf16-mixed' if cuda else '32-true'}",
        f"--trainer.max_steps={args.steps + args.warmup}", "--trainer.limit_val_batches=0",
        "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]",
        "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1",
        "--model.init_args.export_dir=null",
        "--model.init_args.teacher="
        f"{json.dumps({'name_or_path': None, 'config': teacher, 'dtype': 'bfloat16' if cuda else 'float32'})}",
        f"--model.init_args.student={json.dumps({'config': student})}",
        f"--model.init_args.sampling.max_new_tokens={args.max_new_tokens}",
        f"--data.batch_size={args.batch_size}", "--data.max_length=160", "--data.max_prompt_length=96",
        *STRATEGIES[args.strategy],
    ]
    if args.method in SAMPLING_METHODS:
        overrides.append("--model.init_args.regime.name=on_policy")
    overrides += ["--model.init_args.decoding.static_cache=true",
                  f"--model.init_args.decoding.compile={str(args.decode == 'compiled').lower()}"]
    cli = run_cli(overrides, run=False)
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    cli.trainer.fit(cli.model, cli.datamodule)
    timed = slice(args.warmup, None)
    step = statistics.median(timer.seconds[timed])
    result = {
        "method": args.method, "strategy": args.strategy, "decode": args.decode, "steps": len(timer.seconds[timed]),
        "s_per_step": step, "sequences_per_s": args.batch_size / step,
        "rollout_share": statistics.fmean(timer.rollout[timed]) / statistics.fmean(timer.seconds[timed]),
        "scrg_share": statistics.fmean(timer.scrg[timed]) / statistics.fmean(timer.seconds[timed]),
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "student_params_m": sum(p.numel() for p in cli.model.student.parameters()) / 1e6,
        "teacher_params_m": sum(p.numel() for p in cli.model.teacher.parameters()) / 1e6,
    }
    Path(args.result).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench_gpu")
    parser.add_argument("--methods", default="kd,distillm,mgsr")
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--small", action="store_true", help="tiny models, for a CPU smoke run")
    parser.add_argument("--compile", action="store_true",
                        help="also run each sampling method with the decode loop's one-token step compiled")
    parser.add_argument("--decode", default="static", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = (2, 128, 1, 64) if args.small else (12, 768, 6, 512)
    args.teacher_layers, args.teacher_width, args.student_layers, args.student_width = sizes
    if args.result:
        run_one(args)
        return

    out = Path(args.out).resolve()
    root = out / "artifacts"
    prepare(root, args.vocab_size)
    env = dict(os.environ, MGSR_TINY_DIR=str(root), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    rows = []
    runs = [(method, strategy, decode) for method in args.methods.split(",") for strategy in args.strategies.split(",")
            for decode in (("static", "compiled") if args.compile and method in SAMPLING_METHODS else ("static",))]
    for method, strategy, decode in runs:
        result = out / f"{method}-{strategy}-{decode}.json"
        command = [sys.executable, __file__, "--method", method, "--strategy", strategy, "--result", str(result),
                   "--decode", decode, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--batch_size", str(args.batch_size),
                   "--max_new_tokens", str(args.max_new_tokens)] + (["--small"] if args.small else [])
        started = time.perf_counter()
        completed = subprocess.run(command, env=env, cwd=out, capture_output=True, text=True)
        if completed.returncode != 0:
            print(f"{method}/{strategy}/{decode} failed:\n{completed.stderr[-3000:]}", flush=True)
            continue
        rows.append(json.loads(result.read_text()))
        print(f"{method}/{strategy}/{decode}: {time.perf_counter() - started:.0f} s wall", flush=True)
    if not rows:
        sys.exit("no run finished")
    first = rows[0]
    lines = [
        f"{first['device']}, teacher {first['teacher_params_m']:.1f} M, student {first['student_params_m']:.1f} M "
        f"parameters, batch {args.batch_size}, {args.max_new_tokens} new tokens, medians of {first['steps']} steps",
        "",
        "| method | strategy | decode step | s/step | sequences/s | rollout share | SCRG share | peak GPU GiB |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        decode = r["decode"] if r["method"] in SAMPLING_METHODS else "—"
        lines.append(f"| {r['method']} | {r['strategy']} | {decode} | {r['s_per_step']:.3f} | "
                     f"{r['sequences_per_s']:.1f} | "
                     f"{100 * r['rollout_share']:.0f}% | {100 * r['scrg_share']:.0f}% | {r['peak_gpu_gib']:.2f} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
