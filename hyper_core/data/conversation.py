"""One conversation shape for every accepted sample format (no torch here).

Accepted raw samples (``sample`` is one JSON object):

* ``{"messages": [{"role": "user", "content": "text"}, ...]}`` — content a string;
* content lists: ``[{"type": "image", "image": "rel/path.png"}, {"type": "text", "text": "..."}]``;
  a video part is ``{"type": "video", "video": PATH}``, PATH a video file or a list of frame
  image paths, with optional ``fps``, ``max_frames``, ``min_pixels``, ``max_pixels``;
* LLaVA style: string content with ``<image>`` placeholders (and ``{"type": "image"}`` parts
  without a path) filled in order from a top-level ``"images": [...]`` (or ``"image"``: one
  path or a list of paths);
* ``{"prompt": ..., "completion": ...}`` (strings, or lists of messages) → user/assistant;
* ShareGPT: ``{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}``;
* an optional top-level ``"system"`` string becomes a leading system message.

Relative image paths are resolved against the sample's ``_image_dir`` (set from ``[data]
image_root`` or a source's ``image_dir``), else the directory of its data file
(``_source.file``). Images are opened lazily by :func:`load_image`, regular files only; an
image may also come inline as ``{"bytes": ..., "path": ...}`` (Hugging Face ``datasets``' Image
struct, e.g. from Parquet), ``path`` then only naming it.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import attrs

from .errors import SampleError
from .jsonl import ERROR_KEY, IMAGE_DIR_KEY, SOURCE_KEY

if TYPE_CHECKING:
    from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
ROLES = ("system", "user", "assistant")
_ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
}


@attrs.frozen
class TextPart:
    """A piece of text inside a message."""

    text: str


@attrs.frozen(eq=False)
class ImagePart:
    """An image inside a message: a file (opened lazily), encoded bytes inline (``path`` then
    only names it) or an in-memory PIL image."""

    path: Path | None = None
    image: Image.Image | None = None
    data: bytes | None = None

    def describe(self) -> str:
        """The path (``inline`` when the bytes came with the sample), or ``<in-memory image>``."""
        if self.data is not None:
            return f"{self.path} (inline)" if self.path is not None else "<inline image>"
        return str(self.path) if self.path is not None else "<in-memory image>"


@attrs.frozen(kw_only=True)
class VideoPart:
    """A video inside a message: a video file (``path``) or frame image files (``frames``),
    decoded by the adapter's processor; the per-part settings override the adapter's."""

    path: Path | None = None
    frames: tuple[Path, ...] | None = None
    fps: float | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None

    def describe(self) -> str:
        """The path, or the first frame's path and the frame count."""
        if self.frames is not None:
            return f"{self.frames[0]} (+{len(self.frames) - 1} frames)" if self.frames else "[]"
        return str(self.path)


Part = Union[TextPart, ImagePart, VideoPart]  # noqa: UP007 (runtime alias, py3.10)


@attrs.frozen
class Message:
    """One turn: a role (``system``, ``user``, ``assistant``) and its parts in order."""

    role: str
    parts: list[Part]

    @property
    def text(self) -> str:
        """The text parts joined (images left out)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


@attrs.frozen
class Conversation:
    """A list of messages with at least one assistant turn."""

    messages: list[Message]

    @property
    def images(self) -> list[ImagePart]:
        """All image parts in order of appearance."""
        return [p for m in self.messages for p in m.parts if isinstance(p, ImagePart)]

    @property
    def num_images(self) -> int:
        """Number of image parts."""
        return len(self.images)

    @property
    def videos(self) -> list[VideoPart]:
        """All video parts in order of appearance."""
        return [p for m in self.messages for p in m.parts if isinstance(p, VideoPart)]

    def prompt_and_answer(self) -> tuple[Conversation, str]:
        """The conversation before the last assistant turn, and that turn's text (for eval)."""
        last = max(i for i, m in enumerate(self.messages) if m.role == "assistant")
        return Conversation(list(self.messages[:last])), self.messages[last].text

    def to_messages(self) -> list[dict[str, Any]]:
        """HF ``apply_chat_template`` messages: string content when text-only, else a list."""
        out: list[dict[str, Any]] = []
        for m in self.messages:
            if all(isinstance(p, TextPart) for p in m.parts):
                out.append({"role": m.role, "content": m.text})
                continue
            content: list[dict[str, Any]] = []
            for p in m.parts:
                if isinstance(p, TextPart):
                    content.append({"type": "text", "text": p.text})
                elif isinstance(p, VideoPart):
                    frames = None if p.frames is None else [str(f) for f in p.frames]
                    video = {"type": "video", "video": frames or str(p.path)}
                    settings = ("fps", "max_frames", "min_pixels", "max_pixels")
                    video.update({k: getattr(p, k) for k in settings if getattr(p, k)})
                    content.append(video)
                else:
                    item: dict[str, Any] = {"type": "image"}
                    if p.image is not None:
                        item["image"] = p.image
                    elif p.path is not None:
                        item["image"] = str(p.path)
                    content.append(item)
            out.append({"role": m.role, "content": content})
        return out


