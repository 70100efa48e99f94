"""Shared test data for vision-language adapters: odd-sized images, samples with 0/1/2 images,
core-runtime micro-batches and the training loss (any adapter's tests can use them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: name -> (height, width) of the test pictures (odd sizes on purpose).
IMAGE_SIZES: dict[str, tuple[int, int]] = {
    "odd.png": (57, 93),
    "square.png": (112, 112),
    "wide.png": (40, 150),
}


def write_test_images(root: Path) -> Path:
    """Random RGB pictures of :data:`IMAGE_SIZES` plus a ``corrupt.png`` into ``root``."""
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, (h, w) in IMAGE_SIZES.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not a png")
    return root


def chat(user: Any, answer: str, image_dir: Path, **extra: Any) -> dict[str, Any]:
    """A raw sample whose relative image paths resolve against ``image_dir``."""
    return {
        "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ],
        "_source": {"file": str(image_dir / "data.jsonl"), "line": 1},
        **extra,
    }


def vl_samples(image_dir: Path) -> list[dict[str, Any]]:
    """A micro-batch's worth of samples with 0, 1 and 2 images of different sizes."""
    return [
        chat("What colour is the shape?", "a red circle", image_dir),
        chat(
            [{"type": "image", "image": "odd.png"}, {"type": "text", "text": "What shape is it?"}],
            "a square",
            image_dir,
            meta={"question": "shape"},
        ),
        chat(
            "<image>Describe the image.<image>",
            "a blue triangle",
            image_dir,
            images=["square.png", "wide.png"],
        ),
    ]


def runtime(kind: str, pad_token_id: int = 0, *, varlen_kwargs: bool = False) -> Any:
    """The core ``packed`` or ``padded`` runtime (``varlen_kwargs``: see ``BatchingOptions``)."""
    from ..batching.base import BatchingOptions
    from ..batching.packed import PackedRuntime
    from ..batching.padded import PaddedRuntime

    options = BatchingOptions(
        micro_batch_size=8,
        max_seq_len=4096,
        pad_token_id=pad_token_id,
        varlen_kwargs=varlen_kwargs,
    )
    return PackedRuntime(options) if kind == "packed" else PaddedRuntime(options)


def micro_batch(
    features: Sequence[Any], kind: str, pad_token_id: int = 0, *, varlen_kwargs: bool = False
) -> Any:
    """One micro-batch of ``features`` laid out by the core runtime ``kind``."""
    return runtime(kind, pad_token_id, varlen_kwargs=varlen_kwargs).make_micro_batch(list(features))


def loss_of(
    model: Any,
    mb: Any,
    num_loss_tokens: float | None = None,
    forward_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Sum of CE over the shifted labels / ``num_loss_tokens`` (default: the micro-batch's).

    ``forward_kwargs`` default to the training ones (``use_cache=False``).
    """
    from ..step.loss import causal_lm_loss

    kwargs = {"use_cache": False} if forward_kwargs is None else forward_kwargs
    outputs = model(**mb.model_inputs, **kwargs)
    loss, _ = causal_lm_loss(outputs, mb.loss_inputs, float(num_loss_tokens or mb.num_loss_tokens))
    return loss


def loss_and_grads(
    model: Any, mb: Any, forward_kwargs: dict[str, Any] | None = None
) -> tuple[float, dict[str, Any]]:
    """:func:`loss_of` and the gradients it gives every parameter that receives one."""
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, mb, forward_kwargs=forward_kwargs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def assert_same_loss_and_grads(
    results: dict[str, tuple[float, dict[str, Any]]],
    reference: tuple[float, dict[str, Any]],
    atol: float = 1e-5,
) -> None:
    """Every ``name -> (loss, grads)`` of ``results`` equals ``reference`` (``atol``)."""
    import torch

    ref_loss, ref_grads = reference
    for name, (loss, grads) in results.items():
        assert abs(loss - ref_loss) <= atol, (name, loss, ref_loss)
        assert grads.keys() == ref_grads.keys(), name
        for key, grad in grads.items():
            assert torch.allclose(grad, ref_grads[key], atol=atol, rtol=1e-4), (name, key)


def tiny_vl(
    workdir: Path, family: str = "qwen2_5_vl", attn_implementation: str = "sdpa"
) -> tuple[Any, Any, Any]:
    """``(adapter, model, assets)`` of ``family``'s tiny named config with ``attn_implementation``,
    the model built from seed 0 (fp32, CPU)."""
    import torch

    from ..config import load_config_dict
    from ..plugins import get_plugin_host
    from ..resolve import resolve_adapter

    raw = {
        "run": {"output_dir": str(workdir / "run")},
        "model": {"adapter": family, "config": "tiny", "attn_implementation": attn_implementation},
        "data": {"train": {"format": "shapes", "num_samples": 4}},
        "training": {"steps": 1, "global_batch_size": 2, "micro_batch_size": 1, "lr": 1e-3},
    }
    config = load_config_dict(raw)
    adapter = resolve_adapter(config.model, get_plugin_host().registries)
    torch.manual_seed(0)
    return adapter, adapter.build_model(config.model), adapter.build_assets(config.model)


def shuffled_images(samples: Sequence[Mapping[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """The samples with their images permuted across samples (the control of a demo: a model
    that reads the pixels falls to about chance on them)."""
    import copy
    import random

    out = [copy.deepcopy(dict(s)) for s in samples]
    parts = [
        part
        for s in out
        for m in s["messages"]
        if isinstance(m["content"], list)
        for part in m["content"]
        if part.get("type") == "image"
    ]
    images = [p["image"] for p in parts]
    random.Random(seed).shuffle(images)
    for part, image in zip(parts, images, strict=True):
        part["image"] = image
    return out
