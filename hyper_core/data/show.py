"""One transformed sample as the model sees it (``data show``): its tokens decoded back to
text in runs, each run trained or not, each image's (video's) tokens as one placeholder with
their count. No torch here: the sample's ids and shifted labels come in as lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from ..batching.types import IGNORE_INDEX

Kind = Literal["text", "image", "video"]

#: ANSI colours on a terminal: trained text, image and video placeholders.
_COLOURS = {"loss": "\x1b[1;32m", "image": "\x1b[36m", "video": "\x1b[35m"}
_RESET = "\x1b[0m"


@attrs.frozen
class Segment:
    """A run of consecutive tokens of one kind: text trained (``loss``) or not, or the tokens
    of one image or video."""

    kind: Kind
    tokens: int
    loss: bool = False
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        """Plain values."""
        if self.kind == "text":
            return {"kind": "text", "text": self.text, "tokens": self.tokens, "loss": self.loss}
        return {"kind": self.kind, "tokens": self.tokens}


def trained_positions(labels: Sequence[int]) -> list[bool]:
    """Whether each token is a target: labels are shifted (``labels[i]`` is the target at
    ``i + 1``), so token ``i`` is trained when ``labels[i - 1]`` is not ignored."""
    return [False, *(int(t) != IGNORE_INDEX for t in labels[:-1])][: len(labels)]


def segments(
    input_ids: Sequence[int],
    labels: Sequence[int],
    decode: Any,
    *,
    image_token_id: int | None = None,
    video_token_id: int | None = None,
) -> list[Segment]:
    """``input_ids`` cut into runs of text (trained or not) and image/video tokens; each text
    run decoded by ``decode(ids) -> str`` (special tokens kept)."""
    trained = trained_positions(labels)
    media: dict[int, Kind] = {}
    if image_token_id is not None:
        media[int(image_token_id)] = "image"
    if video_token_id is not None:
        media[int(video_token_id)] = "video"
    out: list[Segment] = []
    run: list[int] = []
    key: tuple[Kind, bool] | None = None

    def flush() -> None:
        if key is None or not run:
            return
        kind, loss = key
        text = decode(run) if kind == "text" else ""
        out.append(Segment(kind, len(run), loss, text))

    for token, loss in zip(input_ids, trained, strict=True):
        kind = media.get(int(token), "text")
        this = (kind, loss and kind == "text")
        if this != key:
            flush()
            run, key = [], this
        run.append(int(token))
    flush()
    return out


@attrs.frozen
class ShownSample:
    """One sample of a split, where it comes from, and its segments."""

    index: int
    split: str
    total: int  # samples in the split
    source: str  # file:line
    #: All the sample's segments (every part's, in order).
    segments: tuple[Segment, ...]
    #: A sample of several sequences (a preference pair's chosen and rejected sides): each
    #: part's name and segments, rendered under its name; empty for one sequence.
    parts: tuple[tuple[str, tuple[Segment, ...]], ...] = ()

    @property
    def tokens(self) -> int:
        """All tokens of the sample."""
        return sum(s.tokens for s in self.segments)

    @property
    def loss_tokens(self) -> int:
        """Tokens that are targets of the loss."""
        return sum(s.tokens for s in self.segments if s.loss)

    def media(self, kind: Kind) -> list[int]:
        """Token counts of each image (video), in order."""
        return [s.tokens for s in self.segments if s.kind == kind]

    def to_json(self) -> dict[str, Any]:
        """Plain values for ``--json``."""
        return {
            "index": self.index,
            "split": self.split,
            "samples": self.total,
            "source": self.source,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "image_tokens": self.media("image"),
            "video_tokens": self.media("video"),
            "segments": [s.to_json() for s in self.segments],
            **(
                {
                    "parts": [
                        {"name": n, "segments": [s.to_json() for s in segs]}
                        for n, segs in self.parts
                    ]
                }
                if self.parts
                else {}
            ),
        }

    def render(self, *, colour: bool) -> str:
        """The header and the text, trained runs marked by colour or ``[[...]]``."""
        images, videos = self.media("image"), self.media("video")
        counts = f"{self.tokens} tokens, {self.loss_tokens} trained (loss)"
        if images:
            counts += f", {len(images)} image(s) of {sum(images)} tokens"
        if videos:
            counts += f", {len(videos)} video(s) of {sum(videos)} tokens"
        legend = f"{_COLOURS['loss']}trained text{_RESET}" if colour else "[[trained text]]"
        if images or videos:
            legend += ", <image N: T tokens> (T tokens after expansion)"
        lines = [
            f"{self.split} sample {self.index} of {self.total}: {self.source}",
            counts,
            f"legend: {legend}",
            "",
            "",
        ]
        body: list[str] = []
        numbers = {"image": 0, "video": 0}
        for name, segs in self.parts or (("", self.segments),):
            if name:
                body.append(f"{'' if not body else chr(10)}--- {name} ---\n")
            self._render_segments(segs, body, numbers, colour)
        return "\n".join(lines) + "".join(body).rstrip("\n")

    @staticmethod
    def _render_segments(
        segs: Sequence[Segment], body: list[str], numbers: dict[str, int], colour: bool
    ) -> None:
        for s in segs:
            if s.kind == "text":
                if not s.loss:
                    body.append(s.text)
                elif colour:
                    body.append(f"{_COLOURS['loss']}{s.text}{_RESET}")
                else:
                    body.append(f"[[{s.text}]]")
                continue
            n = numbers[s.kind]
            numbers[s.kind] += 1
            mark = f"<{s.kind} {n}: {s.tokens} tokens>"
            body.append(f"{_COLOURS[s.kind]}{mark}{_RESET}" if colour else mark)
