"""How many new tokens ``evaluate`` samples: enough for the longest reference answer, or a plain count of
the answers it cuts.

A model's training settings (``mgsr_training.json``) or ``--preset`` give the response length its rollouts
sampled, which suits the pair's own task (24 tokens for the tiny pair) but can cut a user's longer answers:
a 54-token answer sampled with 24 new tokens scores as a cut answer. When the length comes from there,
:func:`size_generation` raises it to the longest reference answer of the evaluated rows (its tokens and the
EOS), up to what the model's positions leave after the prompt cap, and says so. A length given on the
command line, or MiniLLM's 256 (the paper's protocol), is kept as it is; in every case the answers longer
than the final length are counted and named in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mgsr_lightning.evaluation.rouge import as_references

COMMAND_LINE = "the command line"


def reference_lengths(tokenizer, eval_sets: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[int]:
    """Per row of every set, the tokens of its longest reference answer with the EOS that ends it, tokenised as
    training tokenises a response."""
    lengths = []
    for records in eval_sets.values():
        for record in records:
            references = as_references(record["output"])
            ids = tokenizer(list(references), add_special_tokens=False)["input_ids"]
            lengths.append(max(len(tokens) for tokens in ids) + 1)
    return lengths


def size_generation(model: str, settings: dict[str, Any], sources: dict[str, str], lengths: Sequence[int],
                    positions: int | None) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """(settings, sources, what to print or None) with ``max_new_tokens`` sized from the reference ``lengths``.

    ``positions``: the model's position table (None: unknown, no cap)."""
    if not lengths:
        return settings, sources, None
    settings, sources = dict(settings), dict(sources)
    budget, longest = settings["max_new_tokens"], max(lengths)
    source = sources["max_new_tokens"]
    room = None if positions is None else positions - settings["max_prompt_length"]
    note = []
    if longest > budget and source != COMMAND_LINE and not source.startswith("default"):
        raised = longest if room is None else min(longest, room)
        if raised > budget:
            note.append(f"max_new_tokens raised from {budget} ({source}) to {raised}: the longest reference answer has "
                        f"{longest - 1} tokens and its EOS")
            settings["max_new_tokens"] = raised
            sources["max_new_tokens"] = f"the longest reference answer (raised from {budget})"
            budget = raised
    cut = sum(length > budget for length in lengths)
    if cut:
        why = (f"the model's {positions} positions leave {room} after prompts of up to {settings['max_prompt_length']} "
               "tokens" if room is not None and budget >= room else f"{source} sets max_new_tokens={budget}")
        note.append(f"{cut} of {len(lengths)} reference answers ({cut / len(lengths):.0%}) are longer than the "
                    f"{budget} new tokens sampled ({why}), so their samples are cut and score lower"
                    + ("" if room is not None and budget >= room else "; pass --max_new_tokens to sample more"))
    return settings, sources, f"{model}: " + "; ".join(note) if note else None


def sized_for(model: str, settings: dict[str, Any], sources: dict[str, str],
              eval_sets: Mapping[str, Sequence[Mapping[str, Any]]], max_examples: int | None = None):
    """:func:`size_generation` for a model folder or hub id, over the rows ``evaluate`` scores."""
    from mgsr_lightning.models.checks import model_positions
    from mgsr_lightning.models.tokenizer import load_tokenizer

    rows = {name: list(records)[:max_examples] if max_examples is not None else list(records)
            for name, records in eval_sets.items()}
    lengths = reference_lengths(load_tokenizer(str(model)), rows)
    return size_generation(str(model), settings, sources, lengths, model_positions(str(model)))
