"""Video input of the Qwen-VL adapters: pixels and grids as transformers lays them out, frame
sampling, mRoPE positions equal to the model's ``get_rope_index``, packed = padded."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from qwen_vl_helpers import ADAPTERS, model_config

from hyper_core.data.conversation import VideoPart, parse_conversation
from hyper_core.data.errors import SampleError
from hyper_core.testing.vl import assert_same_loss_and_grads, chat, loss_and_grads, micro_batch
from hyper_qwen_vl.video import FrameSampling, num_frames, read_clip, sample_indices

VIDEO_FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
KINDS = ("packed", "padded")
#: Small per-frame bounds so that the tiny models see a few tokens per frame.
VIDEO_OPTIONS = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 12}


def write_video(
    path: Path, frames: int = 7, size: tuple[int, int] = (60, 90), fps: int = 4
) -> Path:
    """An MPEG-4 file of random frames (PyAV)."""
    import av

    rng = np.random.default_rng(len(path.name))
    height, width = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def random_frames(count: int, size: tuple[int, int] = (50, 70), seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)) for _ in range(count)]


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    write_video(root / "clip.mp4")
    for i, frame in enumerate(random_frames(3)):
        frame.save(root / f"f{i}.png")
    random_frames(1, (57, 93), seed=1)[0].save(root / "img.png")
    return root


def assets_of(family: str) -> Any:
    return ADAPTERS[family]().build_assets(model_config(family, options=VIDEO_OPTIONS))


def transformers_patchify() -> Any:
    """``Qwen2VLVideoProcessor.patchify`` from transformers' source. Its module imports
    torchvision, which cannot be installed next to this torch, so the method is compiled on
    its own (it uses torch only)."""
    import transformers.models.qwen2_vl as package

    source = (Path(package.__file__).parent / "video_processing_qwen2_vl.py").read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if getattr(n, "name", "") == "Qwen2VLVideoProcessor")
    method = next(n for n in cls.body if getattr(n, "name", "") == "patchify")
    method.decorator_list = []
    namespace: dict[str, Any] = {"torch": torch}
    code = textwrap.dedent(ast.get_source_segment(source, method) or "")
    exec(compile(code, "patchify", "exec"), namespace)
    return namespace["patchify"]


def transformers_video(processor: Any, frames: list, min_pixels: int, max_pixels: int) -> Any:
    """The frames resized, rescaled and normalised by transformers' PIL image processor methods,
    then laid out by transformers' video ``patchify``: ``(pixels, (t, h, w))``."""
    from transformers.image_utils import SizeDict

    proc = processor.image_processor
    size = SizeDict(shortest_edge=min_pixels, longest_edge=max_pixels)
    factor = proc.patch_size * proc.merge_size
    arrays = []
    for frame in frames:
        image = np.asarray(frame).transpose(2, 0, 1)
        image = proc.resize(image, size=size, resample=proc.resample, factor=factor)
        image = proc.normalize(
            proc.rescale(image, proc.rescale_factor), proc.image_mean, proc.image_std
        )
        arrays.append(torch.from_numpy(np.asarray(image, dtype=np.float32)))
    videos = torch.stack(arrays)[None]
    patches, t, h, w = transformers_patchify()(
        None, videos, proc.patch_size, proc.merge_size, proc.temporal_patch_size
    )
    return patches[0], (t, h, w)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("count", [4, 5])
def test_pixels_and_grid_equal_transformers_layout(family: str, count: int) -> None:
    processor = assets_of(family).processor
    frames = random_frames(count)
    low, high = processor.video.min_pixels, processor.video.max_pixels
    ours, grid = processor.video_patches(frames, min_pixels=low, max_pixels=high)
    ref, ref_grid = transformers_video(processor, frames, low, high)
    assert grid == ref_grid and grid[0] == (count + 1) // 2
    assert torch.equal(torch.from_numpy(ours), ref)


def test_two_equal_frames_are_the_image() -> None:
    processor = assets_of("qwen2_5_vl").processor
    frame = random_frames(1, (57, 93))[0]
    low, high = processor.video.min_pixels, processor.video.max_pixels
    video, grid = processor.video_patches([frame, frame], min_pixels=low, max_pixels=high)
    image = processor.image_processor(
        images=[frame], size={"shortest_edge": low, "longest_edge": high}, return_tensors="np"
    )
    assert list(grid) == image["image_grid_thw"][0].tolist()
    assert np.array_equal(video, image["pixel_values"])


