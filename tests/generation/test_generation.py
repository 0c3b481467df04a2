"""Student rollouts: response-aligned logits and the KV-cached sampler, on tiny real GPT-2/OPT/LLaMA models."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model
from torch import nn

from mgsr_lightning.batch import Rollout, positions_from_mask
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.kv_cache import realigned_cache
from mgsr_lightning.generation.sampling import DecodingConfig, SamplingConfig, choose_tokens, filter_logits, inverse_cdf
from mgsr_lightning.generation.scoring import response_logits, response_logits_and_cache, response_logits_from_prefix

EOS, PAD = 0, 1
VOCAB = 400
GREEDY = SamplingConfig(do_sample=False, max_new_tokens=8)
IDS = dict(eos_token_id=EOS, pad_token_id=PAD)


def sharpened(model: nn.Module, scale: float = 5.0) -> nn.Module:
    """Scale every weight matrix, so a random tiny model's next token depends on its context.

    At init a tied GPT-2 only repeats its last token, which would make any comparison of decoders
    trivially pass.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(scale)
    return model


def with_output_bias(model: nn.Module, bias: torch.Tensor) -> nn.Module:
    """Replace the LM head by an untied copy of it that adds ``bias`` [V] to every logit."""
    weight = model.get_output_embeddings().weight
    head = nn.Linear(weight.size(1), weight.size(0), bias=True)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    model.config.tie_word_embeddings = False
    model.lm_head = head
    return model


def positional_gpt2(logit_table: torch.Tensor, hidden: int = 32) -> nn.Module:
    """A real tiny GPT-2 whose next-token logits at absolute position t are ``logit_table[t]``, whatever the tokens.

    Token embeddings and both sublayers' output projections are zeroed, so the final hidden state at
    position t is ln_f(wpe[t]). With the zero-mean, mutually orthogonal rows wpe[t] = e_2t − e_2t+1,
    an lm_head of W = Σ_t logit_table[t] ⊗ h_t / |h_t|² gives back logit_table[t] exactly (positions
    past the table get all-zero logits). It makes errors, EOS and length edges land where a test
    says, and any shift of positions by padding visible.

    Args:
        logit_table: [T, V] with T <= hidden // 2.
    """
    n_positions, vocab_size = logit_table.shape
    assert n_positions <= hidden // 2
    model = build_tiny_model("gpt2", vocab_size, n_layer=1, hidden=hidden)
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        for block in model.transformer.h:
            for projection in (block.attn.c_proj, block.mlp.c_proj):
                projection.weight.zero_()
                projection.bias.zero_()
        position_embeddings = torch.zeros_like(model.transformer.wpe.weight)  # [max_positions, d]
        steps = torch.arange(n_positions)
        position_embeddings[steps, 2 * steps] = 1.0
        position_embeddings[steps, 2 * steps + 1] = -1.0
        model.transformer.wpe.weight.copy_(position_embeddings)
        final_hidden = model.transformer.ln_f(position_embeddings[:n_positions])  # [T, d], orthogonal rows
        head = nn.Linear(hidden, vocab_size, bias=False)
        head.weight.copy_(logit_table.T @ (final_hidden / final_hidden.pow(2).sum(-1, keepdim=True)))  # [V, d]
    model.config.tie_word_embeddings = False
    model.lm_head = head
    return model


def peaked_table(tokens_by_position: list[int], strength: float = 30.0, vocab_size: int = VOCAB) -> torch.Tensor:
    """[T, V] logits that put almost all mass on ``tokens_by_position[t]`` at position t."""
    table = torch.zeros(len(tokens_by_position), vocab_size)
    table[torch.arange(len(tokens_by_position)), torch.tensor(tokens_by_position)] = strength
    return table


