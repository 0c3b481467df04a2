"""The ``reason`` benchmark: generated multi-step tasks where distillation matters.

The tiny task (:mod:`mgsr_lightning.data.tasks.tiny`) has short answers with one right string, so a
teacher's distribution says little that the target does not. Here every answer is a worked chain of
20-60 tokens in which each step reads the previous one (a running value, a list, a word, a
position, an inventory), so an early mistake carries through the rest of the answer: exposure bias
is real. And every answer is written in one of several phrasings (and, where the content allows, in
one of several orders) drawn at random, so the same prompt has many valid targets and the teacher's
distribution over them carries more than any single ground-truth string.

Splits are disjoint by prompt (instruction + input), as in the tiny task; the style of an answer is
not part of the prompt, so a prompt's references in different splits may differ only in phrasing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from mgsr_lightning.data.tasks.tiny import WORDS, Example, write_splits

FEMALE_NAMES = frozenset("Anna Clara Emma Grace Iris Lena Nora Paula Rosa Tara".split())
NAMES = "Anna Ben Clara David Emma Felix Grace Hugo Iris Jonas Lena Marco Nora Oscar Paula Rosa Sam Tara".split()
CITIES = "Lima Oslo Rome Cairo Tokyo Paris Dublin Vienna Madrid Berlin Athens Lisbon Warsaw Havana".split()
JOBS = "baker teacher pilot nurse farmer painter doctor driver writer singer tailor builder".split()
PETS = "cat dog parrot rabbit turtle horse hamster goldfish".split()
HOBBIES = "chess tennis cooking hiking painting fishing dancing reading swimming gardening".split()
ITEMS = "pen book cup hat lamp bag shoe clock vase kite ball map".split()
COLORS = "red blue green yellow white black".split()


def _chain_arithmetic(rng: random.Random) -> Example:
    """Add and subtract in turn from a start value: every step uses the previous result."""
    value = rng.randint(10, 60)
    steps = [(rng.choice("+-"), rng.randint(2, 29)) for _ in range(rng.randint(3, 5))]
    instruction = rng.choice([
        "Work out the result step by step.", "Compute the final value, showing each step.",
        "Follow the operations in order and give the result.", "Calculate step by step.",
    ])
    words = {"+": "add", "-": "subtract"}
    context = f"Start with {value}, then " + ", then ".join(f"{words[op]} {n}" for op, n in steps) + "."
    style = rng.randrange(3)
    lines = []
    for op, n in steps:
        result = value + n if op == "+" else value - n
        if style == 0:
            lines.append(f"{value} {op} {n} = {result}.")
        elif style == 1:
            verb = "plus" if op == "+" else "minus"
            lines.append(f"{value} {verb} {n} is {result}.")
        else:
            verb = "Adding" if op == "+" else "Subtracting"
            lines.append(f"{verb} {n} to {value} gives {result}." if op == "+"
                         else f"{verb} {n} from {value} gives {result}.")
        value = result
    ending = rng.choice([f"The result is {value}.", f"So the answer is {value}.", f"Final value: {value}."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


def _running_total(rng: random.Random) -> Example:
    """Total the prices of a basket, item by item."""
    items = rng.sample(ITEMS, rng.randint(3, 5))
    prices = [rng.randint(2, 19) for _ in items]
    instruction = rng.choice([
        "What do these items cost together? Keep a running total.", "Add up the prices one item at a time.",
        "Find the total price, item by item.", "Compute the bill with a running total.",
    ])
    context = "; ".join(f"{item} {price}" for item, price in zip(items, prices))
    style = rng.randrange(3)
    total, lines = 0, []
    for item, price in zip(items, prices):
        previous, total = total, total + price
        if style == 0:
            lines.append(f"{item} {price}, total {total}.")
        elif style == 1:
            lines.append(f"The {item} costs {price}, so we have {total}." if previous else f"The {item} costs {price}.")
        else:
            lines.append(f"{previous} + {price} = {total}." if previous else f"Start with {price}.")
    ending = rng.choice([f"The total is {total}.", f"Altogether that is {total}.", f"Total cost: {total}."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


LIST_STEPS: dict[str, tuple[list[str], Callable[[list[int]], list[int]]]] = {
    "double": (["doubled", "times two", "after doubling"], lambda xs: [2 * x for x in xs]),
    "add3": (["plus three", "with 3 added", "after adding 3"], lambda xs: [x + 3 for x in xs]),
    "minus1": (["minus one", "with 1 taken off", "after subtracting 1"], lambda xs: [x - 1 for x in xs]),
    "reverse": (["reversed", "in reverse order", "after reversing"], lambda xs: xs[::-1]),
    "sort": (["sorted", "in ascending order", "after sorting"], sorted),
    "drop_first": (["without the first", "first one removed", "after dropping the first"], lambda xs: xs[1:]),
}
LIST_INSTRUCTIONS = {
    "double": "double every number", "add3": "add 3 to every number", "minus1": "subtract 1 from every number",
    "reverse": "reverse the list", "sort": "sort the list", "drop_first": "drop the first number",
}


def _list_transform(rng: random.Random) -> Example:
    """Carry a list of numbers through successive transforms."""
    numbers = [rng.randint(1, 12) for _ in range(rng.randint(3, 4))]
    names = rng.sample(sorted(LIST_STEPS), 3)
    instruction = rng.choice([
        "Apply the steps to the list in order, showing the list after each.",
        "Transform the list step by step.", "Carry out each step on the list and show the result.",
    ])
    context = (f"List: {', '.join(map(str, numbers))}. Steps: "
               + ", then ".join(LIST_INSTRUCTIONS[n] for n in names) + ".")
    style = rng.randrange(3)
    lines = []
    for name in names:
        labels, step = LIST_STEPS[name]
        numbers = step(numbers)
        shown = ", ".join(map(str, numbers))
        label = labels[style]
        lines.append(f"{label.capitalize()}: {shown}." if style != 2 else f"{label.capitalize()} we get {shown}.")
    ending = rng.choice([f"Final list: {', '.join(map(str, numbers))}.",
                         f"The result is {', '.join(map(str, numbers))}."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


WORD_STEPS: dict[str, tuple[str, list[str], Callable[[str], str]]] = {
    "reverse": ("reverse it", ["reversed", "backwards"], lambda w: w[::-1]),
    "upper": ("make it uppercase", ["in capitals", "uppercased"], str.upper),
    "drop_first": ("drop the first letter", ["without the first letter", "minus its first letter"], lambda w: w[1:]),
    "drop_last": ("drop the last letter", ["without the last letter", "minus its last letter"], lambda w: w[:-1]),
    "double_first": ("repeat the first letter", ["with the first letter repeated", "first letter doubled"],
                     lambda w: w[:1] + w),
}


def _word_transform(rng: random.Random) -> Example:
    """Carry a word through letter-level edits."""
    word = rng.choice(WORDS)
    names = rng.sample(sorted(WORD_STEPS), 3)
    instruction = rng.choice([
        "Edit the word step by step and show each stage.", "Apply the changes to the word in order.",
        "Transform the word one step at a time.",
    ])
    context = f"Word: {word}. Steps: " + ", then ".join(WORD_STEPS[n][0] for n in names) + "."
    style = rng.randrange(2)
    lines = []
    for name in names:
        _, labels, step = WORD_STEPS[name]
        word = step(word)
        lines.append(f"{labels[style].capitalize()}: {word}." if style == 0 else f"Now {labels[style]}, it is {word}.")
    ending = rng.choice([f"The final word is {word}.", f"Result: {word}."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


def _grid_walk(rng: random.Random) -> Example:
    """Track a position on a grid through moves."""
    x, y = rng.randint(0, 9), rng.randint(0, 9)
    moves = [(rng.choice(["up", "down", "left", "right"]), rng.randint(1, 5)) for _ in range(rng.randint(3, 4))]
    instruction = rng.choice([
        "Follow the moves and track the position after each one.", "Where do you end up? Show every position.",
        "Trace the path on the grid step by step.",
    ])
    context = f"Start at ({x}, {y}). Moves: " + ", ".join(f"{d} {n}" for d, n in moves) + "."
    style = rng.randrange(3)
    lines = []
    for direction, n in moves:
        dx, dy = {"up": (0, n), "down": (0, -n), "left": (-n, 0), "right": (n, 0)}[direction]
        x, y = x + dx, y + dy
        if style == 0:
            lines.append(f"{direction.capitalize()} {n}: ({x}, {y}).")
        elif style == 1:
            lines.append(f"Moving {direction} {n} reaches ({x}, {y}).")
        else:
            lines.append(f"After {direction} {n} we are at ({x}, {y}).")
    ending = rng.choice([f"You end at ({x}, {y}).", f"Final position: ({x}, {y})."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


def _inventory(rng: random.Random) -> Example:
    """Track the counts of coloured balls in a box through additions and removals."""
    colors = rng.sample(COLORS, 3)
    initial = {c: rng.randint(1, 9) for c in colors[:2]}  # the third colour may be added later
    current, changes = dict(initial), []
    for _ in range(rng.randint(2, 3)):
        color = rng.choice(colors)
        have = current.get(color, 0)
        delta = rng.randint(1, 6) if have == 0 or rng.random() < 0.6 else -rng.randint(1, have)
        changes.append((color, delta))
        current[color] = have + delta
    instruction = rng.choice([
        "Track the balls in the box after each change.", "How many balls of each colour are there? Go step by step.",
        "Update the counts after every change.",
    ])
    context = "The box has " + " and ".join(f"{n} {c}" for c, n in initial.items()) + ". Then " + ", then ".join(
        f"add {d} {c}" if d > 0 else f"remove {-d} {c}" for c, d in changes
    ) + "."
    style = rng.randrange(2)
    current, lines = dict(initial), []
    for color, delta in changes:
        current[color] = current.get(color, 0) + delta
        listed = ", ".join(f"{n} {c}" for c, n in current.items())
        change = f"adding {delta} {color}" if delta > 0 else f"removing {-delta} {color}"
        lines.append(f"After {change}: {listed}." if style == 0 else f"{change.capitalize()} leaves {listed}.")
    total = sum(current.values())
    ending = rng.choice([f"In total {total} balls.", f"That makes {total} balls."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


def _describe_record(rng: random.Random) -> Example:
    """Describe a structured record in sentences, in a random order and with varied phrasing."""
    name = rng.choice(NAMES)
    pronoun = "She" if name in FEMALE_NAMES else "He"
    record = {
        "age": str(rng.randint(18, 80)), "city": rng.choice(CITIES), "job": rng.choice(JOBS),
        "pet": rng.choice(PETS), "hobby": rng.choice(HOBBIES),
    }
    fields = rng.sample(sorted(record), rng.randint(4, 5))
    instruction = rng.choice([
        "Describe the person in full sentences.", "Write a short description of this person.",
        "Turn the record into a few sentences.",
    ])
    context = f"name: {name}; " + "; ".join(f"{f}: {record[f]}" for f in fields)
    phrasings = {
        "age": [f"is {record['age']} years old", f"is aged {record['age']}"],
        "city": [f"lives in {record['city']}", f"comes from {record['city']}"],
        "job": [f"works as a {record['job']}", f"is a {record['job']} by trade"],
        "pet": [f"has a {record['pet']}", f"owns a pet {record['pet']}"],
        "hobby": [f"enjoys {record['hobby']}", f"likes {record['hobby']} in free time"],
    }
    order = rng.sample(fields, len(fields))
    sentences = [f"{name if i == 0 else pronoun} {rng.choice(phrasings[f])}." for i, f in enumerate(order)]
    return {"instruction": instruction, "input": context, "output": " ".join(sentences)}


def _sort_explain(rng: random.Random) -> Example:
    """Sort numbers by repeatedly taking the smallest (or largest) one left."""
    numbers = rng.sample(range(1, 99), rng.randint(4, 5))
    descending = rng.random() < 0.5
    instruction = (
        rng.choice(["Sort the numbers from largest to smallest, one at a time.",
                    "Order these from high to low, step by step."])
        if descending else
        rng.choice(["Sort the numbers from smallest to largest, one at a time.",
                    "Order these from low to high, step by step."])
    )
    context = ", ".join(map(str, numbers))
    remaining, picked, lines = list(numbers), [], []
    style = rng.randrange(2)
    word = "largest" if descending else "smallest"
    while remaining:
        pick = max(remaining) if descending else min(remaining)
        remaining.remove(pick)
        picked.append(pick)
        if style == 0:
            lines.append(f"The {word} left is {pick}.")
        else:
            lines.append(f"Take {pick}.")
    ending = rng.choice([f"Sorted: {', '.join(map(str, picked))}.", f"So the order is {', '.join(map(str, picked))}."])
    return {"instruction": instruction, "input": context, "output": " ".join(lines) + " " + ending}


FAMILIES: dict[str, Callable[[random.Random], Example]] = {
    "chain_arithmetic": _chain_arithmetic,
    "running_total": _running_total,
    "list_transform": _list_transform,
    "word_transform": _word_transform,
    "grid_walk": _grid_walk,
    "inventory": _inventory,
    "describe_record": _describe_record,
    "sort_explain": _sort_explain,
}


def write_reason_dataset(folder: str | Path, sizes: dict[str, int], seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl``, ``validation.jsonl`` and ``test.jsonl`` (as sized) into ``folder``."""
    return write_splits(folder, sizes, seed, FAMILIES)
