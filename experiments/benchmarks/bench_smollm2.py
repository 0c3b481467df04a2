"""Seconds per step, its parts, and peak memory of SFT, KD, GKD, DistiLLM and MGSR on the SmolLM2 pair, on a CPU.

    python -m mgsr_lightning prepare-smollm2          # once
    python experiments/benchmarks/bench_smollm2.py               # 4 x 128 tokens, 5 timed steps per method
    python experiments/benchmarks/bench_smollm2.py --methods kd mgsr --steps 10

Each method runs real Lightning training steps of ``configs/smollm2/<method>.yaml`` under
``configs/common/cpu.yaml`` (fp32, the teacher in fp32) in a fresh subprocess, at a batch of
``--batch`` sequences of at most ``--length`` tokens (prompts up to ``--length`` − ``--new-tokens``,
rollouts of ``--new-tokens``). Methods that can train on student outputs are made to sample on every
step, so the figures are those of a sampling step: GKD on-policy (``lmbda`` 1), DistiLLM and MGSR
with the adaptive threshold at 1 (the replay buffer is far from full, so every draw samples afresh);
their ground-truth steps cost about what a KD step does. Per step it reports the wall time and its
parts: the student rollout (``rollout/seconds``), SCRG (``scrg/seconds``: teacher and student
scoring, correction, re-generation), the loss terms' forward (the objective), and the rest (the
teacher's and student's forwards over the training sequences, backward, optimizer). Peak RSS is the
subprocess's high-water mark (``VmHWM``): models, optimizer state and the step together. "CPU s" is
the process's CPU time per step: on a machine whose cores are shared, wall time also counts waiting,
and the CPU time is the figure that compares across runs (with one torch thread it is at most the wall time).

The losses' memory at V = 49,152: the distillation and span terms run in chunks of ``--chunk-size``
positions (the configs' 1,024 is one chunk at this batch: B·R = 160 response positions), and MGSR
runs a second time with ``chunk_size: null`` (the naive path: every [B, R, V] intermediate at once);
both peaks are printed. For the loss alone, at more positions, see
``experiments/benchmarks/bench_loss_memory.py --vocab 49152``.
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

from proc_memory import status_kib  # the folder of these scripts (see proc_memory.py)

REPO = Path(__file__).resolve().parents[2]
METHODS = ("sft", "kd", "gkd", "distillm", "mgsr")
SAMPLING = {  # overrides that make a sampling method sample on every step
    "gkd": ["--model.init_args.regime.lmbda=1.0"],
    "distillm": ["--model.init_args.regime.init_threshold=1.0"],
    "mgsr": ["--model.init_args.regime.init_threshold=1.0"],
}
LABELS = {"sft": "SFT", "kd": "KD", "gkd": "GKD (on-policy)", "distillm": "DistiLLM", "mgsr": "MGSR",
          "mgsr_naive": "MGSR, unchunked losses"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per method (after --warmup)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128, help="prompt + response tokens")
    parser.add_argument("--new-tokens", type=int, default=40, help="sampled response tokens")
    parser.add_argument("--chunk-size", type=int, default=32,
                        help="positions per loss chunk (distillation and span terms)")
    parser.add_argument("--no-naive", action="store_true", help="skip MGSR's unchunked run")
    parser.add_argument("--paths", nargs="+", default=["fused"], choices=["fused", "unfused"],
                        help="the step's loss head: fused (the default, fused_head: true) and/or unfused (whole "
                             "logits); with both, each method runs both ways, one after the other")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "CHUNK", "PATH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, method: str, chunked: bool, fused: bool) -> dict:
    """In the child: run the steps and return the means per step and the peak RSS. "loss" times the loss terms:
    unfused, the objective over whole logits (its backward is in the rest); fused, the fused head's calls, which
    compute the head's logits and the gradients chunk by chunk (their backward is nearly free)."""
    from lightning.pytorch.callbacks import Callback

    from mgsr_lightning.cli.lightning_cli import PARSER_MODE, DistillCLI
    from mgsr_lightning.data.datamodule import InstructionDataModule
    from mgsr_lightning.losses import fused_objective
    from mgsr_lightning.losses.objective import Objective
    from mgsr_lightning.module import DistillLightningModule

    loss_seconds: list[float] = []

    def timed(function):
        def call(*call_args, **kwargs):
            started = time.perf_counter()
            result = function(*call_args, **kwargs)
            loss_seconds.append(time.perf_counter() - started)
            return result
        return call

    if fused:
        fused_objective.fused_head_loss = timed(fused_objective.fused_head_loss)
    else:
        Objective.__call__ = timed(Objective.__call__)

    class StepTimer(Callback):
        def __init__(self):
            self.rows: list[dict[str, float]] = []
            self.fresh_before = 0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.started = time.perf_counter()
            self.cpu_started = time.process_time()
            self.losses_before = len(loss_seconds)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("rollout/", "scrg/"))}
            # rollout and SCRG metrics are logged by sampling steps only; other steps keep stale values
            fresh = module.regime.source_counts["fresh"] > self.fresh_before
            self.fresh_before = module.regime.source_counts["fresh"]
            row = {"step": time.perf_counter() - self.started, "cpu": time.process_time() - self.cpu_started,
                   "loss": sum(loss_seconds[self.losses_before:])}
            if fresh:
                row |= logged
            self.rows.append(row)

    overrides = [
        "--config", str(REPO / "configs" / "smollm2" / f"{method}.yaml"),
        "--config", str(REPO / "configs" / "common" / "cpu.yaml"),
        f"--data.batch_size={args.batch}", f"--data.max_length={args.length}",
        f"--data.max_prompt_length={args.length - args.new_tokens}",
        f"--model.init_args.sampling.max_new_tokens={args.new_tokens}",
        f"--trainer.max_steps={args.steps + args.warmup}", "--trainer.limit_val_batches=0", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]", "--model.init_args.export_dir=null",
        "--trainer.enable_progress_bar=false", f"--model.init_args.fused_head={str(fused).lower()}",
        *SAMPLING.get(method, []),
    ]
    chunk = args.chunk_size if chunked else "null"
    if method != "sft":  # SFT has no distillation term to chunk
        overrides += [f'--model.init_args.distill={{"chunk_size": {chunk}}}',
                      f'--model.init_args.span={{"chunk_size": {chunk}}}']
    cli = DistillCLI(DistillLightningModule, InstructionDataModule, subclass_mode_model=True,
                     parser_kwargs={"parser_mode": PARSER_MODE}, save_config_callback=None, run=False, args=overrides)
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    rows = timer.rows[args.warmup:]

    def mean(key: str) -> float:
        return statistics.fmean(row.get(key, 0.0) for row in rows)

    return {"steps": len(rows), "step": mean("step"), "cpu": mean("cpu"), "rollout": mean("rollout/seconds"),
            "scrg": mean("scrg/seconds"),
            "loss": mean("loss"), "response_tokens": mean("rollout/response_tokens"),
            "peak_rss_gib": status_kib("VmHWM") / 2**20}


