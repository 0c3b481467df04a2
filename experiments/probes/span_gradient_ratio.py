"""How hard does the span term pull on the student? ‖∇ span‖ / ‖∇ forward KL‖ for each relation.

    python experiments/probes/span_gradient_ratio.py                 # tiny GPT-2 pair, random init and after SFT
    python experiments/probes/span_gradient_ratio.py --sft-steps 0   # random init only

A tiny GPT-2 pair (teacher 2 layers d = 64, student 1 layer d = 32, V = 400, the test suite's
shapes) on sequences from a random peaked bigram chain (so that trained models have peaked
next-token distributions, as language models do). Both models are measured at random init, then
after ``--sft-steps`` of cross-entropy on the chain's sequences (the teacher gets twice as many, so
it stays ahead of the student). On one held-out batch with spans of ``--span-length`` tokens the
script prints, per span relation, the span loss and the norm of its gradient on the student's
parameters divided by forward KL's and by the cross-entropy's.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from mgsr_lightning.losses import forward_kl, gradient_norm_ratio, span_correlation_loss
from mgsr_lightning.losses.span_correlation import RELATIONS


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=400)
    parser.add_argument("--length", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--span-length", type=int, default=4, help="tokens per span (fixed windows)")
    parser.add_argument("--sft-steps", type=int, default=150, help="student SFT steps (teacher: twice as many)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def gpt2(vocab: int, n_layer: int, hidden: int, seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=128, n_embd=hidden, n_layer=n_layer, n_head=2)
    return GPT2LMHeadModel(config)


def bigram_sampler(vocab: int, generator: torch.Generator):
    """Sequences [B, L] from a random bigram chain whose rows are peaked (Dirichlet(0.05))."""
    transitions = torch.distributions.Dirichlet(torch.full((vocab,), 0.05)).sample((vocab,))  # [V, V]

    def sample(batch: int, length: int) -> torch.Tensor:
        tokens = [torch.randint(vocab, (batch,), generator=generator)]
        for _ in range(length - 1):
            tokens.append(torch.multinomial(transitions[tokens[-1]], 1, generator=generator).squeeze(-1))
        return torch.stack(tokens, 1)

    return sample


def sft(model: GPT2LMHeadModel, sample, steps: int, batch: int, length: int) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        ids = sample(batch, length)
        logits = model(ids).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def measure(teacher, student, ids: torch.Tensor, span_length: int) -> list[str]:
    with torch.no_grad():
        teacher_logits = teacher(ids).logits[:, :-1]
    student_logits = student(ids).logits[:, :-1]  # [B, L − 1, V]
    spans = (torch.arange(student_logits.size(1)) // span_length).expand(ids.size(0), -1)
    params = list(student.parameters())
    distill = forward_kl(student_logits, teacher_logits)
    cross_entropy = F.cross_entropy(student_logits.reshape(-1, student_logits.size(-1)), ids[:, 1:].reshape(-1))
    fkl_to_ce = gradient_norm_ratio(distill, cross_entropy, params).item()
    lines = [f"  forward KL {distill.item():.4f}, cross-entropy {cross_entropy.item():.4f}, "
             f"‖∇FKL‖/‖∇CE‖ {fkl_to_ce:.3f}"]
    for relation in RELATIONS:
        span = span_correlation_loss(student_logits, teacher_logits, spans=spans, relation=relation)
        to_fkl = gradient_norm_ratio(span, distill, params).item()
        to_ce = gradient_norm_ratio(span, cross_entropy, params).item()
        lines.append(
            f"  {relation:<11} span {span.item():.3g}  ‖∇span‖/‖∇FKL‖ {to_fkl:.3g}  ‖∇span‖/‖∇CE‖ {to_ce:.3g}"
        )
    return lines


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    sample = bigram_sampler(args.vocab, generator)
    teacher = gpt2(args.vocab, n_layer=2, hidden=64, seed=args.seed + 1).eval()
    student = gpt2(args.vocab, n_layer=1, hidden=32, seed=args.seed + 2).eval()
    held_out = sample(args.batch, args.length)
    print(f"tiny GPT-2 pair, V = {args.vocab}, batch {args.batch}×{args.length}, spans of {args.span_length} tokens")
    print("random init:")
    print("\n".join(measure(teacher, student, held_out, args.span_length)))
    if args.sft_steps:
        sft(teacher, sample, 2 * args.sft_steps, args.batch, args.length)
        sft(student, sample, args.sft_steps, args.batch, args.length)
        print(f"after SFT (teacher {2 * args.sft_steps} steps, student {args.sft_steps}):")
        print("\n".join(measure(teacher, student, held_out, args.span_length)))


if __name__ == "__main__":
    main()
