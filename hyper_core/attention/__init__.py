"""Attention implementations hyper-train registers with ``transformers``.

``varlen`` (:mod:`.varlen`): torch SDPA paid per sample of a packed row. ``flash_varlen``
(:mod:`.flash_varlen`): torch's varlen flash kernel on CUDA, ``varlen`` elsewhere.
``flex_varlen`` (:mod:`.flex_varlen`): torch's ``flex_attention`` over the row with a
``BlockMask`` of its samples and bidirectional spans. Importing
this package imports neither torch nor transformers; :func:`register` does, once.
"""

from __future__ import annotations

from typing import Any

#: The name ``[model] attn_implementation`` gives to :func:`.varlen.varlen_attention_forward`.
VARLEN = "varlen"
#: ... and to :func:`.flash_varlen.flash_varlen_forward` (torch's varlen kernel on CUDA).
FLASH_VARLEN = "flash_varlen"
#: ... and to :func:`.flex_varlen.flex_varlen_forward` (``flex_attention``, a ``BlockMask``).
FLEX_VARLEN = "flex_varlen"
#: The implementations hyper-train registers with transformers.
OWN_IMPLEMENTATIONS = frozenset({VARLEN, FLASH_VARLEN, FLEX_VARLEN})
#: The forward kwarg with a packed row's bidirectional spans: an int ``(n, 2)`` tensor of
#: ``[start, end)`` over the ``B·L`` tokens flattened; the tokens of one span attend to each
#: other both ways (on top of causal attention within their sample, as transformers'
#: ``token_type_ids`` block mask: Gemma 3's image tokens). The packed runtime adds it from
#: :attr:`SampleFeatures.bidirectional_spans <hyper_core.batching.types.SampleFeatures>`.
BIDIRECTIONAL_SPANS = "bidirectional_spans"
#: Forward kwargs that carry a packed row's sample boundaries (flash-attention's names) and
#: its bidirectional spans.
VARLEN_KWARGS = (
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    BIDIRECTIONAL_SPANS,
)
#: Implementations that read :data:`VARLEN_KWARGS` in the language model's attention layers.
VARLEN_IMPLEMENTATIONS = frozenset(
    {
        VARLEN,
        FLASH_VARLEN,
        FLEX_VARLEN,
        "flash_attention_2",
        "flash_attention_3",
        "flash_attention_4",
    }
)


def uses_varlen_kwargs(attn_implementation: str | None) -> bool:
    """Whether micro-batches for ``attn_implementation`` should carry :data:`VARLEN_KWARGS`."""
    return attn_implementation in VARLEN_IMPLEMENTATIONS


def drop_varlen_kwargs(module: Any) -> Any:
    """Make ``module`` (a vision tower) ignore :data:`VARLEN_KWARGS`: the language model's
    boundaries, which some models' forward passes on to the tower with the other kwargs.

    Returns the hook handle.
    """

    def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return args, {k: v for k, v in kwargs.items() if k not in VARLEN_KWARGS}

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def register() -> None:
    """Register ``varlen``, ``flash_varlen`` and ``flex_varlen`` with transformers' attention
    and mask interfaces (idempotent)."""
    from .flash_varlen import register as register_flash
    from .flex_varlen import register as register_flex
    from .varlen import register as _register

    _register()
    register_flash()
    register_flex()


__all__ = [
    "BIDIRECTIONAL_SPANS",
    "FLASH_VARLEN",
    "FLEX_VARLEN",
    "OWN_IMPLEMENTATIONS",
    "VARLEN",
    "VARLEN_IMPLEMENTATIONS",
    "VARLEN_KWARGS",
    "drop_varlen_kwargs",
    "register",
    "uses_varlen_kwargs",
]
