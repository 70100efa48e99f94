"""An offline byte-level BPE tokenizer, trained in-process in milliseconds (no downloads).

Layout of the vocabulary (fixed, documented): the special tokens come first, with ids
``0 .. n-1`` in the order ``[pad_token, eos_token, *special_tokens]`` (duplicates dropped, first
occurrence kept); then the 256 byte-level symbols; then the learned merges. Special-token ids
therefore depend only on that list, never on the corpus or ``vocab_size``.
``len(tokenizer) <= vocab_size`` (fewer when the corpus offers fewer merges).

Training is deterministic (same arguments → same vocab, across processes) and cached per
argument set; every call returns a fresh ``PreTrainedTokenizerFast`` (callers may mutate it,
e.g. ``padding_side``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: The ChatML special tokens (Qwen's names).
CHATML_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_WORDS = """
the a an of to and in on is it that this what which who how why where when there here with for
from by as at be are was were has have had do does did not no yes can will would should could
one two three four five six seven eight nine ten zero plus minus times equals answer question
image picture photo shape shapes colour color colours describe description small large big
circle square triangle rectangle red green blue yellow purple orange white black grey gray pink
brown light dark left right top bottom middle center centre upright round
What colour is the shape? What shape is it? Describe the image. a red circle a blue square
a green triangle a yellow circle a purple square an orange triangle
reverse repeat copy after before next letter comes opposite word sky grass snow coal blood
banana lemon cherry apple leaf sea night day hot cold up down big small fast slow old new
happy sad open closed full empty high low early late long short hard soft wet dry
milk river stone cloud tiger piano candle garden window rocket pencil forest bridge
silver planet butter castle dragon mirror violin monkey winter summer island button ladder
user assistant system You are a helpful assistant.
""".split()

_DEFAULT_CORPUS: tuple[str, ...] = (
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    ". , : ; ! ? ' \" ( ) [ ] { } - + * / = < > _ # @ % & | \\ ~ ^ $",
    " ".join(_WORDS),
    "What colour is the shape? What shape is it? Describe the image.",
    "What comes after c? What is the opposite of hot? What colour is the sky? Repeat: apple",
    "You are a helpful assistant.",
    # Role names at the start of a line, as chat templates put them (merged early: frequent).
    *(["system\nuser\nassistant\n"] * 64),
)


def _special_list(pad_token: str, eos_token: str, special_tokens: Sequence[str]) -> list[str]:
    return list(dict.fromkeys([pad_token, eos_token, *special_tokens]))


@functools.lru_cache(maxsize=16)
def _trained_json(specials: tuple[str, ...], corpus: tuple[str, ...], vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_DEFAULT_CORPUS) + list(corpus), trainer=trainer)
    return tok.to_str()


def tokenizer_json(
    *,
    special_tokens: Sequence[str],
    corpus: Iterable[str] | None = None,
    vocab_size: int = 512,
    pad_token: str = "<|endoftext|>",
    eos_token: str = "<|im_end|>",
) -> str:
    """The serialised ``tokenizers`` JSON of the tokenizer (cached; no transformers import)."""
    specials = tuple(_special_list(pad_token, eos_token, special_tokens))
    minimum = len(specials) + 256
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} < {minimum} (256 bytes + special tokens)")
    return _trained_json(specials, tuple(corpus or ()), int(vocab_size))


def build_offline_tokenizer(
    *,
    special_tokens: Sequence[str] = (),
    corpus: Iterable[str] | None = None,
    vocab_size: int = 512,
    chat_template: str | None = None,
    pad_token: str = "<|endoftext|>",
    eos_token: str = "<|im_end|>",
    named_special_tokens: Mapping[str, str] | None = None,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus`` + a built-in corpus.

    Any text encodes (byte-level). All special tokens (``pad_token``, ``eos_token``,
    ``special_tokens``, then the values of ``named_special_tokens`` not listed yet) are never
    split and have ids ``0..n-1`` in that order. ``named_special_tokens`` maps attribute names
    to tokens, as stock processors read them: ``{"image_token": "<image_soft_token>"}`` gives
    ``tokenizer.image_token`` and ``tokenizer.image_token_id``, kept by ``save_pretrained``.

    Example::

        tok = build_offline_tokenizer(
            special_tokens=["<start_of_turn>", "<end_of_turn>"],
            named_special_tokens={"boi_token": "<start_of_image>", "image_token": "<img>"},
            pad_token="<pad>",
            eos_token="<eos>",
        )
        assert tok.image_token_id == tok.convert_tokens_to_ids("<img>")
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    named = dict(named_special_tokens or {})
    listed = list(dict.fromkeys([*special_tokens, *named.values()]))
    specials = _special_list(pad_token, eos_token, listed)
    raw = tokenizer_json(
        special_tokens=listed,
        corpus=corpus,
        vocab_size=vocab_size,
        pad_token=pad_token,
        eos_token=eos_token,
    )
    extra = [t for t in specials if t not in (pad_token, eos_token)]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(raw),
        pad_token=pad_token,
        eos_token=eos_token,
        extra_special_tokens=extra,
        model_specific_special_tokens=named,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def special_token_ids(tokenizer: object, tokens: Sequence[str] | None = None) -> dict[str, int]:
    """``token -> id`` for ``tokens`` (default: all special tokens of ``tokenizer``).

    Raises ``KeyError`` naming a token the vocabulary lacks.
    """
    names = list(tokens) if tokens is not None else list(tokenizer.all_special_tokens)  # type: ignore[attr-defined]
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    missing = [t for t in names if t not in vocab]
    if missing:
        raise KeyError(f"tokens not in the vocabulary: {missing}")
    return {t: int(vocab[t]) for t in names}
