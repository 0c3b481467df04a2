"""The embedded default task: a small instruction-following dataset generated deterministically.

Ten task families, each with several paraphrased instruction templates and a checkable answer, so
that a few-million-parameter teacher learns them on a CPU in minutes while a smaller student
visibly lags behind. Answers are short sentences or lists (ROUGE-L gives partial credit) and
exact-match checkable. Splits are disjoint: a prompt (instruction + input) appears in one split only;
recall families (capitals, antonyms) do reuse facts across splits under other phrasings, as real
instruction data does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from mgsr_lightning.data.records import write_jsonl

WORDS = (
    "apple river stone cloud garden window silver forest candle mirror pocket tiger lemon castle orange "
    "rabbit pencil summer winter basket rocket violin planet bridge meadow jacket kitten marble puzzle "
    "ladder island anchor button carpet dragon feather hammer jungle kettle lantern magnet needle"
).split()
COLORS = "red blue green yellow purple orange black white pink brown gray gold".split()
ADJECTIVES = "small big quiet bright old young happy cold warm dark soft loud".split()
CAPITALS = {
    "France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin", "Japan": "Tokyo",
    "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
    "Greece": "Athens", "Chile": "Santiago", "Cuba": "Havana", "Poland": "Warsaw", "Ireland": "Dublin",
    "Austria": "Vienna", "Portugal": "Lisbon", "Sweden": "Stockholm", "Finland": "Helsinki", "Russia": "Moscow",
    "China": "Beijing", "India": "New Delhi", "Mexico": "Mexico City", "Brazil": "Brasilia", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad", "Thailand": "Bangkok", "Vietnam": "Hanoi", "Argentina": "Buenos Aires",
}
ANTONYMS = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark", "early": "late",
    "strong": "weak", "rich": "poor", "open": "closed", "full": "empty", "high": "low", "hard": "soft",
    "young": "old", "wet": "dry", "loud": "quiet", "clean": "dirty", "thick": "thin", "wide": "narrow",
}

Example = dict[str, str]


def _reverse_word(rng: random.Random) -> Example:
    word = rng.choice(WORDS)
    instruction = rng.choice([
        "Reverse the letters of the given word.", "Write the given word backwards.",
        "Spell the word below in reverse order.", "Return the word with its letters reversed.",
    ])
    return {"instruction": instruction, "input": word, "output": word[::-1]}


def _add_numbers(rng: random.Random) -> Example:
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    instruction = rng.choice([
        f"What is {a} plus {b}?", f"Add {a} and {b}.", f"Compute the sum of {a} and {b}.",
        f"Calculate {a} + {b}.",
    ])
    return {"instruction": instruction, "input": "", "output": f"{a} plus {b} is {a + b}."}


def _sort_numbers(rng: random.Random) -> Example:
    numbers = rng.sample(range(1, 100), rng.randint(3, 5))
    instruction = rng.choice([
        "Sort the numbers in ascending order.", "Arrange these numbers from smallest to largest.",
        "Put the following numbers in increasing order.", "Order the numbers from low to high.",
    ])
    text = ", ".join(map(str, numbers))
    return {"instruction": instruction, "input": text, "output": ", ".join(map(str, sorted(numbers)))}


def _uppercase(rng: random.Random) -> Example:
    phrase = f"{rng.choice(ADJECTIVES)} {rng.choice(COLORS)} {rng.choice(WORDS)}"
    instruction = rng.choice([
        "Rewrite the phrase in capital letters.", "Convert the text to upper case.",
        "Write the following phrase in uppercase.", "Make every letter of this phrase a capital.",
    ])
    return {"instruction": instruction, "input": phrase, "output": phrase.upper()}


def _count_words(rng: random.Random) -> Example:
    words = rng.sample(WORDS, rng.randint(2, 7))
    text = " ".join(words)
    instruction = rng.choice([
        "How many words are in the text?", "Count the words in the following text.",
        "Tell me the number of words below.", "How many words does this sentence contain?",
    ])
    return {"instruction": instruction, "input": text, "output": f"There are {len(words)} words."}


def _capital(rng: random.Random) -> Example:
    country = rng.choice(sorted(CAPITALS))
    instruction, context = rng.choice([
        (f"What is the capital of {country}?", ""), (f"Name the capital city of {country}.", ""),
        (f"Which city is the capital of {country}?", ""), (f"Tell me the capital of {country}.", ""),
        ("What is the capital of this country?", country), ("Name the capital city of the country below.", country),
        ("Which city is the capital of the given country?", country), ("Give the capital of the country.", country),
    ])
    return {"instruction": instruction, "input": context, "output": f"The capital of {country} is {CAPITALS[country]}."}


def _antonym(rng: random.Random) -> Example:
    word = rng.choice(sorted(ANTONYMS))
    instruction, context = rng.choice([
        (f"What is the opposite of {word}?", ""), (f"Give an antonym of the word {word}.", ""),
        (f"Name a word that means the opposite of {word}.", ""), (f"What word is the antonym of {word}?", ""),
        ("What is the opposite of the given word?", word), ("Give an antonym of the word below.", word),
        ("Name a word that means the opposite of this one.", word), ("Find the antonym.", word),
    ])
    return {"instruction": instruction, "input": context, "output": f"The opposite of {word} is {ANTONYMS[word]}."}


def _last_item(rng: random.Random) -> Example:
    items = rng.sample(COLORS, rng.randint(3, 5))
    text = ", ".join(items)
    first = rng.random() < 0.5
    instruction = rng.choice(
        ["What is the first item in the list?", "Which item comes first in this list?", "Name the first element."]
        if first
        else ["What is the last item in the list?", "Which item comes last in this list?", "Name the final element."]
    )
    answer = items[0] if first else items[-1]
    return {"instruction": instruction, "input": text,
            "output": f"The {'first' if first else 'last'} item is {answer}."}


def _compare(rng: random.Random) -> Example:
    a, b = rng.sample(range(1, 200), 2)
    instruction = rng.choice([
        f"Which is larger, {a} or {b}?", f"Which number is bigger: {a} or {b}?",
        f"Compare {a} and {b} and say which is greater.", f"Of {a} and {b}, which is the larger number?",
    ])
    big, small = max(a, b), min(a, b)
    return {"instruction": instruction, "input": "", "output": f"{big} is larger than {small}."}


def _describe(rng: random.Random) -> Example:
    adjective, color, noun = rng.choice(ADJECTIVES), rng.choice(COLORS), rng.choice(WORDS)
    instruction = rng.choice([
        "Write a sentence describing the object with the given adjective and color.",
        "Describe the thing in one sentence using both words.",
        "Make a short sentence about the object, mentioning its size or mood and its color.",
    ])
    text = f"object: {noun}; adjective: {adjective}; color: {color}"
    return {"instruction": instruction, "input": text, "output": f"The {adjective} {noun} is {color}."}


FAMILIES: dict[str, Callable[[random.Random], Example]] = {
    "reverse_word": _reverse_word,
    "add_numbers": _add_numbers,
    "sort_numbers": _sort_numbers,
    "uppercase": _uppercase,
    "count_words": _count_words,
    "capital": _capital,
    "antonym": _antonym,
    "first_last_item": _last_item,
    "compare_numbers": _compare,
    "describe_object": _describe,
}


def generate_splits(
    sizes: dict[str, int], seed: int = 0, families: dict[str, Callable[[random.Random], Example]] | None = None
) -> dict[str, list[Example]]:
    """Generate disjoint splits (e.g. ``{"train": 20000, "validation": 200, "test": 500}``) of
    ``families`` (default: this module's).

    Evaluation splits cycle through the families (equal counts); training draws them uniformly. A
    prompt already used in an earlier split is redrawn, so no prompt leaks into another split.
    """
    families = families or FAMILIES
    rng = random.Random(seed)
    names = sorted(families)
    used: set[str] = set()
    splits: dict[str, list[Example]] = {}
    # evaluation splits first, so that their instances are reserved before training data is drawn
    for split in sorted(sizes, key=lambda s: s == "train"):
        rows: list[Example] = []
        seen_here: set[str] = set()
        attempts = 0
        while len(rows) < sizes[split]:
            attempts += 1
            if attempts > 200 * sizes[split] + 1000:
                raise RuntimeError(f"could not draw {sizes[split]} distinct {split} rows; ask for fewer")
            family = names[len(rows) % len(names)] if split != "train" else rng.choice(names)
            example = families[family](rng)
            key = example["instruction"] + "\n" + example["input"]
            if key in used or (split != "train" and key in seen_here):
                continue
            seen_here.add(key)
            rows.append(dict(example, family=family))
        used |= seen_here
        splits[split] = rows
    return splits


def write_splits(
    folder: str | Path, sizes: dict[str, int], seed: int = 0,
    families: dict[str, Callable[[random.Random], Example]] | None = None,
) -> dict[str, Path]:
    """Write the splits of :func:`generate_splits` (``train.jsonl``, ``validation.jsonl``, ``test.jsonl``,
    as sized) of ``families`` (default: this module's) into ``folder``; returns their paths."""
    folder = Path(folder)
    paths = {}
    for split, rows in generate_splits(sizes, seed, families).items():
        paths[split] = folder / f"{split}.jsonl"
        write_jsonl(rows, paths[split])
    return paths


def write_tiny_dataset(folder: str | Path, sizes: dict[str, int], seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl``, ``validation.jsonl`` and ``test.jsonl`` (as sized) into ``folder``."""
    return write_splits(folder, sizes, seed)
