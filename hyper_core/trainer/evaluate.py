"""Evaluation: loss, perplexity, token accuracy, answer exact match, sample generations.

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
from pathlib import Path
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
    token_hits = 0
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
            right = logits.argmax(-1) == labels
            token_hits += int((right & mask).sum())
            hits = right | ~mask
            for (row, start, end), meta in zip(sample_rows(mb, labels), mb.meta, strict=False):
                if (meta or {}).get("filler"):
                    continue
                ok = int(bool(hits[row, start:end].all()))
                for key in ("all", (meta or {}).get("question_type")):
                    if key is not None:
                        correct[key][0] += ok
                        correct[key][1] += 1
    samples = generate_samples(trainer, trainer.config.training.eval_generate_samples)
    model.train()
    stats = {
        "loss_sum": loss_sum,
        "tokens": tokens,
        "token_hits": token_hits,
        "correct": dict(correct),
    }
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
    eval_loss = total_loss / max(total_tokens, 1)
    metrics: dict[str, Any] = {
        "eval_loss": eval_loss,
        "perplexity": math.exp(eval_loss) if eval_loss < 700 else math.inf,
        "token_accuracy": sum(s["token_hits"] for s in gathered) / max(total_tokens, 1),
        "eval_tokens": total_tokens,
    }
    for key, (ok, n) in sorted(merged.items()):
        metrics[f"accuracy_{key}"] = ok / n if n else 0.0
        metrics[f"count_{key}"] = n
    if samples:
        metrics["samples"] = samples
        if dist.is_main:
            write_samples(trainer, samples)
    return metrics


#: Answers may run this many tokens past their reference's length.
GENERATE_SLACK_TOKENS = 16


def generate_samples(trainer: Trainer, n: int) -> list[dict[str, str]]:
    """``{prompt, reference, answer}`` of the first ``n`` usable eval samples, by ``generate``.

    Every rank generates the same answers from the same samples, each for a fixed number of
    tokens when there are several ranks, so that a sharded model's forwards stay in step.
    """
    if n <= 0:
        return []
    from ..data.conversation import ImagePart, parse_conversation
    from ..data.errors import SampleError
    from ..inference import GenerationSettings, decode, generate_answer_ids

    raw = getattr(trainer.dataloaders.eval.dataset, "raw_samples", ())
    tokenizer = trainer.assets.tokenizer
    out: list[dict[str, str]] = []
    for sample in raw:
        if len(out) == n:
            break
        try:
            conversation, reference = parse_conversation(sample).prompt_and_answer()
            prompt = trainer.adapter.generation_prompt(conversation, trainer.assets)
        except SampleError:  # counted as skipped by the eval loader already
            continue
        reference_tokens = len(tokenizer.encode(reference, add_special_tokens=False))
        settings = GenerationSettings(max_new_tokens=reference_tokens + GENERATE_SLACK_TOKENS)
        with trainer.training_context():
            ids = generate_answer_ids(
                trainer.unwrapped_model,
                prompt,
                settings,
                trainer.assets,
                fixed_length=trainer.dist.world_size > 1,
            )
        turn = next((m for m in reversed(conversation.messages) if m.role == "user"), None)
        parts = turn.parts if turn is not None else []
        text = "".join("<image>" if isinstance(p, ImagePart) else p.text for p in parts)
        out.append({"prompt": text, "reference": reference, "answer": decode(trainer.assets, ids)})
    return out


def write_samples(trainer: Trainer, samples: list[dict[str, str]]) -> None:
    """Append the samples to ``output_dir/eval_samples.jsonl`` and TensorBoard (rank 0)."""
    step = trainer.state.global_step
    path = Path(trainer.config.run.output_dir) / "eval_samples.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for sample in samples:
            f.write(json.dumps({"step": step, **sample}, ensure_ascii=False) + "\n")
    if trainer.metrics_writer is not None:
        table = "\n\n".join(
            f"**prompt** {s['prompt']}  \n**reference** {s['reference']}  \n"
            f"**answer** {s['answer']}"
            for s in samples
        )
        trainer.metrics_writer.write_text("eval/samples", table, step)