# ------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------


class _Placeholder:
    """An image part still to be filled from the top-level ``images`` list."""


def _is_pil(value: Any) -> bool:
    return hasattr(value, "mode") and hasattr(value, "size") and hasattr(value, "convert")


def _base_dir(sample: Mapping[str, Any], base_dir: str | Path | None) -> Path | None:
    if base_dir is not None:
        return Path(base_dir)
    if sample.get(IMAGE_DIR_KEY):
        return Path(str(sample[IMAGE_DIR_KEY]))
    source = sample.get(SOURCE_KEY)
    if isinstance(source, Mapping) and source.get("file"):
        return Path(str(source["file"])).parent
    return None


def _image_part(value: Any, base: Path | None, where: str) -> ImagePart:
    if _is_pil(value):
        return ImagePart(image=value)
    if isinstance(value, Mapping) and value.get("bytes") is not None:  # HF datasets' Image
        data, name = value["bytes"], value.get("path")
        if not isinstance(data, bytes):
            raise SampleError("bad_format", f"{where}: image bytes must be bytes, got {data!r}")
        return ImagePart(path=Path(name) if isinstance(name, str) and name else None, data=data)
    if isinstance(value, Mapping) and "path" in value:
        value = value["path"]
    if isinstance(value, str) and value.startswith("file://"):
        value = value[len("file://") :]
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise SampleError("bad_format", f"{where}: image must be a path, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return ImagePart(path=path)


def _video_part(item: Mapping[str, Any], base: Path | None, where: str) -> VideoPart:
    value = item.get("video", item.get("path"))
    if isinstance(value, list):
        if not value:
            raise SampleError("bad_format", f"{where}: video frame list is empty")
        at = f"{where}.video"
        parts = [_image_part(v, base, f"{at}[{i}]") for i, v in enumerate(value)]
        if any(p.path is None or p.data is not None or p.image is not None for p in parts):
            raise SampleError("bad_format", f"{at}: video frames must be paths")
        fields: dict[str, Any] = {"frames": tuple(p.path for p in parts)}
    else:
        fields = {"path": _image_part(value, base, f"{where}.video").path}
        if fields["path"] is None:
            raise SampleError("bad_format", f"{where}: video must be a path or a list of paths")
    kinds = {"fps": float, "max_frames": int, "min_pixels": int, "max_pixels": int}
    for key, kind in kinds.items():
        v = item.get(key)
        if v is None:
            continue
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v <= 0
            or (kind is int and int(v) != v)
        ):
            raise SampleError("bad_format", f"{where}.{key}: must be a positive number, got {v!r}")
        fields[key] = kind(v)
    return VideoPart(**fields)


def _split_placeholders(text: str) -> list[Any]:
    parts: list[Any] = []
    for i, chunk in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append(_Placeholder())
        if chunk:
            parts.append(TextPart(chunk))
    return parts


def _content_parts(content: Any, base: Path | None, where: str) -> list[Any]:
    if isinstance(content, str):
        return _split_placeholders(content)
    if not isinstance(content, list):
        kind = type(content).__name__
        raise SampleError("bad_format", f"{where}: content must be a string or a list, got {kind}")
    parts: list[Any] = []
    for j, item in enumerate(content):
        at = f"{where}[{j}]"
        if isinstance(item, str):
            parts.extend(_split_placeholders(item))
            continue
        if not isinstance(item, Mapping):
            raise SampleError("bad_format", f"{at}: expected an object, got {item!r}")
        kind = item.get("type")
        if kind is None:
            kind = "text" if "text" in item else "image" if "image" in item else None
        if kind == "text":
            text = item.get("text")
            if not isinstance(text, str):
                raise SampleError("bad_format", f"{at}: text part without a string 'text'")
            parts.extend(_split_placeholders(text))
        elif kind == "video":
            parts.append(_video_part(item, base, at))
        elif kind in ("image", "image_url"):
            value = item.get("image", item.get("path", item.get("url", item.get("image_url"))))
            if isinstance(value, Mapping) and "url" in value:
                value = value["url"]
            parts.append(_Placeholder() if value is None else _image_part(value, base, at))
        else:
            raise SampleError("bad_format", f"{at}: unknown content type {kind!r}")
    return parts


