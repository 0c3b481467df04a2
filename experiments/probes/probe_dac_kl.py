"""Can a loss alone pull free student logits onto a fixed teacher? DAC-KL's variants against forward KL.

    python experiments/probes/probe_dac_kl.py                      # V = 4,096, 8 positions, 600 Adam steps
    python experiments/probes/probe_dac_kl.py --vocab 256 --steps 300

The student is a free [N, V] logit tensor (no model), started at zero (uniform), and trained with
Adam on one loss alone against a fixed teacher: Zipf-like probabilities ``p_k ∝ k^(−s)`` over a
random permutation of the vocabulary per position, with s = 1.1 ("peaked") or s = 0.5 ("flat").
A loss that is a divergence drives forward KL(p‖q) to 0. For each loss the script prints the final
loss value, forward KL, and the student's mass on the entries past the teacher's 0.975 cumulative
mass (where the teacher has 2.5%). DAC-KL runs with fixed bounds and with ClipNet trained jointly in
its own parameter group (learning rate 1e-3, as the configs do), each variant with the current
default band (fixed (0, 0.98), ClipNet from (0.005, 0.98)) and with the earlier one (fixed (0, 0.9),
ClipNet from (0.02, 0.9)), and with a hard band edge (β = 0.001 instead of 0.02). With soft edges
every entry keeps a weight of at least σ(−0.1/β) ≈ 0.007 and Adam's per-coordinate scaling recovers
even those small gradients, so "paper" converges too, only slowly; with a hard edge the weight past
the band underflows and "paper" cannot see the student's mass there at all.
"""

from __future__ import annotations

import argparse

import torch

from mgsr_lightning.losses import ClipNet, dac_kl, forward_kl

TAIL_START = 0.975


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=4096, help="V")
    parser.add_argument("--positions", type=int, default=8, help="N, teacher rows (one permutation each)")
    parser.add_argument("--steps", type=int, default=600, help="Adam steps on the student logits")
    parser.add_argument("--lr", type=float, default=0.1, help="Adam learning rate of the student logits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the tensors are small)")
    return parser.parse_args(argv)


def zipf_teacher(positions: int, vocab: int, exponent: float, generator: torch.Generator) -> torch.Tensor:
    """[1, N, V] logits of p_k ∝ k^(−exponent), each row over its own random permutation of the vocabulary."""
    log_probs = -exponent * torch.arange(1, vocab + 1, dtype=torch.float32).log()
    rows = [log_probs[torch.randperm(vocab, generator=generator)] for _ in range(positions)]
    return torch.stack(rows)[None]


def student_mass_past(teacher_logits: torch.Tensor, student_logits: torch.Tensor, start: float) -> float:
    """Mean over positions of the student's mass on the entries where the teacher's exclusive cumulative
    mass (in the teacher's descending order) is at least ``start``."""
    p, q = teacher_logits.softmax(-1), student_logits.softmax(-1)
    sorted_p, order = p.sort(-1, descending=True)
    past = (sorted_p.cumsum(-1) - sorted_p) >= start
    return float((q.gather(-1, order) * past).sum(-1).mean())


# name -> dac_kl options; None is forward_kl
LOSSES: dict[str, dict | None] = {
    "rest fixed (0, .98)": dict(variant="rest", mode="fixed", fixed_bounds=(0.0, 0.98)),
    "rest learned (.005, .98)": dict(variant="rest", mode="learned", init_bounds=(0.005, 0.98)),
    "rest fixed (0, .9)": dict(variant="rest", mode="fixed", fixed_bounds=(0.0, 0.9)),
    "rest learned (.02, .9)": dict(variant="rest", mode="learned", init_bounds=(0.02, 0.9)),
    "paper fixed (0, .98)": dict(variant="paper", mode="fixed", fixed_bounds=(0.0, 0.98)),
    "paper learned (.005, .98)": dict(variant="paper", mode="learned", init_bounds=(0.005, 0.98)),
    "paper fixed (0, .9)": dict(variant="paper", mode="fixed", fixed_bounds=(0.0, 0.9)),
    "paper learned (.02, .9)": dict(variant="paper", mode="learned", init_bounds=(0.02, 0.9)),
    "rest fixed (0, .9) β=.001": dict(variant="rest", mode="fixed", fixed_bounds=(0.0, 0.9), beta=1e-3),
    "paper fixed (0, .9) β=.001": dict(variant="paper", mode="fixed", fixed_bounds=(0.0, 0.9), beta=1e-3),
    "forward_kl": None,
}


def train(teacher_logits: torch.Tensor, options: dict | None, steps: int, lr: float) -> tuple[float, float, float]:
    """(final loss, forward KL, student mass past TAIL_START) after ``steps`` Adam steps on free logits."""
    student_logits = torch.zeros_like(teacher_logits, requires_grad=True)
    options = dict(options or {})
    init_bounds = options.pop("init_bounds", None)
    clip_net = ClipNet(init_bounds=init_bounds) if init_bounds is not None else None
    groups = [{"params": [student_logits], "lr": lr}]
    if clip_net is not None:
        groups.append({"params": clip_net.parameters(), "lr": 1e-3, "weight_decay": 0.0})
    optimizer = torch.optim.Adam(groups)
    for _ in range(steps):
        if not options:
            loss = forward_kl(student_logits, teacher_logits)
        else:
            loss, _ = dac_kl(student_logits, teacher_logits, clip_net=clip_net, **options)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        fkl = float(forward_kl(student_logits, teacher_logits))
        past = student_mass_past(teacher_logits, student_logits, TAIL_START)
    return float(loss.detach()), fkl, past


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    teachers = {
        "peaked (s=1.1)": zipf_teacher(args.positions, args.vocab, 1.1, generator),
        "flat (s=0.5)": zipf_teacher(args.positions, args.vocab, 0.5, generator),
    }
    print(f"V = {args.vocab}, N = {args.positions}, {args.steps} Adam steps at lr {args.lr}")
    print(f"{'teacher':<16} {'loss':<28} {'final loss':>10} {'forward KL':>10} {'q past 0.975':>12}")
    for teacher_name, teacher_logits in teachers.items():
        past_teacher = student_mass_past(teacher_logits, teacher_logits, TAIL_START)
        for loss_name, options in LOSSES.items():
            torch.manual_seed(args.seed)
            value, fkl, past = train(teacher_logits, options, args.steps, args.lr)
            print(f"{teacher_name:<16} {loss_name:<28} {value:>10.4f} {fkl:>10.4f} {past:>12.3f}", flush=True)
        print(f"{teacher_name:<16} {'(teacher itself)':<28} {'':>10} {'':>10} {past_teacher:>12.3f}")


if __name__ == "__main__":
    main()
