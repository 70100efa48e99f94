"""Helpers of the preference plugin's tests: text pairs from the text demo, tiny DPO runs."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyper_core.testing import run_tiny_training, tiny_text_config

PLUGIN = "hyper_preference.plugin"


def write_text_pairs(path: Path, n: int = 32, seed: int = 0, style: str = "messages") -> Path:
    """``n`` pairs from the text demo: the right answer chosen, another task answer rejected.

    ``style``: ``messages`` (string replies), ``sharegpt`` (LLaMA-Factory's ``conversations``
    with ``from``/``value`` reply messages) or ``prompt`` (TRL's prompt/chosen/rejected)."""
    from hyper_core.demo.text import ensure_text_demo

    rows = [json.loads(line) for line in ensure_text_demo("train").read_text().splitlines()]
    rng = random.Random(seed)
    answers: dict[str, list[str]] = {}
    for row in rows:
        answers.setdefault(row["meta"]["task"], []).append(row["meta"]["answer"])
    out = []
    for row in rows[:n]:
        question = row["messages"][0]["content"]
        right = row["meta"]["answer"]
        wrong = rng.choice([a for a in answers[row["meta"]["task"]] if a != right])
        if style == "sharegpt":
            out.append(
                {
                    "conversations": [{"from": "human", "value": question}],
                    "chosen": {"from": "gpt", "value": right},
                    "rejected": {"from": "gpt", "value": wrong},
                }
            )
        elif style == "prompt":
            out.append({"prompt": question, "chosen": right, "rejected": wrong})
        else:
            out.append(
                {
                    "messages": [{"role": "user", "content": question}],
                    "chosen": right,
                    "rejected": wrong,
                }
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def dpo_config(out: Path, pairs: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """The tiny text run on the ``pairs`` file with ``[preference] loss = "sigmoid"``."""
    cfg = tiny_text_config(
        out,
        data={"train": {"format": "preference", "path": str(pairs)}},
        training={"steps": 2, "global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3},
        preference={"loss": "sigmoid", "beta": 0.5},
    )
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def train(raw: Mapping[str, Any], *plugins: Any) -> Any:
    """Train in this process with the preference plugin (and ``plugins``)."""
    return run_tiny_training(raw, plugins=(PLUGIN, *plugins))