def run_child(argv: list[str], method: str, chunked: bool, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, __file__, *argv, "--child", method, "chunked" if chunked else "naive", path],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args, args.child[0], args.child[1] == "chunked", args.child[2] == "fused")))
        return
    print(f"SmolLM2-135M-Instruct (30 layers) -> 6-layer student, CPU fp32, batch {args.batch} x {args.length} tokens, "
          f"rollouts of {args.new_tokens} tokens, torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}; "
          f"means of {args.steps} steps after {args.warmup} warm-up")
    print(f"{'method':<34}{'s/step':>8}{'CPU s':>7}{'rollout':>9}{'SCRG':>8}{'losses':>8}{'rest':>8}"
          f"{'gen. share':>11}{'peak RSS':>10}")
    runs = [(method, True, path) for method in args.methods for path in args.paths]
    if "mgsr" in args.methods and not args.no_naive:
        runs += [("mgsr", False, path) for path in args.paths]
    for method, chunked, path in runs:
        label = LABELS[method if chunked else "mgsr_naive"] + (f", {path}" if len(args.paths) > 1 else "")
        try:
            r = run_child(argv, method, chunked, path)
        except RuntimeError as error:
            print(f"{label:<34} failed: {error}")
            continue
        rest = r["step"] - r["rollout"] - r["scrg"] - r["loss"]
        generation = (r["rollout"] + r["scrg"]) / r["step"]
        print(f"{label:<34}{r['step']:>8.2f}{r['cpu']:>7.2f}{r['rollout']:>9.2f}{r['scrg']:>8.2f}{r['loss']:>8.2f}{rest:>8.2f}"
              f"{100 * generation:>10.0f}%{r['peak_rss_gib']:>8.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
