"""The Qwen-VL adapters' training ids and labels are unchanged by one-pass tokenising: ChatML
puts a special token at every piece boundary, so the one-pass ids equal the piecewise ones
(the old path, kept as the slow-tokenizer fallback), images and videos included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from qwen_vl_helpers import ADAPTERS, cached_assets

from hyper_core.data.multimodal import tokenize_multimodal
from hyper_core.testing.conformance_tokens import EDGE_SAMPLES


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("one-pass-frames")
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)).save(root / f"f{i}.png")
    return root


def _video_sample(root: Path) -> dict[str, Any]:
    video = {"type": "video", "video": [str(root / "f0.png"), str(root / "f1.png")]}
    image = {"type": "image", "image": str(root / "f0.png")}
    return {
        "messages": [
            {"role": "user", "content": [video, {"type": "text", "text": " What moves? "}, image]},
            {"role": "assistant", "content": " a square "},
        ]
    }


@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_ids_and_labels_equal_the_piecewise_path(
    family: str, samples: list[dict[str, Any]], frames: Path
) -> None:
    adapter, assets = ADAPTERS[family](), cached_assets(family)
    for i, sample in enumerate([*samples, *EDGE_SAMPLES, _video_sample(frames)]):
        one, old = (
            tokenize_multimodal(
                sample, assets.processor, adapter.chat_format, max_seq_len=4096, piecewise=p
            )
            for p in (False, True)
        )
        assert one.input_ids.tolist() == old.input_ids.tolist(), f"sample {i}"
        assert one.labels.tolist() == old.labels.tolist(), f"sample {i}"
        assert one.image_token_counts == old.image_token_counts
        assert one.video_token_counts == old.video_token_counts
