"""The README's demo: a tiny Qwen2.5-VL learns colours and shapes from pixels.

Held-out accuracy must pass the issue's bars, and with images shuffled across samples the same
model must fall to about chance — proof that the pixels reach the loss. The exported model must
answer colour questions through ``hyper-train chat`` and through the user guide's
plain-transformers snippet.
"""

from __future__ import annotations

import copy
import io
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from hyper_core.cli import main
from hyper_core.config import load_config
from hyper_core.data.conversation import parse_conversation
from hyper_core.testing import isolated_host, read_metrics
from hyper_core.trainer.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "qwen2_5_vl_demo.toml"
GUIDE = REPO / "docs" / "user-guide.md"
QUESTION = "What colour is the shape?"
#: Colour questions asked through ``hyper-train chat``.
CHAT_QUESTIONS = 20


def shuffle_images(raw_samples: list[dict], seed: int = 0) -> list[dict]:
    """The same samples with their image paths permuted (a derangement-ish shuffle)."""
    samples = copy.deepcopy(list(raw_samples))
    parts = [
        part
        for s in samples
        for m in s["messages"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part.get("type") == "image"
    ]
    images = [p["image"] for p in parts]
    rng = random.Random(seed)
    shuffled = images[:]
    rng.shuffle(shuffled)
    for part, image in zip(parts, shuffled, strict=True):
        part["image"] = image
    return samples


def colour_questions(raw_samples: list[dict], n: int) -> list[tuple[Path, str]]:
    """``(image, colour)`` of the first ``n`` colour questions."""
    found = []
    for sample in raw_samples:
        if sample["meta"]["question_type"] == "colour" and len(found) < n:
            (image,) = parse_conversation(sample).images
            found.append((image.path, sample["meta"]["answer"]))
    return found


def chat_answers(
    export: Path,
    questions: list[tuple[Path, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[str]:
    """``hyper-train chat EXPORT``'s answers, one conversation per question (stdin)."""
    lines = "".join(f"/image {image}\n{QUESTION}\n/clear\n" for image, _ in questions)
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    capsys.readouterr()
    assert main(["chat", str(export), "--device", "cpu"]) == 0
    return capsys.readouterr().out.splitlines()


def guide_snippet_answer(
    export: Path,
    image: Path,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """What the user guide's "Inference with transformers" snippet prints for ``image``."""
    section = GUIDE.read_text().split("### Inference with transformers", 1)[1]
    code = re.search(r"^```python\n(.*?)^```", section, flags=re.S | re.M).group(1)
    work.mkdir()
    shutil.copy(image, work / "shape.png")
    monkeypatch.chdir(work)
    capsys.readouterr()
    namespace: dict[str, Any] = {}
    exec(code.replace('"runs/qwen2_5_vl_demo/hf"', repr(str(export))), namespace)
    return capsys.readouterr().out.strip()


@pytest.mark.slow
def test_demo_learns_from_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host = isolated_host(["hyper_qwen_vl.plugin"])
    config = load_config(
        DEMO,
        [
            f"--run.output_dir={tmp_path}",
            "--logging.progress=none",
            "--checkpoint.export_hf=true",
        ],
        host.registries.config_sections,
    )
    trainer = Trainer(config, host)
    trainer.train()
    final = trainer.last_eval
    assert final["accuracy_colour"] >= 0.95, final
    assert final["accuracy_shape"] >= 0.85, final
    logged = [m for m in read_metrics(tmp_path) if "loss" in m]
    assert logged[-1]["loss"] < 0.5 * logged[0]["loss"]

    eval_set = trainer.dataloaders.eval.dataset
    # the trained model answers with `hyper-train chat` (greedy answers are right exactly
    # where teacher-forced ones are, so about as often as accuracy_colour says)
    questions = colour_questions(eval_set.raw_samples, CHAT_QUESTIONS)
    answers = chat_answers(tmp_path / "hf", questions, monkeypatch, capsys)
    assert len(answers) == len(questions)
    right = [a == colour for a, (_, colour) in zip(answers, questions, strict=True)]
    assert sum(right) >= 0.9 * len(questions), list(zip(answers, questions, strict=True))
    # and through plain transformers, as the user guide shows
    image, colour = questions[right.index(True)]
    snippet = guide_snippet_answer(
        tmp_path / "hf", image, tmp_path / "snippet", monkeypatch, capsys
    )
    assert snippet == colour

    eval_set.raw_samples = shuffle_images(eval_set.raw_samples)
    control = trainer.evaluate()
    assert control["accuracy_colour"] <= 0.4, control  # chance ~1/6
    assert control["accuracy_shape"] <= 0.6, control  # chance ~1/3
