"""Evaluation metrics that say something on real data: token accuracy, perplexity, and sample
generations (``[training] eval_generate_samples``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.demo.text import ensure_text_demo
from hyper_core.generation import ChatModel, GenerationSettings
from hyper_core.testing import TinyRun, read_metrics, run_tiny_training, tiny_text_config
from hyper_core.trainer.evaluate import GENERATE_SLACK_TOKENS
from hyper_core.trainer.metrics import MetricsWriter


def tiny_run(output_dir: Path, generate: int) -> TinyRun:
    config = tiny_text_config(
        output_dir,
        data={"eval": str(ensure_text_demo("eval")), "eval_samples": 8},
        training={"eval_generate_samples": generate, "eval_every_steps": 2},
    )
    return run_tiny_training(config, steps=3)


@pytest.fixture(scope="module")
def with_samples(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    return tiny_run(tmp_path_factory.mktemp("eval2"), generate=2)


def test_token_accuracy_and_perplexity_match_a_hand_computation(with_samples: TinyRun) -> None:
    trainer = with_samples.trainer
    metrics = trainer.last_eval
    model = trainer.unwrapped_model
    model.eval()
    loss_sum, tokens, hits = 0.0, 0, 0
    with torch.no_grad():
        for i in range(len(trainer.datasets.eval)):
            features = trainer.datasets.eval[i]
            logits = model(input_ids=features.input_ids[None]).logits[0]
            mask = features.labels != -100
            loss_sum += float(
                torch.nn.functional.cross_entropy(
                    logits[mask].float(), features.labels[mask], reduction="sum"
                )
            )
            tokens += int(mask.sum())
            hits += int((logits.argmax(-1)[mask] == features.labels[mask]).sum())
    assert metrics["eval_tokens"] == tokens
    assert metrics["token_accuracy"] == pytest.approx(hits / tokens, abs=1e-9)
    assert metrics["eval_loss"] == pytest.approx(loss_sum / tokens, rel=1e-4)
    assert metrics["perplexity"] == pytest.approx(math.exp(loss_sum / tokens), rel=1e-4)
    # a real fraction here, unlike whole-answer exact match
    assert 0 < metrics["token_accuracy"] < 1 and metrics["accuracy_all"] == 0.0


def test_sample_generations_are_logged(with_samples: TinyRun) -> None:
    trainer = with_samples.trainer
    evals = with_samples.eval_metrics
    assert [e["step"] for e in evals] == [2, 3]
    raw = trainer.datasets.eval.raw_samples
    expected_refs = [s["messages"][-1]["content"] for s in raw[:2]]
    chat = ChatModel(adapter=trainer.adapter, model=trainer.unwrapped_model, assets=trainer.assets)
    final = evals[-1]["samples"]
    assert [s["prompt"] for s in final] == [s["messages"][0]["content"] for s in raw[:2]]
    assert [s["reference"] for s in final] == expected_refs
    # the answers are the trained model's greedy answers to the prompts
    answers = [chat.answer(s["messages"][:-1]) for s in raw[:2]]
    assert [s["answer"] for s in final] == answers
    lines = (with_samples.output_dir / "eval_samples.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [2, 2, 3, 3]
    assert [{k: r[k] for k in ("prompt", "reference", "answer")} for r in records[2:]] == final


def test_generated_answers_are_the_models_greedy_answers(with_samples: TinyRun) -> None:
    """With weights that answer something (not at once ``<|im_end|>``, as after 3 steps)."""
    trainer = with_samples.trainer
    model = trainer.unwrapped_model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        samples = trainer.evaluate()["samples"]
        raw = trainer.datasets.eval.raw_samples[:2]
        chat = ChatModel(adapter=trainer.adapter, model=model, assets=trainer.assets)
        tokenizer = trainer.assets.tokenizer
        answers = []
        for sample in raw:
            # as long as the reference plus GENERATE_SLACK_TOKENS
            limit = len(tokenizer.encode(sample["messages"][-1]["content"]))
            settings = GenerationSettings(max_new_tokens=limit + GENERATE_SLACK_TOKENS)
            answers.append(chat.answer(sample["messages"][:-1], settings))
    finally:
        model.load_state_dict(saved)
    assert all(answers)
    assert [s["answer"] for s in samples] == answers


def test_sample_generations_go_to_tensorboard(with_samples: TinyRun, tmp_path: Path) -> None:
    class Board:
        def __init__(self) -> None:
            self.texts: list[tuple[str, str, int]] = []

        def add_text(self, tag: str, text: str, step: int) -> None:
            self.texts.append((tag, text, step))

        def add_scalar(self, *args: Any) -> None:
            pass

        def close(self) -> None:
            pass

    trainer = with_samples.trainer
    board = Board()
    trainer.metrics_writer = MetricsWriter(tmp_path)
    trainer.metrics_writer._tb = board
    try:
        metrics = trainer.evaluate()
    finally:
        trainer.metrics_writer.close()
        trainer.metrics_writer = None
    ((tag, text, step),) = board.texts
    assert tag == "eval/samples" and step == 3
    for sample in metrics["samples"]:
        assert f"**reference** {sample['reference']}" in text
        assert f"**answer** {sample['answer']}" in text


def test_no_generations_when_off(tmp_path: Path) -> None:
    run = tiny_run(tmp_path, generate=0)
    assert run.eval_metrics and all("samples" not in e for e in run.eval_metrics)
    assert "token_accuracy" in run.eval_metrics[-1]
    assert not (tmp_path / "eval_samples.jsonl").exists()
    assert all("samples" not in m.get("eval", {}) for m in read_metrics(tmp_path))
