"""Data preflight: token, image, video and padding statistics of transformed samples
(``data stats``).

The computation here is pure: it takes per-sample counts and the batch sizes, and predicts the
padding the way the batching runtimes lay out micro-batches. Samples are taken in the order
read (a run shuffles them, so a run's padding differs by the luck of the draw). With ``[data]
buffer_size`` the prediction is made twice, without and with the buffer's length grouping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..batching.padded import round_up
from ..batching.token_budget import (
    StepPlanner,
    assign_to_ranks,
    pack_by_tokens,
)

#: How many ``file:line`` are kept per bad-sample reason.
MAX_WHERE = 3
#: Bars of the text histogram.
HISTOGRAM_BINS = 8
HISTOGRAM_WIDTH = 30


@attrs.frozen
class SampleCounts:
    """What one transformed sample holds: tokens, of them image, loss and video tokens, images
    and videos."""

    tokens: int
    image_tokens: int
    loss_tokens: int
    images: int
    video_tokens: int = 0
    videos: int = 0


@attrs.frozen
class BadSample:
    """A sample the transform skipped, by reason and ``file:line``, and what exactly is wrong
    (e.g. the resolved path of a missing image)."""

    reason: str
    where: str
    message: str = ""


@attrs.frozen
class Summary:
    """min/median/p90/max/total of a list of counts (median: the lower middle value; p90: the
    nearest rank, ``sorted[ceil(0.9 n) - 1]``); all 0 for no values."""

    min: int
    median: int
    p90: int
    max: int
    total: int

    @classmethod
    def of(cls, values: Sequence[int]) -> Summary:
        """The summary of ``values``."""
        if not values:
            return cls(0, 0, 0, 0, 0)
        s = sorted(values)
        n = len(s)
        return cls(s[0], s[(n - 1) // 2], s[math.ceil(0.9 * n) - 1], s[-1], sum(s))


@attrs.frozen
class Padding:
    """Predicted padding of one batching layout over the samples read."""

    micro_batches: int
    tokens: int  # real tokens
    padding: int  # padding positions

    @property
    def ratio(self) -> float:
        """Fraction of the model's input positions that are padding."""
        total = self.tokens + self.padding
        return self.padding / total if total else 0.0


@attrs.frozen
class Batching:
    """The config's batch sizes and the world size they are checked against."""

    global_batch_size: int
    micro_batch_size: int
    world_size: int = 1
    pad_to_multiple_of: int = 1
    #: ``[data] max_tokens_per_micro_batch``: micro-batches of up to this many tokens.
    max_tokens: int | None = None
    #: ``[data] buffer_size``: steps regrouped by length within this many steps.
    buffer_steps: int = 1

    @property
    def accumulation(self) -> int:
        """Micro-batches per step on each rank (``global = micro × accumulation × world``)."""
        return self.global_batch_size // (self.micro_batch_size * self.world_size)


