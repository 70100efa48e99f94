"""Evaluation: loss over the eval set and teacher-forced answer exact match.

A sample's answer counts as correct when the argmax prediction equals the label at every loss
position: that is exactly when greedy decoding would produce the answer, without the cost of
``generate``. Samples whose ``meta`` has a ``question_type`` are also counted per type.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .trainer import Trainer


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


def run_evaluation(trainer: Trainer) -> dict[str, Any]:
    """Evaluate ``trainer.model`` on the eval loader; returns global metrics."""
    import torch

    loader = trainer.dataloaders.eval
    dist = trainer.dist
    model = trainer.model
    model.eval()
    micro_batches = [mb for step in loader.iter_epoch_once() for mb in step.micro_batches]
    n_local = torch.tensor([len(micro_batches)], dtype=torch.int64, device=dist.device)
    if dist.world_size > 1:
        import torch.distributed as tdist

        tdist.all_reduce(n_local, op=tdist.ReduceOp.MAX)
    n_target = int(n_local.item())
    loss_sum = 0.0
    tokens = 0
    correct: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    forward_kwargs = trainer.adapter.forward_kwargs()
    with torch.no_grad():
        for i in range(n_target):
            real = i < len(micro_batches)
            mb = micro_batches[i] if real else (micro_batches[-1] if micro_batches else None)
            if mb is None:
                mb = trainer._last_micro_batch
            model_inputs, loss_inputs = trainer.get_batch(mb)
            with trainer.training_context():
                outputs = model(**model_inputs, **forward_kwargs)
            if not real:
                continue
            logits = outputs.logits
            labels = loss_inputs["labels"]
            mask = labels != -100
            loss_sum += float(
                torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, -2),
                    labels.flatten(),
                    ignore_index=-100,
                    reduction="sum",
                )
            )
            tokens += int(mask.sum())
            hits = (logits.argmax(-1) == labels) | ~mask
            for (row, start, end), meta in zip(sample_rows(mb, labels), mb.meta, strict=False):
                if (meta or {}).get("filler"):
                    continue
                ok = int(bool(hits[row, start:end].all()))
                for key in ("all", (meta or {}).get("question_type")):
                    if key is not None:
                        correct[key][0] += ok
                        correct[key][1] += 1
    model.train()
    stats = {"loss_sum": loss_sum, "tokens": tokens, "correct": dict(correct)}
    if dist.world_size > 1:
        import torch.distributed as tdist

        gathered: list[Any] = [None] * dist.world_size
        tdist.all_gather_object(gathered, stats)
    else:
        gathered = [stats]
    total_loss = sum(s["loss_sum"] for s in gathered)
    total_tokens = sum(s["tokens"] for s in gathered)
    merged: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in gathered:
        for key, (ok, n) in s["correct"].items():
            merged[key][0] += ok
            merged[key][1] += n
    metrics: dict[str, Any] = {
        "eval_loss": total_loss / max(total_tokens, 1),
        "eval_tokens": total_tokens,
    }
    for key, (ok, n) in sorted(merged.items()):
        metrics[f"accuracy_{key}"] = ok / n if n else 0.0
        metrics[f"count_{key}"] = n
    return metrics
