"""Chat-template rendering to token ids and shifted labels, shared by all adapters.

A :class:`ChatFormat` renders each message as ``prefix(role) + parts + suffix``. The trained ids
are the ids of the rendered string: the whole conversation is rendered once (each image as the
processor's placeholder text) and tokenised in one pass by the fast tokenizer
(``add_special_tokens=False``), as ``apply_chat_template(..., tokenize=True)`` does at inference,
so a BPE merge across a piece boundary (``"Assistant: "`` + ``"a"`` → ``" a"``) is what training
sees too. The loss mask comes from the tokens' character offsets: a token is trained when it
covers a character of a trained span, the assistant's content or the stripped suffix
(``message_suffix.rstrip()``, i.e. ``<|im_end|>`` but not the newline after it) of assistant
messages; never prefixes alone, system/user turns or image tokens. Each image placeholder's
tokens are replaced by the adapter's expansion.

A tokenizer without offsets (a slow, Python tokenizer) falls back to the piecewise path, each
piece tokenised on its own and the ids concatenated, with a warning once per process: refusing
would break models whose tokenizer has no fast version, and the piecewise ids equal the
one-pass ids wherever special tokens sit at the boundaries (ChatML).
"""

from __future__ import annotations

import bisect
import json
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..batching.types import IGNORE_INDEX, SampleFeatures
from .conversation import (
    ROLES,
    Conversation,
    ImagePart,
    Message,
    TextPart,
    parse_conversation,
)
from .errors import SampleError

ImageTokens = Callable[[int, ImagePart], Sequence[int]]


def _role_prefixes(
    value: Mapping[str, str] | Iterable[tuple[str, str]],
) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    pairs = tuple((str(role), str(prefix)) for role, prefix in items)
    unknown = sorted({role for role, _ in pairs} - set(ROLES))
    if unknown:
        raise ValueError(f"role_prefixes: unknown roles {unknown} (roles are {list(ROLES)})")
    return pairs


@attrs.frozen(kw_only=True)
class ChatFormat:
    """How messages are rendered: ``prefix(role) + parts + message_suffix``.

    ``message_prefix`` may contain ``{role}``; ``role_prefixes`` replaces it for the roles it
    names (e.g. ``{"user": "User:", "assistant": "Assistant:"}``, given as a mapping).
    ``default_system``: a system message inserted when the conversation does not start with
    one (Qwen2/2.5 behaviour). ``bos``: text emitted once at the start.
    """

    message_prefix: str
    message_suffix: str
    bos: str | None = None
    default_system: str | None = None
    role_prefixes: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_role_prefixes)

    def prefix(self, role: str) -> str:
        """The prefix of a message of ``role``."""
        for name, prefix in self.role_prefixes:
            if name == role:
                return prefix
        return self.message_prefix.replace("{role}", role)

    @property
    def loss_suffix(self) -> str:
        """The part of the suffix that carries loss in assistant turns (e.g. ``<|im_end|>``)."""
        return self.message_suffix.rstrip()

    @property
    def trailing_suffix(self) -> str:
        """The rest of the suffix (whitespace after the end-of-message token): no loss."""
        return self.message_suffix[len(self.loss_suffix) :]

    def render(self, conversation: Conversation, *, add_generation_prompt: bool = False) -> str:
        """The text of a text-only conversation (images are left out)."""
        pieces = _pieces(conversation, self, add_generation_prompt=add_generation_prompt)
        return "".join(text for kind, text, _ in pieces if kind != "image")

    @property
    def chat_template(self) -> str:
        """A Jinja template for HF ``apply_chat_template`` that renders text like :meth:`render`
        (image parts are left out; see :meth:`template`)."""
        return _jinja_template(self, image=None)

    def template(self, *, image: str | None = None) -> str:
        """A Jinja template for HF ``apply_chat_template`` that renders like training does.

        Each image part becomes ``image``, the text that stands for one image before the
        processor expands it (:attr:`ImageTextProcessor.image_placeholder
        <hyper_core.adapters.processor.ImageTextProcessor.image_placeholder>`, e.g.
        ``<image>``); None leaves image parts out. The prefixes follow :meth:`prefix`, so a
        subclass that overrides it is followed for the roles in ``ROLES``.
        """
        return _jinja_template(self, image=image)


