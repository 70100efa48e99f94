"""The synthetic shapes data set: content, determinism, caching, the dataset format."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from hyper_core.config.fields import format_options
from hyper_core.data.conversation import load_image, parse_conversation
from hyper_core.demo import shapes
from hyper_core.demo.shapes import (
    COLOURS,
    JITTER,
    QUESTIONS,
    ShapesOptions,
    ensure_shapes,
    generate_shapes,
    load_shapes_format,
)
from hyper_core.errors import ConfigError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HYPER_TRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_samples_match_their_images(tmp_path: Path) -> None:
    data = generate_shapes(tmp_path, num_samples=24, image_size=48, seed=1)
    fill_ratio = {"square": [], "circle": [], "triangle": []}
    for sample in _lines(data):
        meta = sample["meta"]
        user, assistant = sample["messages"]
        question_type = meta["question_type"]
        assert user["content"][1]["text"] == QUESTIONS[question_type]
        expected = {
            "colour": meta["colour"],
            "shape": meta["shape"],
            "describe": f"{'an' if meta['colour'] == 'orange' else 'a'} {meta['colour']} "
            f"{meta['shape']}",
        }[question_type]
        assert assistant["content"] == meta["answer"] == expected
        img = Image.open(tmp_path / user["content"][0]["image"])
        assert img.mode == "RGB" and img.size == (48, 48)
        (_, bg), (n_fill, fill) = sorted(((n, c) for n, c in img.getcolors(48 * 48)), reverse=True)[
            :2
        ]
        if n_fill > 48 * 48 / 2:  # the shape covers most of the picture: swap
            bg, fill = fill, bg
        assert all(c >= 215 for c in bg)
        assert all(abs(a - b) <= JITTER for a, b in zip(fill, COLOURS[meta["colour"]]))
        ys, xs = zip(
            *[(y, x) for y in range(48) for x in range(48) if img.getpixel((x, y)) == fill]
        )
        box = (max(xs) - min(xs) + 1) * (max(ys) - min(ys) + 1)
        fill_ratio[meta["shape"]].append(len(xs) / box)
    assert all(0.95 <= r for r in fill_ratio["square"])
    assert all(0.7 <= r <= 0.85 for r in fill_ratio["circle"])
    assert all(0.4 <= r <= 0.62 for r in fill_ratio["triangle"])


def test_deterministic_and_split_dependent(tmp_path: Path) -> None:
    a = generate_shapes(tmp_path / "a", num_samples=5, image_size=32, seed=3)
    b = generate_shapes(tmp_path / "b", num_samples=5, image_size=32, seed=3)
    c = generate_shapes(tmp_path / "c", num_samples=5, image_size=32, seed=3, split="eval")
    assert a.read_text() == b.read_text()
    for i in range(5):
        name = f"images/{i:05d}.png"
        assert (a.parent / name).read_bytes() == (b.parent / name).read_bytes()
    assert [(a.parent / f"images/{i:05d}.png").read_bytes() for i in range(5)] != [
        (c.parent / f"images/{i:05d}.png").read_bytes() for i in range(5)
    ]


def test_question_mix(tmp_path: Path) -> None:
    data = generate_shapes(tmp_path, num_samples=60, image_size=16, seed=0, question_mix=(0, 1, 0))
    assert Counter(s["meta"]["question_type"] for s in _lines(data)) == {"shape": 60}
    data = generate_shapes(tmp_path, num_samples=300, image_size=16, seed=0, question_mix=(1, 2, 2))
    counts = Counter(s["meta"]["question_type"] for s in _lines(data))
    assert 40 <= counts["colour"] <= 80 and counts["shape"] > counts["colour"]


def test_cache_generates_once_even_concurrently(cache: Path, monkeypatch) -> None:
    calls = []
    real = shapes.generate_shapes

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(shapes, "generate_shapes", counting)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_shapes(num_samples=6, image_size=16)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 4
    path = results[0]
    assert path.parent.parent == cache / "shapes" and path.parent.name.startswith("v1-train-6x16")
    assert not [p for p in path.parent.parent.iterdir() if ".tmp-" in p.name]
    mtime = path.stat().st_mtime_ns
    assert ensure_shapes(num_samples=6, image_size=16) == path and path.stat().st_mtime_ns == mtime
    assert len(calls) == 1
    other = ensure_shapes(num_samples=6, image_size=16, seed=1)
    assert other != path and len(calls) == 2


def test_failed_generation_leaves_nothing(cache: Path, monkeypatch) -> None:
    def broken(out_dir, **kwargs):
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "half").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(shapes, "generate_shapes", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure_shapes(num_samples=3, image_size=16)
    assert [p.name for p in (cache / "shapes").iterdir() if not p.name.endswith(".lock")] == []


def test_dataset_format(cache: Path, tmp_path: Path) -> None:
    train = load_shapes_format(None, ShapesOptions(num_samples=4, image_size=32), tmp_path)
    evals = load_shapes_format(
        None, ShapesOptions(num_samples=4, image_size=32, split="eval"), tmp_path
    )
    assert len(train) == len(evals) == 4
    conv = parse_conversation(train[0])
    assert load_image(conv.images[0]).size == (32, 32)
    assert train[0]["_source"]["line"] == 1 and "meta" in train[0]
    assert conv.images[0].path != parse_conversation(evals[0]).images[0].path
    local = load_shapes_format("shape_cache", ShapesOptions(num_samples=2, image_size=16), tmp_path)
    assert Path(local[0]["_source"]["file"]).is_relative_to(tmp_path / "shape_cache")


def test_dataset_format_option_errors(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        format_options(ShapesOptions, {"num_sample": 4}, "$.data.train")
    ((path, message),) = info.value.problems
    assert path == "$.data.train.num_sample" and "did you mean 'num_samples'" in message
    with pytest.raises(ConfigError) as info:
        format_options(
            ShapesOptions,
            {"num_samples": 0, "image_size": "big", "question_mix": [1, 2], "split": "eval"},
            "$.data.eval",
        )
    assert {p for p, _ in info.value.problems} == {
        "$.data.eval.num_samples",
        "$.data.eval.image_size",
        "$.data.eval.question_mix",
    }
    assert not (cache / "shapes").exists()
