"""Evaluation (the ``build_evaluator`` stage's default): loss by the run's ``loss_fn``,
perplexity, token accuracy, answer exact match, sample generations.

A sample's answer counts as correct when the argmax prediction equals the label at every loss
position: that is exactly when greedy decoding would produce the answer, without the cost of
``generate``. Samples whose ``meta`` has a ``question_type`` are also counted per type. Exact
match of whole answers says little on long answers (captions), so the share of label tokens
predicted right (``token_accuracy``) and ``perplexity`` are reported too, and
``[training] eval_generate_samples`` logs real ``generate`` answers of the first eval samples.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    import torch

    from ..data.conversation import Part
    from ..parallel.env import DistEnv
    from ..step.lockstep import Lockstep
    from .metrics import MetricsWriter

#: Answers may run this many tokens past their reference's length.
GENERATE_SLACK_TOKENS = 16

#: An evaluation's metrics: numbers, plus ``samples`` (``{prompt, reference, answer}`` dicts).
EvalMetrics = dict[str, float | int | list[dict[str, str]]]


class Evaluator(Protocol):
    """What ``build_evaluator`` returns: evaluates the model it was built with (a collective:
    every rank calls it together). A ``samples`` entry is written to ``eval_samples.jsonl``."""

    def evaluate(self) -> EvalMetrics:
        """Global metrics over the eval set (the same on every rank)."""
        ...


def sample_rows(micro_batch: Any, labels: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(row, start, end)`` of each sample of a micro-batch in its label tensor."""
    lengths = micro_batch.sample_lengths
    if labels.shape[0] > 1:  # padded: one row per sample
        return [(i, 0, n) for i, n in enumerate(lengths)]
    spans, offset = [], 0
    for n in lengths:
        spans.append((0, offset, offset + n))
        offset += n
    return spans


@attrs.define(kw_only=True)
class DefaultEvaluator:
    """Eval loss by the run's ``loss_fn``, perplexity, token accuracy, exact match per question
    type, and ``[training] eval_generate_samples`` generations, over the eval loader.

    ``eval_loss`` is the sum of ``loss_fn(outputs, loss_inputs, 1.0)`` over the eval
    micro-batches divided by their count of label tokens: the training loss's normalisation,
    so a plugin's ``build_loss`` changes both alike.
    """

    config: Any
    dist: DistEnv
    adapter: Any
    model: torch.nn.Module
    #: ``model`` without its data-parallel wrapper (for ``generate``).
    unwrapped_model: torch.nn.Module
    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, Any]]]
    assets: Any
    loader: Any
    get_batch: Callable[[Any], tuple[dict[str, Any], dict[str, Any]]]
    training_context: Callable[[], AbstractContextManager[Any]]
    lockstep: Lockstep[Any]

    def evaluate(self) -> EvalMetrics:
        """Evaluate on the eval loader; every rank returns the same global metrics."""
        import torch

        model = self.model
        model.eval()
        micro_batches = [mb for step in self.loader.iter_epoch_once() for mb in step.micro_batches]
        stats = _Stats()
        forward_kwargs = self.adapter.forward_kwargs()
        try:
            with torch.no_grad():
                for mb, weight in self.lockstep.schedule(micro_batches):
                    model_inputs, loss_inputs = self.get_batch(mb)
                    with self.training_context():
                        outputs = model(**model_inputs, **forward_kwargs)
                    if weight:
                        loss, _ = self.loss_fn(outputs, loss_inputs, 1.0)
                        stats.add(mb, outputs.logits, loss_inputs, loss.detach())
            samples = self.generate_samples(self.config.training.eval_generate_samples)
        finally:
            model.train()
        metrics = stats.merged(self.dist)
        if samples:
            metrics["samples"] = samples
        return metrics

    def generate_samples(self, n: int) -> list[dict[str, str]]:
        """``{prompt, reference, answer}`` of the first ``n`` usable eval samples, by
        ``generate``.

        Every rank generates the same answers from the same samples, each for a fixed number of
        tokens when there are several ranks, so that a sharded model's forwards stay in step.
        """
        if n <= 0:
            return []
        from ..data.conversation import parse_conversation
        from ..data.errors import SampleError
        from ..generation import GenerationSettings, decode, generate_answer_ids

        raw = getattr(self.loader.dataset, "raw_samples", ())
        tokenizer = self.assets.tokenizer
        out: list[dict[str, str]] = []
        for sample in raw:
            if len(out) == n:
                break
            try:
                conversation, reference = parse_conversation(sample).prompt_and_answer()
                prompt = self.adapter.generation_prompt(conversation, self.assets)
            except SampleError:  # counted as skipped by the eval loader already
                continue
            reference_tokens = len(tokenizer.encode(reference, add_special_tokens=False))
            settings = GenerationSettings(max_new_tokens=reference_tokens + GENERATE_SLACK_TOKENS)
            with self.training_context():
                ids = generate_answer_ids(
                    self.unwrapped_model,
                    prompt,
                    settings,
                    self.assets,
                    fixed_length=self.dist.world_size > 1,
                )
            turn = next((m for m in reversed(conversation.messages) if m.role == "user"), None)
            parts = turn.parts if turn is not None else []
            text = "".join(_prompt_text(p) for p in parts)
            out.append({"prompt": text, "reference": reference, "answer": decode(self.assets, ids)})
        return out