def test_frame_sampling_follows_qwen_vl_utils() -> None:
    sampling = FrameSampling(fps=2.0, min_frames=4, max_frames=768, temporal_patch_size=2)
    assert num_frames(7, 4.0, sampling) == 4  # 3.5 wanted, at least 4
    assert num_frames(300, 30.0, sampling) == 20  # 10 s at 2 fps
    assert num_frames(300, 30.0, FrameSampling(max_frames=9)) == 8  # even, <= max
    assert num_frames(1, 30.0, sampling) == 1  # padded to a patch by the processor
    assert sample_indices(7, 4) == [0, 2, 4, 6]
    assert sample_indices(3, 8) == [0, 1, 2]


def test_video_file_and_frame_list(video_dir: Path) -> None:
    conv = parse_conversation(
        chat(
            [
                {"type": "video", "video": "clip.mp4", "max_frames": 2},
                {"type": "video", "video": ["f0.png", "f1.png", "f2.png"], "fps": 1},
            ],
            "ok",
            video_dir,
        )
    )
    file_part, frames_part = conv.videos
    assert file_part == VideoPart(path=video_dir / "clip.mp4", max_frames=2)
    clip = read_clip(file_part, FrameSampling())
    assert clip.indices == [0, 6] and clip.total == 7 and clip.source_fps == 4.0
    assert [f.size for f in clip.frames] == [(90, 60)] * 2
    # Matroska keeps no frame count: the packets are counted instead
    mkv = read_clip(VideoPart(path=write_video(video_dir / "clip.mkv", frames=9)), FrameSampling())
    assert mkv.indices == [0, 3, 5, 8] and mkv.total == 9
    listed = read_clip(frames_part, FrameSampling())
    assert listed.indices == [0, 1, 2] and listed.sample_fps == 1.0
    assert conv.to_messages()[0]["content"][:2] == [
        {"type": "video", "video": str(video_dir / "clip.mp4"), "max_frames": 2},
        {"type": "video", "video": [str(video_dir / f"f{i}.png") for i in range(3)], "fps": 1.0},
    ]
    bad = {
        "fps: must be a positive number": {"video": "a.mp4", "fps": 0},
        "max_frames: must be a positive number": {"video": "a.mp4", "max_frames": 2.5},
        "video frames must be paths": {"video": [{"bytes": b"x", "path": "f0.png"}]},
        "video frame list is empty": {"video": []},
    }
    for message, part in bad.items():
        with pytest.raises(SampleError, match=message):
            parse_conversation(chat([{"type": "video", **part}], "x", video_dir))


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_mrope_positions_equal_get_rope_index(family: str, video_dir: Path) -> None:
    adapter = ADAPTERS[family]()
    config = model_config(family, options=VIDEO_OPTIONS)
    assets = adapter.build_assets(config)
    torch.manual_seed(0)
    model = adapter.build_model(config)
    sample = chat(
        [
            {"type": "image", "image": "img.png"},
            {"type": "text", "text": "First"},
            {"type": "video", "video": "clip.mp4"},
            {"type": "video", "video": ["f0.png", "f1.png", "f2.png"], "fps": 1},
            {"type": "text", "text": "Which?"},
        ],
        "the second",
        video_dir,
    )
    feat = adapter.transform(sample, assets, max_seq_len=4096)
    media = feat.media
    assert media["video_grid_thw"].tolist() == [[2, 4, 6], [2, 4, 4]]
    assert ("second_per_grid_ts" in media) == (family == "qwen2_5_vl")
    types = feat.token_fields["mm_token_type_ids"]
    assert set(types.tolist()) == {0, 1, 2}
    ref, _ = model.model.get_rope_index(
        feat.input_ids[None],
        mm_token_type_ids=types[None],
        image_grid_thw=media["image_grid_thw"],
        video_grid_thw=media["video_grid_thw"],
        second_per_grid_ts=media.get("second_per_grid_ts"),
    )
    assert torch.equal(feat.position_ids[1:], ref[:, 0])
    if family == "qwen3_vl":  # a timestamp and a vision span per temporal patch
        text = assets.tokenizer.decode(feat.input_ids.tolist())
        stamps = ["<0.2 seconds>", "<1.2 seconds>", "<0.5 seconds>", "<2.0 seconds>"]
        spans = [f"{s}<|vision_start|>" for s in stamps]
        assert all(span in text for span in spans) and text.count("<|vision_start|>") == 5
    if family == "qwen2_5_vl":  # 2 s per patch at 1 fps: temporal rows are seconds apart
        assert media["second_per_grid_ts"].tolist() == [0.875, 2.0]
        video = feat.position_ids[1, types == 2]
        assert video.unique().numel() == 4 and int(video.max() - video.min()) > 1
    # the model runs on it: the pixels and tokens agree
    with torch.no_grad():
        out = model(**micro_batch([feat], "packed").model_inputs, use_cache=False)
    assert torch.isfinite(out.logits).all()


