"""The text SFT demo data: four short-answer tasks a tiny causal LM learns in a few hundred
steps (the next letter, opposites, colours of things, repeating a word). Deterministic, stdlib
only. ``configs/data/make_text_demo.py`` writes the repository's copy; :func:`ensure_text_demo`
writes one into the cache for installs without the repository (the test kit uses it).

Answers are one or two tokens, so the loss (answer + ``<|im_end|>``) drops visibly. The eval
lines are fresh draws from the same facts, each with ``meta = {"task", "answer"}``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import string
from pathlib import Path

NUM_TRAIN = 1000
NUM_EVAL = 100
SEEDS = {"train": "hyper-train/text-demo/train", "eval": "hyper-train/text-demo/eval"}

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


def ensure_text_demo(split: str = "train") -> Path:
    """The ``split`` (``train``/``eval``) JSONL in ``$HYPER_TRAIN_CACHE/text_demo/``, written
    once (atomically)."""
    from ..data.cache import cache_root

    num = NUM_TRAIN if split == "train" else NUM_EVAL
    path = cache_root() / "text_demo" / f"text_demo{'' if split == 'train' else '_eval'}.jsonl"
    text = render(num, SEEDS[split])
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path