QWEN_CHATML = ChatFormat(
    message_prefix="<|im_start|>{role}\n",
    message_suffix="<|im_end|>\n",
    bos=None,
    default_system="You are a helpful assistant.",
)


@attrs.frozen(kw_only=True)
class TokenizedConversation:
    """Token ids, shifted labels (``labels[i]`` = target at position ``i``) and image spans."""

    input_ids: list[int]
    labels: list[int]
    #: ``(start, end)`` (end exclusive) of each image's tokens in ``input_ids``, in order.
    image_spans: list[tuple[int, int]]
    num_loss_tokens: int

    @property
    def length(self) -> int:
        """Number of tokens."""
        return len(self.input_ids)


# A piece: (kind, text, loss) with kind "text" or "image"; for images text is unused and the
# third element is the ImagePart.
_Piece = tuple[str, Any, Any]


def _pieces(
    conversation: Conversation, fmt: ChatFormat, *, add_generation_prompt: bool
) -> list[_Piece]:
    pieces: list[_Piece] = []
    if fmt.bos:
        pieces.append(("text", fmt.bos, False))
    messages: list[Message] = list(conversation.messages)
    if fmt.default_system is not None and (not messages or messages[0].role != "system"):
        messages.insert(0, Message("system", [TextPart(fmt.default_system)]))
    for message in messages:
        learn = message.role == "assistant"
        pieces.append(("text", fmt.prefix(message.role), False))
        for part in message.parts:
            if isinstance(part, TextPart):
                if part.text:
                    pieces.append(("text", part.text, learn))
            else:
                pieces.append(("image", "", part))
        pieces.append(("text", fmt.loss_suffix, learn))
        pieces.append(("text", fmt.trailing_suffix, False))
    if add_generation_prompt:
        pieces.append(("text", fmt.prefix("assistant"), False))
    return pieces


#: Token ids of short pieces, per tokenizer. The template's prefixes and suffixes and, in SFT
#: data, many questions and answers repeat in every sample; a tokenizer call costs ~20 µs.
#: Keyed by the tokenizer's size as well, so that adding tokens invalidates it.
_PIECE_CACHE: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, tuple[int, ...]]]] = (
    weakref.WeakKeyDictionary()
)
_CACHED_PIECE_CHARS = 256
_CACHE_ENTRIES = 16384


def _encode(tokenizer: Any, text: str) -> Sequence[int]:
    if not text:
        return ()
    if len(text) > _CACHED_PIECE_CHARS:
        return tokenizer.encode(text, add_special_tokens=False)
    try:
        size = len(tokenizer)
        entry = _PIECE_CACHE.get(tokenizer)
        if entry is None or entry[0] != size or len(entry[1]) >= _CACHE_ENTRIES:
            entry = _PIECE_CACHE[tokenizer] = (size, {})
    except TypeError:  # no len(), not hashable or not weak-referenceable
        return tokenizer.encode(text, add_special_tokens=False)
    cache = entry[1]
    ids = cache.get(text)
    if ids is None:
        ids = cache[text] = tuple(tokenizer.encode(text, add_special_tokens=False))
    return ids


