"""Preference pairs: reading, splitting into the two conversations, tokenising both.

A pair is one raw sample: a prompt conversation and two assistant replies. Accepted shapes:

* ``{"messages": [...prompt turns...], "chosen": REPLY, "rejected": REPLY}``;
* LLaMA-Factory's pairwise ShareGPT: ``{"conversations": [...], "chosen": {"from": "gpt",
  "value": ...}, "rejected": {...}, "images": [...]}`` (or ``messages`` with ``{"role":
  "assistant", "content": ...}`` replies);
* TRL's ``{"prompt": ..., "chosen": ..., "rejected": ...}`` (strings or message lists).

A ``REPLY`` is a string, a content list, one assistant message, or a list of messages (the
last being the assistant's). The pair's two conversations are the prompt plus each reply; the
run's own transform (the adapter's) tokenises each, so every check of a sample applies to each
side, and a failing side skips the pair under the side's reason (``too_long``,
``image_token_mismatch``, ...). A pair without one of its replies is ``missing_pair_side``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_core.batching.types import SampleFeatures
from hyper_core.config.schema import at_least, meta
from hyper_core.data.errors import SampleError
from hyper_core.data.jsonl import DEFAULT_MAX_LINE_BYTES

if TYPE_CHECKING:
    import torch

SIDES = ("chosen", "rejected")
#: Meta keys each side's features carry: the pair's key (reference log-probs are stored under
#: it) and the side.
PAIR_KEY = "preference_key"
SIDE_KEY = "preference_side"


@attrs.frozen(kw_only=True)
class PreferenceOptions:
    """Options of the ``preference`` format (JSON lines, a JSON array, or Parquet)."""

    max_samples: int | None = attrs.field(
        default=None, validator=at_least(1), metadata=meta("Keep the first N pairs.")
    )
    max_line_bytes: int = attrs.field(
        default=DEFAULT_MAX_LINE_BYTES,
        validator=at_least(1),
        metadata=meta("JSON lines: longer lines are `too_long` pairs, not parsed."),
    )


def load_preference_format(
    path: str | None, options: PreferenceOptions | None, base_dir: Path
) -> Sequence[dict[str, Any]]:
    """The ``preference`` dataset format: pairs from ``.jsonl``/``.json`` (the core's JSON
    reader) or ``.parquet`` (its Parquet reader), read lazily with provenance."""
    from hyper_core.data.jsonl import JsonlOptions, load_jsonl_format

    options = options or PreferenceOptions()
    if path is not None and Path(path).suffix.lower() == ".parquet":
        from hyper_core.data.parquet import ParquetOptions, load_parquet_format

        return load_parquet_format(path, ParquetOptions(max_samples=options.max_samples), base_dir)
    jsonl = JsonlOptions(max_samples=options.max_samples, max_line_bytes=options.max_line_bytes)
    return load_jsonl_format(path, jsonl, base_dir)


def _reply_messages(reply: Any, key: str, side: str) -> list[Any]:
    """The messages a reply appends to the prompt, in the prompt's style (``key``)."""
    if isinstance(reply, list) and reply and all(isinstance(m, Mapping) for m in reply):
        if any("role" in m or "from" in m for m in reply):
            return list(reply)  # a list of messages
    if isinstance(reply, Mapping) and ("role" in reply or "from" in reply):
        return [dict(reply)]
    if isinstance(reply, str | list):
        if key == "conversations":
            return [{"from": "gpt", "value": reply}]
        return [{"role": "assistant", "content": reply}]
    raise SampleError("bad_format", f"{side!r} must be a string, content list or message")


def split_pair(sample: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chosen and the rejected conversation of a pair (raw samples the core parses)."""
    missing = [side for side in SIDES if sample.get(side) in (None, "", [])]
    if missing:
        raise SampleError("missing_pair_side", f"no {' and no '.join(missing)} reply")
    base = {k: v for k, v in sample.items() if k not in SIDES}
    if "messages" in base or "conversations" in base:
        key = "messages" if "messages" in base else "conversations"
        prompt = base[key]
        if not isinstance(prompt, list):
            raise SampleError("bad_format", f"{key!r} must be a list of prompt messages")
    elif "prompt" in base:
        key, prompt = "messages", base.pop("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        base.pop("completion", None)
    else:
        keys = ", ".join(sorted(k for k in sample if not k.startswith("_"))) or "none"
        message = f"a pair needs 'messages', 'conversations' or 'prompt' (keys: {keys})"
        raise SampleError("bad_format", message)
    return tuple(  # type: ignore[return-value]
        {**base, key: [*prompt, *_reply_messages(sample[side], key, side)]} for side in SIDES
    )


@attrs.define(kw_only=True)
class PairFeatures(SampleFeatures):
    """A pair as one sample for the loader: ``input_ids``/``labels`` are both sides'
    concatenated (so lengths, token budgets and ``data stats`` count both), and the batching
    lays out :attr:`chosen` and :attr:`rejected` as two sequences of one micro-batch."""

    chosen: SampleFeatures
    rejected: SampleFeatures

    def parts(self) -> dict[str, SampleFeatures]:
        """``data show`` renders each side under its name."""
        return {"chosen": self.chosen, "rejected": self.rejected}


def pair_key(chosen: SampleFeatures, rejected: SampleFeatures) -> str:
    """A content hash of the pair's tokens and media: the key of its reference log-probs."""
    digest = hashlib.sha1()
    for features in (chosen, rejected):
        for tensor in (features.input_ids, features.labels, *features.media.values()):
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _with_meta(features: SampleFeatures, key: str, side: str) -> SampleFeatures:
    return attrs.evolve(features, meta={**features.meta, PAIR_KEY: key, SIDE_KEY: side})


def _cat(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    import torch

    if a is None or b is None:
        return None
    return torch.cat([a, b], dim=-1)


class PairTransform:
    """The run's transform applied to each side of a pair (picklable when it is)."""

    def __init__(self, transform: Callable[[Mapping[str, Any]], SampleFeatures]) -> None:
        self.transform = transform

    def __call__(self, sample: Mapping[str, Any]) -> PairFeatures:
        chosen_raw, rejected_raw = split_pair(sample)
        chosen = self.transform(chosen_raw)
        rejected = self.transform(rejected_raw)
        key = pair_key(chosen, rejected)
        chosen, rejected = _with_meta(chosen, key, "chosen"), _with_meta(rejected, key, "rejected")
        return PairFeatures(
            input_ids=_cat(chosen.input_ids, rejected.input_ids),
            labels=_cat(chosen.labels, rejected.labels),
            position_ids=_cat(chosen.position_ids, rejected.position_ids),
            num_images=chosen.num_images + rejected.num_images,
            num_videos=chosen.num_videos + rejected.num_videos,
            meta={**chosen.meta, SIDE_KEY: "pair"},
            chosen=chosen,
            rejected=rejected,
        )
