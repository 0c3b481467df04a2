"""The ``facts`` benchmark: generated tasks whose content is knowledge the teacher holds.

In the ``reason`` benchmark (:mod:`mgsr_lightning.data.tasks.reasoning`) every answer is computed from
the prompt, and a CPU-sized teacher learns the format of the chains but not their arithmetic, so it
has little beyond the ground truth to pass on. Here the content is a fixed, generated world of
creatures, each with six attributes and two relations (a friend and a rival), that the prompts never
state: the teacher learns it from all training rows and the students see a tenth of them, as a large
model knows more than its student's labelled data says. Three families ask about it:

- ``describe``: three or four facts about one creature, chosen, ordered and worded at random (the
  prompt says how many, not which), so at each sentence start the teacher's next-token distribution
  spreads over the wordings of every fact not yet told (and after ``It is`` over the creature's colour
  and size) while the ground truth names one;
- ``follow``: a chain of friend/rival lookups in which every step starts from the previous answer, so
  an early mistake carries through the rest;
- ``compare``: two creatures' sizes (or leg counts) looked up, then compared.

The world is drawn from ``WORLD_SEED`` whatever the split seed, so every split asks about the same
creatures; splits are disjoint by prompt, as in the other embedded tasks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mgsr_lightning.data.tasks.tiny import Example, write_splits

WORLD_SEED = 1234
N_CREATURES = 120
ONSETS = "b d f g k l m n p r s t v z br dr gr kr pl tr sk".split()
VOWELS = "a e i o u".split()
CODAS = "x n m l r s k".split()
VALUES = {
    "home": "marsh desert forest cave river mountain meadow island jungle tundra".split(),
    "colour": "red blue green yellow white black grey orange".split(),
    "food": "berries fish seeds insects leaves roots honey mushrooms".split(),
    "size": "tiny small medium large huge".split(),  # in increasing order
    "legs": "two four six eight".split(),  # in increasing order
    "sound": "hums hisses sings barks chirps growls".split(),
}
ATTRIBUTES = tuple(VALUES)
NUMBER_WORDS = {3: "three", 4: "four"}
PHRASINGS = {
    "home": ["lives in the {}", "makes its home in the {}"],
    "colour": ["is {}", "has {} skin"],
    "food": ["eats {}", "feeds on {}"],
    "size": ["is {} in size", "is a {} creature"],
    "legs": ["has {} legs", "walks on {} legs"],
    "sound": ["{}", "often {}"],
}


@dataclass(frozen=True)
class Creature:
    name: str
    attributes: dict[str, str]
    friend: str
    rival: str


@cache
def world() -> dict[str, Creature]:
    """The fixed world every split asks about: ``N_CREATURES`` creatures by name."""
    rng = random.Random(WORLD_SEED)
    names: list[str] = []
    while len(names) < N_CREATURES:
        name = (rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(ONSETS) + rng.choice(VOWELS)
                + rng.choice(CODAS)).capitalize()
        if name not in names:
            names.append(name)
    creatures = {}
    for name in names:
        others = [other for other in names if other != name]
        creatures[name] = Creature(
            name=name,
            attributes={attribute: rng.choice(values) for attribute, values in VALUES.items()},
            friend=rng.choice(others),
            rival=rng.choice(others),
        )
    return creatures


def _describe(rng: random.Random) -> Example:
    """Three or four facts about one creature: the prompt says how many, the answer picks which (and
    their order and wording) at random, so one prompt has many valid answers."""
    creature = rng.choice(list(world().values()))
    count = rng.randint(3, 4)
    instruction = rng.choice(["Describe the creature.", "Tell me about this creature.", "What is this creature like?"])
    context = f"Creature: {creature.name}. Facts: {NUMBER_WORDS[count]}."
    told = rng.sample(ATTRIBUTES, count)
    sentences = [
        f"{'The ' + creature.name if i == 0 else 'It'} {rng.choice(PHRASINGS[a]).format(creature.attributes[a])}."
        for i, a in enumerate(told)
    ]
    return {"instruction": instruction, "input": context, "output": " ".join(sentences)}


def _follow(rng: random.Random) -> Example:
    """Friend and rival lookups chained: each step starts from the creature the last one reached."""
    creatures = world()
    current = rng.choice(list(creatures))
    steps = [rng.choice(["friend", "rival"]) for _ in range(rng.randint(3, 4))]
    instruction = rng.choice(["Follow the links between creatures.", "Walk from creature to creature."])
    context = f"Start: {current}. Follow: {', '.join(steps)}."
    style = rng.randrange(2)
    lines = []
    for step in steps:
        reached = getattr(creatures[current], step)
        lines.append(f"The {step} of {current} is {reached}." if style == 0 else f"{current}'s {step} is {reached}.")
        current = reached
    ending = rng.choice([f"We end at {current}.", f"The last one is {current}."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


def _compare(rng: random.Random) -> Example:
    """Two creatures' sizes or leg counts looked up, then compared."""
    first, second = rng.sample(list(world().values()), 2)
    attribute = rng.choice(["size", "legs"])
    ranks = {value: i for i, value in enumerate(VALUES[attribute])}
    a, b = first.attributes[attribute], second.attributes[attribute]
    if attribute == "size":
        instruction = rng.choice(["Which creature is bigger?", "Compare the sizes of the two creatures."])
        facts = [f"The {c.name} is {c.attributes['size']} in size." for c in (first, second)]
        verdict = ("They are the same size." if a == b else
                   f"So the {(first if ranks[a] > ranks[b] else second).name} is bigger.")
    else:
        instruction = rng.choice(["Which creature has more legs?", "Compare the legs of the two creatures."])
        facts = [f"The {c.name} has {c.attributes['legs']} legs." for c in (first, second)]
        verdict = ("They have the same number of legs." if a == b else
                   f"So the {(first if ranks[a] > ranks[b] else second).name} has more legs.")
    if rng.random() < 0.5:
        facts.reverse()
    context = f"Creatures: {first.name} and {second.name}."
    return {"instruction": instruction, "input": context, "output": " ".join(facts) + " " + verdict}


FAMILIES: dict[str, Callable[[random.Random], Example]] = {
    "describe": _describe,
    "follow": _follow,
    "compare": _compare,
}


def write_facts_dataset(folder: str | Path, sizes: dict[str, int], seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl``, ``validation.jsonl`` and ``test.jsonl`` (as sized) into ``folder``."""
    return write_splits(folder, sizes, seed, FAMILIES)
