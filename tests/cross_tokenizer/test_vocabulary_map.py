"""The shared-vocabulary map, and the exact-match loss with one tokenizer on both sides (the same-tokenizer loss)."""

from __future__ import annotations

import pytest
import torch

from mgsr_lightning.cross_tokenizer import align_texts, shared_vocabulary, token_surfaces
from mgsr_lightning.losses import DIVERGENCES, dac_kl
from mgsr_lightning.losses.cross_tokenizer import exact_match_loss


def test_byte_level_and_sentencepiece_pieces_map_by_what_they_spell(small_bpe, sentencepiece):
    shared = shared_vocabulary(small_bpe, sentencepiece)
    pairs = {small_bpe.convert_ids_to_tokens(s): sentencepiece.convert_ids_to_tokens(t)
             for s, t in zip(shared.student_ids.tolist(), shared.teacher_ids.tolist())}
    assert pairs["Ġ"] == "▁"  # a space
    assert pairs["â"] == "<0xE2>"  # byte 0xE2: a byte-level character and a byte-fallback token
    assert pairs["Ċ"] == "\n"  # newline, a piece of the SentencePiece vocabulary (not its <0x0A>)
    assert pairs["Ġthe"] == "▁the"
    assert pairs["The"] == "The" and pairs["ick"] == "ick"  # pieces inside or at the start of a text
    assert pairs["<|endoftext|>"] == "</s>"  # the end-of-sequence tokens, by role
    assert "<|pad|>" not in pairs and "<s>" not in pairs.values()
    assert len(set(shared.student_ids.tolist())) == len(shared) == len(set(shared.teacher_ids.tolist()))
    # nothing else: every pair spells the same bytes
    student_surfaces, teacher_surfaces = token_surfaces(small_bpe), token_surfaces(sentencepiece)
    for s, t, surface in zip(shared.student_ids.tolist(), shared.teacher_ids.tolist(), shared.surfaces):
        if surface == ("special", "<end of sequence>"):
            assert (s, t) == (small_bpe.eos_token_id, sentencepiece.eos_token_id)
        else:
            assert student_surfaces[s] == surface == teacher_surfaces[t]


def test_a_smaller_bpe_is_inside_a_larger_one_trained_on_the_same_text(small_bpe, large_bpe):
    shared = shared_vocabulary(small_bpe, large_bpe)
    assert len(shared) == len(small_bpe)  # BPE's first merges are the same: every small piece is a large one
    assert shared.student_ids.tolist() == sorted(range(len(small_bpe)))


TEXTS = ["Hello world, the capital of France is Paris.", "The answer is 42. the lazy dog"]


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "generalized_jsd", "alpha_beta", "dac_kl"])
def test_with_one_tokenizer_on_both_sides_it_is_the_same_tokenizer_loss(small_bpe, divergence):
    alignment = align_texts(TEXTS, small_bpe, small_bpe, add_special_tokens=True)
    assert alignment.one_to_one.equal(alignment.group_mask)  # these texts split no character
    shared = shared_vocabulary(small_bpe, small_bpe)
    assert len(shared) == len(small_bpe)
    generator = torch.Generator().manual_seed(0)
    batch, length = alignment.student.input_ids.shape
    student = torch.randn(batch, length, len(small_bpe), generator=generator) * 3
    teacher = torch.randn(batch, length, len(small_bpe), generator=generator) * 3
    student[0, 2, 5] = float("-inf")
    mask = alignment.student.groups >= 0
    params = {"mode": "fixed", "fixed_bounds": (0.02, 0.9)} if divergence == "dac_kl" else {}
    got, _ = exact_match_loss(student, teacher, alignment.aligned_groups(), shared.student_ids, shared.teacher_ids,
                              divergence=divergence, params=params, temperature=1.3)
    if divergence == "dac_kl":
        want, _ = dac_kl(student, teacher, mask, temperature=1.3, **params)
    else:
        want = DIVERGENCES[divergence](student, teacher, mask, temperature=1.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
