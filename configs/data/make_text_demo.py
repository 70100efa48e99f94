"""Generate the text SFT demo data (deterministic, stdlib only).

    python configs/data/make_text_demo.py            # writes text_demo.jsonl, text_demo_eval.jsonl
    python configs/data/make_text_demo.py --check    # exit 1 if the files are not up to date

Four short-answer tasks that a tiny causal LM learns in a few hundred steps: the next letter,
opposites, colours of things, and repeating a word. Answers are one or two tokens, so the loss
(answer + ``<|im_end|>``) drops visibly. The eval lines are fresh draws from the same facts
(in-distribution), each with ``meta = {"task", "answer"}`` for per-task accuracy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import string
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_FILE = HERE / "text_demo.jsonl"
EVAL_FILE = HERE / "text_demo_eval.jsonl"
NUM_TRAIN = 1000
NUM_EVAL = 100

# fmt: off
OPPOSITES = [
    ("hot", "cold"), ("up", "down"), ("big", "small"), ("fast", "slow"), ("old", "new"),
    ("happy", "sad"), ("open", "closed"), ("full", "empty"), ("high", "low"), ("early", "late"),
    ("long", "short"), ("hard", "soft"), ("wet", "dry"), ("day", "night"), ("left", "right"),
]
COLOURS = [
    ("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"),
    ("blood", "red"), ("a banana", "yellow"), ("a lemon", "yellow"), ("a cherry", "red"),
    ("a leaf", "green"), ("the sea", "blue"), ("milk", "white"), ("an orange", "orange"),
]
# fmt: on
WORDS = (
    "apple river stone cloud tiger piano candle garden window rocket pencil forest bridge "
    "orange silver planet butter castle dragon mirror yellow circle square violin monkey "
    "winter summer island button ladder"
).split()


def _facts() -> list[tuple[str, str, str]]:
    facts = []
    letters = string.ascii_lowercase
    for a, b in itertools.pairwise(letters):
        facts.append(("next_letter", f"What comes after {a}?", b))
    for a, b in OPPOSITES:
        facts.append(("opposite", f"What is the opposite of {a}?", b))
        facts.append(("opposite", f"What is the opposite of {b}?", a))
    for thing, colour in COLOURS:
        facts.append(("colour", f"What colour is {thing}?", colour))
    for word in WORDS:
        facts.append(("repeat", f"Repeat: {word}", word))
    return facts


def _line(task: str, question: str, answer: str) -> str:
    sample = {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ],
        "meta": {"task": task, "answer": answer},
    }
    return json.dumps(sample, separators=(",", ":"))


def render(num: int, seed: str) -> str:
    """``num`` lines drawn from the facts with ``random.Random(seed)``."""
    rng = random.Random(seed)
    facts = _facts()
    return "".join(_line(*rng.choice(facts)) + "\n" for _ in range(num))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args(argv)
    files = {
        args.out_dir / TRAIN_FILE.name: render(NUM_TRAIN, "hyper-train/text-demo/train"),
        args.out_dir / EVAL_FILE.name: render(NUM_EVAL, "hyper-train/text-demo/eval"),
    }
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"out of date: {p}", file=sys.stderr)
        return 1 if stale else 0
    for p, text in files.items():
        p.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