def plural(n: int, noun: str) -> str:
    """``1 step``, ``2 steps``, ``2 micro-batches``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"


def micro_batch_groups(lengths: Sequence[int | None], batching: Batching) -> Iterable[list[int]]:
    """The token counts of each micro-batch, as a run groups them: each step takes
    ``global_batch_size`` samples, each rank its contiguous share, drops the bad ones (None),
    and splits the rest into ``micro_batch_size`` groups (see ``StepSampler.step_indices``)."""
    g, w, m = batching.global_batch_size, batching.world_size, batching.micro_batch_size
    for begin in range(0, len(lengths), g):
        step = lengths[begin : begin + g]
        size = len(step)
        for r in range(w):
            share = [n for n in step[(r * size) // w : ((r + 1) * size) // w] if n is not None]
            for i in range(0, len(share), m):
                yield share[i : i + m]


def token_budget_plan(lengths: Sequence[int | None], batching: Batching) -> list[list[list[int]]]:
    """Per step, per rank, the token counts of its micro-batches under ``max_tokens``, as a run
    lays them out: the step's usable samples shared among the ranks by tokens, each share
    packed up to the budget (see :mod:`hyper_core.batching.token_budget`)."""
    assert batching.max_tokens is not None
    g, w = batching.global_batch_size, batching.world_size
    plan = []
    for begin in range(0, len(lengths), g):
        usable = [n for n in lengths[begin : begin + g] if n is not None]
        ranks = []
        for share in assign_to_ranks(usable, w):
            share_lengths = [usable[i] for i in share]
            groups = pack_by_tokens(share_lengths, batching.max_tokens, batching.micro_batch_size)
            ranks.append([sum(share_lengths[i] for i in group) for group in groups])
        plan.append(ranks)
    return plan


@attrs.frozen
class TokenBudget:
    """Predicted micro-batches under ``max_tokens_per_micro_batch``."""

    max_tokens: int
    micro_batches: int
    tokens: Summary  # per micro-batch
    per_rank_step: Summary  # micro-batches of one rank in one step
    #: Zero-weight repeats that ``Lockstep`` adds so that every rank runs as many forwards.
    repeats: int
    #: The largest over the steps of max/mean tokens per rank (1.0: balanced).
    imbalance: float

    @classmethod
    def of(cls, lengths: Sequence[int | None], batching: Batching) -> TokenBudget:
        """The prediction for the samples read, in the order read."""
        assert batching.max_tokens is not None
        plan = token_budget_plan(lengths, batching)
        sizes = [t for step in plan for rank in step for t in rank]
        counts = [len(rank) for step in plan for rank in step]
        repeats = sum(max(map(len, step)) * len(step) - sum(map(len, step)) for step in plan)
        imbalance = 1.0
        for step in plan:
            totals = [sum(rank) for rank in step]
            if sum(totals):
                imbalance = max(imbalance, max(totals) * len(totals) / sum(totals))
        return cls(
            batching.max_tokens,
            len(sizes),
            Summary.of(sizes),
            Summary.of(counts),
            repeats,
            imbalance,
        )

    def to_json(self) -> dict[str, Any]:
        """Plain numbers."""
        return {
            "max_tokens": self.max_tokens,
            "micro_batches": self.micro_batches,
            "tokens_per_micro_batch": attrs.asdict(self.tokens),
            "micro_batches_per_rank_step": attrs.asdict(self.per_rank_step),
            "lockstep_repeats": self.repeats,
            "max_rank_tokens_over_mean": round(self.imbalance, 6),
        }

    def render(self) -> list[str]:
        """The report's lines."""
        t, c = self.tokens, self.per_rank_step
        forwards = self.micro_batches + self.repeats
        share = 100 * self.repeats / forwards if forwards else 0.0
        return [
            f"token budget {self.max_tokens} (max_tokens_per_micro_batch), in the order read:",
            f"  {plural(self.micro_batches, 'micro-batch')}; tokens per micro-batch min {t.min}, "
            f"median {t.median}, max {t.max}",
            f"  micro-batches per step on one rank: min {c.min}, median {c.median}, max {c.max}; "
            f"{plural(self.repeats, 'lockstep repeat')} ({share:.1f}% of forwards)",
            f"  tokens per rank per step: max/mean {self.imbalance:.3f}",
        ]


def buffered_order(lengths: Sequence[int | None], batching: Batching) -> list[int | None]:
    """``lengths`` laid out as a run with ``buffer_steps`` steps of look-ahead lays out its
    steps: the whole steps of each buffer regrouped as the loader regroups them (see
    :class:`~hyper_core.batching.token_budget.StepPlanner`), a partial last step as read. The
    steps keep the planner's order; the counts predicted do not depend on it."""
    g, k = batching.global_batch_size, batching.buffer_steps
    planner = StepPlanner(g)
    if batching.max_tokens is not None:
        planner = StepPlanner(
            g, batching.world_size, batching.max_tokens, batching.micro_batch_size
        )
    whole = len(lengths) // g * g
    out: list[int | None] = []
    for begin in range(0, whole, g * k):
        buffer = lengths[begin : min(begin + g * k, whole)]
        for group in planner(buffer):
            out.extend(buffer[i] for i in group)
    out.extend(lengths[whole:])
    return out


