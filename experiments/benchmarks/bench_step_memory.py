"""Peak memory and seconds of one distillation step of the loss head, fused against unfused, at real vocabularies.

    python experiments/benchmarks/bench_step_memory.py --out experiments/results/speed/memory.md
    python experiments/benchmarks/bench_step_memory.py --vocabs 50257 --lengths 512 --dtypes float32  # one cell

One step of the loss head: the student's last hidden states [1, T, H] → logits → loss → backward to the
hidden states and the head, with the teacher's hidden states and head as its input (no gradient).

- unfused: today's path. Student logits ``hidden @ head.T`` [1, T, V] and the teacher's, whole; then the
  pure losses of ``mgsr_lightning.losses`` on them, run in chunks of ``--loss-chunk-size`` positions (their
  own ``chunk_size``: unchunked, DAC-KL alone would hold ~25 float32 [T, V] blocks, 30 GiB at V = 151,936
  and T = 2,048), and the cross-entropy as ``response_cross_entropy`` computes it (whole logits).
- fused: ``mgsr_lightning.losses.fused_head.fused_head_loss`` with the same terms (``fused_terms``), in
  chunks of ``--chunk-size`` positions (the head's matmuls), each loss in its own chunks of
  ``--loss-chunk-size`` inside them: no whole [1, T, V] tensor.

Losses: ``kd``, forward KL; ``mgsr``, MGSR's default objective (``configs/methods/mgsr.yaml``): the
ground-truth cross-entropy + DAC-KL (learned ClipNet, "rest" variant over α-β (0.2, 0.7)) + 0.1 · the
span term (normalised relation, spans of 8 tokens: 7 pairs each), all positions compared. The
cross-entropy reads the same hidden states (a ground-truth step, where the training sequences are the
ground truth).

How it is measured. Each (loss, dtype, V, T, path) runs in a fresh subprocess with ``--threads`` torch
threads (by default a cell's unfused and fused subprocesses run at the same time, so that both see
the same load on a shared machine; ``--no-side-by-side`` runs them one after the other) and glibc's
mmap threshold pinned at 1 MiB (``MALLOC_MMAP_THRESHOLD_``: freed large blocks are returned to the
kernel, so the resident set follows what is allocated; see bench_loss_memory.py). The
subprocess builds its inputs (hidden states, both heads, ClipNet), runs one warm-up step on 16
positions, then resets the resident-set high-water mark (``proc_memory.reset_peak_rss``) and times one
step. It reports two memory figures from ``/proc/self/status``:

    step peak     VmHWM − VmRSS before the step: the most memory the step held on top of its inputs
    process peak  VmHWM: the whole process (torch, the inputs: both heads, and the step)

and the step's seconds twice: the process's CPU time (with one thread, the step's own compute, whatever
else runs on the machine's cores: the figure to compare on a shared machine) and its wall time.

The inputs (the student's and teacher's heads, [V, H] each, and the hidden states) are the same in both
paths; the step peak is what fusing changes. The last line gives the step peak ratio at V = 151,936,
T = 2,048, fp32; the table gives both.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from proc_memory import (  # the folder of these scripts (see proc_memory.py)
    measured_in_child,
    reset_peak_rss,
    status_kib,
)

LOSSES = ("kd", "mgsr")
PATHS = ("unfused", "fused")
LABELS = {"kd": "KD", "mgsr": "MGSR"}
MGSR_DAC_KL = dict(mode="learned", variant="rest", base="alpha_beta", base_params={"alpha": 0.2, "beta": 0.7})
SPAN_WEIGHT = 0.1
SPAN_LENGTH = 8
KEY_VOCAB, KEY_LENGTH = 151936, 2048  # the cell of the summary line (fp32)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[50257, 128256, 151936])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048], help="T, positions per row")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--hidden", type=int, default=896, help="H of the student and the teacher")
    parser.add_argument("--chunk-size", type=int, default=128, help="positions per chunk of the fused head")
    parser.add_argument("--loss-chunk-size", type=int, default=32,
                        help="the losses' own chunk_size (positions; span: pairs), both paths")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per subprocess")
    parser.add_argument("--side-by-side", action=argparse.BooleanOptionalAction, default=True,
                        help="run each cell's unfused and fused processes at the same time (the same load on a "
                             "shared machine, half the wall time; memory: both at once)")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at the same time (memory: all at once)")
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    parser.add_argument("--results", type=Path,
                        help="each cell's figures, one JSON line each, appended (default: --out with .jsonl); the "
                             "table is rendered from all of them, so runs over parts of the grid add up")
    parser.add_argument("--render-only", action="store_true", help="only render --out from --results")
    parser.add_argument("--child", nargs=5, metavar=("LOSS", "DTYPE", "V", "T", "PATH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, loss_name: str, dtype_name: str, vocab: int, length: int, path: str) -> dict:
    """In the child: build the inputs, warm up, then one timed step; bytes and seconds."""
    import torch
    import torch.nn.functional as F

    from mgsr_lightning.losses import ClipNet, dac_kl, forward_kl, span_correlation_loss
    from mgsr_lightning.losses.fused_head import TeacherHead, fused_head_loss
    from mgsr_lightning.losses.fused_terms import cross_entropy_term, dac_kl_term, divergence_term, span_term

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    student_head = (torch.randn(vocab, args.hidden) / args.hidden**0.5).to(dtype).requires_grad_()
    teacher_head = (torch.randn(vocab, args.hidden) / args.hidden**0.5).to(dtype)
    clip_net = ClipNet()
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.01)

    def inputs(positions: int):
        hidden = torch.randn(1, positions, args.hidden, dtype=dtype).requires_grad_()
        teacher_hidden = torch.randn(1, positions, args.hidden, dtype=dtype)
        labels = torch.randint(0, vocab, (1, positions))
        mask = torch.ones(1, positions, dtype=torch.bool)
        spans = (torch.arange(positions) // SPAN_LENGTH)[None]
        return hidden, teacher_hidden, labels, mask, spans

    def step(hidden, teacher_hidden, labels, mask, spans) -> float:
        chunk = args.loss_chunk_size
        if path == "unfused":
            student_logits = F.linear(hidden, student_head)  # [1, T, V]
            with torch.no_grad():
                teacher_logits = F.linear(teacher_hidden, teacher_head)
            if loss_name == "kd":
                loss = forward_kl(student_logits, teacher_logits, mask, chunk_size=chunk)
            else:
                per_token = F.cross_entropy(student_logits.float().flatten(0, 1), labels.flatten(), reduction="none")
                loss = (per_token * mask.flatten()).sum() / mask.sum().clamp_min(1)
                loss = loss + dac_kl(student_logits, teacher_logits, mask, clip_net=clip_net, chunk_size=chunk,
                                     **MGSR_DAC_KL)[0]
                loss = loss + SPAN_WEIGHT * span_correlation_loss(student_logits, teacher_logits, mask, spans=spans,
                                                                  chunk_size=chunk)
        else:
            if loss_name == "kd":
                terms = {"distill": (1.0, divergence_term("forward_kl", mask, chunk_size=chunk))}
            else:
                terms = {"sft": (1.0, cross_entropy_term(labels, mask)),
                         "distill": (1.0, dac_kl_term(mask, clip_net=clip_net, chunk_size=chunk, **MGSR_DAC_KL)),
                         "span": (SPAN_WEIGHT, span_term(spans, mask, chunk_size=chunk))}
            loss, _ = fused_head_loss(hidden, student_head, terms, TeacherHead(teacher_hidden, teacher_head),
                                      chunk_size=args.chunk_size)
        loss.backward()
        return float(loss)

    step(*inputs(16))
    student_head.grad = None
    for parameter in clip_net.parameters():
        parameter.grad = None
    batch = inputs(length)
    before = status_kib("VmRSS") * 1024
    reset_peak_rss()
    start, cpu_start = time.perf_counter(), time.process_time()
    loss = step(*batch)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = status_kib("VmHWM") * 1024
    return {"step_peak": peak - before, "process_peak": peak, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "loss": loss}


def run_child(argv: list[str], cell: tuple) -> dict:
    """``measure`` in a fresh subprocess (mmap threshold pinned, see the docstring)."""
    return measured_in_child(__file__, [*argv, "--child", *map(str, cell)])


def _run_or_none(argv: list[str], cell: tuple) -> dict | None:
    try:
        return run_child(argv, cell)
    except RuntimeError as error:
        print(f"{' '.join(map(str, cell))} failed: {error}", file=sys.stderr)
        return None


def main(argv=None) -> None:
    argv = list(argv if argv is not None else sys.argv[1:])
    args = parse_args(argv)
    if args.child:
        loss_name, dtype_name, vocab, length, path = args.child
        print(json.dumps(measure(args, loss_name, dtype_name, int(vocab), int(length), path)))
        return
    results = args.results or (args.out.with_suffix(".jsonl") if args.out is not None else None)
    if args.render_only:
        render(args, _read_results(results))
        return
    child_argv = _without_option(_without_option(_without_option(argv, "--out"), "--results"), "--jobs")
    grid = [(loss_name, dtype_name, vocab, length) for dtype_name in args.dtypes for loss_name in args.losses
            for vocab in args.vocabs for length in args.lengths]
    # the cells of the summary line first, so that a run cut short still has them
    grid.sort(key=lambda cell: (cell[1], cell[2], cell[3]) != ("float32", KEY_VOCAB, KEY_LENGTH))
    lock = threading.Lock()

    def run_cell(cell: tuple) -> None:
        _wait_for_memory(cell, args.hidden)
        with ThreadPoolExecutor(max_workers=2 if args.side_by_side else 1) as pool:
            unfused, fused = pool.map(lambda path: _run_or_none(child_argv, (*cell, path)), PATHS)
        record = dict(zip(("loss", "dtype", "vocab", "length"), cell), unfused=unfused, fused=fused)
        with lock:
            if results is not None:
                results.parent.mkdir(parents=True, exist_ok=True)
                with results.open("a") as file:
                    file.write(json.dumps(record) + "\n")
            render(args, _read_results(results) if results is not None else [record])

    with ThreadPoolExecutor(max_workers=args.jobs) as cells:
        list(cells.map(run_cell, grid))


def _wait_for_memory(cell: tuple, hidden: int) -> None:
    """Start a cell only when the machine has room for both of its processes (an upper estimate: the unfused
    step's peak, measured at 10-19 bytes per T·V entry for KD and 18-24 for MGSR, both heads in both
    processes, 1 GiB of runtime), so that parallel runs or other users of a shared machine do not push it
    into the OOM killer; waits at most 30 minutes."""
    loss_name, dtype_name, vocab, length = cell
    size = 2 if dtype_name == "bfloat16" else 4
    need = length * vocab * (20 if loss_name == "kd" else 26) + 4 * vocab * hidden * size + 2**30
    for _ in range(180):
        if _available_bytes() > need:
            return
        time.sleep(10)


def _available_bytes() -> int:
    text = Path("/proc/meminfo").read_text()
    return int(text.split("MemAvailable:")[1].split()[0]) * 1024


def _read_results(path: Path | None) -> list[dict]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def render(args: argparse.Namespace, records: list[dict]) -> None:
    """Print the table of ``records`` (the last record of each cell), in grid order, and write it to ``--out``."""
    cells = {(r["loss"], r["dtype"], r["vocab"], r["length"]): r for r in records}
    gib = 2**30
    together = ", the cell's two paths at the same time" if args.side_by_side else ""
    lines = [
        "# One step of the loss head, fused against unfused: peak memory and seconds",
        "",
        f"Hidden {args.hidden}, batch 1, fused chunks of {args.chunk_size} positions, the losses' own chunks of "
        f"{args.loss_chunk_size} (both paths), {args.threads} torch thread(s) per subprocess, CPU; one step per "
        f"cell and path, each in a fresh process{together}. Step peak: VmHWM − VmRSS before the step (memory on top "
        "of the inputs); process peak: VmHWM. GiB = 2^30 bytes. CPU s: the process's CPU time over the step (with "
        "one thread, its compute, whatever else shares the cores); wall s: the step's wall time. Written by",
        "",
        "    python experiments/benchmarks/bench_step_memory.py --out experiments/results/speed/memory.md",
        "",
        "| loss | dtype | V | T | step peak GiB unfused | fused | fused / unfused | process peak GiB unfused | fused "
        "| fused / unfused | CPU s/step unfused | fused | fused / unfused | wall s/step unfused | fused "
        "| loss unfused | fused |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[str, float] = {}
    for loss_name in LOSSES:
        for dtype_name in ("float32", "bfloat16"):
            for key in sorted(k for k in cells if k[:2] == (loss_name, dtype_name)):
                record = cells[key]
                unfused, fused = record["unfused"], record["fused"]
                prefix = f"| {LABELS[loss_name]} | {dtype_name} | {key[2]} | {key[3]} "
                if unfused is None or fused is None:
                    lines.append(prefix + "| failed: see stderr | | | | | | | | | | | | |")
                    continue
                step_ratio = fused["step_peak"] / unfused["step_peak"]
                if key[1:] == ("float32", KEY_VOCAB, KEY_LENGTH):
                    ratios[loss_name] = step_ratio
                lines.append(
                    prefix
                    + f"| {unfused['step_peak'] / gib:.2f} | {fused['step_peak'] / gib:.2f} | {step_ratio:.2f} "
                    f"| {unfused['process_peak'] / gib:.2f} | {fused['process_peak'] / gib:.2f} "
                    f"| {fused['process_peak'] / unfused['process_peak']:.2f} "
                    f"| {unfused['cpu_seconds']:.2f} | {fused['cpu_seconds']:.2f} "
                    f"| {fused['cpu_seconds'] / unfused['cpu_seconds']:.2f} "
                    f"| {unfused['seconds']:.2f} | {fused['seconds']:.2f} "
                    f"| {unfused['loss']:.6g} | {fused['loss']:.6g} |"
                )
    if all(name in ratios for name in LOSSES):
        lines += ["", f"fused / unfused peak memory at V = {KEY_VOCAB}, T = {KEY_LENGTH}: "
                      f"KD {ratios['kd']:.2f}×, MGSR {ratios['mgsr']:.2f}×"]
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


def _without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (``--out x`` or ``--out=x``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept


if __name__ == "__main__":
    main()
