"""The reason benchmark's generated task family: deterministic, correct, multi-modal, disjoint splits."""

import random
import re
from collections import Counter, defaultdict

import pytest

from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.data.tasks.reasoning import (
    FAMILIES,
    LIST_INSTRUCTIONS,
    LIST_STEPS,
    WORD_STEPS,
    write_reason_dataset,
)
from mgsr_lightning.data.tasks.tiny import generate_splits

SIZES = {"train": 400, "validation": 40, "test": 40}


def test_generation_is_deterministic():
    assert generate_splits(SIZES, 3, FAMILIES) == generate_splits(SIZES, 3, FAMILIES)
    assert generate_splits(SIZES, 3, FAMILIES) != generate_splits(SIZES, 4, FAMILIES)


def test_splits_are_disjoint_by_prompt_and_evaluation_splits_balanced():
    splits = generate_splits(SIZES, 0, FAMILIES)
    keys = {split: {r["instruction"] + "\n" + r["input"] for r in rows} for split, rows in splits.items()}
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert set(Counter(r["family"] for r in splits["test"]).values()) == {SIZES["test"] // len(FAMILIES)}


def test_answers_are_long_worked_chains():
    rows = generate_splits({"train": 2000}, 0, FAMILIES)["train"]
    words = [len(r["output"].split()) for r in rows]
    # ~1.3 BPE tokens per word on this data: 14-50 words are the 20-60 tokens the benchmark wants
    assert min(words) >= 12 and max(words) <= 50
    assert sum(words) / len(words) > 20


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_has_several_phrasings_of_one_content(family):
    """The same content is written in more than one way, so the ground truth is one draw of many."""
    rng = random.Random(0)
    openings = set()
    for _ in range(200):
        row = FAMILIES[family](rng)
        content = set(re.findall(r"\w+", row["input"].lower()))
        words = [w for w in re.findall(r"[a-z]+", row["output"].lower()) if w not in content]
        openings.add(tuple(words[:2]))  # the answer's first words, its content (numbers, input words) left out
    assert len(openings) >= 2


def _final_number(text: str) -> int:
    return int(re.findall(r"-?\d+", text)[-1])


def test_chain_arithmetic_and_running_total_are_correct():
    rng = random.Random(1)
    for _ in range(300):
        row = FAMILIES["chain_arithmetic"](rng)
        value, *steps = re.findall(r"(add|subtract|Start with) (\d+)", row["input"])
        total = int(value[1]) + sum(int(n) if op == "add" else -int(n) for op, n in steps)
        assert _final_number(row["output"]) == total
        row = FAMILIES["running_total"](rng)
        assert _final_number(row["output"]) == sum(int(n) for n in re.findall(r"\d+", row["input"]))


def test_list_and_word_transforms_are_correct():
    rng = random.Random(2)
    instructions = {text: name for name, text in LIST_INSTRUCTIONS.items()}
    for _ in range(300):
        row = FAMILIES["list_transform"](rng)
        numbers_text, steps_text = row["input"][len("List: "):].split(". Steps: ")
        numbers = [int(n) for n in numbers_text.split(", ")]
        for step in steps_text.rstrip(".").split(", then "):
            numbers = LIST_STEPS[instructions[step]][1](numbers)
        assert row["output"].endswith(", ".join(map(str, numbers)) + ".")
        row = FAMILIES["word_transform"](rng)
        word_text, steps_text = row["input"][len("Word: "):].split(". Steps: ")
        by_text = {text: step for text, _, step in WORD_STEPS.values()}
        word = word_text
        for step in steps_text.rstrip(".").split(", then "):
            word = by_text[step](word)
        assert row["output"].endswith(f" {word}.")


def test_grid_walk_inventory_and_sort_are_correct():
    rng = random.Random(3)
    for _ in range(300):
        row = FAMILIES["grid_walk"](rng)
        x, y = map(int, re.match(r"Start at \((-?\d+), (-?\d+)\)", row["input"]).groups())
        for direction, n in re.findall(r"(up|down|left|right) (\d+)", row["input"]):
            dx, dy = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}[direction]
            x, y = x + dx * int(n), y + dy * int(n)
        assert row["output"].endswith(f"({x}, {y}).")
        row = FAMILIES["inventory"](rng)
        counts = defaultdict(int)
        for n, color in re.findall(r"(\d+) (\w+)", row["input"].split(". Then ")[0]):
            counts[color] += int(n)
        for op, n, color in re.findall(r"(add|remove) (\d+) (\w+)", row["input"]):
            counts[color] += int(n) if op == "add" else -int(n)
        assert min(counts.values()) >= 0
        assert _final_number(row["output"]) == sum(counts.values())
        row = FAMILIES["sort_explain"](rng)
        numbers = sorted(int(n) for n in row["input"].split(", "))
        if "largest to smallest" in row["instruction"] or "high to low" in row["instruction"]:
            numbers.reverse()
        assert row["output"].endswith(", ".join(map(str, numbers)) + ".")


def test_describe_record_states_every_field_once():
    rng = random.Random(4)
    for _ in range(200):
        row = FAMILIES["describe_record"](rng)
        fields = dict(part.split(": ") for part in row["input"].split("; "))
        assert row["output"].startswith(fields.pop("name"))
        assert len(row["output"].split(". ")) == len(fields)
        for value in fields.values():
            assert value in row["output"]


def test_write_reason_dataset(tmp_path):
    paths = write_reason_dataset(tmp_path, {"train": 50, "validation": 16, "test": 16}, seed=0)
    assert [len(read_jsonl(paths[s])) for s in ("train", "validation", "test")] == [50, 16, 16]
