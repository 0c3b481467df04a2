"""What a teacher cache saves and what it costs, on the tiny pair (``prepare-tiny``).

1. Cache size on disk per million response tokens at each k (``cache-teacher`` over the first ``--rows``
   training rows).
2. The loss error of a sparse teacher at each k: KD's forward KL and MGSR's DAC-KL (α-β base, ClipNet at
   its start) of the tiny config's student (random init) against the teacher densified from the cache,
   relative to the live teacher's, over the cached rows.
3. KD and MGSR (``configs/tiny/kd.yaml``, ``mgsr.yaml``) for ``--steps`` steps with the cache and with the
   live teacher, each in its own process: median seconds per step after the first two, and peak RSS.
The SmolLM2 pair is measured too when ``artifacts/smollm2`` exists; otherwise the script says why not.

    python experiments/benchmarks/bench_teacher_cache.py --out runs/bench_teacher_cache
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("MGSR_TINY_DIR", REPO / "artifacts" / "tiny"))


def _fit_args(method: str, rows: int, steps: int, out: Path) -> list[str]:
    return ["--config", str(REPO / "configs" / "tiny" / f"{method}.yaml"), f"--data.max_train_examples={rows}",
            f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0", "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}",
            f"--trainer.logger.init_args.save_dir={out}", f"--model.init_args.export_dir={out}/hf"]


def one_run(method: str, cache: str | None, rows: int, steps: int, out: Path) -> None:
    """In a child process: fit ``method`` and print its step times and peak RSS as one JSON line."""
    from mgsr_lightning.cli import run_cli
    from mgsr_lightning.module import DistillLightningModule

    times: list[float] = []
    original = DistillLightningModule.training_step

    def timed(self, batch, batch_idx):
        start = time.perf_counter()
        loss = original(self, batch, batch_idx)
        times.append(time.perf_counter() - start)
        return loss

    DistillLightningModule.training_step = timed
    args = ["fit", *_fit_args(method, rows, steps, out)] + ([f"--data.teacher_cache={cache}"] if cache else [])
    cli = run_cli(args)
    print(json.dumps({"step_s": statistics.median(times[2:]), "peak_rss_mib": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024, "teacher_loaded": cli.model.teacher is not None}))


def loss_errors(cache: Path, rows: int) -> dict[str, float]:
    """Relative error of KD's and DAC-KL's loss with the cached (densified) teacher against the live one."""
    import torch

    from mgsr_lightning.batch import Rollout
    from mgsr_lightning.cli import run_cli
    from mgsr_lightning.data.teacher_cache import BATCH_KEYS, CachedTeacherCollator
    from mgsr_lightning.generation import response_logits
    from mgsr_lightning.losses.dac_kl import ClipNet, dac_kl
    from mgsr_lightning.losses.divergences import forward_kl
    from mgsr_lightning.losses.sparse_teacher import densify

    cli = run_cli(_fit_args("kd", rows, 1, cache.parent / "errors") + [f"--data.teacher_cache={cache}"], run=False)
    module, data = cli.model, cli.datamodule
    data.setup("fit")
    module.configure_model()
    teacher = module.load_teacher().eval()
    collate = CachedTeacherCollator(data.tokenizer.pad_token_id, data.teacher_cache)
    clip_net, totals = ClipNet(), {"kd": [0.0, 0.0], "dac_kl": [0.0, 0.0]}
    examples = data.train_examples()
    with torch.no_grad():
        for start in range(0, len(examples), 64):
            batch = collate(examples[start : start + 64])
            rollout = Rollout.from_batch(batch)
            live = response_logits(teacher, rollout, module.vocab_size)
            cached = densify(*(batch[key] for key in BATCH_KEYS), module.vocab_size)
            student = response_logits(module.student, rollout, module.vocab_size)
            mask, base = rollout.response_mask, {"base": "alpha_beta", "base_params": {"alpha": 0.2, "beta": 0.7}}
            for name, loss in (("kd", lambda t: forward_kl(student, t, mask)),
                               ("dac_kl", lambda t: dac_kl(student, t, mask, clip_net=clip_net, **base)[0])):
                live_loss, cached_loss = float(loss(live)), float(loss(cached))
                totals[name][0] += abs(cached_loss - live_loss)
                totals[name][1] += abs(live_loss)
    return {name: error / reference for name, (error, reference) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench_teacher_cache")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--ks", default="16,64,256")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child process: METHOD CACHE|-
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if args.one:
        one_run(args.one[0], None if args.one[1] == "-" else args.one[1], args.rows, args.steps, out / "fit")
        return
    from mgsr_lightning.pipeline.cache_teacher import cache_teacher

    print(f"tiny pair ({ROOT}), first {args.rows} training rows; a CPU shared with other jobs")
    print("\n| k | MiB on disk | MiB per million tokens | KD loss rel. error | DAC-KL loss rel. error |")
    print("|---|---|---|---|---|")
    caches = {}
    for k in map(int, args.ks.split(",")):
        caches[k] = out / f"cache-k{k}"
        written = cache_teacher([str(REPO / "configs" / "tiny" / "kd.yaml")], top_k=k, out=str(caches[k]),
                                overrides=[f"--data.max_train_examples={args.rows}"])
        errors = loss_errors(caches[k], args.rows)
        print(f"| {k} | {written['bytes'] / 2**20:.1f} | {written['bytes'] / written['positions'] * 1e6 / 2**20:.0f} "
              f"| {errors['kd']:.2e} | {errors['dac_kl']:.2e} |", flush=True)
    k = 64 if 64 in caches else next(iter(caches))
    print(f"\n| Method | teacher | s/step (median of {args.steps - 2}) | peak RSS MiB | teacher loaded |")
    print("|---|---|---|---|---|")
    for method in ("kd", "mgsr"):
        for label, cache in ((f"cache k={k}", str(caches[k])), ("live", "-")):
            result = subprocess.run([sys.executable, __file__, "--out", str(out / f"{method}-{label[:5]}"), "--rows",
                                     str(args.rows), "--steps", str(args.steps), "--one", method, cache],
                                    capture_output=True, text=True, check=True)
            row = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"| {method} | {label} | {row['step_s']:.3f} | {row['peak_rss_mib']:.0f} | {row['teacher_loaded']} |",
                  flush=True)
    smollm2 = REPO / "artifacts" / "smollm2"
    if not smollm2.is_dir():
        print(f"\nSmolLM2 pair skipped: {smollm2} does not exist (python -m mgsr_lightning prepare-smollm2 needs "
              "the SmolLM2 GGUF, which this machine does not have offline)")


if __name__ == "__main__":
    main()
