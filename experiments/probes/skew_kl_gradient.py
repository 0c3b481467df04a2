"""Why DistiLLM's skew forward KL barely moves a student trained from scratch.

``KL(p ‖ α·p + (1 − α)·q)`` saturates at ``log(1/α)`` where the student's probability q of the
teacher's token is small: the mixture is then ≈ α·p and the gradient on that token's logit is
≈ (1 − α)·q/α instead of forward KL's ≈ 1 − q. A randomly initialised student (q ≈ 1/V) therefore
gets a gradient two orders of magnitude weaker than under forward KL; a student that already puts
some mass on the teacher's tokens (DistiLLM starts from an SFT-initialised student) does not. Adam
rescales the overall size of a gradient, not the weighting inside it: within a batch, the positions
where the student is still far from the teacher weigh ~q/α, little next to those it already gets
right, so a from-scratch student learns the hard tokens last.

    python experiments/probes/skew_kl_gradient.py
"""

from __future__ import annotations

import torch

from mgsr_lightning.losses.divergences import DIVERGENCES

VOCAB, ROWS = 2048, 64


def gradient_norms(student_boost: float, alpha: float = 0.1) -> tuple[float, float, float]:
    """(student mass on the teacher's token, ‖∇ forward KL‖, ‖∇ skew forward KL‖) on [1, ROWS, VOCAB] logits."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.arange(ROWS)
    target = torch.randint(VOCAB, (ROWS,), generator=generator)
    teacher = torch.randn(ROWS, VOCAB, generator=generator) * 0.02
    teacher[rows, target] += 8.0  # a confident teacher
    student = torch.randn(ROWS, VOCAB, generator=generator) * 0.02
    student[rows, target] += student_boost
    student.requires_grad_()
    mass = student.softmax(-1)[rows, target].mean().item()
    norms = []
    for name, params in (("forward_kl", {}), ("skew_forward_kl", {"alpha": alpha})):
        (gradient,) = torch.autograd.grad(DIVERGENCES[name](student[None], teacher[None], **params), student)
        norms.append(gradient.norm().item())
    return mass, norms[0], norms[1]


def main() -> None:
    print("| student | its mass on the teacher's token | ‖∇‖ forward KL | ‖∇‖ skew forward KL (α 0.1) | ratio |")
    print("|---|:---:|:---:|:---:|:---:|")
    for label, boost in (("random init", 0.0), ("partly trained", 4.0), ("well trained", 7.0)):
        mass, fkl, skew = gradient_norms(boost)
        print(f"| {label} | {mass:.4f} | {fkl:.3g} | {skew:.3g} | {fkl / skew:.0f}× |")


if __name__ == "__main__":
    main()
