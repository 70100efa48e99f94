"""Generation: prompt a model in memory and decode its answer.

The prompt goes through the adapter's own transform (:meth:`ModelAdapter.generation_prompt`),
so it is tokenised exactly as in training, images included; the answer is the new tokens up to
the end-of-turn token. Evaluation's sample generations, ``hyper-train predict`` and
``hyper-train chat`` use this (the last two on a model that
:mod:`hyper_core.trained_model` loads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .errors import UserError

if TYPE_CHECKING:
    import torch

    from .adapters.base import GenerationPrompt, ModelAdapter, ModelAssets
    from .data.conversation import Conversation


@attrs.frozen(kw_only=True)
class GenerationSettings:
    """How answers are decoded: greedy when ``temperature`` is 0."""

    max_new_tokens: int = 128
    temperature: float = 0.0


@attrs.define(kw_only=True)
class ChatModel:
    """A model ready to answer: adapter, weights (eval mode) and tokenizer/processor."""

    adapter: ModelAdapter
    model: torch.nn.Module
    assets: ModelAssets

    def answer(
        self, messages: Sequence[Mapping[str, Any]], settings: GenerationSettings | None = None
    ) -> str:
        """The assistant's reply to ``messages`` (HF chat messages, ending in a user turn)."""
        conversation = prompt_conversation(messages)
        prompt = build_prompt(self.adapter, conversation, self.assets)
        ids = generate_answer_ids(self.model, prompt, settings or GenerationSettings(), self.assets)
        return decode(self.assets, ids)


def prompt_conversation(messages: Sequence[Mapping[str, Any]]) -> Conversation:
    """The :class:`Conversation` of chat ``messages``; images as paths or PIL images."""
    from .data.conversation import parse_conversation
    from .data.errors import SampleError

    # Parsed with the answer's (empty) turn, which a sample needs, then without it.
    turns = [*(dict(m) for m in messages), {"role": "assistant", "content": ""}]
    try:
        return parse_conversation({"messages": turns}).prompt_and_answer()[0]
    except SampleError as exc:
        raise UserError(f"prompt: {exc.reason}: {exc.message}") from None


def build_prompt(
    adapter: ModelAdapter, conversation: Conversation, assets: ModelAssets
) -> GenerationPrompt:
    """The adapter's generation prompt; bad input (a corrupt image...) is a :class:`UserError`."""
    from .data.errors import SampleError

    try:
        return adapter.generation_prompt(conversation, assets)
    except SampleError as exc:
        raise UserError(f"prompt: {exc.reason}: {exc.message}") from None


def generate_answer_ids(
    model: torch.nn.Module,
    prompt: GenerationPrompt,
    settings: GenerationSettings,
    assets: ModelAssets,
    *,
    fixed_length: bool = False,
) -> list[int]:
    """The generated token ids up to (without) the first end-of-turn token.

    ``fixed_length``: run exactly ``max_new_tokens`` forwards whatever is generated, so that
    ranks of a sharded model, which all-gather in every forward, stay in step.
    """
    (ids,) = generate_batch_ids(model, [prompt], settings, assets, fixed_length=fixed_length)
    return ids


def _left_padded(prompts: Sequence[GenerationPrompt], pad_id: int) -> dict[str, Any]:
    """The prompts as one batch, each row left-padded (its attention mask 0 there): ids and
    per-token fields padded, media concatenated in order as the model's forward takes them."""
    import torch

    feats = [p.features for p in prompts]
    width = max(f.input_ids.shape[0] for f in feats)

    def pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
        return torch.stack(
            [torch.nn.functional.pad(r, (width - r.shape[0], 0), value=value) for r in rows]
        )

    inputs: dict[str, Any] = {
        "input_ids": pad([f.input_ids for f in feats], pad_id),
        "attention_mask": pad([torch.ones_like(f.input_ids) for f in feats], 0),
    }
    for key in feats[0].token_fields:
        inputs[key] = pad([f.token_fields[key] for f in feats], 0)
    for key in {k for f in feats for k in f.media}:
        inputs[key] = torch.cat([f.media[key] for f in feats if key in f.media])
    return inputs


def generate_batch_ids(
    model: torch.nn.Module,
    prompts: Sequence[GenerationPrompt],
    settings: GenerationSettings,
    assets: ModelAssets,
    *,
    fixed_length: bool = False,
) -> list[list[int]]:
    """For each prompt, the generated ids up to (without) its first end-of-turn token; the
    prompts are generated as one left-padded batch (see :func:`generate_answer_ids`)."""
    import torch
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    inputs = _left_padded(prompts, assets.pad_token_id)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    stop: list[int] = []
    for prompt in prompts:
        stop += [int(t) for t in prompt.stop_token_ids if int(t) not in stop]
    eos = getattr(assets.tokenizer, "eos_token_id", None)
    if eos is not None and eos not in stop:
        stop.append(int(eos))
    sample = settings.temperature > 0
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=0,
        do_sample=sample,
        temperature=settings.temperature if sample else None,
        top_p=None,
        top_k=None,
        eos_token_id=None if fixed_length else stop,
        pad_token_id=assets.pad_token_id,
    )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(**inputs, generation_config=config)
    finally:
        model.train(was_training)
    answers = []
    for row in out[:, inputs["input_ids"].shape[1] :].tolist():
        cut = next((i for i, token in enumerate(row) if token in stop), len(row))
        answers.append([int(t) for t in row[:cut]])
    return answers


def decode(assets: ModelAssets, ids: Sequence[int]) -> str:
    """Text of generated ids, special tokens dropped."""
    return str(assets.tokenizer.decode(list(ids), skip_special_tokens=True)).strip()
