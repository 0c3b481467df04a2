"""Wall-clock cost of DAC-KL against forward_kl on V = 50,257: forward + backward, and forward alone.

    python experiments/bench_dac_kl_cost.py                       # 512 positions, bf16 logits, CPU
    python experiments/bench_dac_kl_cost.py --tokens 8192 --device cuda

DAC-KL does what forward_kl does (two log-softmaxes and a KL over V) plus one sort of each [chunk, V]
block (O(V log V) per row, with an int64 index block), a gather of the student at the sorted
indices, ClipNet on the top-k, and about ten more [chunk, V] elementwise passes for the band. The
script times each loss on the same logits and prints the median of ``--repeats`` runs after one
warm-up, and the ratio to forward_kl with the same chunking. Three more rows: "dac_kl taped" (ClipNet
band, plain autograd instead of the "rest" variant's written-out backward, the reference it replaced),
"dac_kl alpha_beta" (the band over the α-β divergence, MGSR's default base, taped like every base but
forward KL) and "sort alone" (DAC-KL's one sort with its log-softmax: the floor of any sort-based band). The
ratios are the figure to read: on CPU the absolute times move with the machine's load and include
the kernel's page faults, since torch's CPU allocator maps fresh pages for every large block (half
the wall time on a 2-core VM).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mgsr_lightning.losses import ClipNet, dac_kl, forward_kl


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512, help="B·T, the compared positions")
    parser.add_argument("--batch", type=int, default=8, help="B (T = tokens / B)")
    parser.add_argument("--vocab", type=int, default=50257, help="V")
    parser.add_argument("--chunk-size", type=int, default=512, help="positions per chunk for the chunked rows")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    return parser.parse_args(argv)


def median_seconds(step, repeats: int, device: torch.device) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sort_rows(logits: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """DAC-KL's one sort, alone: the float32 log-probabilities of every row, sorted per chunk (the
    returned zero keeps ``.backward()`` in the timing loop a no-op)."""
    rows = logits.flatten(0, 1)
    chunk = chunk_size or rows.size(0)
    for start in range(0, rows.size(0), chunk):
        torch.log_softmax(rows[start : start + chunk].float(), -1).sort(dim=-1, descending=True)
    return logits.new_zeros((), dtype=torch.float32, requires_grad=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    length = args.tokens // args.batch
    generator = torch.Generator(device=device).manual_seed(0)
    student = (torch.randn(args.batch, length, args.vocab, generator=generator, device=device) * 3).to(dtype)
    student.requires_grad_(True)
    teacher = (torch.randn(args.batch, length, args.vocab, generator=generator, device=device) * 3).to(dtype)
    clip_net = ClipNet().to(device)
    losses = {
        "forward_kl": lambda chunk_size: forward_kl(student, teacher, chunk_size=chunk_size),
        "dac_kl fixed": lambda chunk_size: dac_kl(student, teacher, mode="fixed", chunk_size=chunk_size)[0],
        "dac_kl learned": lambda chunk_size: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size)[0],
        "dac_kl taped": lambda chunk_size: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size,
                                                  written_backward=False)[0],
        # MGSR's default: the band over the alpha-beta divergence (taped: only forward KL has a written backward)
        "dac_kl alpha_beta": lambda chunk_size: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size,
                                                       base="alpha_beta", base_params={"alpha": 0.2, "beta": 0.7})[0],
        "sort alone": lambda chunk_size: _sort_rows(teacher, chunk_size),
    }
    print(
        f"B·T = {args.tokens:,}, V = {args.vocab:,}, {args.dtype} logits, device = {args.device}, "
        f"torch threads = {torch.get_num_threads()}; median of {args.repeats} after a warm-up"
    )
    print(f"{'loss':<16}{'chunk_size':>11}{'fwd+bwd s':>11}{'ratio':>8}{'fwd s':>9}{'ratio':>8}")
    for chunk_size in (None, args.chunk_size):
        baseline = None
        for name, loss in losses.items():

            def train_step():
                student.grad = None
                loss(chunk_size).backward()

            def forward_only():
                with torch.no_grad():
                    loss(chunk_size)

            train = median_seconds(train_step, args.repeats, device)
            forward = median_seconds(forward_only, args.repeats, device)
            baseline = baseline or (train, forward)
            print(f"{name:<16}{str(chunk_size):>11}{train:>11.2f}{train / baseline[0]:>8.2f}"
                  f"{forward:>9.2f}{forward / baseline[1]:>8.2f}")


if __name__ == "__main__":
    main()
