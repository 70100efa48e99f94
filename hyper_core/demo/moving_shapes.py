"""The synthetic "moving shapes" video data set of the CPU video demo (PIL only, no torch).

Each clip is ``num_frames`` frames of one shape (circle, square, triangle; 6 colours) on a
light background, crossing the frame left, right, up or down in even steps while it jumps
about on the other axis through the same positions in a random order. Each sample asks "Which
way does the shape move?" → ``left``/``right``/``up``/``down`` (chance 1/4), with a video part
that lists the clip's frame files and ``"meta": {"question_type": "direction", "answer",
"direction"}``.

With ``shuffled_frames`` the frames are listed in a random order: the same pictures without
their time order, the control that must stay at chance. The jumps make it a fair control: the
unordered positions of a clip are one random pairing of the same offsets on both axes, alike
for all four directions, so only the time order tells the direction.

Clips are generated once into ``$HYPER_TRAIN_CACHE/moving_shapes/<name-with-hash>`` the way
:mod:`hyper_core.demo.shapes` caches its images (lock file, temporary folder, atomic rename).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import attrs

from ..config.fields import at_least, between, meta
from ..data.cache import cache_root
from ..data.jsonl import RawSample
from .shapes import (
    COLOURS,
    DATA_FILE,
    JITTER,
    SHAPES,
    _check_split,
    cached_data_set,
    draw_shape,
    load_generated,
)

FORMAT_VERSION = 1
DIRECTIONS: dict[str, tuple[int, int]] = {
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
QUESTION = "Which way does the shape move?"
DEFAULT_NUM_SAMPLES = {"train": 1000, "eval": 100}


def _frames(
    rng: random.Random, size: int, num_frames: int, direction: str
) -> tuple[list[Any], str, str]:
    from PIL import Image, ImageDraw

    colour = rng.choice(list(COLOURS))
    shape = rng.choice(SHAPES)
    fill = tuple(max(0, min(255, c + rng.randint(-JITTER, JITTER))) for c in COLOURS[colour])
    background = tuple(rng.randint(215, 255) for _ in range(3))
    side = rng.randint(max(4, round(size * 0.2)), max(5, round(size * 0.3)))
    travel = size - side
    offsets = [round(travel * k / max(1, num_frames - 1)) for k in range(num_frames)]
    dx, dy = DIRECTIONS[direction]
    along = offsets if dx + dy > 0 else offsets[::-1]
    across = rng.sample(offsets, len(offsets))
    xs, ys = (along, across) if dx else (across, along)
    frames = []
    for x0, y0 in zip(xs, ys, strict=True):
        img = Image.new("RGB", (size, size), background)
        draw_shape(ImageDraw.Draw(img), shape, (x0, y0, x0 + side - 1, y0 + side - 1), fill)
        frames.append(img)
    return frames, colour, shape


def generate_moving_shapes(
    out_dir: str | Path,
    *,
    num_samples: int,
    image_size: int = 56,
    num_frames: int = 8,
    seed: int,
    split: str = "train",
    shuffled_frames: bool = False,
) -> Path:
    """Write ``clips/NNNNN/K.png`` and ``data.jsonl`` into ``out_dir``; return the JSONL path.

    Deterministic in all arguments; ``split`` is part of the seed, so train and eval differ.
    The clips do not depend on ``shuffled_frames``, only the order their frames are listed in.
    """
    out = Path(out_dir)
    rng = random.Random(f"hyper-train/moving_shapes/v{FORMAT_VERSION}/{split}/{seed}")
    order_rng = random.Random(f"hyper-train/moving_shapes/order/{split}/{seed}")
    lines = []
    for i in range(num_samples):
        direction = rng.choice(list(DIRECTIONS))
        frames, colour, shape = _frames(rng, image_size, num_frames, direction)
        clip = out / "clips" / f"{i:05d}"
        clip.mkdir(parents=True, exist_ok=True)
        names = [f"clips/{i:05d}/{k}.png" for k in range(num_frames)]
        for name, frame in zip(names, frames, strict=True):
            frame.save(out / name, format="PNG", compress_level=1)
        if shuffled_frames:
            order_rng.shuffle(names)
        sample = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": names},
                        {"type": "text", "text": QUESTION},
                    ],
                },
                {"role": "assistant", "content": direction},
            ],
            "meta": {
                "question_type": "direction",
                "answer": direction,
                "direction": direction,
                "colour": colour,
                "shape": shape,
            },
        }
        lines.append(json.dumps(sample, separators=(",", ":")))
    data = out / DATA_FILE
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data


def ensure_moving_shapes(*, root: str | Path | None = None, **args: Any) -> Path:
    """The ``data.jsonl`` of the cached data set of :func:`generate_moving_shapes`' ``args``
    (``seed`` and ``num_samples`` required), generating it first if needed (concurrency-safe,
    like :func:`~hyper_core.demo.shapes.ensure_shapes`)."""
    base = Path(root) if root is not None else cache_root() / "moving_shapes"
    key = json.dumps({"version": FORMAT_VERSION, **args}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"v{FORMAT_VERSION}-{args.get('split', 'train')}-{args['num_samples']}-{digest}"
    return cached_data_set(base, name, lambda tmp: generate_moving_shapes(tmp, **args))


@attrs.frozen(kw_only=True)
class MovingShapesOptions:
    """Options of the ``moving_shapes`` format (``{ format = "moving_shapes", ... }``)."""

    num_samples: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Clips to generate (default 1000 for split `train`, 100 otherwise)."),
    )
    image_size: int = attrs.field(
        default=56, validator=between(16, 1024), metadata=meta("Frame side, in pixels.")
    )
    num_frames: int = attrs.field(
        default=8, validator=between(2, 256), metadata=meta("Frames per clip.")
    )
    seed: int = attrs.field(default=0, metadata=meta("Generator seed (with `split`)."))
    split: str = attrs.field(
        default="train",
        validator=_check_split,
        metadata=meta("Part of the seed, so that `train` and `eval` differ."),
    )
    shuffled_frames: bool = attrs.field(
        default=False,
        metadata=meta("List each clip's frames in a random order (the no-time-order control)."),
    )

    def generator_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`generate_moving_shapes`."""
        return {
            "split": self.split,
            "num_samples": self.num_samples
            or DEFAULT_NUM_SAMPLES.get(self.split, DEFAULT_NUM_SAMPLES["eval"]),
            "image_size": self.image_size,
            "num_frames": self.num_frames,
            "seed": self.seed,
            "shuffled_frames": self.shuffled_frames,
        }


def load_moving_shapes_format(
    path: str | None,
    options: MovingShapesOptions | None = None,
    base_dir: str | Path | None = None,
) -> list[RawSample]:
    """The ``moving_shapes`` dataset format; ``path``, when given, is the cache folder to use
    instead of the default (relative to ``base_dir``)."""
    return load_generated(ensure_moving_shapes, path, options or MovingShapesOptions(), base_dir)
