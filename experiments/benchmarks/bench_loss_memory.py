"""Peak extra memory of the losses, unchunked (``chunk_size=None``) against chunked, forward + backward.

    python experiments/benchmarks/bench_loss_memory.py                      # B·T = 8,192, V = 50,257, bf16 logits
    python experiments/benchmarks/bench_loss_memory.py --tokens 1024 --chunk-size 256 --losses forward_kl

How it is measured. Each (loss, path) runs in a fresh subprocess, so nothing cached by an earlier
run is counted. The subprocess builds the logits (student with ``requires_grad``), then resets the
kernel's resident-set high-water mark (writing 5 to ``/proc/self/clear_refs`` sets VmHWM to the
current RSS), runs the loss forward and backward once, and reports ``VmHWM − VmRSS_before``: the most
memory the loss ever held at once on top of its inputs. RSS counts pages actually written, which is
what the loss needed, and it sees every allocation, unlike Python-level tracers (tracemalloc does not
see torch's allocator). It is honest on CPU because the subprocess runs with
``MALLOC_MMAP_THRESHOLD_`` = 1 MiB: glibc then serves every block of 1 MiB or more with mmap and
unmaps it on free, so freed [rows, V] intermediates do not linger in the heap (with glibc's default,
dynamic threshold, freed blocks under 32 MiB are kept and would be counted); small-block arenas and
Python objects add a few MiB of noise. With ``--device cuda`` the figure is
``torch.cuda.max_memory_allocated`` over the same window instead.

The figure includes the gradient of the student logits (their size, in their dtype), which every
backward must produce whatever the loss; it is printed separately, and "beyond grad" subtracts it.

The unchunked path holds O(B·T·V) memory (about 24 float32 [B·T, V] blocks for DAC-KL, ~38 GiB at the
default size). So it is first run at ``--probe-tokens`` positions; if the probe's figure, scaled
linearly to ``--tokens``, exceeds 80% of MemAvailable, the scaled figure is printed, marked as
extrapolated, instead of running it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from proc_memory import (  # the folder of these scripts (see proc_memory.py)
    measured_in_child,
    reset_peak_rss,
    status_kib,
)

# dac_kl_taped: DAC-KL with plain autograd instead of the "rest" variant's written-out backward
LOSSES = ("forward_kl", "dac_kl", "dac_kl_taped", "span_correlation")
PATHS = ("naive", "chunked")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192, help="B·T, the compared positions")
    parser.add_argument("--batch", type=int, default=8, help="B (T = tokens / B)")
    parser.add_argument("--vocab", type=int, default=50257, help="V")
    parser.add_argument("--chunk-size", type=int, default=512, help="positions (span loss: pairs) per chunk")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of both logits")
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--probe-tokens", type=int, default=1024, help="B·T of the unchunked probe run")
    parser.add_argument("--child", nargs=2, metavar=("LOSS", "PATH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, loss_name: str, path: str) -> dict:
    """Run one loss forward + backward in this process; returns bytes and seconds."""
    import torch

    from mgsr_lightning.losses import ClipNet, dac_kl, forward_kl, span_correlation_loss

    dtype = getattr(torch, args.dtype)
    batch, length = args.batch, args.tokens // args.batch
    device = torch.device(args.device)
    student = torch.randn(batch, length, args.vocab, dtype=dtype, device=device).requires_grad_(True)
    teacher = torch.randn(batch, length, args.vocab, dtype=dtype, device=device)
    chunk_size = args.chunk_size if path == "chunked" else None
    spans = (torch.arange(length, device=device) // 8).expand(batch, length)  # spans of 8 tokens: 7 pairs each
    clip_net = ClipNet().to(device)

    def run():
        if loss_name == "forward_kl":
            return forward_kl(student, teacher, chunk_size=chunk_size)
        if loss_name in ("dac_kl", "dac_kl_taped"):
            written = loss_name == "dac_kl"
            return dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size, written_backward=written)[0]
        return span_correlation_loss(student, teacher, spans=spans, chunk_size=chunk_size)

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = status_kib("VmRSS") * 1024
        reset_peak_rss()
    start = time.perf_counter()
    run().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = status_kib("VmHWM") * 1024
    seconds = time.perf_counter() - start
    return {"extra": peak - before, "grad": student.numel() * student.element_size(), "seconds": seconds}


def run_child(argv: list[str], loss_name: str, path: str, tokens: int) -> dict:
    """``measure`` in a fresh subprocess (with glibc's mmap threshold pinned, see the docstring)."""
    return measured_in_child(__file__, [*argv, "--tokens", str(tokens), "--child", loss_name, path])


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        return int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read(), re.MULTILINE).group(1)) * 1024


def main(argv=None) -> None:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args, *args.child)))
        return
    gib = 2**30
    print(
        f"B·T = {args.tokens:,} (B = {args.batch}), V = {args.vocab:,}, {args.dtype} logits, "
        f"chunk_size = {args.chunk_size}, "
        f"device = {args.device}; forward + backward, peak memory on top of the inputs"
    )
    print(f"{'loss':<18}{'path':<9}{'extra GiB':>10}{'grad GiB':>10}{'beyond grad':>13}{'seconds':>9}")
    for loss_name in args.losses:
        for path in args.paths:
            note = ""
            try:
                if path == "naive" and args.device == "cpu" and args.probe_tokens < args.tokens:
                    probe = run_child(argv, loss_name, path, args.probe_tokens)
                    scale = args.tokens / args.probe_tokens
                    projected = {key: value * scale for key, value in probe.items()}
                    if projected["extra"] > 0.8 * available_bytes():
                        result = projected
                        note = f"  extrapolated x{scale:g} from B·T = {args.probe_tokens:,} (does not fit in RAM here)"
                    else:
                        result = run_child(argv, loss_name, path, args.tokens)
                else:
                    result = run_child(argv, loss_name, path, args.tokens)
            except RuntimeError as error:
                print(f"{loss_name:<18}{path:<9} failed: {error}")
                continue
            print(
                f"{loss_name:<18}{path:<9}{result['extra'] / gib:>10.2f}{result['grad'] / gib:>10.2f}"
                f"{(result['extra'] - result['grad']) / gib:>13.2f}{result['seconds']:>9.1f}{note}"
            )


if __name__ == "__main__":
    main()