@attrs.frozen
class BufferEffect:
    """What ``[data] buffer_size`` steps of look-ahead change, next to the same without: the
    padding of fixed-size micro-batches (steps grouped by length) or, with a token budget, its
    micro-batches (steps planned for the budget)."""

    buffer_steps: int
    #: Without a budget: padding with and without the buffer.
    padding: dict[str, Padding] | None
    unbuffered: dict[str, Padding] | None
    #: With a budget: the micro-batches with and without the buffer.
    token_budget: TokenBudget | None
    unbuffered_budget: TokenBudget | None

    @classmethod
    def of(cls, lengths: Sequence[int | None], batching: Batching) -> BufferEffect:
        """The prediction for the samples read, regrouped as a run regroups them."""
        grouped = buffered_order(lengths, batching)
        if batching.max_tokens is None:
            padding = predict_padding(grouped, batching), predict_padding(lengths, batching)
            return cls(batching.buffer_steps, *padding, None, None)
        budget = TokenBudget.of(grouped, batching), TokenBudget.of(lengths, batching)
        return cls(batching.buffer_steps, None, None, *budget)

    def to_json(self) -> dict[str, Any]:
        """Plain numbers (those with the buffer)."""
        padding = None
        if self.padding is not None:
            padding = {
                k: {**attrs.asdict(v), "ratio": round(v.ratio, 6)} for k, v in self.padding.items()
            }
        return {
            "buffer_size": self.buffer_steps,
            "padding": padding,
            "token_budget": None if self.token_budget is None else self.token_budget.to_json(),
        }

    def render(self) -> list[str]:
        """The report's lines."""
        k = self.buffer_steps
        if self.token_budget is not None and self.unbuffered_budget is not None:
            with_, without = self.token_budget, self.unbuffered_budget
            t, c = with_.tokens, with_.per_rank_step
            return [
                f"buffer_size {k} (steps planned for the token budget within {k} steps), "
                "in the order read:",
                f"  {plural(with_.micro_batches, 'micro-batch')} (without the buffer "
                f"{without.micro_batches}); tokens per micro-batch min {t.min}, "
                f"median {t.median}, max {t.max}",
                f"  {with_.micro_batches + with_.repeats} forwards with "
                f"{plural(with_.repeats, 'lockstep repeat')} (without the buffer "
                f"{without.micro_batches + without.repeats} with {without.repeats}); "
                f"micro-batches per step on one rank: min {c.min}, median {c.median}, max {c.max}",
                f"  tokens per rank per step: max/mean {with_.imbalance:.3f} (without the buffer "
                f"{without.imbalance:.3f})",
            ]
        assert self.padding is not None and self.unbuffered is not None
        lines = [
            f"buffer_size {k} (steps regrouped by length within {k} steps), in the order read:"
        ]
        for name, p in self.padding.items():
            lines.append(
                f"  {name:<7} {p.padding} padding of {p.tokens + p.padding} positions "
                f"({100 * p.ratio:.1f}%, without the buffer "
                f"{100 * self.unbuffered[name].ratio:.1f}%)"
            )
        return lines


def predict_padding(lengths: Sequence[int | None], batching: Batching) -> dict[str, Padding]:
    """Padding of the ``padded`` runtime (each micro-batch right-padded to its longest sample,
    rounded up to ``pad_to_multiple_of``) and of ``packed`` (one row, its total rounded up);
    without the vision filler that several ranks add to image-less VL micro-batches."""
    multiple = batching.pad_to_multiple_of
    groups = list(micro_batch_groups(lengths, batching))
    tokens = sum(sum(g) for g in groups)
    padded = sum(len(g) * round_up(max(g), multiple) for g in groups) - tokens
    packed = sum(round_up(sum(g), multiple) for g in groups) - tokens
    return {
        "padded": Padding(len(groups), tokens, padded),
        "packed": Padding(len(groups), tokens, packed),
    }


