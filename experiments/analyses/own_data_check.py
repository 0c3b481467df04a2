"""The README's "Distil on your own data" path, run as written for every method on the embedded tiny task.

Writes the embedded tiny task's splits as a user's JSONL files, then runs the README's commands with
``MGSR_TINY_DIR`` set to ``<out>/root``: ``prepare --data``, one ``fit --config configs/tiny/<method>.yaml
--config $MGSR_TINY_DIR/init_student.yaml`` per method, ``evaluate`` of the teacher and every student on the
test rows, and ``table``. It prints each method's ROUGE-L against SFT's (the check: at or above 0.9x SFT)
and which of the package's warnings each fit raised.

The full check (the shipped steps: teacher 600, initial student 400, each method 400; five sampling seeds)::

    python experiments/analyses/own_data_check.py --out runs/own_data_check

A quick run that only shows the script works::

    python experiments/analyses/own_data_check.py --out /tmp/own_data_check --max_steps 4 --seeds '[10]' \\
        --train_size 400 --validation_size 40 --test_size 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

METHODS = ["sft", "kd", "rkl", "jsd", "tvd", "gkd", "imitkd", "seqkd", "distillm", "abkd", "mgsr"]
SHARE_OF_SFT = 0.9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/own_data_check", help="folder of the user's data and MGSR_TINY_DIR")
    parser.add_argument("--methods", default=",".join(METHODS), help="configs/tiny/<method>.yaml, comma-separated")
    parser.add_argument("--max_steps", type=int, default=None,
                        help="steps of every training (teacher, initial student, each method); default: the configs'")
    parser.add_argument("--seeds", default=None, help="evaluate's sampling seeds, e.g. '[10]' (default: 10-50)")
    parser.add_argument("--train_size", type=int, default=20000)
    parser.add_argument("--validation_size", type=int, default=200)
    parser.add_argument("--test_size", type=int, default=400)
    args = parser.parse_args()

    from mgsr_lightning.__main__ import main as run
    from mgsr_lightning.data.tasks.tiny import write_tiny_dataset

    out = Path(args.out).resolve()
    methods = [method.strip() for method in args.methods.split(",") if method.strip()]
    if "sft" not in methods:
        methods.insert(0, "sft")
    data = out / "my_data"
    if not (data / "test.jsonl").is_file():
        write_tiny_dataset(data, {"train": args.train_size, "validation": args.validation_size, "test": args.test_size})
    root = out / "root"
    os.environ["MGSR_TINY_DIR"] = str(root)  # the README's `export MGSR_TINY_DIR=...`
    steps = [] if args.max_steps is None else [f"--trainer.max_steps={args.max_steps}",
                                               f"--trainer.val_check_interval={min(100, args.max_steps)}"]

    prepare = ["prepare", "--data", str(data)]
    if args.max_steps is not None:
        prepare += ["--teacher_steps", str(args.max_steps), "--init_steps", str(args.max_steps)]
    run(prepare)

    fired: dict[str, list[str]] = {}
    for method in methods:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(["fit", "--config", str(REPO / "configs" / "tiny" / f"{method}.yaml"),
                 "--config", str(root / "init_student.yaml"), *steps])
        ours = [w for w in caught if w.category.__module__.startswith("mgsr_lightning")]
        for w in ours:  # shown as a log would show them, with their names
            print(warnings.formatwarning(w.message, w.category, w.filename, w.lineno), end="", file=sys.stderr)
        fired[method] = sorted({w.category.__name__ for w in ours})

    models = [str(root / "teacher")] + [str(root / "students" / method) for method in methods]
    evaluate = ["evaluate", "--model", "[" + ", ".join(models) + "]", "--sets", f"[{root / 'data' / 'test.jsonl'}]",
                "--out", str(root / "eval")]
    if args.seeds is not None:
        evaluate += ["--seeds", args.seeds]
    run(evaluate)
    run(["table", "--runs", f"[{root / 'eval'}]", "--out", str(root / "results")])

    scores = {
        Path(model).name: json.loads((root / "eval" / Path(model).name / "metrics.json").read_text())["avg"]["rougeL"]
        for model in models
    }
    sft = scores["sft"]
    lines = [f"ROUGE-L on {root / 'data' / 'test.jsonl'} (teacher {scores['teacher']:.2f}, SFT {sft:.2f}; "
             f"check: each method >= {SHARE_OF_SFT} x SFT = {SHARE_OF_SFT * sft:.2f})",
             f"{'method':<10} {'ROUGE-L':>8} {'x SFT':>6}  check  warnings"]
    passed = True
    for method in methods:
        ratio = scores[method] / sft if sft > 0 else float("nan")
        ok = scores[method] >= SHARE_OF_SFT * sft
        passed &= ok
        lines.append(f"{method:<10} {scores[method]:>8.2f} {ratio:>6.2f}  {'ok' if ok else 'BELOW':<5}  "
                     f"{', '.join(fired[method]) or '-'}")
    lines.append(f"every method at or above {SHARE_OF_SFT} x SFT: {'yes' if passed else 'no'}")
    report = "\n".join(lines)
    (out / "check.txt").write_text(report + "\n")
    print("\n" + report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
