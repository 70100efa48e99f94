"""Moving images and encoder outputs as tensors: the layout records round-trip, and features
computed in separate encoder calls, packed, split per image and rebuilt give every Qwen-VL
family (and Kimi-K2.5) the same loss and gradients as its own forward (Qwen3-VL's deepstack
features too)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from ep_helpers import needs_vl, tiny_vl_micro_batch, write_images

from hyper_core.adapters.vision_context import VisionContext
from hyper_core.adapters.vision_outputs import FlatOutputs
from hyper_encoder_parallel.vision_io import Schema, merge_inputs

FAMILIES = [
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    pytest.param(
        "kimi_k25",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("hyper_kimi_k26") is None,
            reason="hyper-train-kimi-k26 not installed",
        ),
    ),
]
KEYS = ("pixel_values", "image_grid_thw")


def test_schema_header_and_records_round_trip() -> None:
    keys = ("pixel_values", "image_grid_thw", "second_per_grid_ts")
    image = {
        "pixel_values": torch.randn(12, 3, 2, 2),
        "image_grid_thw": torch.tensor([[1, 3, 4]]),
        "second_per_grid_ts": torch.tensor([0.3], dtype=torch.float32),
    }
    schema = Schema.of(keys, image)
    header = schema.header(5)
    assert len(header) == Schema.header_len(keys) and header[0] == 5
    again = Schema.from_header(keys, header)
    assert again == schema
    record = schema.record(image)
    assert len(record) == schema.record_len and record[0] == 12
    meta = again.metadata(record, torch.device("cpu"))
    assert torch.equal(meta["image_grid_thw"], image["image_grid_thw"])
    assert torch.equal(meta["second_per_grid_ts"], image["second_per_grid_ts"])  # bit-exact
    assert again.empty_patches(7, torch.device("cpu")).shape == (7, 3, 2, 2)
    with pytest.raises(ValueError, match="declares"):
        Schema.of(KEYS, image)


def _batch(family: str, image_dir: Path) -> tuple[Any, Any, dict[str, Any], dict[str, Any], int]:
    adapter, model, mb = tiny_vl_micro_batch(family, image_dir)
    return adapter, model, mb.model_inputs, mb.loss_inputs, mb.num_loss_tokens


def _loss_and_grads(model: Any, inputs: dict[str, Any], loss_inputs: Any, n: int) -> Any:
    from hyper_core.step.loss import causal_lm_loss

    model.zero_grad(set_to_none=True)
    loss, _ = causal_lm_loss(model(**inputs, use_cache=False), loss_inputs, n)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@needs_vl
@pytest.mark.parametrize("family", FAMILIES)
def test_features_from_separate_calls_reproduce_the_forward(family: str, tmp_path: Path) -> None:
    write_images(tmp_path)
    adapter, model, inputs, loss_inputs, n_tokens = _batch(family, tmp_path)
    ref_loss, ref_grads = _loss_and_grads(model, inputs, loss_inputs, n_tokens)
    vision = adapter.parallel_plan(model).vision_encoder.module
    assert any(k.startswith(f"{vision}.") for k in ref_grads)

    context = VisionContext(config=model.config)
    images = adapter.split_vision_inputs(inputs, context)
    assert len(images) == 3
    # Two "ranks": one encodes images 0 and 2, the other image 1; each packs its rows.
    shares = [[0, 2], [1]]
    per_image: list[Any] = [None] * len(images)
    for share in shares:
        share_inputs = merge_inputs([images[i] for i in share], KEYS)
        out = adapter.call_vision_encoder(model, share_inputs, context)
        flat = FlatOutputs(out, len(share))
        blocks = flat.pack().split(flat.rows, dim=0)
        for i, block in zip(share, blocks, strict=True):
            per_image[i] = flat.unpack(block)
    if family.startswith("qwen3"):
        assert len(per_image[0]) == 2  # pooler_output + one deepstack level
    rebuilt = flat.rebuild(per_image)
    injected = adapter.inject_vision_outputs(inputs, rebuilt, context)
    assert "pixel_values" not in injected and "image_grid_thw" in injected

    from hyper_core.step.loss import causal_lm_loss

    model.zero_grad(set_to_none=True)
    loss, _ = causal_lm_loss(model(**injected, use_cache=False), loss_inputs, n_tokens)
    loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert torch.allclose(loss, ref_loss, atol=1e-6, rtol=0)
    assert sorted(grads) == sorted(ref_grads)
    worst = max((grads[k] - ref_grads[k]).abs().max().item() for k in grads)
    assert worst <= 1e-5, worst


@needs_vl
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_videos_are_entries_after_the_images(family: str, tmp_path: Path) -> None:
    """A micro-batch with 2 images and 2 videos: the adapter splits 4 entries (images first),
    one encoder call over all of them (the tower takes a video's frames like an image's
    patches) injected back gives the forward's loss and gradients."""
    from hyper_core.batching.base import BatchingOptions
    from hyper_core.batching.packed import PackedRuntime
    from hyper_core.config.schema import ModelConfig
    from hyper_core.plugins import get_plugin_host

    write_images(tmp_path)
    adapter = get_plugin_host().registries.model_adapters.get(family)()
    options = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 8}
    model_config = ModelConfig(adapter=family, config="tiny", options=options)
    torch.manual_seed(0)
    model = adapter.build_model(model_config)
    assets = adapter.build_assets(model_config)
    source = {"file": str(tmp_path / "data.jsonl"), "line": 1}

    def sample(content: list[dict[str, Any]], answer: str) -> dict[str, Any]:
        question = {"type": "text", "text": "What is it?"}
        return {
            "messages": [
                {"role": "user", "content": [*content, question]},
                {"role": "assistant", "content": answer},
            ],
            "_source": source,
        }

    video = {"type": "video", "video": [str(tmp_path / "s56.png")] * 4}
    samples = [
        sample([{"type": "image", "image": "s112.png"}, video], "a red circle"),
        sample([video, {"type": "image", "image": "r84x140.png"}], "blue"),
    ]
    features = [adapter.transform(s, assets, max_seq_len=512) for s in samples]
    pad = assets.pad_token_id
    batching = BatchingOptions(micro_batch_size=2, max_seq_len=512, pad_token_id=pad)
    mb = PackedRuntime(batching).make_micro_batch(features)
    inputs, n_tokens = mb.model_inputs, mb.num_loss_tokens
    assert inputs["pixel_values_videos"] is not None
    ref_loss, ref_grads = _loss_and_grads(model, inputs, mb.loss_inputs, n_tokens)

    context = VisionContext.of(mb, model.config)
    entries = adapter.split_vision_inputs(inputs, context)
    assert len(entries) == 4 and all(set(e) == set(KEYS) for e in entries)
    assert [int(e["image_grid_thw"][0, 0]) for e in entries] == [1, 1, 2, 2]  # 4 frames: t = 2
    outputs = adapter.call_vision_encoder(model, merge_inputs(entries, KEYS), context)
    injected = adapter.inject_vision_outputs(inputs, outputs, context)
    assert "pixel_values" not in injected and "pixel_values_videos" not in injected
    assert sorted(injected["mm_encoder_outputs"]) == ["image", "video"]
    loss, grads = _loss_and_grads(model, injected, mb.loss_inputs, n_tokens)
    assert torch.allclose(loss, ref_loss, atol=1e-6, rtol=0)
    assert sorted(grads) == sorted(ref_grads)
    worst = max((grads[k] - ref_grads[k]).abs().max().item() for k in grads)
    assert worst <= 1e-5, worst
