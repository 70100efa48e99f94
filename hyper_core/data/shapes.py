"""The synthetic "coloured shapes" VL data set of the CPU demo (PIL only, no torch).

One shape (circle, square, upright triangle) per image, 6 colours with ±25 jitter per channel,
a light random background, random size and position. Each sample asks one question:

* ``colour``: "What colour is the shape?" → ``red``
* ``shape``: "What shape is it?" → ``circle``
* ``describe``: "Describe the image." → ``a red circle``

drawn with weights ``question_mix`` (colour:shape:describe). Samples are in the conversation
format (a content list with the image part and the question) with ``"meta": {"question_type",
"answer", "colour", "shape"}``.

Data sets are generated once into ``$HYPER_TRAIN_CACHE`` (default ``~/.cache/hyper-train``)
``/shapes/<name-with-hash>``: written to a temporary folder and renamed atomically, under a lock
file so that concurrent ranks generate it once.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .jsonl import RawSample, read_jsonl

FORMAT_VERSION = 1

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 200, 30),
    "purple": (140, 60, 190),
    "orange": (240, 130, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
QUESTION_TYPES: tuple[str, ...] = ("colour", "shape", "describe")
QUESTIONS: dict[str, str] = {
    "colour": "What colour is the shape?",
    "shape": "What shape is it?",
    "describe": "Describe the image.",
}
JITTER = 25
DATA_FILE = "data.jsonl"
DEFAULT_NUM_SAMPLES = {"train": 2000, "eval": 200}


def describe(colour: str, shape: str) -> str:
    """``a red circle`` / ``an orange square``."""
    article = "an" if colour[0] in "aeiou" else "a"
    return f"{article} {colour} {shape}"


def answer_for(question_type: str, colour: str, shape: str) -> str:
    """The expected answer of a question about a ``colour`` ``shape``."""
    if question_type == "colour":
        return colour
    if question_type == "shape":
        return shape
    return describe(colour, shape)


def _draw(rng: random.Random, size: int) -> tuple[Any, str, str]:
    from PIL import Image, ImageDraw

    colour = rng.choice(list(COLOURS))
    shape = rng.choice(SHAPES)
    fill = tuple(max(0, min(255, c + rng.randint(-JITTER, JITTER))) for c in COLOURS[colour])
    background = tuple(rng.randint(215, 255) for _ in range(3))
    side = rng.randint(max(4, round(size * 0.3)), max(5, round(size * 0.6)))
    x0, y0 = rng.randint(0, size - side), rng.randint(0, size - side)
    x1, y1 = x0 + side - 1, y0 + side - 1
    img = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(img)
    if shape == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=fill)
    elif shape == "square":
        draw.rectangle((x0, y0, x1, y1), fill=fill)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=fill)
    return img, colour, shape


def generate_shapes(
    out_dir: str | Path,
    *,
    num_samples: int,
    image_size: int = 112,
    seed: int,
    question_mix: Sequence[float] = (1, 2, 2),
    split: str = "train",
) -> Path:
    """Write ``images/NNNNN.png`` and ``data.jsonl`` into ``out_dir``; return the JSONL path.

    Deterministic in all arguments; ``split`` is part of the seed, so train and eval differ.
    """
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    # str seeds are hashed with SHA-512 by random.Random: stable across processes.
    rng = random.Random(f"hyper-train/shapes/v{FORMAT_VERSION}/{split}/{seed}")
    weights = [float(w) for w in question_mix]
    lines = []
    for i in range(num_samples):
        img, colour, shape = _draw(rng, image_size)
        question_type = rng.choices(QUESTION_TYPES, weights=weights)[0]
        rel = f"images/{i:05d}.png"
        img.save(out / rel, format="PNG", compress_level=1)
        answer = answer_for(question_type, colour, shape)
        sample = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": rel},
                        {"type": "text", "text": QUESTIONS[question_type]},
                    ],
                },
                {"role": "assistant", "content": answer},
            ],
            "meta": {
                "question_type": question_type,
                "answer": answer,
                "colour": colour,
                "shape": shape,
            },
        }
        lines.append(json.dumps(sample, separators=(",", ":")))
    data = out / DATA_FILE
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data


# ------------------------------------------------------------------------------------------
# cache
# ------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$HYPER_TRAIN_CACHE`` or ``~/.cache/hyper-train``."""
    return Path(os.environ.get("HYPER_TRAIN_CACHE") or "~/.cache/hyper-train").expanduser()