def left_padded(prompts: list[list[int]], extra_padding: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, P] prompt ids and mask, with ``extra_padding`` more pad columns than needed."""
    rollout = Rollout.from_token_lists(prompts, [[] for _ in prompts], pad_token_id=PAD)
    pad = torch.full((len(prompts), extra_padding), PAD)
    ids = torch.cat([pad, rollout.prompt_ids], dim=1)
    mask = torch.cat([pad != PAD, rollout.prompt_mask], dim=1)
    return ids, mask


PROMPTS = [[5, 17, 42], [8, 9, 10, 11, 12, 13], [99]]


# ---------------------------------------------------------------- logits over a rollout


def test_response_logits_are_aligned_with_the_response_tokens():
    rollout = Rollout.from_token_lists([[5, 6], [7]], [[20, 0], [21, 22, 23]], pad_token_id=PAD)
    # Column P-1+r of the full logits predicts response token r; response_logits keeps only those.
    model = build_tiny_model("gpt2", VOCAB, n_layer=1)
    full = model(**rollout.model_inputs()).logits  # [B, P+R, V]
    torch.testing.assert_close(response_logits(model, rollout), full[:, 1:4])
    torch.testing.assert_close(response_logits(model, rollout, vocab_size=7), full[:, 1:4, :7])


# ---------------------------------------------------------------- decoding


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
def test_greedy_matches_hf_generate_with_left_padding(family):
    model = sharpened(build_tiny_model(family, VOCAB, n_layer=1))
    prompt_ids, prompt_mask = left_padded(PROMPTS)

    rollout = sample(model, prompt_ids, prompt_mask, Decoding(GREEDY, **IDS))
    reference = model.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask.long(),
        do_sample=False,
        max_new_tokens=GREEDY.max_new_tokens,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )

    assert torch.equal(rollout.response_ids, reference[:, prompt_ids.size(1) :])
    assert torch.equal(rollout.prompt_ids, prompt_ids)
    assert rollout.response_mask.all()  # no EOS in 8 greedy steps of these models: every row runs to the cap


def test_row_seeds_make_each_row_independent_of_batch_and_padding():
    model = sharpened(build_tiny_model("llama", VOCAB, n_layer=1))
    config = SamplingConfig(max_new_tokens=10)
    seeds = torch.tensor([11, 22, 33])

    batched = sample(model, *left_padded(PROMPTS), Decoding(config, **IDS), seeds=seeds)
    _, batched_responses = batched.to_token_lists()

    reversed_batch = sample(model, *left_padded(PROMPTS[::-1]), Decoding(config, **IDS), seeds=seeds.flip(0))
    assert reversed_batch.to_token_lists()[1] == batched_responses[::-1]
    for row, prompt in enumerate(PROMPTS):
        prompt_ids, prompt_mask = left_padded([prompt], extra_padding=3)
        alone = sample(model, prompt_ids, prompt_mask, Decoding(config, **IDS), seeds=seeds[row : row + 1])
        assert alone.to_token_lists()[1] == [batched_responses[row]]

    other_seed = sample(model, *left_padded(PROMPTS[:1]), Decoding(config, **IDS), seeds=seeds[:1] + 1)
    assert other_seed.to_token_lists()[1] != batched_responses[:1]


def test_without_seeds_the_global_rng_drives_sampling():
    model = sharpened(build_tiny_model("opt", VOCAB, n_layer=1))
    config = SamplingConfig(max_new_tokens=10)

    torch.manual_seed(7)
    first = sample(model, *left_padded(PROMPTS), Decoding(config, **IDS))
    torch.manual_seed(7)
    again = sample(model, *left_padded(PROMPTS), Decoding(config, **IDS))
    torch.manual_seed(8)
    other = sample(model, *left_padded(PROMPTS), Decoding(config, **IDS))

    assert torch.equal(first.response_ids, again.response_ids)
    assert not torch.equal(first.response_ids, other.response_ids)


def test_eos_ends_each_row_and_is_kept():
    # Position 4 predicts EOS, every other position token 7: a row whose prompt has n real tokens
    # predicts its response token r at position n-1+r, so it ends with its (6-n)-th response token.
    model = positional_gpt2(peaked_table([7, 7, 7, 7, EOS, 7, 7, 7]))
    prompt_ids, prompt_mask = left_padded([[5, 6], [5, 6, 7, 8]], extra_padding=1)

    config = SamplingConfig(max_new_tokens=12)
    rollout = sample(model, prompt_ids, prompt_mask, Decoding(config, **IDS), seeds=torch.tensor([0, 1]))

    assert rollout.response_ids.tolist() == [[7, 7, 7, EOS], [7, EOS, PAD, PAD]]
    assert rollout.response_mask.tolist() == [[True] * 4, [True, True, False, False]]


def test_max_new_tokens_and_max_length_cap_each_row():
    model = positional_gpt2(peaked_table([7] * 16))  # never EOS
    prompts = [[5, 6], [5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11]]
    config = SamplingConfig(max_new_tokens=5)

    uncapped = sample(model, *left_padded(prompts), Decoding(config, **IDS))
    assert uncapped.response_lengths().tolist() == [5, 5, 5]

    capped = sample(model, *left_padded(prompts), Decoding(config, **IDS), max_length=6)
    assert capped.response_lengths().tolist() == [4, 2, 0]  # prompt + response <= 6; a longer prompt gets nothing
    assert capped.to_token_lists()[1] == [[7] * 4, [7] * 2, []]

    per_row = sample(model, *left_padded(prompts), Decoding(config, **IDS), max_length=torch.tensor([3, 9, 8]))
    assert per_row.response_lengths().tolist() == [1, 5, 1]


def test_padded_vocabulary_rows_are_never_sampled():
    # Embedding rows 300..399 stand for a padded vocabulary; a large bias makes the model prefer them.
    bias = torch.zeros(VOCAB)
    bias[300:] = 100.0
    model = with_output_bias(build_tiny_model("gpt2", VOCAB, n_layer=1), bias)
    config = SamplingConfig(max_new_tokens=10)
    seeds = torch.tensor([1, 2, 3])

    unsliced = sample(model, *left_padded(PROMPTS), Decoding(config, **IDS), seeds=seeds)
    sliced = sample(model, *left_padded(PROMPTS), Decoding(config, **IDS, vocab_size=300), seeds=seeds)

    assert (unsliced.response_ids >= 300).all()
    assert (sliced.response_ids < 300).all()
    assert sliced.response_mask.all()


def test_top_k_one_and_tiny_top_p_sample_the_greedy_tokens():
    model = sharpened(build_tiny_model("gpt2", VOCAB, n_layer=1))
    prompt_ids, prompt_mask = left_padded(PROMPTS)
    seeds = torch.tensor([4, 5, 6])

    def sampled(config: SamplingConfig) -> Rollout:
        return sample(model, prompt_ids, prompt_mask, Decoding(config, **IDS), seeds=seeds)

    greedy = sampled(GREEDY)
    top_k_one = sampled(SamplingConfig(top_k=1, max_new_tokens=8))
    tiny_top_p = sampled(SamplingConfig(top_p=1e-6, max_new_tokens=8))
    full = sampled(SamplingConfig(max_new_tokens=8))

    assert torch.equal(top_k_one.response_ids, greedy.response_ids)
    assert torch.equal(tiny_top_p.response_ids, greedy.response_ids)
    assert not torch.equal(full.response_ids, greedy.response_ids)


def test_filter_logits_temperature_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.allclose(filter_logits(logits, SamplingConfig(temperature=2.0)), logits / 2)
    top_two = filter_logits(logits, SamplingConfig(top_k=2))
    assert top_two[0, :2].tolist() == [4.0, 3.0] and torch.isinf(top_two[0, 2:]).all()

    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    # top_p keeps the fewest most likely tokens whose mass reaches top_p: 0.5 + 0.3 >= 0.75.
    kept = torch.isfinite(filter_logits(probs.log(), SamplingConfig(top_p=0.75)))
    assert kept.tolist() == [[False, True, False, True]]
    kept = torch.isfinite(filter_logits(probs.log(), SamplingConfig(top_p=0.85)))
    assert kept.tolist() == [[False, True, True, True]]


def test_top_k_sampling_draws_only_among_the_k_best():
    logits = torch.tensor([0.0, 2.0, 1.0, 1.5, -1.0]).expand(2000, 5)
    draws = choose_tokens(logits, SamplingConfig(top_k=2))
    assert set(draws.tolist()) == {1, 3}


def test_seeded_draws_follow_the_distribution_and_skip_impossible_tokens():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    draws = choose_tokens(probs.log().expand(20_000, 6), SamplingConfig(), seeds=torch.arange(20_000), counter=3)
    frequencies = torch.bincount(draws, minlength=6).double() / 20_000
    torch.testing.assert_close(frequencies, probs.double(), atol=0.015, rtol=0)
    # a uniform at the top of [0, 1) lands on the last token with mass, never on the impossible tail
    edge = inverse_cdf(probs[None], torch.tensor([1 - 2.0**-53], dtype=torch.float64))
    assert edge.tolist() == [4]
    assert inverse_cdf(probs[None], torch.zeros(1, dtype=torch.float64)).tolist() == [1]


def test_sampling_config_rejects_invalid_values():
    for bad in (dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


# ---------------------------------------------------------------- use of the rollout for training


def test_rollout_feeds_a_student_forward_with_grad():
    # Ids made under torch.inference_mode() would raise "Inference tensors cannot be saved for backward" here.
    student = build_tiny_model("gpt2", VOCAB, n_layer=1)
    rollout = sample(student, *left_padded(PROMPTS), Decoding(SamplingConfig(max_new_tokens=6), **IDS))
    assert not rollout.response_ids.is_inference()

    student.train()
    logits = response_logits(student, rollout)  # [B, R, V]
    labels = rollout.response_ids.masked_fill(~rollout.response_mask, -100)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    assert student.lm_head.weight.grad is not None and student.lm_head.weight.grad.abs().sum() > 0


def test_sampling_runs_without_dropout_and_restores_train_mode():
    model = sharpened(build_tiny_model("gpt2", VOCAB, n_layer=1))
    prompt_ids, prompt_mask = left_padded(PROMPTS)
    in_eval = sample(model, prompt_ids, prompt_mask, Decoding(GREEDY, **IDS))

    model.train()  # GPT-2's dropout (p = 0.1) would change the greedy tokens if it stayed on
    in_train = sample(model, prompt_ids, prompt_mask, Decoding(GREEDY, **IDS))

    assert model.training
    assert torch.equal(in_train.response_ids, in_eval.response_ids)


def test_empty_prompt_is_rejected():
    model = build_tiny_model("gpt2", VOCAB, n_layer=1)
    prompt_ids, prompt_mask = left_padded([[5, 6], []])
    with pytest.raises(ValueError, match="at least one real token"):
        sample(model, prompt_ids, prompt_mask, Decoding(GREEDY, **IDS))


# ---------------------------------------------------------------- re-generation from the scoring forward's KV cache

EIGHT_TOKENS = SamplingConfig(max_new_tokens=8)


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
def test_realigned_cache_gives_the_logits_of_re_encoding_the_prefix(family):
    model = sharpened(build_tiny_model(family, VOCAB, seed=3, n_layer=2))
    rollout = sample(model, *left_padded(PROMPTS, 2), Decoding(EIGHT_TOKENS, **IDS), seeds=torch.tensor([1, 2, 3]))
    _, cache = response_logits_and_cache(model, rollout)
    cuts = torch.tensor([5, 0, 3])  # per row: keep response[:cut], then feed a new token
    new_tokens = torch.tensor([70, 71, 72])
    columns = torch.arange(rollout.response_ids.size(1))[None, :]
    keep = rollout.response_mask & (columns < cuts[:, None])
    prompts, responses = rollout.to_token_lists()
    contexts = [p + r[:cut] + [token]
                for p, r, cut, token in zip(prompts, responses, cuts.tolist(), new_tokens.tolist())]
    context_ids, context_mask = left_padded(contexts)

    # The context less its new token is prompt + response[:cut]: its columns in the scoring forward.
    real = torch.cat([rollout.prompt_mask, keep], 1)
    order = torch.sort(real.long(), dim=1, stable=True).indices[:, real.size(1) - (context_ids.size(1) - 1):]
    realigned = realigned_cache(cache, torch.arange(3), order)
    assert realigned is not None
    positions = positions_from_mask(context_mask)
    continued = model(input_ids=context_ids[:, -1:], attention_mask=context_mask.long(),
                      position_ids=positions[:, -1:], cache=realigned, use_cache=True).logits[:, -1]
    encoded = model(input_ids=context_ids, attention_mask=context_mask.long(), position_ids=positions).logits[:, -1]
    torch.testing.assert_close(continued, encoded, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
@pytest.mark.parametrize("unchanged", [0, 3, 7])
def test_logits_from_an_earlier_forward_s_prefix_equal_a_full_forward(family, unchanged):
    model = sharpened(build_tiny_model(family, VOCAB, seed=3, n_layer=2))
    earlier = sample(model, *left_padded(PROMPTS, 2), Decoding(EIGHT_TOKENS, **IDS), seeds=torch.tensor([1, 2, 3]))
    earlier_logits, cache = response_logits_and_cache(model, earlier)
    # A new rollout: the same prompts and response[:unchanged], then other tokens, two columns wider,
    # with rows of different lengths (row 1 ends early, its tail padding).
    width = earlier.response_ids.size(1)
    new_ids = torch.cat([earlier.response_ids, earlier.response_ids[:, :2]], 1).clone()
    new_ids[:, unchanged:] = torch.randint(3, VOCAB, (3, width + 2 - unchanged),
                                           generator=torch.Generator().manual_seed(0))
    new_mask = torch.ones_like(new_ids, dtype=torch.bool)
    new_mask[:, :unchanged] = earlier.response_mask[:, :unchanged]
    new_mask[1, max(unchanged, 5):] = False
    new_ids = new_ids.masked_fill(~new_mask, PAD)
    new = Rollout(earlier.prompt_ids, earlier.prompt_mask, new_ids, new_mask)

    reused = response_logits_from_prefix(model, new, earlier_logits, cache, unchanged)

    assert reused.shape == (3, width + 2, VOCAB)
    full = response_logits(model, new)
    torch.testing.assert_close(reused[new_mask], full[new_mask], rtol=1e-5, atol=1e-5)


def test_a_cache_that_cannot_be_realigned_falls_back_to_re_encoding():
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    sliding = DynamicCache()
    sliding.layers = [DynamicSlidingWindowLayer(sliding_window=4)]
    assert realigned_cache(sliding, torch.arange(1), torch.zeros(1, 2, dtype=torch.long)) is None


# ---------------------------------------------------------------- the decode loop's static cache and compiled step


def static_and_dynamic(model, prompt_ids, prompt_mask, sampling, **kwargs):
    """The rollouts of ``sample`` with the preallocated cache and with a growing one, same everything else."""
    return [sample(model, prompt_ids, prompt_mask,
                   Decoding(sampling, **IDS, loop=DecodingConfig(static_cache=static)), **kwargs)
            for static in (True, False)]


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
@pytest.mark.parametrize("sampling", [SamplingConfig(max_new_tokens=12), SamplingConfig(max_new_tokens=12, top_p=0.8),
                                      SamplingConfig(do_sample=False, max_new_tokens=12)])
def test_the_static_cache_samples_the_tokens_of_the_dynamic_one(family, sampling):
    model = sharpened(build_tiny_model(family, VOCAB, seed=4))
    seeds = torch.tensor([3, 5, 7])
    static, dynamic = static_and_dynamic(model, *left_padded(PROMPTS, 1), sampling, seeds=seeds,
                                         max_length=torch.tensor([12, 16, 9]))

    assert static.response_ids.size(1) > 1 and static.response_mask.sum(-1).unique().numel() > 1  # rows end apart
    assert torch.equal(static.response_ids, dynamic.response_ids)
    assert torch.equal(static.response_mask, dynamic.response_mask)


def test_the_static_cache_continues_from_a_realigned_prefix():
    model = sharpened(build_tiny_model("llama", VOCAB, seed=3, n_layer=2))
    rollout = sample(model, *left_padded(PROMPTS, 2), Decoding(EIGHT_TOKENS, **IDS), seeds=torch.tensor([1, 2, 3]))
    _, cache = response_logits_and_cache(model, rollout)
    # continue every row after its whole prompt + response (left-packed as ``sample`` expects)
    context_ids, context_mask = rollout.model_inputs()["input_ids"], rollout.model_inputs()["attention_mask"].bool()
    order = torch.sort(context_mask.long(), dim=1, stable=True).indices
    context_ids, context_mask = context_ids.gather(1, order), context_mask.gather(1, order)
    prefix = realigned_cache(cache, torch.arange(3), order[:, :-1])
    prefix_copy = realigned_cache(cache, torch.arange(3), order[:, :-1])
    seeds = torch.tensor([4, 5, 6])

    static, dynamic = (sample(model, context_ids, context_mask,
                              Decoding(EIGHT_TOKENS, **IDS, loop=DecodingConfig(static_cache=static)), seeds=seeds,
                              cache=cache_in)
                       for static, cache_in in ((True, prefix), (False, prefix_copy)))
    encoded = sample(model, context_ids, context_mask, Decoding(EIGHT_TOKENS, **IDS), seeds=seeds)

    assert torch.equal(static.response_ids, dynamic.response_ids)
    assert torch.equal(static.response_ids, encoded.response_ids)


def test_decoding_config_rejects_compiling_a_growing_cache():
    with pytest.raises(ValueError, match="static_cache"):
        DecodingConfig(static_cache=False, compile=True)
    assert not DecodingConfig().static_cache and not DecodingConfig().compile


@pytest.mark.slow
def test_the_compiled_step_samples_the_tokens_of_the_eager_loop():
    model = sharpened(build_tiny_model("gpt2", VOCAB, seed=3, n_layer=2))
    seeds = torch.tensor([1, 2, 3])
    eager = sample(model, *left_padded(PROMPTS, 1), Decoding(EIGHT_TOKENS, **IDS), seeds=seeds)
    loop = DecodingConfig(static_cache=True, compile=True)
    compiled = sample(model, *left_padded(PROMPTS, 1), Decoding(EIGHT_TOKENS, **IDS, loop=loop), seeds=seeds)
    assert torch.equal(compiled.response_ids, eager.response_ids)