def _prompt_text(part: Part) -> str:
    """A logged prompt's text of one content part: ``<image>``/``<video>`` for media."""
    from ..data.conversation import ImagePart, VideoPart

    if isinstance(part, ImagePart):
        return "<image>"
    if isinstance(part, VideoPart):
        return "<video>"
    return part.text


@attrs.define
class _Stats:
    """One rank's running sums, kept on the device until :meth:`merged` (no host sync per
    micro-batch or sample)."""

    #: (loss sum, loss tokens, tokens predicted right), accumulated on the device.
    sums: Any = None
    #: Per micro-batch: each counted sample's answer-correct flag (device) and its keys.
    answers: list[tuple[torch.Tensor, list[list[str]]]] = attrs.field(factory=list)

    def add(
        self, mb: Any, logits: torch.Tensor, loss_inputs: dict[str, Any], loss_sum: torch.Tensor
    ) -> None:
        import torch

        from ..step.label_positions import full_labels, full_predictions

        labels = full_labels(loss_inputs["labels"], loss_inputs)
        mask = labels != -100
        right = full_predictions(logits.argmax(-1), loss_inputs) == labels
        step = torch.stack([loss_sum.double(), mask.sum().double(), (right & mask).sum().double()])
        self.sums = step if self.sums is None else self.sums + step
        # A sample is right when no loss position in its span is wrong: a span's count of
        # misses is a difference of the row's running count.
        misses = torch.nn.functional.pad((~(right | ~mask)).long().cumsum(-1), (1, 0))
        rows, starts, ends, keys = [], [], [], []
        for (row, start, end), meta in zip(sample_rows(mb, labels), mb.meta, strict=False):
            if (meta or {}).get("filler"):
                continue
            rows.append(row)
            starts.append(start)
            ends.append(end)
            kind = (meta or {}).get("question_type")
            keys.append(["all"] if kind is None else ["all", kind])
        if keys:
            index = torch.tensor(rows, device=misses.device)
            span = misses[index, torch.tensor(ends, device=misses.device)]
            span = span - misses[index, torch.tensor(starts, device=misses.device)]
            self.answers.append((span == 0, keys))

    def _host(self) -> tuple[float, int, int, dict[str, list[int]]]:
        """The sums and per-key ``[correct, count]`` on the host (the one sync)."""
        import torch

        loss_sum, tokens, hits = (0.0, 0, 0) if self.sums is None else self.sums.tolist()
        correct: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        if self.answers:
            flags = torch.cat([ok for ok, _ in self.answers]).tolist()
            keys = [k for _, ks in self.answers for k in ks]
            for ok, names in zip(flags, keys, strict=True):
                for name in names:
                    correct[name][0] += int(ok)
                    correct[name][1] += 1
        return loss_sum, int(tokens), int(hits), dict(correct)

    def merged(self, dist: DistEnv) -> EvalMetrics:
        """The metrics of every rank's sums together (a collective)."""
        mine = self._host()
        gathered: Sequence[Any] = [mine]
        if dist.world_size > 1:
            import torch.distributed as tdist

            everyone: list[Any] = [None] * dist.world_size
            tdist.all_gather_object(everyone, mine)
            # The ranks of a [parallel] cp group evaluate the same rows: count each group once.
            gathered = everyone[:: dist.cp]
        total_tokens = sum(s[1] for s in gathered)
        merged: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for s in gathered:
            for key, (ok, n) in s[3].items():
                merged[key][0] += ok
                merged[key][1] += n
        eval_loss = sum(s[0] for s in gathered) / max(total_tokens, 1)
        metrics: EvalMetrics = {
            "eval_loss": eval_loss,
            "perplexity": math.exp(eval_loss) if eval_loss < 700 else math.inf,
            "token_accuracy": sum(s[2] for s in gathered) / max(total_tokens, 1),
            "eval_tokens": total_tokens,
        }
        for key, (ok, n) in sorted(merged.items()):
            metrics[f"accuracy_{key}"] = ok / n if n else 0.0
            metrics[f"count_{key}"] = n
        return metrics


def write_samples(
    output_dir: Path, step: int, samples: list[dict[str, str]], writer: MetricsWriter | None
) -> None:
    """Append the samples to ``output_dir/eval_samples.jsonl`` and TensorBoard (rank 0)."""
    path = output_dir / "eval_samples.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for sample in samples:
            f.write(json.dumps({"step": step, **sample}, ensure_ascii=False) + "\n")
    if writer is not None:
        table = "\n\n".join(
            f"**prompt** {s['prompt']}  \n**reference** {s['reference']}  \n"
            f"**answer** {s['answer']}"
            for s in samples
        )
        writer.write_text("eval/samples", table, step)