def shapes_dir_name(
    *, num_samples: int, image_size: int, seed: int, split: str, question_mix: Sequence[float]
) -> str:
    """The cache folder name of a parameter set (format version and a hash included)."""
    key = {
        "version": FORMAT_VERSION,
        "num_samples": num_samples,
        "image_size": image_size,
        "seed": seed,
        "split": split,
        "question_mix": [float(w) for w in question_mix],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"v{FORMAT_VERSION}-{split}-{num_samples}x{image_size}-s{seed}-{digest}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the rename race below still keeps the data set whole
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_shapes(
    *,
    num_samples: int,
    image_size: int = 112,
    seed: int = 0,
    split: str = "train",
    question_mix: Sequence[float] = (1, 2, 2),
    root: str | Path | None = None,
) -> Path:
    """The ``data.jsonl`` of the cached data set, generating it first if needed.

    Safe under concurrency: one process generates (lock file), others wait and reuse it; the
    folder appears only complete (temporary folder + atomic rename).
    """
    base = Path(root) if root is not None else cache_root() / "shapes"
    name = shapes_dir_name(
        num_samples=num_samples,
        image_size=image_size,
        seed=seed,
        split=split,
        question_mix=question_mix,
    )
    final = base / name
    if (final / DATA_FILE).is_file():
        return final / DATA_FILE
    base.mkdir(parents=True, exist_ok=True)
    with _file_lock(base / f".{name}.lock"):
        if (final / DATA_FILE).is_file():
            return final / DATA_FILE
        tmp = base / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            generate_shapes(
                tmp,
                num_samples=num_samples,
                image_size=image_size,
                seed=seed,
                question_mix=question_mix,
                split=split,
            )
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / DATA_FILE).is_file():  # lost the race to a complete copy: fine
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final / DATA_FILE


# ------------------------------------------------------------------------------------------
# dataset format
# ------------------------------------------------------------------------------------------

_OPTIONS = ("num_samples", "image_size", "seed", "split", "question_mix")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    problems: list[tuple[str, str]] = []
    for key in options:
        if key not in _OPTIONS:
            close = difflib.get_close_matches(key, _OPTIONS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(_OPTIONS)})"
            problems.append((f"{where}.{key}", f"unknown option {key!r} of format 'shapes'{hint}"))
    split = options.get("split", "train")
    if not isinstance(split, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", split):
        problems.append(
            (f"{where}.split", f"expected a name like 'train' or 'eval', got {split!r}")
        )
        split = "train"
    default_n = DEFAULT_NUM_SAMPLES.get(split, DEFAULT_NUM_SAMPLES["eval"])
    parsed = {
        "split": split,
        "num_samples": options.get("num_samples", default_n),
        "image_size": options.get("image_size", 112),
        "seed": options.get("seed", 0),
        "question_mix": options.get("question_mix", (1, 2, 2)),
    }
    if not _is_int(parsed["num_samples"]) or parsed["num_samples"] < 1:
        problems.append(
            (f"{where}.num_samples", f"expected a positive int, got {parsed['num_samples']!r}")
        )
    if not _is_int(parsed["image_size"]) or not 16 <= parsed["image_size"] <= 2048:
        problems.append(
            (f"{where}.image_size", f"expected an int in 16..2048, got {parsed['image_size']!r}")
        )
    if not _is_int(parsed["seed"]):
        problems.append((f"{where}.seed", f"expected an int, got {parsed['seed']!r}"))
    mix = parsed["question_mix"]
    if isinstance(mix, Mapping):
        unknown = set(mix) - set(QUESTION_TYPES)
        mix = [mix.get(q, 0) for q in QUESTION_TYPES] if not unknown else None
    ok = (
        isinstance(mix, (list, tuple))
        and len(mix) == len(QUESTION_TYPES)
        and all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in mix)
        and sum(mix) > 0
    )
    if not ok:
        problems.append(
            (
                f"{where}.question_mix",
                "expected 3 non-negative weights (colour, shape, describe) with a positive sum, "
                f"got {parsed['question_mix']!r}",
            )
        )
    else:
        parsed["question_mix"] = tuple(float(w) for w in mix)  # type: ignore[union-attr]
    if problems:
        raise ConfigError(problems)
    return parsed


def load_shapes_format(
    path: str | None,
    options: Mapping[str, Any] | None = None,
    base_dir: str | Path | None = None,
    *,
    where: str | None = None,
) -> list[RawSample]:
    """The ``shapes`` dataset format: ``{ format = "shapes", num_samples = 2000, split = ... }``.

    Options: ``num_samples`` (default 2000 for ``train``, 200 otherwise), ``image_size`` (112),
    ``seed`` (0), ``split`` (``"train"``), ``question_mix`` (``[1, 2, 2]``). ``path``, when given,
    is the cache folder to use instead of the default (relative to ``base_dir``). ``where`` is
    the config path for error messages (default ``$.data.<split>``).
    """
    options = dict(options or {})
    split = options.get("split", "train")
    parsed = _parse_options(
        options, where or f"$.data.{split if isinstance(split, str) else 'train'}"
    )
    root: Path | None = None
    if path:
        root = Path(path)
        if not root.is_absolute() and base_dir is not None:
            root = Path(base_dir) / root
    return read_jsonl(ensure_shapes(root=root, **parsed))
