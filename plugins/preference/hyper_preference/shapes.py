"""``shapes_pairs``: the core's synthetic shapes data as preference pairs (the CPU demo).

Each shapes sample becomes a pair whose chosen reply is its answer and whose rejected reply is
a plausible wrong one: the nearest other colour of the palette (red → orange, blue → purple,
...) for the colour and describe questions, another shape for the shape question (seeded per
sample). The options are the ``shapes`` format's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyper_core.demo.shapes import COLOURS, SHAPES, ShapesOptions, describe


def confusable_colour(colour: str) -> str:
    """The palette's nearest other colour in RGB: the plausible wrong answer."""
    rgb = COLOURS[colour]
    others = (name for name in COLOURS if name != colour)
    return min(
        others, key=lambda n: sum((a - b) ** 2 for a, b in zip(COLOURS[n], rgb, strict=True))
    )


def wrong_answer(meta: Mapping[str, Any], rng: random.Random) -> str:
    """The rejected reply of a shapes sample."""
    colour, shape = meta["colour"], meta["shape"]
    kind = meta["question_type"]
    if kind == "colour":
        return confusable_colour(colour)
    if kind == "describe":
        return describe(confusable_colour(colour), shape)
    return rng.choice([s for s in SHAPES if s != shape])


def as_pair(sample: dict[str, Any], index: int, seed: int) -> dict[str, Any]:
    """The pair of one shapes sample: its prompt turns, its answer chosen, a wrong one rejected."""
    messages = sample["messages"]
    meta = sample["meta"]
    rng = random.Random(f"shapes-pairs/{seed}/{index}")
    return {
        **{k: v for k, v in sample.items() if k != "messages"},
        "messages": messages[:-1],
        "chosen": messages[-1]["content"],
        "rejected": wrong_answer(meta, rng),
    }


def load_shapes_pairs_format(
    path: str | None, options: ShapesOptions | None, base_dir: Path
) -> list[dict[str, Any]]:
    """The ``shapes_pairs`` dataset format: ``{ format = "shapes_pairs", num_samples = ...,
    split = ..., question_mix = ... }`` (the ``shapes`` options)."""
    from hyper_core.demo.shapes import ensure_shapes, load_generated

    options = options or ShapesOptions()
    samples = load_generated(ensure_shapes, path, options, base_dir)
    return [as_pair(s, i, options.seed) for i, s in enumerate(samples)]
