"""A tile-based VL adapter (the ``new-plugin --vision --tiles`` scaffold: tiny InternVL) runs on
``HFModelAdapter``'s vision defaults: each image's tile count travels with the micro-batch as
host metadata (``image_meta``, never a model input), ``split_vision_inputs`` cuts the tiles per
image, and ``call_vision_encoder`` gives each image's features as its tiles' concatenated."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hyper_core.adapters.vision_context import VisionContext
from hyper_core.config.schema import ModelConfig
from hyper_core.scaffold import scaffold
from hyper_core.testing import isolated_host
from hyper_core.testing.vl import micro_batch, vl_samples, write_test_images

NAME = "tiles-probe"
ADAPTER = "tiles_probe"


@pytest.fixture(scope="module")
def subject(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The scaffolded adapter (importable), its tiny model, assets and the test samples'
    features."""
    root = tmp_path_factory.mktemp("tiles")
    package = scaffold(NAME, "adapter", root, vision=True, tiles=True)
    sys.path.insert(0, str(package))
    try:
        host = isolated_host(["hyper_tiles_probe.plugin"])
        adapter = host.registries.model_adapters.get(ADAPTER)()
        model_config = ModelConfig(adapter=ADAPTER, config="tiny")
        torch.manual_seed(0)
        model = adapter.build_model(model_config).eval()
        assets = adapter.build_assets(model_config)
        samples = vl_samples(write_test_images(root / "images"))
        features = [adapter.transform(s, assets, max_seq_len=1024) for s in samples]
        yield {"adapter": adapter, "model": model, "assets": assets, "features": features}
    finally:
        sys.path.remove(str(package))
        for name in [m for m in sys.modules if m.startswith("hyper_tiles_probe")]:
            del sys.modules[name]


@pytest.mark.parametrize("kind", ["packed", "padded"])
def test_tile_counts_travel_with_the_micro_batch_not_to_the_model(
    subject: dict[str, Any], kind: str
) -> None:
    features = subject["features"]
    per_sample = [f.image_meta.get("num_patches", torch.empty(0)).tolist() for f in features]
    assert [len(c) for c in per_sample] == [f.num_images for f in features] == [0, 1, 2]
    counts = [n for c in per_sample for n in c]
    assert len(set(counts)) > 1, counts  # the odd sizes give different tile counts
    mb = micro_batch(features, kind)
    assert mb.image_meta["num_patches"].tolist() == counts
    assert mb.model_inputs["pixel_values"].shape[0] == sum(counts)
    assert "num_patches" not in mb.model_inputs


def test_each_image_is_its_tiles_and_its_features_are_theirs_concatenated(
    subject: dict[str, Any],
) -> None:
    adapter, model = subject["adapter"], subject["model"]
    mb = micro_batch(subject["features"], "packed")
    context = VisionContext.of(mb, model.config)
    counts = context.counts("num_patches")
    parts = adapter.split_vision_inputs(mb.model_inputs, context)
    assert [p["pixel_values"].shape[0] for p in parts] == counts
    pixels = mb.model_inputs["pixel_values"]
    with torch.no_grad():
        whole = adapter.call_vision_encoder(model, mb.model_inputs, context).pooler_output
        cfg = model.config
        tiles = model.get_image_features(
            pixel_values=pixels,
            vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy,
        ).pooler_output
        last = adapter.call_vision_encoder(model, parts[-1], context.take([len(parts) - 1]))
    tokens = tiles.shape[1]
    assert [a.shape[0] for a in whole] == [n * tokens for n in counts]
    start = 0
    for image, n in zip(whole, counts, strict=True):
        expected = tiles[start : start + n].reshape(n * tokens, -1)
        torch.testing.assert_close(image, expected, atol=1e-5, rtol=1e-5)
        start += n
    torch.testing.assert_close(last.pooler_output[0], whole[-1], atol=1e-5, rtol=1e-5)


def test_a_context_without_the_tile_counts_names_the_key(subject: dict[str, Any]) -> None:
    mb = micro_batch(subject["features"], "packed")
    context = VisionContext(config=subject["model"].config)
    with pytest.raises(KeyError, match=r"'num_patches' is missing.*metadata_keys"):
        subject["adapter"].split_vision_inputs(mb.model_inputs, context)


def test_take_keeps_the_rows_of_the_images_asked_for() -> None:
    context = VisionContext(config=None, image_meta={"num_patches": torch.tensor([3, 1, 5])})
    assert context.take([2, 0]).counts("num_patches") == [5, 3]
    assert context.take([]).counts("num_patches") == []
