"""The vision filler of a video model: with it, every micro-batch (text, images, videos or
both) runs the vision tower twice, so that several ranks' FSDP all-gathers stay in step, and
the loss is the one without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from qwen_vl_helpers import ADAPTERS, cached_assets, model_config

from hyper_core.testing.vl import chat, loss_of, runtime


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``img.png`` and four video frames ``f0..f3.png``."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("filler-media")
    rng = np.random.default_rng(0)
    for name in ("img", "f0", "f1", "f2", "f3"):
        pixels = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{name}.png")
    return root


def samples(media_dir: Path) -> dict[str, Any]:
    video = {"type": "video", "video": [f"f{i}.png" for i in range(4)]}
    image = {"type": "image", "image": "img.png"}
    question = {"type": "text", "text": "What is it?"}
    return {
        "text": chat("Hi", "hello", media_dir),
        "image": chat([image, question], "a picture", media_dir),
        "video": chat([video, question], "a film", media_dir),
        "both": chat([image, video, question], "both", media_dir),
    }


GROUPS = [("text",), ("image",), ("video",), ("text", "image"), ("image", "video"), ("both",)]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("kind", ["packed", "padded"])
def test_every_micro_batch_runs_the_tower_twice_with_the_same_loss(
    family: str, kind: str, media_dir: Path
) -> None:
    adapter, assets = ADAPTERS[family](), cached_assets(family)
    filler = adapter.vision_filler(assets)
    assert (filler.num_images, filler.num_videos, filler.num_loss_tokens) == (1, 1, 0)
    torch.manual_seed(0)
    model = adapter.build_model(model_config(family))
    calls: list[int] = []
    tower = model.get_submodule(adapter.vision_module)
    tower.register_forward_hook(lambda *_: calls.append(1))
    feats = {
        name: adapter.transform(s, assets, max_seq_len=512)
        for name, s in samples(media_dir).items()
    }
    assert [feats[n].num_videos for n in ("text", "image", "video", "both")] == [0, 0, 1, 1]
    plain_rt, filled_rt = runtime(kind, assets.pad_token_id), runtime(kind, assets.pad_token_id)
    filled_rt.vision_filler = filler
    kwargs = adapter.forward_kwargs()
    for names in GROUPS:
        group = [feats[n] for n in names]
        (plain,) = plain_rt.collate(group)
        (filled,) = filled_rt.collate(group)
        with torch.no_grad():
            a = loss_of(model, plain, forward_kwargs=kwargs)
            calls.clear()
            b = loss_of(model, filled, forward_kwargs=kwargs)
        assert len(calls) == 2, f"{names}: the tower ran {len(calls)} times"
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=f"{names}")
        assert (filled.num_samples, filled.num_tokens) == (plain.num_samples, plain.num_tokens)
        has_both = names in (("image", "video"), ("both",))
        assert len(filled.meta) == len(plain.meta) + (not has_both)
