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
import hashlib
import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..config.fields import at_least, between, meta
from ..data.cache import cache_root
from ..data.jsonl import RawSample, read_jsonl

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
    draw_shape(ImageDraw.Draw(img), shape, (x0, y0, x1, y1), fill)
    return img, colour, shape


def draw_shape(draw: Any, shape: str, box: tuple[int, int, int, int], fill: Any) -> None:
    """Draw ``shape`` (one of :data:`SHAPES`) filling ``box`` (``x0, y0, x1, y1``)."""
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=fill)


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
    """The ``data.jsonl`` of the cached data set, generating it first if needed
    (:func:`cached_data_set`)."""
    base = Path(root) if root is not None else cache_root() / "shapes"
    name = shapes_dir_name(
        num_samples=num_samples,
        image_size=image_size,
        seed=seed,
        split=split,
        question_mix=question_mix,
    )
    return cached_data_set(
        base,
        name,
        lambda tmp: generate_shapes(
            tmp,
            num_samples=num_samples,
            image_size=image_size,
            seed=seed,
            question_mix=question_mix,
            split=split,
        ),
    )


def cached_data_set(base: Path, name: str, generate: Callable[[Path], Any]) -> Path:
    """``base/name/data.jsonl``, written first by ``generate(folder)`` if it is not there.

    Safe under concurrency: one process generates (lock file), others wait and reuse it; the
    folder appears only complete (temporary folder + atomic rename).
    """
    final = base / name
    if (final / DATA_FILE).is_file():
        return final / DATA_FILE
    base.mkdir(parents=True, exist_ok=True)
    with _file_lock(base / f".{name}.lock"):
        if (final / DATA_FILE).is_file():
            return final / DATA_FILE
        tmp = base / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            generate(tmp)
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


def _check_split(_inst: Any, _attr: attrs.Attribute, value: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", value):
        raise ValueError(f"expected a name like 'train' or 'eval', got {value!r}")


def _check_mix(_inst: Any, _attr: attrs.Attribute, value: list[float] | dict[str, float]) -> None:
    weights = _mix_weights(value)
    if weights is None or any(w < 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(
            "expected 3 non-negative weights (colour, shape, describe) with a positive sum, "
            f"got {value!r}"
        )


def _mix_weights(value: list[float] | dict[str, float]) -> tuple[float, ...] | None:
    if isinstance(value, dict):
        if set(value) - set(QUESTION_TYPES):
            return None
        return tuple(float(value.get(q, 0)) for q in QUESTION_TYPES)
    return tuple(float(w) for w in value) if len(value) == len(QUESTION_TYPES) else None


@attrs.frozen(kw_only=True)
class ShapesOptions:
    """Options of the ``shapes`` format (``[data] train = { format = "shapes", ... }``)."""

    num_samples: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Samples to generate (default 2000 for split `train`, 200 otherwise)."),
    )
    image_size: int = attrs.field(
        default=112, validator=between(16, 2048), metadata=meta("Image side, in pixels.")
    )
    seed: int = attrs.field(default=0, metadata=meta("Generator seed (with `split`)."))
    split: str = attrs.field(
        default="train",
        validator=_check_split,
        metadata=meta("Part of the seed, so that `train` and `eval` differ."),
    )
    question_mix: list[float] | dict[str, float] = attrs.field(
        factory=lambda: [1.0, 2.0, 2.0],
        validator=_check_mix,
        metadata=meta("Weights of the colour, shape and describe questions (array or table)."),
    )

    def generator_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`ensure_shapes`."""
        return {
            "split": self.split,
            "num_samples": self.num_samples
            or DEFAULT_NUM_SAMPLES.get(self.split, DEFAULT_NUM_SAMPLES["eval"]),
            "image_size": self.image_size,
            "seed": self.seed,
            "question_mix": _mix_weights(self.question_mix),
        }


def load_shapes_format(
    path: str | None,
    options: ShapesOptions | None = None,
    base_dir: str | Path | None = None,
) -> list[RawSample]:
    """The ``shapes`` dataset format: ``{ format = "shapes", num_samples = 2000, split = ... }``.

    ``options`` are :class:`ShapesOptions` (None: the defaults). ``path``, when given, is the
    cache folder to use instead of the default (relative to ``base_dir``).
    """
    return load_generated(ensure_shapes, path, options or ShapesOptions(), base_dir)


def load_generated(
    ensure: Callable[..., Path], path: str | None, options: Any, base_dir: str | Path | None
) -> list[RawSample]:
    """A generated format's samples: the data set of ``options.generator_args()`` made by
    ``ensure`` (in the cache, or the folder ``path`` relative to ``base_dir``)."""
    root: Path | None = None
    if path:
        root = Path(path)
        if not root.is_absolute() and base_dir is not None:
            root = Path(base_dir) / root
    return read_jsonl(ensure(root=root, **options.generator_args()))