def test_packed_equals_padded_with_videos(video_dir: Path) -> None:
    adapter = ADAPTERS["qwen2_5_vl"]()
    config = model_config("qwen2_5_vl", options=VIDEO_OPTIONS)
    assets = adapter.build_assets(config)
    torch.manual_seed(0)
    model = adapter.build_model(config)
    samples = [
        chat([{"type": "video", "video": "clip.mp4"}, "Moving?"], "yes", video_dir),
        chat("No video here.", "fine", video_dir),
        chat(
            [
                {"type": "video", "video": ["f0.png", "f1.png", "f2.png"]},
                {"type": "image", "image": "img.png"},
                "Same?",
            ],
            "no",
            video_dir,
        ),
    ]
    feats = [adapter.transform(s, assets, max_seq_len=4096) for s in samples]
    results = {
        kind: loss_and_grads(model, micro_batch(feats, kind)) for kind in ("packed", "padded")
    }
    padded = results.pop("padded")
    assert any("visual.blocks" in name for name in padded[1])  # the video pixels reach the loss
    assert_same_loss_and_grads(results, padded)


def test_sample_without_video_support_is_bad_format(video_dir: Path) -> None:
    from hyper_core.data.chat import QWEN_CHATML
    from hyper_core.data.multimodal import tokenize_multimodal

    class ImagesOnly:
        tokenizer = assets_of("qwen2_vl").tokenizer

    sample = chat([{"type": "video", "video": "clip.mp4"}, "hi"], "x", video_dir)
    with pytest.raises(SampleError, match="takes none") as info:
        tokenize_multimodal(sample, ImagesOnly(), QWEN_CHATML, max_seq_len=512)  # type: ignore[arg-type]
    assert info.value.reason == "bad_format"


def test_generation_prompt_keeps_the_video_and_its_settings(video_dir: Path) -> None:
    adapter = ADAPTERS["qwen2_5_vl"]()
    assets = assets_of("qwen2_5_vl")
    part = {"type": "video", "video": "clip.mp4", "max_frames": 2}
    sample = chat([part, "Moving?"], "yes", video_dir)
    trained = adapter.transform(sample, assets, max_seq_len=4096)
    prompt, _ = parse_conversation(sample).prompt_and_answer()
    features = adapter.generation_prompt(prompt, assets).features
    assert features.media["video_grid_thw"].tolist() == [[1, 4, 6]]  # 2 frames: 1 patch
    assert torch.equal(features.media["pixel_values_videos"], trained.media["pixel_values_videos"])
    assert torch.equal(features.input_ids, trained.input_ids[: features.length])


def test_video_patches_count_as_vision_flops(video_dir: Path) -> None:
    adapter = ADAPTERS["qwen2_5_vl"]()
    config = model_config("qwen2_5_vl", options=VIDEO_OPTIONS)
    assets = adapter.build_assets(config)
    model = adapter.build_model(config, device="meta")
    contents = {
        "video": [{"type": "video", "video": ["f0.png", "f0.png", "f0.png"]}, "What?"],
        "image": [{"type": "image", "image": "f0.png"}, "What?"],
    }
    grids, flops = {}, {}
    for name, content in contents.items():
        feat = adapter.transform(chat(content, "x", video_dir), assets, max_seq_len=4096)
        grids[name] = feat.media[f"{name}_grid_thw"].tolist()
        flops[name] = adapter.flops(model, micro_batch([feat], "packed")).vision
    assert grids == {"video": [[2, 4, 4]], "image": [[1, 4, 4]]}
    # two temporal patches, each attended on its own like one image
    assert flops["video"] == pytest.approx(2 * flops["image"])