#: The longest vocabulary entry in UTF-8 bytes, per tokenizer (keyed by its size, like the
#: piece cache): computed once, it bounds the text one token can cover.
_MAX_TOKEN_BYTES: weakref.WeakKeyDictionary[Any, tuple[int, int | None]] = (
    weakref.WeakKeyDictionary()
)


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes of (normalised) text one token can cover, or None if unknown.

    The longest vocabulary entry in UTF-8: exact for plain entries, an over-estimate for
    byte-level BPE and SentencePiece entries, whose characters spell a byte or a space with up
    to 3 bytes. Either way ``bytes / max_token_bytes`` is a lower bound on the tokens of a text,
    for tokenizers that keep every byte of the normalised text (byte-level BPE, SentencePiece;
    not e.g. BERT's whitespace-dropping pre-tokenizer, which no chat model uses).
    """
    try:
        size = len(tokenizer)
        entry = _MAX_TOKEN_BYTES.get(tokenizer)
    except TypeError:  # no len(), not hashable or not weak-referenceable
        size, entry = None, None
    if entry is not None and entry[0] == size:
        return entry[1]
    get_vocab = getattr(tokenizer, "get_vocab", None)
    value = None
    if callable(get_vocab):
        value = max((len(str(t).encode("utf-8")) for t in get_vocab()), default=0) or None
    if size is not None:
        _MAX_TOKEN_BYTES[tokenizer] = (size, value)
    return value


def check_text_length(
    conversation: Conversation, tokenizer: Any, chat_format: ChatFormat, max_seq_len: int
) -> None:
    """:class:`SampleError` ``too_long`` when the rendered text alone needs more than
    ``max_seq_len`` tokens, decided without tokenising (BPE on one huge text takes minutes).

    The tokens of the rendered text are at least ``Σ bytes / M`` with ``M``
    the :func:`max_token_bytes`; bytes are counted after the tokenizer's normaliser when it has
    one (a normaliser may shorten text). Passing says nothing: the tokens are still counted.
    """
    texts = [
        text
        for kind, text, _ in _pieces(conversation, chat_format, add_generation_prompt=False)
        if kind == "text"
    ]
    per_token = max_token_bytes(tokenizer)
    if per_token is None:
        return
    budget = max_seq_len * per_token
    if 4 * sum(map(len, texts)) <= budget:  # UTF-8: at most 4 bytes per character
        return
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    if nbytes <= budget:
        return
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    if normalizer is not None:
        nbytes = sum(len(normalizer.normalize_str(t).encode("utf-8")) for t in texts)
        if nbytes <= budget:
            return
    raise SampleError(
        "too_long",
        f"{nbytes} bytes of text need more than max_seq_len {max_seq_len} tokens (a token "
        f"covers at most {per_token} bytes; not tokenised)",
    )


class PiecewiseTokensWarning(UserWarning):
    """Training ids are tokenised piece by piece (no offsets): they may differ from inference's."""


def has_offsets(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a fast (``tokenizers``-backed) one, which gives offsets."""
    return bool(getattr(tokenizer, "is_fast", False)) and hasattr(tokenizer, "backend_tokenizer")


def _tokenize_piecewise(
    conversation: Conversation,
    tokenizer: Any,
    fmt: ChatFormat,
    image_tokens: ImageTokens | None,
    *,
    add_generation_prompt: bool,
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    """The fallback: each piece tokenised on its own, the ids concatenated."""
    ids: list[int] = []
    loss: list[bool] = []
    spans: list[tuple[int, int]] = []
    for kind, text, extra in _pieces(
        conversation, fmt, add_generation_prompt=add_generation_prompt
    ):
        if kind == "image":
            if image_tokens is None:
                raise SampleError("bad_format", "sample has an image but the model takes none")
            toks = [int(t) for t in image_tokens(len(spans), extra)]
            spans.append((len(ids), len(ids) + len(toks)))
            ids.extend(toks)
            loss.extend([False] * len(toks))
        else:
            toks = _encode(tokenizer, text)
            ids.extend(toks)
            loss.extend([bool(extra)] * len(toks))
    return ids, loss, spans


def _render_spans(
    pieces: Sequence[_Piece], image_placeholder: str | None
) -> tuple[str, list[tuple[int, int]], list[tuple[int, int, ImagePart]]]:
    """The rendered text, the character spans of its trained pieces (merged where adjacent)
    and of each image placeholder, in order."""
    out: list[str] = []
    at = 0
    loss: list[tuple[int, int]] = []
    images: list[tuple[int, int, ImagePart]] = []
    for kind, text, extra in pieces:
        if kind == "image":
            if image_placeholder is None:
                raise ValueError("a sample with images needs the image placeholder to render")
            text = image_placeholder
            images.append((at, at + len(text), extra))
        elif extra and text:
            if loss and loss[-1][1] == at:
                loss[-1] = (loss[-1][0], at + len(text))
            else:
                loss.append((at, at + len(text)))
        out.append(text)
        at += len(text)
    return "".join(out), loss, images


def _tokenize_one_pass(
    conversation: Conversation,
    tokenizer: Any,
    fmt: ChatFormat,
    image_tokens: ImageTokens | None,
    image_placeholder: str | None,
    *,
    add_generation_prompt: bool,
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    """The rendered string tokenised once; loss and image spans from the tokens' offsets."""
    pieces = _pieces(conversation, fmt, add_generation_prompt=add_generation_prompt)
    if image_tokens is None and any(kind == "image" for kind, _, _ in pieces):
        raise SampleError("bad_format", "sample has an image but the model takes none")
    text, loss_spans, image_spans = _render_spans(pieces, image_placeholder)
    return tokenize_rendered(tokenizer, text, loss_spans, image_spans, image_tokens)


def tokenize_rendered(
    tokenizer: Any,
    text: str,
    loss_spans: Sequence[tuple[int, int]],
    image_spans: Sequence[tuple[int, int, Any]],
    image_tokens: ImageTokens | None,
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    """``text`` tokenised once by a fast tokenizer: its ids, whether each is trained (it covers
    a character of a ``loss_spans`` span, ``(start, end)`` in characters) and the token spans
    of the images, each image's placeholder tokens (characters ``start:end``, third element
    passed to ``image_tokens(index, part)``) replaced by ``image_tokens``' ids.

    Raises :class:`SampleError` ``image_token_mismatch`` when a placeholder's characters do
    not tokenise on their own (a token spans its edge).
    """
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    raw_ids: list[int] = encoding.ids
    offsets: list[tuple[int, int]] = encoding.offsets
    # A token is trained when it covers a character of a trained span (" a" after the prefix
    # "Assistant:" does). Offsets are in text order, so each span's tokens are a slice.
    starts = [s for s, _ in offsets]
    ends = [e for _, e in offsets]
    raw_loss = [False] * len(raw_ids)
    for a, b in loss_spans:
        lo, hi = bisect.bisect_right(ends, a), bisect.bisect_left(starts, b)
        raw_loss[lo:hi] = [True] * (hi - lo)
    if not image_spans:
        return raw_ids, raw_loss, []
    if image_tokens is None:
        raise SampleError("bad_format", "sample has an image but the model takes none")
    ids: list[int] = []
    loss: list[bool] = []
    spans: list[tuple[int, int]] = []
    t, n = 0, len(raw_ids)
    for index, (a, b, part) in enumerate(image_spans):
        while t < n and offsets[t][0] < a:
            ids.append(raw_ids[t])
            loss.append(raw_loss[t])
            t += 1
        first = t
        while t < n and offsets[t][0] < b:
            t += 1
        merged = first > 0 and offsets[first - 1][1] > a
        if merged or first == t or offsets[first][0] != a or offsets[t - 1][1] != b:
            raise SampleError(
                "image_token_mismatch",
                f"image {index}: the placeholder {text[a:b]!r} merges with the text around it "
                "into other tokens (it must tokenise on its own, as special tokens do)",
            )
        toks = [int(x) for x in image_tokens(index, part)]
        spans.append((len(ids), len(ids) + len(toks)))
        ids.extend(toks)
        loss.extend([False] * len(toks))
    ids.extend(raw_ids[t:])
    loss.extend(raw_loss[t:])
    return ids, loss, spans


def _tokenize(
    conversation: Conversation,
    tokenizer: Any,
    fmt: ChatFormat,
    image_tokens: ImageTokens | None,
    image_placeholder: str | None,
    *,
    add_generation_prompt: bool,
    piecewise: bool,
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    if not piecewise and not has_offsets(tokenizer):
        warnings.warn(
            f"{type(tokenizer).__name__} gives no offsets (not a fast tokenizer): training "
            "tokenises the chat piece by piece, and its ids may differ from inference's where "
            "a merge crosses a piece boundary; use the model's fast tokenizer",
            PiecewiseTokensWarning,
            stacklevel=3,
        )
        piecewise = True
    if piecewise:
        return _tokenize_piecewise(
            conversation, tokenizer, fmt, image_tokens, add_generation_prompt=add_generation_prompt
        )
    return _tokenize_one_pass(
        conversation,
        tokenizer,
        fmt,
        image_tokens,
        image_placeholder,
        add_generation_prompt=add_generation_prompt,
    )


def tokenize_conversation(
    conversation: Conversation,
    tokenizer: Any,
    chat_format: ChatFormat,
    *,
    image_tokens: ImageTokens | None = None,
    image_placeholder: str | None = None,
    max_seq_len: int | None,
    piecewise: bool = False,
) -> TokenizedConversation:
    """Render and tokenise ``conversation`` for training, in one pass (module docstring).

    ``image_placeholder`` is the text that stands for an image in the rendered string (what
    the exported template writes, e.g. ``<|vision_start|><|image_pad|><|vision_end|>``;
    needed when the conversation has images); ``image_tokens(index, part)`` gives the token
    ids that replace the ``index``-th placeholder's tokens (the adapter's expansion, e.g.
    ``<|vision_start|>`` + ``<|image_pad|>`` × N + ``<|vision_end|>``); a video part is
    rendered with the same placeholder and replaced by its own expansion. ``piecewise``: the
    old piece-by-piece path (the slow-tokenizer fallback; for comparisons and benchmarks).
    Raises :class:`SampleError` ``too_long`` (never truncates; text far over the limit is
    rejected before tokenising, see :func:`check_text_length`), ``no_loss_tokens``, or
    ``image_token_mismatch`` when a placeholder does not tokenise on its own.
    """
    if max_seq_len is not None:
        check_text_length(conversation, tokenizer, chat_format, max_seq_len)
    ids, loss, spans = _tokenize(
        conversation,
        tokenizer,
        chat_format,
        image_tokens,
        image_placeholder,
        add_generation_prompt=False,
        piecewise=piecewise,
    )
    if max_seq_len is not None and len(ids) > max_seq_len:
        raise SampleError("too_long", f"{len(ids)} tokens > max_seq_len {max_seq_len}")
    labels = [ids[i + 1] if loss[i + 1] else IGNORE_INDEX for i in range(len(ids) - 1)]
    labels.append(IGNORE_INDEX)
    num_loss = sum(1 for t in labels if t != IGNORE_INDEX)
    if num_loss == 0:
        raise SampleError("no_loss_tokens", "no assistant tokens to learn from")
    return TokenizedConversation(
        input_ids=ids, labels=labels, image_spans=spans, num_loss_tokens=num_loss
    )


def tokenize_prompt(
    conversation: Conversation,
    tokenizer: Any,
    chat_format: ChatFormat,
    *,
    image_tokens: ImageTokens | None = None,
    image_placeholder: str | None = None,
    piecewise: bool = False,
) -> TokenizedConversation:
    """Token ids of ``conversation`` followed by the assistant prefix (for generation), in one
    pass like :func:`tokenize_conversation`.

    Use :meth:`Conversation.prompt_and_answer` first to drop the answer; labels are all ignored.
    """
    ids, _, spans = _tokenize(
        conversation,
        tokenizer,
        chat_format,
        image_tokens,
        image_placeholder,
        add_generation_prompt=True,
        piecewise=piecewise,
    )
    return TokenizedConversation(
        input_ids=ids, labels=[IGNORE_INDEX] * len(ids), image_spans=spans, num_loss_tokens=0
    )


def to_features(tokenized: TokenizedConversation, **fields: Any) -> SampleFeatures:
    """:class:`SampleFeatures` with int64 ``input_ids``/``labels``; ``fields`` passed through."""
    import torch

    return SampleFeatures(
        input_ids=torch.tensor(tokenized.input_ids, dtype=torch.long),
        labels=torch.tensor(tokenized.labels, dtype=torch.long),
        **fields,
    )


class TextChatTransform:
    """The text-only transform: raw sample → conversation → tokens → :class:`SampleFeatures`.

    Picklable when the tokenizer is; ``meta`` of the sample is copied to the features.
    """

    def __init__(self, tokenizer: Any, chat_format: ChatFormat, *, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.max_seq_len = max_seq_len

    def __call__(self, sample: Any) -> SampleFeatures:
        conversation = parse_conversation(sample)
        tokenized = tokenize_conversation(
            conversation, self.tokenizer, self.chat_format, max_seq_len=self.max_seq_len
        )
        return to_features(tokenized, meta=dict(sample.get("meta") or {}))


def _lit(text: str) -> str:
    # Jinja string literals decode backslash escapes like Python's unicode-escape.
    return json.dumps(text, ensure_ascii=False)


def _jinja_template(fmt: ChatFormat, *, image: str | None) -> str:
    before, sep, after = fmt.message_prefix.partition("{role}")

    def default_prefix(role_expr: str) -> str:
        if not sep:
            return f"{{{{- {_lit(before)} -}}}}"
        return f"{{{{- {_lit(before)} + {role_expr} + {_lit(after)} -}}}}"

    role = "message[" + _lit("role") + "]"
    # Roles whose prefix is not message_prefix with {role} filled in (role_prefixes, or an
    # overridden prefix()) get their own literal; any other role follows message_prefix.
    special = [
        (r, fmt.prefix(r))
        for r in ROLES
        if fmt.prefix(r) != fmt.message_prefix.replace("{role}", r)
    ]
    prefix = default_prefix(role)
    if special:
        branches = "".join(
            f"{{%- {'if' if i == 0 else 'elif'} {role} == {_lit(r)} -%}}{{{{- {_lit(p)} -}}}}"
            for i, (r, p) in enumerate(special)
        )
        prefix = f"{branches}{{%- else -%}}{prefix}{{%- endif -%}}"
    image_part = ""
    if image is not None:
        image_part = f"{{%- elif part['type'] == 'image' -%}}{{{{- {_lit(image)} -}}}}"

    out = []
    if fmt.bos:
        out.append(f"{{{{- {_lit(fmt.bos)} -}}}}")
    out.append("{%- for message in messages -%}")
    if fmt.default_system is not None:
        system = fmt.prefix("system") + fmt.default_system + fmt.message_suffix
        out.append(
            "{%- if loop.first and message['role'] != 'system' -%}"
            f"{{{{- {_lit(system)} -}}}}"
            "{%- endif -%}"
        )
    out.append(prefix)
    out.append(
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
        f"{image_part}{{%- endif -%}}"
        "{%- endfor -%}{%- endif -%}"
    )
    out.append(f"{{{{- {_lit(fmt.message_suffix)} -}}}}")
    out.append("{%- endfor -%}")
    out.append(
        "{%- if add_generation_prompt -%}"
        f"{{{{- {_lit(fmt.prefix('assistant'))} -}}}}"
        "{%- endif -%}"
    )
    return "".join(out)


QWEN_CHATML_TEMPLATE = QWEN_CHATML.chat_template
