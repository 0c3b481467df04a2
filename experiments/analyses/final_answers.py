"""Is the final answer right? A phrasing-free check of the reason benchmark's generations.

ROUGE-L against one reference written in one of several random phrasings mixes two things: whether
the content is right and whether the phrasing happens to match. This script scores only the content
of the last step: the last number of the answer (chain_arithmetic, running_total, grid_walk's final
y, inventory's ball count), the numbers of the last sentence (list_transform and sort_explain's final
list) or the last word (word_transform), compared with the same taken from the reference;
describe_record has no final answer and is left out. On the facts benchmark: the creature a ``follow``
chain ends at, the verdict sentence of ``compare``, and whether a ``describe`` answer states as many
facts as asked, all of them true of the creature (its reference states a random few, so it is not
compared). Per method: the mean over training seeds of each
run's accuracy (over its sampling seeds) ± the standard error over seeds.

    python experiments/analyses/final_answers.py runs/reproduce-reason --methods sft,kd,distillm,abkd,mgsr

Before any student is trained, the same check on a teacher's answers to the validation split tells
whether it has content to pass on (``evaluate`` of one model writes ``<out>/generations.jsonl``):

    python -m mgsr_lightning evaluate --model artifacts/reason/teacher \
        --sets '[artifacts/reason/data/validation.jsonl]' --seeds '[10, 20]' --out runs/teacher_check
    python experiments/analyses/final_answers.py --generations runs/teacher_check/generations.jsonl \
        --data artifacts/reason/data/validation.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from mgsr_lightning.data.tasks.knowledge import NUMBER_WORDS, VALUES, world
from mgsr_lightning.evaluation.report import mean_and_standard_error

NUMBER = re.compile(r"-?\d+")
WORD = re.compile(r"[A-Za-z]+")
ATTRIBUTE_VALUES = {value for values in VALUES.values() for value in values}


def final_answer(text: str, family: str):
    """What the last step of an answer of ``family`` says; None for a family without a final answer."""
    if family == "describe_record":
        return None
    if family == "compare":  # its verdict sentence ("So the Kodul is bigger.")
        return text.strip().split(". ")[-1].strip()
    if family in ("word_transform", "follow"):
        words = WORD.findall(text)
        return words[-1] if words else ""
    if family in ("list_transform", "sort_explain"):
        return tuple(NUMBER.findall(text.strip().split(". ")[-1]))
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else ""


def facts_true(prediction: str, row: dict) -> bool:
    """A facts ``describe`` answer is right when it states as many distinct facts as the prompt asks and
    every one is true of the creature (the reference states a random few, so it is not compared)."""
    name, count = re.fullmatch(r"Creature: (\w+)\. Facts: (\w+)\.", row["input"]).groups()
    creature = world().get(name)
    stated = [word for word in WORD.findall(prediction) if word in ATTRIBUTE_VALUES]
    wanted = {word: number for number, word in NUMBER_WORDS.items()}.get(count)
    return (creature is not None and len(stated) == wanted == len(set(stated))
            and set(stated) <= set(creature.attributes.values()))


def accuracy(generations: Path, rows: list[dict]) -> tuple[float, dict[str, float]]:
    """(% right over all scored generations, % right per family) of one ``generations.jsonl``."""
    right = defaultdict(list)
    for line in generations.read_text().splitlines():
        generation = json.loads(line)
        row = rows[generation["index"]]
        if row["family"] == "describe":
            right["describe"].append(facts_true(generation["prediction"], row))
            continue
        reference = final_answer(row["output"], row["family"])
        if reference is not None:
            right[row["family"]].append(final_answer(generation["prediction"], row["family"]) == reference)
    every = [hit for hits in right.values() for hit in hits]
    return 100 * statistics.fmean(every), {family: 100 * statistics.fmean(hits)
                                           for family, hits in sorted(right.items())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="?", help="runs folder of reproduce, e.g. runs/reproduce-reason")
    parser.add_argument("--generations", type=Path, nargs="+", default=None,
                        help="instead of a runs folder: generations.jsonl files written by evaluate, one row each")
    parser.add_argument("--methods", default="sft,kd,distillm,abkd,mgsr")
    parser.add_argument("--data", type=Path, default=Path("artifacts/reason/data/test.jsonl"),
                        help="the split the generations answer (rows with a 'family' field)")
    args = parser.parse_args(argv)
    if (args.runs is None) == (args.generations is None):
        parser.error("give a runs folder or --generations files, not both or neither")
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    if args.generations:
        missing = [str(path) for path in args.generations if not path.is_file()]
        if missing:
            parser.error(f"generations file not found: {', '.join(missing)}")
        runs = {str(path): [path] for path in args.generations}
    else:
        teacher = args.runs / "teacher" / "eval" / "generations.jsonl"
        runs = {"teacher": [teacher]} if teacher.is_file() else {}
        for method in args.methods.split(","):
            runs[method] = sorted((args.runs / method).glob("seed*/eval/generations.jsonl"))
    print("| Method | final answer right, % (mean ± SE over training seeds) | per family, % (mean over seeds) |")
    print("|---|:---:|---|")
    for method, files in runs.items():
        if not files:
            print(f"| {method} | (no evaluated run) | |")
            continue
        scores = [accuracy(path, rows) for path in files]
        totals = [total for total, _ in scores]
        mean, error = mean_and_standard_error(totals)
        cell = f"{mean:.2f} (one run)" if error is None else f"{mean:.2f} ± {error:.2f}"
        families = {family: statistics.fmean(per[family] for _, per in scores) for family in scores[0][1]}
        listed = ", ".join(f"{family} {value:.0f}" for family, value in families.items())
        print(f"| {method} | {cell} | {listed} |")


if __name__ == "__main__":
    main()
