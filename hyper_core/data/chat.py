"""Chat-template rendering to token ids and shifted labels, shared by all adapters.

A :class:`ChatFormat` renders each message as ``prefix(role) + parts + suffix``. Each piece is
tokenised on its own (``add_special_tokens=False``) and concatenated, so the loss boundaries are
exact. The loss covers the assistant's content tokens and the stripped suffix
(``message_suffix.rstrip()``, i.e. ``<|im_end|>`` but not the newline after it) of assistant
messages; never prefixes, system/user turns or image tokens.
"""

from __future__ import annotations

import json
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

    Each piece is tokenised on its own, so the tokens are at least ``Σ bytes / M`` with ``M``
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


def _tokenize(
    conversation: Conversation,
    tokenizer: Any,
    fmt: ChatFormat,
    image_tokens: ImageTokens | None,
    *,
    add_generation_prompt: bool,
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
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


def tokenize_conversation(
    conversation: Conversation,
    tokenizer: Any,
    chat_format: ChatFormat,
    *,
    image_tokens: ImageTokens | None = None,
    max_seq_len: int | None,
) -> TokenizedConversation:
    """Render and tokenise ``conversation`` for training.

    ``image_tokens(index, part)`` gives the token ids of the ``index``-th image (the adapter's
    expansion, e.g. ``<|vision_start|>`` + ``<|image_pad|>`` × N + ``<|vision_end|>``).
    Raises :class:`SampleError` ``too_long`` (never truncates; text far over the limit is
    rejected before tokenising, see :func:`check_text_length`) or ``no_loss_tokens``.
    """
    if max_seq_len is not None:
        check_text_length(conversation, tokenizer, chat_format, max_seq_len)
    ids, loss, spans = _tokenize(
        conversation, tokenizer, chat_format, image_tokens, add_generation_prompt=False
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
) -> TokenizedConversation:
    """Token ids of ``conversation`` followed by the assistant prefix (for generation).

    Use :meth:`Conversation.prompt_and_answer` first to drop the answer; labels are all ignored.
    """
    ids, _, spans = _tokenize(
        conversation, tokenizer, chat_format, image_tokens, add_generation_prompt=True
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
