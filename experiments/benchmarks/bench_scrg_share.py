"""Time share of SCRG in an MGSR training step, and SCRG's correction statistics, on the tiny pair.

    python experiments/benchmarks/bench_scrg_share.py                      # 30 steps, fresh student outputs every step
    python experiments/benchmarks/bench_scrg_share.py --steps 60 --config configs/tiny/mgsr.yaml

Runs real Lightning training steps of ``configs/tiny/mgsr.yaml`` with the regime forced to
``on_policy`` (so every step samples a rollout and revises it; in the default adaptive regime only a
share of steps does) and reports, per step: wall time, the student rollout, SCRG (teacher + student
scoring, correction, batched re-generation), and the rest (losses, backward, optimizer). Needs the
embedded default (``python -m mgsr_lightning prepare-tiny``). The first 3 steps are warm-up and
not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from lightning.pytorch.callbacks import Callback

from mgsr_lightning.cli.lightning_cli import PARSER_MODE, DistillCLI
from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.module import DistillLightningModule

WARMUP = 3


class StepTimer(Callback):
    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # on-policy: every step logs its rollout's timings and SCRG's statistics afresh
        logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("rollout/", "scrg/"))}
        self.rows.append({"step": time.perf_counter() - self.started, **logged})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny/mgsr.yaml")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    cli = DistillCLI(
        DistillLightningModule, InstructionDataModule, subclass_mode_model=True,
        parser_kwargs={"parser_mode": PARSER_MODE}, save_config_callback=None, run=False,
        args=[
            "--config", args.config, "--model.init_args.regime.name=on_policy", f"--data.batch_size={args.batch_size}",
            f"--trainer.max_steps={args.steps + WARMUP}", "--trainer.limit_val_batches=0", "--trainer.logger=false",
            "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]", "--model.init_args.export_dir=null",
            "--trainer.enable_progress_bar=false",
        ],
    )
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    rows = timer.rows[WARMUP:]

    def mean(key: str) -> float:
        return statistics.fmean(row.get(key, 0.0) for row in rows)

    step, rollout, scrg = mean("step"), mean("rollout/seconds"), mean("scrg/seconds")
    print(f"{len(rows)} steps of {args.config} (on-policy, batch {args.batch_size}), means per step:")
    print(f"  step wall time            {step:.3f} s")
    print(f"  student rollout           {rollout:.3f} s  ({100 * rollout / step:.1f}% of the step)")
    print(f"  SCRG (score, correct, re-generate) {scrg:.3f} s  ({100 * scrg / step:.1f}% of the step)")
    print(f"  losses + backward + optimizer {step - rollout - scrg:.3f} s  "
          f"({100 * (step - rollout - scrg) / step:.1f}%)")
    print("SCRG corrections:")
    print(f"  rows corrected            {100 * mean('scrg/corrected_fraction'):.1f}%")
    print(f"  mean error position       {mean('scrg/mean_error_position'):.2f} (response token index)")
    print(f"  mean tokens re-generated  {mean('scrg/mean_regenerated_tokens'):.2f} per corrected row")
    print(f"  mean rollout length       {mean('rollout/response_tokens'):.2f} tokens")


if __name__ == "__main__":
    main()
