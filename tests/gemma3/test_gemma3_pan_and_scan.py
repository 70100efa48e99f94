"""Pan-and-scan (``[model.options] pan_and_scan = true``): training's ids and pixels are stock
``Gemma3Processor``'s, a model with crops trains (packed = padded, per-image encoder = whole),
and an export's image processor crops as training did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from hyper_core.batching.spans import true_runs
from hyper_core.config import load_config_dict
from hyper_core.config.adapter_options import check_adapter_options
from hyper_core.data.conversation import load_images, parse_conversation
from hyper_core.errors import ConfigError
from hyper_core.plugins.manager import PluginHost
from hyper_core.testing.conformance import (
    AdapterUnderTest,
    check_one_pass_tokens,
    check_packed_equals_padded,
    check_train_step,
    check_vision_encoder,
)
from hyper_core.testing.vl import chat

PLUGIN = "hyper_gemma3.plugin"
#: (height, width): cropped in 2 (wide), not cropped (square), cropped in 3 (tall) at the
#: default crop settings (crops of at least 256 px, from an aspect ratio of 1.2).
BIG_IMAGES = {"wide.png": (256, 640), "small.png": (64, 64), "tall.png": (900, 300)}
#: Small crops, so that the kit's small test images (57×93, 40×150) are cropped too.
SMALL_CROPS = {"pan_and_scan": True, "pan_and_scan_min_crop_size": 16}


def subject(options: dict[str, Any], workdir: Path) -> AdapterUnderTest:
    model = {"config": "tiny", "attn_implementation": "varlen", "options": options}
    return AdapterUnderTest("gemma3", model, plugins=[PLUGIN], workdir=workdir)


def big_image_sample(root: Path) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for name, (h, w) in BIG_IMAGES.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)
    return chat(
        "<image>Compare them.<image>and<image>",
        "the first is wide",
        root,
        images=list(BIG_IMAGES),
    )


def stock_processor(t: AdapterUnderTest) -> Any:
    """Stock ``Gemma3Processor`` of the adapter's tokenizer and a PIL image processor of the
    tower's size (its pan-and-scan settings are the processor's call defaults)."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    side = t.adapter.hf_config(t.model_config()).vision_config.image_size
    image_processor = Gemma3ImageProcessorPil(size={"height": side, "width": side})
    tokenizer = t.assets.tokenizer
    return Gemma3Processor(
        image_processor, tokenizer, chat_template=tokenizer.chat_template, image_seq_length=16
    )


def stock_inputs(processor: Any, sample: dict[str, Any], **kwargs: Any) -> Any:
    conversation = parse_conversation(sample)
    text = processor.apply_chat_template(conversation.to_messages(), tokenize=False)
    images = load_images(conversation)
    return processor(text=[text], images=[images], return_tensors="pt", **kwargs)


def test_training_inputs_equal_stock_processor(tmp_path: Path) -> None:
    t = subject({"pan_and_scan": True}, tmp_path)
    sample = big_image_sample(tmp_path / "images")
    (features,) = t.features([sample])
    assert features.image_meta["num_crops"].tolist() == [2, 0, 3]

    stock = stock_inputs(stock_processor(t), sample, do_pan_and_scan=True)
    assert len(stock["pixel_values"]) == 3 + 2 + 3
    assert stock["input_ids"][0].tolist() == features.input_ids.tolist()
    assert torch.equal(stock["pixel_values"], features.media["pixel_values"])
    assert stock["token_type_ids"][0].tolist() == features.token_fields["token_type_ids"].tolist()
    # one bidirectional block per tile (the original and each crop), as transformers' mask
    assert features.bidirectional_spans == true_runs(stock["token_type_ids"][0].bool())
    assert len(features.bidirectional_spans) == 8

    # the control: without pan-and-scan, neither the adapter nor stock crop
    (plain,) = subject({}, tmp_path / "plain").features([sample])
    assert plain.media["pixel_values"].shape[0] == 3
    assert stock_inputs(stock_processor(t), sample)["input_ids"][0].tolist() == (
        plain.input_ids.tolist()
    )


