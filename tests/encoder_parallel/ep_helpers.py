"""Helpers of the encoder-parallel tests: skewed VL data sets, tiny configs, torchrun."""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from hyper_core.testing import processes

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

GLOBAL_BATCH = 8
MICRO_BATCH = 2
WORLD = 2
STEPS = 5

#: name -> (height, width); the tiny Qwen2.5-VL has 14-px patches merged 2×2 (28-px cells).
IMAGE_SIZES: dict[str, tuple[int, int]] = {
    "s56.png": (56, 56),  # 16 patches
    "w56x84.png": (56, 84),  # 24
    "t112x56.png": (112, 56),  # 32
    "r84x112.png": (84, 112),  # 48
    "r84x140.png": (84, 140),  # 60
    "s112.png": (112, 112),  # 64
}
BIG = ["s112.png", "r84x140.png", "r84x112.png", "s56.png"]
SMALL = ["w56x84.png", "t112x56.png"]


def vl_available() -> bool:
    """Whether the Qwen-VL adapter distribution is importable."""
    return importlib.util.find_spec("hyper_qwen_vl") is not None


needs_vl = pytest.mark.skipif(not vl_available(), reason="hyper-train-qwen-vl not installed")


def write_images(root: Path) -> None:
    """Random RGB pictures of :data:`IMAGE_SIZES` into ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for name, (h, w) in IMAGE_SIZES.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)


def conversation(images: Sequence[str], i: int) -> dict[str, Any]:
    """A one-turn conversation with ``images`` (relative paths; ``v:NAME``: a 4-frame video
    of that picture) and a short answer."""
    content: list[dict[str, Any]] = [
        {"type": "video", "video": [name[2:]] * 4}
        if name.startswith("v:")
        else {"type": "image", "image": name}
        for name in images
    ]
    content.append({"type": "text", "text": f"Question {i}: what is shown?"})
    answers = ["a red circle", "a blue square", "green", "a purple triangle", "orange"]
    return {
        "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": answers[i % len(answers)]},
        ]
    }


def _rank0_sample(step: int, j: int) -> list[str]:
    """Two images per sample (4 per micro-batch), sizes rotating."""
    a = BIG[(step + j) % len(BIG)]
    b = BIG[(step + 2 * j + 1) % len(BIG)]
    return [a, b]


def layout(kind: str) -> list[list[str]]:
    """Images of each sample, in dataset order, for :data:`STEPS` global batches.

    With ``shuffle = false`` step ``s`` covers samples ``[8s, 8s+8)``: rank 0 takes the first
    four (two micro-batches of two), rank 1 the last four.

    * ``skew``: rank 0 has 4 images per micro-batch, rank 1 one (4× fewer, and smaller);
    * ``none``: rank 0 as in ``skew``, rank 1 none at all; at step 2 rank 0's first
      micro-batch is text-only too (a micro-step without images anywhere), at step 3 its second
      holds a single image (below ``min_images``: no rebalancing, rank 1 runs a dummy).
    * ``three`` (3 ranks, global batch 6, one micro-batch each): only rank 0 has images, two
      at even steps (one rank computes nothing and runs a dummy), four at odd steps.
    * ``video``: rank 0 has images and 4-frame videos (``v:``) in every micro-batch, rank 1
      one small image per step.
    """
    samples: list[list[str]] = []
    if kind == "video":
        for step in range(STEPS):
            big = BIG[step % len(BIG)]
            rank0 = [[f"v:{big}", "s56.png"], ["v:r84x112.png"], ["s112.png"], ["v:s56.png", big]]
            samples += [*rank0, [], [SMALL[step % 2]], [], []]
        return samples
    if kind == "three":
        for step in range(STEPS):
            second = ["r84x112.png", "s56.png"] if step % 2 else []
            samples += [["s112.png", "r84x140.png"], second, [], [], [], []]
        return samples
    for step in range(STEPS):
        rank0 = [_rank0_sample(step, j) for j in range(4)]
        if kind == "skew":
            small = SMALL[step % len(SMALL)]
            rank1: list[list[str]] = [[small], [], [SMALL[(step + 1) % 2]], []]
        elif kind == "none":
            rank1 = [[], [], [], []]
            if step == 2:
                rank0[0], rank0[1] = [], []
            if step == 3:
                rank0[2], rank0[3] = ["s56.png"], []
        else:
            raise ValueError(kind)
        samples += rank0 + rank1
    return samples


def tiny_vl_micro_batch(family: str, image_dir: Path) -> tuple[Any, Any, Any]:
    """A tiny ``family`` adapter and model (seed 0), and one packed micro-batch of two samples
    with three images of :func:`write_images` in ``image_dir``."""
    import torch

    from hyper_core.batching.base import BatchingOptions
    from hyper_core.batching.packed import PackedRuntime
    from hyper_core.config.schema import ModelConfig
    from hyper_core.plugins import get_plugin_host

    adapter = get_plugin_host().registries.model_adapters.get(family)()
    model_config = ModelConfig(adapter=family, config="tiny")
    torch.manual_seed(0)
    model = adapter.build_model(model_config)
    assets = adapter.build_assets(model_config)
    source = {"file": str(image_dir / "data.jsonl"), "line": 1}

    def sample(images: list[str], answer: str) -> dict[str, Any]:
        content: list[dict[str, str]] = [{"type": "image", "image": i} for i in images]
        content.append({"type": "text", "text": "What is it?"})
        return {
            "messages": [
                {"role": "user", "content": content},
                {"role": "assistant", "content": answer},
            ],
            "_source": source,
        }

    samples = [sample(["s112.png", "s56.png"], "a red circle"), sample(["r84x140.png"], "blue")]
    features = [adapter.transform(s, assets, max_seq_len=512) for s in samples]
    options = BatchingOptions(micro_batch_size=2, max_seq_len=512, pad_token_id=assets.pad_token_id)
    return adapter, model, PackedRuntime(options).make_micro_batch(features)


def write_dataset(root: Path, kind: str) -> Path:
    """``root/<kind>.jsonl`` (images in ``root``)."""
    write_images(root)
    path = root / f"{kind}.jsonl"
    rows = [json.dumps(conversation(imgs, i)) for i, imgs in enumerate(layout(kind))]
    path.write_text("\n".join(rows) + "\n")
    return path


def vl_config(out: Path, data: Path, **sections: Mapping[str, Any]) -> dict[str, Any]:
    """Tiny ``qwen2_5_vl`` run on ``data``: 5 steps of 8 samples, 2 per micro-batch."""
    cfg: dict[str, Any] = {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"adapter": "qwen2_5_vl", "config": "tiny"},
        "data": {
            "train": str(data),
            "max_seq_len": 512,
            "batching": "packed",
            "shuffle": False,
            "num_workers": 0,
        },
        "training": {
            "steps": STEPS,
            "global_batch_size": GLOBAL_BATCH,
            "micro_batch_size": MICRO_BATCH,
            "lr": 1e-3,
            "warmup_steps": 0,
        },
        "logging": {"every_steps": 1, "progress": "none"},
        "checkpoint": {"resume": "none"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


#: Subprocesses (rank processes, the CLI) import this folder's helpers.
subprocess_env = functools.partial(processes.subprocess_env, (HERE, REPO))
hyper_train = functools.partial(processes.hyper_train, importable=(HERE, REPO))
torchrun = functools.partial(processes.torchrun, importable=(HERE, REPO))


def read_losses(out: Path) -> dict[int, float]:
    """``step -> loss`` from ``metrics.jsonl``."""
    found = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            found[int(record["step"])] = float(record["loss"])
    return found


def read_metrics(out: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


#: Loss and per-parameter gradient tolerance of the N ranks = 1 rank comparisons.
TOL = 1e-5


def train_one_rank(out: Path, raw: dict[str, Any], plugins: Sequence[str] = ()) -> None:
    """The reference: one process, the whole global batch, with the gradient probe (and the
    plugin modules ``plugins``)."""
    import torch

    from hyper_core.config import load_config_dict
    from hyper_core.plugins.manager import PluginHost
    from hyper_core.trainer.trainer import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        host = PluginHost(extra_modules=["ep_probe", *plugins], strict=True)
        Trainer(load_config_dict(raw, sections=host.registries.config_sections), host).train()
    finally:
        torch.set_num_threads(threads)


def assert_same_training(a: Path, b: Path, tol: float = TOL, tower: str = ".visual.") -> None:
    """Same per-step losses and per-parameter gradients, within ``tol`` (0: bit-identical);
    the vision tower's parameters (names containing ``tower``) have gradients."""
    import torch

    la, lb = read_losses(a), read_losses(b)
    assert sorted(la) == list(range(1, STEPS + 1)) == sorted(lb)
    worst_loss = max(abs(la[k] - lb[k]) for k in la)
    ga, gb = torch.load(a / "grads.pt"), torch.load(b / "grads.pt")
    assert sorted(ga) == sorted(gb) == list(range(1, STEPS + 1))
    worst = 0.0
    for step in ga:
        assert sorted(ga[step]) == sorted(gb[step]), step
        assert any(tower in name for name in ga[step])
        for name, grad in ga[step].items():
            worst = max(worst, (grad - gb[step][name]).abs().max().item())
    assert worst_loss <= tol and worst <= tol, (worst_loss, worst)
