"""Wall-clock cost of DAC-KL against forward_kl on V = 50,257: forward + backward (and forward alone
with ``--forward``), ending with one summary line against the target ``<= 2x`` forward KL.

    python experiments/benchmarks/bench_dac_kl_cost.py                       # 256 positions, bf16 logits, CPU (~1 min)
    python experiments/benchmarks/bench_dac_kl_cost.py --all --forward       # + the taped references and the sort alone
    python experiments/benchmarks/bench_dac_kl_cost.py --tokens 8192 --device cuda

Rows: "dac_kl fixed" (the fixed band (0, 0.98)), "dac_kl learned" (ClipNet's band, MGSR's token loss
over forward KL, the paper's), "dac_kl alpha_beta" (ClipNet's band over the α-β divergence, α = 0.2,
β = 0.7, MGSR's default base, through its written-out backward); with ``--all`` also "dac_kl taped" and
"dac_kl alpha_beta taped" (the same two losses through plain autograd, the references of the written
backward) and "sort alone" (the one sort with its log-softmax, on 16-bit keys for bf16 logits: the floor
of any sort-based band). The losses are timed
side by side, one repeat of each in turn, so that the machine's load moves all of them alike; the ratios
to forward_kl (medians over ``--repeats``) are the figures to read. The summary line reads the ratio of
"dac_kl learned" and of "dac_kl alpha_beta"; when one misses the target, the script prints
torch.profiler's top operators of that loss (``--no-profile`` skips it).
"""

from __future__ import annotations

import argparse

import torch
from side_by_side import side_by_side  # the folder of these scripts (see side_by_side.py)

from mgsr_lightning.losses import ClipNet, dac_kl, forward_kl
from mgsr_lightning.losses.dac_kl_band import sort_teacher

TARGET = 2.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256, help="B·T, the compared positions")
    parser.add_argument("--batch", type=int, default=8, help="B (T = tokens / B)")
    parser.add_argument("--vocab", type=int, default=50257, help="V")
    parser.add_argument("--chunk-size", type=int, default=256, help="positions per chunk (0: unchunked)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--forward", action="store_true", help="also time the forward alone")
    parser.add_argument("--all", action="store_true", help="also the taped reference and the sort alone")
    parser.add_argument("--no-profile", action="store_true", help="no profile when the target is missed")
    return parser.parse_args(argv)


def _sort_rows(student: torch.Tensor, teacher: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """DAC-KL's one sort, alone, as its written path runs it (``dac_kl_band.sort_teacher``): the teacher's
    float32 log-probabilities of every row in descending order, per chunk, sorted on 16-bit keys for
    bf16 logits (the returned zero keeps ``.backward()`` in the timing loop a no-op)."""
    student_rows, teacher_rows = student.detach().flatten(0, 1), teacher.flatten(0, 1)
    chunk = chunk_size or teacher_rows.size(0)
    for start in range(0, teacher_rows.size(0), chunk):
        rows = slice(start, start + chunk)
        sort_teacher(student_rows[rows], teacher_rows[rows], 1.0, band="mass", summary_k=None)
    return teacher.new_zeros((), dtype=torch.float32, requires_grad=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    chunk_size = args.chunk_size or None
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (args.batch, args.tokens // args.batch, args.vocab)
    student = (torch.randn(shape, generator=generator, device=device) * 3).to(dtype).requires_grad_(True)
    teacher = (torch.randn(shape, generator=generator, device=device) * 3).to(dtype)
    clip_net = ClipNet().to(device)
    alpha_beta = {"base": "alpha_beta", "base_params": {"alpha": 0.2, "beta": 0.7}}
    losses = {
        "forward_kl": lambda: forward_kl(student, teacher, chunk_size=chunk_size),
        "dac_kl fixed": lambda: dac_kl(student, teacher, mode="fixed", chunk_size=chunk_size)[0],
        "dac_kl learned": lambda: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size)[0],
        "dac_kl alpha_beta": lambda: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size,
                                            **alpha_beta)[0],
    }
    if args.all:
        losses["dac_kl taped"] = lambda: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size,
                                                written_backward=False)[0]
        losses["dac_kl alpha_beta taped"] = lambda: dac_kl(student, teacher, clip_net=clip_net, chunk_size=chunk_size,
                                                           written_backward=False, **alpha_beta)[0]
        losses["sort alone"] = lambda: _sort_rows(student, teacher, chunk_size)

    def train_step(loss):
        def step():
            student.grad = None
            clip_net.zero_grad(set_to_none=True)
            loss().backward()
        return step

    def forward_step(loss):
        def step():
            with torch.no_grad():
                loss()
        return step

    print(f"B·T = {args.tokens:,}, V = {args.vocab:,}, {args.dtype} logits, chunk_size = {chunk_size}, "
          f"device = {args.device}, torch threads = {torch.get_num_threads()}; median of {args.repeats}, side by side")
    train = side_by_side({name: train_step(loss) for name, loss in losses.items()}, args.repeats, device)
    forward = side_by_side({name: forward_step(loss) for name, loss in losses.items()}, args.repeats, device) \
        if args.forward else None
    print(f"{'loss':<24}{'fwd+bwd s':>11}{'ratio':>8}" + (f"{'fwd s':>9}{'ratio':>8}" if forward else ""))
    for name in losses:
        line = f"{name:<24}{train[name]:>11.3f}{train[name] / train['forward_kl']:>8.2f}"
        if forward:
            line += f"{forward[name]:>9.3f}{forward[name] / forward['forward_kl']:>8.2f}"
        print(line)
    ratios = {name: train[name] / train["forward_kl"] for name in ("dac_kl learned", "dac_kl alpha_beta")}
    missed = [name for name, ratio in ratios.items() if ratio > TARGET]
    if missed and not args.no_profile:
        for name in missed:
            print_profile(name, train_step(losses[name]))
    verdicts = ", ".join(f"{name} {ratio:.2f}x {'met' if ratio <= TARGET else 'missed'}"
                         for name, ratio in ratios.items())
    print(f"summary: DAC-KL fwd+bwd / forward_kl at V = {args.vocab:,} (target <= {TARGET:g}x): {verdicts}")


def print_profile(name: str, step) -> None:
    """torch.profiler's top operators (self CPU time) of one training step of ``name``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    print(f"profile of {name!r}, one fwd+bwd step, top operators by self CPU time:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=36))


if __name__ == "__main__":
    main()