def test_training_with_crops(tmp_path: Path) -> None:
    """The kit's samples with crops: a step lowers the loss, packed = padded, the encoder's
    per-image calls (encoder parallelism's) give the whole batch's features, and training's ids
    are the saved chat template's with each image expanded."""
    t = subject(SMALL_CROPS, tmp_path)
    crops = [f.image_meta["num_crops"].tolist() for f in t.features() if f.num_images]
    assert crops == [[2], [0, 4]]
    mb = t.micro_batch("packed")
    assert len(mb.model_inputs["pixel_values"]) == mb.num_images + 6
    check_train_step(t)
    check_packed_equals_padded(t)
    check_vision_encoder(t)
    check_one_pass_tokens(t)  # each image expanded with its own crop count


def test_export_crops_as_training(tmp_path: Path) -> None:
    """The export's image processor holds the pan-and-scan settings: stock
    ``AutoImageProcessor`` gives training's pixels, and stock ``AutoProcessor`` (whose own
    call defaults switch pan-and-scan off) training's ids given the saved settings."""
    from transformers import AutoImageProcessor, AutoProcessor, Gemma3Processor

    t = subject(SMALL_CROPS, tmp_path)
    model = t.build_model()
    out = tmp_path / "export"
    t.adapter.export_hf(model.state_dict(), model.config, out, assets=t.assets)
    sample = t.samples[2]
    (features,) = t.features([sample])

    image_processor = AutoImageProcessor.from_pretrained(str(out), local_files_only=True)
    images = load_images(parse_conversation(sample))
    pixels = image_processor(images, return_tensors="pt")
    assert pixels["num_crops"].tolist() == [0, 4]
    assert torch.equal(pixels["pixel_values"], features.media["pixel_values"])

    processor = AutoProcessor.from_pretrained(str(out), local_files_only=True)
    assert isinstance(processor, Gemma3Processor)
    saved = processor.image_processor
    settings = {
        key: getattr(saved, key)
        for key in (
            "do_pan_and_scan",
            "pan_and_scan_min_crop_size",
            "pan_and_scan_max_num_crops",
            "pan_and_scan_min_ratio_to_activate",
        )
    }
    assert settings == {**t.adapter.parse_options(t.model_config()).image_processor_settings()}
    stock = stock_inputs(processor, sample, **settings)
    assert stock["input_ids"][0].tolist() == features.input_ids.tolist()
    assert torch.equal(stock["pixel_values"], features.media["pixel_values"])

    # training on from the export: the options decide, whatever the saved config says
    for options, crops in ((SMALL_CROPS, [0, 4]), ({}, [0, 0])):
        config = t.model_config(path=str(out), config=None, options=options)
        assets = t.adapter.build_assets(config)
        resumed = t.adapter.transform(sample, assets, max_seq_len=t.max_seq_len)
        assert resumed.image_meta["num_crops"].tolist() == crops


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pan_and_scan": "yes"}, "$.model.options.pan_and_scan: expected bool"),
        (
            {"pan_and_scan_max_num_crops": 1},
            "$.model.options.pan_and_scan_max_num_crops: must be >= 2, got 1",
        ),
        ({"crops": 2}, "$.model.options.crops: unknown key"),
    ],
)
def test_bad_options_name_their_path(options: dict[str, Any], message: str) -> None:
    raw = {
        "model": {"adapter": "gemma3", "config": "tiny", "options": options},
        "data": {"train": {"format": "shapes", "num_samples": 4}},
        "training": {"steps": 1, "global_batch_size": 1, "micro_batch_size": 1, "lr": 1e-3},
    }
    with pytest.raises(ConfigError) as err:
        check_adapter_options(load_config_dict(raw), PluginHost(entry_points=True).registries)
    assert str(err.value).startswith(message), str(err.value)
