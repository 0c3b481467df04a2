"""A user's own instruction data, written by the tests: small JSONL files of two checkable tasks."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["apple", "river", "stone", "cloud", "green", "house", "light", "music", "paper", "table", "water", "plant"]


def instruction_rows(count: int, seed: int) -> list[dict[str, str]]:
    """Rows of two short tasks with checkable answers: reverse a word, add two numbers."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        if rng.random() < 0.5:
            word = rng.choice(WORDS)
            rows.append({"instruction": "Reverse the letters of the word.", "input": word, "output": word[::-1]})
        else:
            a, b = rng.randint(1, 60), rng.randint(1, 60)
            rows.append({"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a} plus {b} is {a + b}."})
    return rows


def write_user_data(folder: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> dict[str, Path]:
    sizes = sizes or {"train": 48, "validation": 8, "test": 8}
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for offset, (split, count) in enumerate(sizes.items()):
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(row) + "\n" for row in instruction_rows(count, seed * 10 + offset)))
    return paths