def histogram(values: Sequence[int], bins: int = HISTOGRAM_BINS) -> list[tuple[int, int, int]]:
    """``(low, high, count)`` of equal-width integer bins from min to max (inclusive)."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    width = max(1, -(-(hi - lo + 1) // bins))
    counts = [0] * -(-(hi - lo + 1) // width)
    for v in values:
        counts[(v - lo) // width] += 1
    return [(lo + i * width, lo + (i + 1) * width - 1, c) for i, c in enumerate(counts)]


@attrs.frozen
class DataStats:
    """The preflight report of one data set."""

    samples_total: int  # samples in the data set
    samples_read: int
    samples: tuple[SampleCounts, ...]
    bad: tuple[BadSample, ...]
    batching: Batching
    runtime: str  # the config's batching runtime
    #: Each read sample's tokens, None for a bad one, in the order read.
    lengths: tuple[int | None, ...]

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch over every sample of the data set (drop_last)."""
        return self.samples_total // self.batching.global_batch_size

    @property
    def usable(self) -> int:
        """Samples read that the transform kept."""
        return len(self.samples)

    def no_usable_reason(self) -> str | None:
        """One line saying why no sample read is usable, or None when one is."""
        if self.samples:
            return None
        if not self.samples_read:
            return "the training data has no samples"
        reasons = ", ".join(f"{r}={e['count']}" for r, e in self.bad_by_reason().items())
        first = self.bad[0]
        return (
            f"no usable sample: all {self.samples_read} read are bad ({reasons}); e.g. "
            f"{first.where}: {first.reason}: {first.message}"
        )

    def bad_by_reason(self) -> dict[str, dict[str, Any]]:
        """``reason -> {count, first: [file:line, ...], example: "file:line: message"}``, most
        frequent first; ``example`` is the first sample of that reason, with what is wrong."""
        out: dict[str, dict[str, Any]] = {}
        for b in self.bad:
            entry = out.setdefault(
                b.reason, {"count": 0, "first": [], "example": f"{b.where}: {b.message}"}
            )
            entry["count"] += 1
            if len(entry["first"]) < MAX_WHERE:
                entry["first"].append(b.where)
        return dict(sorted(out.items(), key=lambda kv: (-kv[1]["count"], kv[0])))

    def summaries(self) -> dict[str, Summary]:
        """Per-sample tokens, image tokens, loss tokens, images, video tokens and videos."""
        s = self.samples
        return {
            "tokens": Summary.of([c.tokens for c in s]),
            "image_tokens": Summary.of([c.image_tokens for c in s]),
            "loss_tokens": Summary.of([c.loss_tokens for c in s]),
            "images": Summary.of([c.images for c in s]),
            "video_tokens": Summary.of([c.video_tokens for c in s]),
            "videos": Summary.of([c.videos for c in s]),
        }

    def to_json(self) -> dict[str, Any]:
        """Plain numbers for ``--json``."""
        b = self.batching
        return {
            "samples": {
                "total": self.samples_total,
                "read": self.samples_read,
                "usable": len(self.samples),
                "bad": len(self.bad),
            },
            "bad": self.bad_by_reason(),
            "per_sample": {k: attrs.asdict(v) for k, v in self.summaries().items()},
            "histogram": {"tokens": [list(h) for h in histogram([c.tokens for c in self.samples])]},
            "padding": {
                k: {**attrs.asdict(v), "ratio": round(v.ratio, 6)}
                for k, v in predict_padding(self.lengths, b).items()
            },
            "runtime": self.runtime,
            "batching": {**attrs.asdict(b), "micro_batches_per_step": b.accumulation},
            "token_budget": (
                None if b.max_tokens is None else TokenBudget.of(self.lengths, b).to_json()
            ),
            "buffer": (None if b.buffer_steps == 1 else BufferEffect.of(self.lengths, b).to_json()),
            "steps_per_epoch": self.steps_per_epoch,
        }

    def render(self) -> str:
        """The human-readable report."""
        b = self.batching
        lines = [
            f"samples: {self.samples_read} read of {self.samples_total}, "
            f"{len(self.samples)} usable, {len(self.bad)} bad"
        ]
        for reason, entry in self.bad_by_reason().items():
            more = ", ..." if entry["count"] > len(entry["first"]) else ""
            lines.append(f"  {reason}: {entry['count']} ({', '.join(entry['first'])}{more})")
            lines.append(f"    e.g. {entry['example']}")
        if not self.samples:
            lines.append("no usable samples: no tokens, padding or steps to predict")
            return "\n".join(lines)
        lines.append("per sample        min  median     p90     max     total")
        has_videos = any(c.videos for c in self.samples)
        for name, s in self.summaries().items():
            if name.startswith("video") and not has_videos:  # text and image data: no rows
                continue
            lines.append(f"  {name:<14}{s.min:>5}{s.median:>8}{s.p90:>8}{s.max:>8}{s.total:>10}")
        bins = histogram([c.tokens for c in self.samples])
        if bins:
            lines.append("tokens per sample:")
            top = max(c for _, _, c in bins)
            for lo, hi, count in bins:
                bar = "#" * round(HISTOGRAM_WIDTH * count / top)
                label = str(lo) if lo == hi else f"{lo}-{hi}"
                lines.append(f"  {label:>13} {count:>6} {bar}".rstrip())
        lines.append(
            f"padding at micro_batch_size {b.micro_batch_size}, in the order read "
            f"(this config batches {self.runtime}):"
        )
        for name, p in predict_padding(self.lengths, b).items():
            lines.append(
                f"  {name:<7} {p.padding} padding of {p.tokens + p.padding} positions "
                f"({100 * p.ratio:.1f}%) in {plural(p.micro_batches, 'micro-batch')}"
            )
        epoch = f"{plural(self.steps_per_epoch, 'step')} per epoch of {self.samples_total} samples"
        if b.max_tokens is None:
            lines.append(
                f"steps: {b.accumulation} micro-batches of {b.micro_batch_size} per step on each "
                f"of {b.world_size} rank(s) (global_batch_size {b.global_batch_size}); {epoch}"
            )
        else:
            lines.extend(TokenBudget.of(self.lengths, b).render())
            lines.append(
                f"steps: {b.global_batch_size} samples per step shared by tokens among "
                f"{b.world_size} rank(s), micro-batches of up to {b.max_tokens} tokens and "
                f"{b.micro_batch_size} samples; {epoch}"
            )
        if b.buffer_steps > 1:
            lines.extend(BufferEffect.of(self.lengths, b).render())
        return "\n".join(lines)