def _raw_messages(sample: Mapping[str, Any]) -> tuple[list[tuple[str, Any, str]], str]:
    """``(role, content, where)`` of each message, and the key they came from."""
    if "messages" in sample:
        raw = sample["messages"]
        key = "messages"
    elif "conversations" in sample:
        raw = sample["conversations"]
        key = "conversations"
    elif "prompt" in sample or "completion" in sample:
        out: list[tuple[str, Any, str]] = []
        for field, role in (("prompt", "user"), ("completion", "assistant")):
            value = sample.get(field)
            if value is None:
                raise SampleError("bad_format", f"prompt/completion sample without {field!r}")
            if isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
                sub, _ = _raw_messages({"messages": value})
                out.extend((r, c, f"{field}{w[len('messages') :]}") for r, c, w in sub)
            else:
                out.append((role, value, field))
        return out, "prompt"
    else:
        keys = ", ".join(sorted(k for k in sample if not k.startswith("_"))) or "none"
        raise SampleError(
            "bad_format",
            f"no 'messages', 'conversations' or 'prompt'/'completion' (keys: {keys})",
        )
    if not isinstance(raw, list) or not raw:
        raise SampleError("bad_format", f"{key!r} must be a non-empty list")
    out = []
    for i, msg in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(msg, Mapping):
            raise SampleError("bad_format", f"{where}: expected an object, got {msg!r}")
        role = msg.get("role", msg.get("from"))
        content = msg.get("content", msg.get("value"))
        out.append((role, content, where))
    return out, key


def parse_conversation(
    sample: Mapping[str, Any], *, base_dir: str | Path | None = None
) -> Conversation:
    """Normalise one raw sample to a :class:`Conversation`; raise :class:`SampleError` if bad.

    ``base_dir`` overrides the directory that relative image paths are resolved against
    (default: ``sample["_image_dir"]``, else the directory of ``sample["_source"]["file"]``,
    else the working directory).
    """
    if ERROR_KEY in sample:
        reason, message = sample[ERROR_KEY]
        raise SampleError(str(reason), str(message))
    base = _base_dir(sample, base_dir)
    raw, _ = _raw_messages(sample)

    messages: list[tuple[str, list[Any]]] = []
    system = sample.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise SampleError("bad_format", "'system' must be a string")
        if not raw or _ROLE_ALIASES.get(str(raw[0][0]).lower()) != "system":
            messages.append(("system", [TextPart(system)] if system else []))
    for role_value, content, where in raw:
        role = _ROLE_ALIASES.get(role_value.lower()) if isinstance(role_value, str) else None
        if role is None:
            raise SampleError(
                "bad_format", f"{where}: unknown role {role_value!r} (expected one of {ROLES})"
            )
        if content is None:
            raise SampleError("bad_format", f"{where}: message without content")
        messages.append((role, _content_parts(content, base, f"{where}.content")))

    images = sample.get("images")
    if images is None and sample.get("image") is not None:  # a null column: no image
        image = sample["image"]
        images = image if isinstance(image, list) else [image]
    if images is None:
        images = []
    if not isinstance(images, list):
        raise SampleError("bad_format", "'images' must be a list")
    num_placeholders = sum(isinstance(p, _Placeholder) for _, parts in messages for p in parts)
    if num_placeholders != len(images):
        raise SampleError(
            "image_token_mismatch",
            f"{num_placeholders} image placeholder(s) in the text but {len(images)} image(s)",
        )
    fill = iter(_image_part(v, base, f"images[{i}]") for i, v in enumerate(images))
    result = [
        Message(role, [next(fill) if isinstance(p, _Placeholder) else p for p in parts])
        for role, parts in messages
    ]
    if not any(m.role == "assistant" for m in result):
        raise SampleError("bad_format", "no assistant turn (nothing to learn from)")
    return Conversation(result)


def load_image(part: ImagePart) -> Image.Image:
    """The image of ``part`` as RGB; :class:`SampleError` ``missing_image``/``corrupt_image``."""
    if part.image is not None:
        img = part.image
        return img if img.mode == "RGB" else img.convert("RGB")
    if part.data is not None:
        return _open_rgb(io.BytesIO(part.data), part.describe())
    if part.path is None:
        raise SampleError("missing_image", "image part has neither a path nor an image")
    _check_regular_file(part.path)
    return _open_rgb(part.path, str(part.path))


def _open_rgb(source: Path | io.BytesIO, name: str) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as opened:
            opened.load()
            return opened.copy() if opened.mode == "RGB" else opened.convert("RGB")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise SampleError("missing_image", f"image not found: {name}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise SampleError("corrupt_image", f"cannot read image {name}: {exc}") from None
    except Image.DecompressionBombError as exc:
        raise SampleError("corrupt_image", f"image too large {name}: {exc}") from None


def _check_regular_file(path: Path) -> None:
    # Opening a FIFO (or a device) blocks forever, deaf to SIGTERM: look before opening.
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise SampleError("missing_image", f"image not found: {path}") from None
    except OSError as exc:
        raise SampleError("corrupt_image", f"cannot read image {path}: {exc}") from None
    if not stat.S_ISREG(mode):
        raise SampleError("missing_image", f"not a regular file: {path}")


def load_images(conversation: Conversation | Sequence[ImagePart]) -> list[Image.Image]:
    """:func:`load_image` of every image part in order."""
    parts = conversation.images if isinstance(conversation, Conversation) else conversation
    return [load_image(p) for p in parts]
