"""The facts benchmark's generated tasks: a fixed world, answers true to it, several orders and
phrasings of one content, disjoint splits."""

import random
import re
from collections import Counter

from mgsr_lightning.data.tasks.knowledge import ATTRIBUTES, FAMILIES, N_CREATURES, VALUES, world
from mgsr_lightning.data.tasks.tiny import generate_splits

SIZES = {"train": 600, "validation": 60, "test": 60}


def test_the_world_is_fixed_and_has_distinct_single_word_names():
    creatures = world()
    assert len(creatures) == N_CREATURES and all(re.fullmatch(r"[A-Z][a-z]+", name) for name in creatures)
    for creature in creatures.values():
        assert set(creature.attributes) == set(ATTRIBUTES)
        assert all(creature.attributes[a] in VALUES[a] for a in ATTRIBUTES)
        assert creature.friend in creatures and creature.rival in creatures
        assert creature.name not in (creature.friend, creature.rival)
    # every split seed asks about the same world: the prompts of different seeds name the same creatures
    names = {seed: {w for r in generate_splits(SIZES, seed, FAMILIES)["train"]
                    for w in re.findall(r"[A-Z][a-z]+", r["input"])}
             for seed in (0, 1)}
    assert names[0] - {"Creature", "Facts", "Start", "Follow", "Creatures"} <= set(creatures)
    assert len(names[0] & names[1]) > N_CREATURES // 2


def test_generation_is_deterministic_and_splits_disjoint_and_balanced():
    splits = generate_splits(SIZES, 0, FAMILIES)
    assert splits == generate_splits(SIZES, 0, FAMILIES) and splits != generate_splits(SIZES, 1, FAMILIES)
    keys = {split: {r["instruction"] + "\n" + r["input"] for r in rows} for split, rows in splits.items()}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert set(Counter(r["family"] for r in splits["test"]).values()) == {SIZES["test"] // len(FAMILIES)}


def test_describe_states_true_facts_of_the_named_creature_as_many_as_asked():
    rng = random.Random(0)
    for _ in range(300):
        row = FAMILIES["describe"](rng)
        name, count = re.fullmatch(r"Creature: (\w+)\. Facts: (three|four)\.", row["input"]).groups()
        truth = world()[name].attributes
        stated = [w for w in re.findall(r"[a-z]+", row["output"]) if any(w in values for values in VALUES.values())]
        assert len(stated) == {"three": 3, "four": 4}[count] == len(set(stated)), row
        assert set(stated) <= set(truth.values()), row
        assert row["output"].startswith(f"The {name} ")


def test_follow_chains_each_step_from_the_last_one_reached():
    rng = random.Random(1)
    for _ in range(300):
        row = FAMILIES["follow"](rng)
        start, steps = re.fullmatch(r"Start: (\w+)\. Follow: (.+)\.", row["input"]).groups()
        current = start
        for step in steps.split(", "):
            current = getattr(world()[current], step)
        assert re.findall(r"[A-Z][a-z]+", row["output"])[-1] == current


def test_compare_verdict_follows_the_looked_up_values():
    rng = random.Random(2)
    for _ in range(300):
        row = FAMILIES["compare"](rng)
        first, second = re.fullmatch(r"Creatures: (\w+) and (\w+)\.", row["input"]).groups()
        attribute = "size" if "size" in row["output"] else "legs"
        rank = [VALUES[attribute].index(world()[name].attributes[attribute]) for name in (first, second)]
        verdict = row["output"].split(". ")[-1]
        if rank[0] == rank[1]:
            assert verdict.startswith("They")
        else:
            assert (first if rank[0] > rank[1] else second) in verdict


def test_one_prompt_has_many_valid_answers():
    """The facts told, their order and their wording are drawn anew for each row, so one prompt has many
    valid answers and the ground truth is one draw of them."""
    rng = random.Random(3)
    by_prompt: dict[str, set[str]] = {}
    wordings = set()
    for _ in range(3000):
        row = FAMILIES["describe"](rng)
        by_prompt.setdefault(row["instruction"] + row["input"], set()).add(row["output"])
        wordings |= {sentence.split()[1] for sentence in row["output"].split(". ")[1:]}  # "It lives", "It makes", ...
    repeated = [answers for answers in by_prompt.values() if len(answers) > 1]
    assert len(repeated) > 100  # prompts drawn twice or more almost always got different answers
    assert {"lives", "makes", "eats", "feeds", "has", "walks"} <= wordings
