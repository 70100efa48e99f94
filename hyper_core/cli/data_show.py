"""``hyper-train data show CONFIG [--index N | --where TEXT] [--split train|eval] [--json]``:
one sample rendered as the model sees it (:mod:`hyper_core.data.show`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import UserError


def add_show_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``data show`` (on the ``data`` parser, which ``stats`` shares)."""
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument(
        "--index", type=int, default=None, help="show: the sample at this 0-based position"
    )
    pick.add_argument(
        "--where",
        default=None,
        metavar="TEXT",
        help="show: the first sample whose text contains TEXT",
    )
    parser.add_argument(
        "--split", choices=["train", "eval"], default="train", help="show: which data (train)"
    )


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a raw sample (keys starting with ``_``, the core's own, skipped)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if not str(k).startswith("_"):
                yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def find_sample(raw: Sequence[Mapping[str, Any]], text: str) -> int | None:
    """The position of the first raw sample with a string containing ``text``."""
    for i in range(len(raw)):
        if any(text in s for s in _strings(raw[i])):
            return i
    return None


def _pick(args: argparse.Namespace, dataset: Any) -> int:
    total = len(dataset)
    if args.where is not None:
        index = find_sample(dataset.raw_samples, args.where)
        if index is None:
            raise UserError(f"--where {args.where!r}: no {args.split} sample of {total} has it")
        return index
    index = 0 if args.index is None else args.index
    if not 0 <= index < total:
        raise UserError(
            f"--index {index}: out of range, the {args.split} data has {total} samples "
            f"(0..{total - 1})"
        )
    return index


def cmd_data_show(args: argparse.Namespace, config: Any, host: Any) -> int:
    """Render the chosen sample; a sample the transform skips is a one-line error."""
    from ..data.dataset import Skipped
    from ..data.jsonl import format_source
    from ..data.show import Segment, ShownSample, segments
    from ..trainer.data_stats import prepare_data

    prepared = prepare_data(config, host)
    dataset = getattr(prepared.datasets, args.split)
    if dataset is None:
        raise UserError("--split eval: the config sets no [data] eval")
    index = _pick(args, dataset)
    source = format_source(dataset.raw_samples[index], index)
    item = dataset[index]
    if isinstance(item, Skipped):
        raise UserError(
            f"{args.split} sample {index} ({source}) is skipped in training: "
            f"{item.reason}: {item.message}"
        )
    tokenizer = prepared.assets.tokenizer
    processor = getattr(prepared.assets, "processor", None)

    def decode(ids: list[int]) -> str:
        return str(
            tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )

    def shown_segments(features: Any) -> tuple[Segment, ...]:
        return tuple(
            segments(
                features.input_ids.tolist(),
                features.labels.tolist(),
                decode,
                image_token_id=getattr(processor, "image_token_id", None),
                video_token_id=getattr(processor, "video_token_id", None),
            )
        )

    parts = tuple((name, shown_segments(f)) for name, f in item.parts().items())
    shown = ShownSample(
        index=index,
        split=args.split,
        total=len(dataset),
        source=source,
        segments=tuple(seg for _, segs in parts for seg in segs),
        parts=parts if len(parts) > 1 else (),
    )
    if args.json:
        print(json.dumps(shown.to_json(), indent=2, ensure_ascii=False))
    else:
        print(shown.render(colour=sys.stdout.isatty()))
    return 0