def sample_counts(
    features: Any, image_token_id: int | None, video_token_id: int | None = None
) -> SampleCounts:
    """The counts of one :class:`~hyper_core.batching.types.SampleFeatures`; image (video)
    tokens are the positions holding ``image_token_id`` (``video_token_id``), 0 without one."""

    def count(token_id: int | None) -> int:
        return 0 if token_id is None else int((features.input_ids == token_id).sum())

    return SampleCounts(
        tokens=features.length,
        image_tokens=count(image_token_id),
        loss_tokens=features.num_loss_tokens,
        images=int(features.num_images),
        video_tokens=count(video_token_id),
        videos=int(features.num_videos),
    )


def collect_stats(
    dataset: Sequence[Any],
    *,
    limit: int | None,
    batching: Batching,
    runtime: str,
    image_token_id: int | None = None,
    video_token_id: int | None = None,
) -> DataStats:
    """Read the first ``limit`` (None: all) items of a ``TransformedDataset`` and count them."""
    from .dataset import Skipped

    total = len(dataset)
    n = total if limit is None else min(limit, total)
    samples: list[SampleCounts] = []
    bad: list[BadSample] = []
    lengths: list[int | None] = []
    for i in range(n):
        item = dataset[i]
        if isinstance(item, Skipped):
            bad.append(BadSample(item.reason, item.where(), item.message))
            lengths.append(None)
        else:
            counts = sample_counts(item, image_token_id, video_token_id)
            samples.append(counts)
            lengths.append(counts.tokens)
    return DataStats(
        samples_total=total,
        samples_read=n,
        samples=tuple(samples),
        bad=tuple(bad),
        batching=batching,
        runtime=runtime,
        lengths=tuple(lengths),
    )
