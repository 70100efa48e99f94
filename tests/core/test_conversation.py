"""Normalising sample formats into a Conversation, and lazy image loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from hyper_core.data.conversation import (
    ImagePart,
    TextPart,
    load_image,
    parse_conversation,
)
from hyper_core.data.errors import SampleError


def _src(tmp_path: Path) -> dict:
    return {"_source": {"file": str(tmp_path / "sub" / "data.jsonl"), "line": 3}}


def test_string_content_messages() -> None:
    conv = parse_conversation(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
            ]
        }
    )
    assert [m.role for m in conv.messages] == ["system", "user", "assistant"]
    assert conv.messages[2].parts == [TextPart("Hello")]
    assert conv.num_images == 0


def test_content_list_images_resolve_against_the_jsonl_dir(tmp_path: Path) -> None:
    sample = {
        **_src(tmp_path),
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "img/a.png"},
                    {"type": "text", "text": "What?"},
                    {"type": "image", "image": "/abs/b.png"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
        ],
    }
    conv = parse_conversation(sample)
    parts = conv.messages[0].parts
    assert isinstance(parts[0], ImagePart) and parts[0].path == tmp_path / "sub" / "img" / "a.png"
    assert parts[1] == TextPart("What?")
    assert parts[2].path == Path("/abs/b.png")
    assert parse_conversation(sample, base_dir=tmp_path).images[0].path == tmp_path / "img/a.png"


def test_llava_placeholders_filled_in_order(tmp_path: Path) -> None:
    sample = {
        **_src(tmp_path),
        "images": ["one.png", "two.png"],
        "messages": [
            {"role": "user", "content": "<image>\nCompare with <image> please"},
            {"role": "assistant", "content": "same"},
        ],
    }
    parts = parse_conversation(sample).messages[0].parts
    assert [type(p).__name__ for p in parts] == ["ImagePart", "TextPart", "ImagePart", "TextPart"]
    assert parts[0].path.name == "one.png" and parts[2].path.name == "two.png"
    assert parts[1].text == "\nCompare with " and parts[3].text == " please"


@pytest.mark.parametrize("images", [["a.png"], ["a.png", "b.png", "c.png"], []])
def test_llava_count_mismatch(images: list[str]) -> None:
    sample = {
        "images": images,
        "messages": [
            {"role": "user", "content": "<image> and <image>"},
            {"role": "assistant", "content": "x"},
        ],
    }
    with pytest.raises(SampleError) as info:
        parse_conversation(sample)
    assert info.value.reason == "image_token_mismatch"


def test_prompt_completion_sharegpt_and_system() -> None:
    conv = parse_conversation({"prompt": "2+2?", "completion": "4", "system": "Math."})
    assert [(m.role, m.text) for m in conv.messages] == [
        ("system", "Math."),
        ("user", "2+2?"),
        ("assistant", "4"),
    ]
    conv = parse_conversation(
        {
            "image": "x.png",
            "conversations": [
                {"from": "human", "value": "<image>What is it?"},
                {"from": "gpt", "value": "a cat"},
            ],
        }
    )
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.images[0].path == Path("x.png")
    prompt, answer = conv.prompt_and_answer()
    assert answer == "a cat" and [m.role for m in prompt.messages] == ["user"]


@pytest.mark.parametrize(
    "sample",
    [
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]},
        {"messages": []},
        {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "y"}]},
        {"text": "no conversation here"},
        {"prompt": "only a prompt"},
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
    ],
)
def test_bad_format(sample: dict) -> None:
    with pytest.raises(SampleError) as info:
        parse_conversation(sample)
    assert info.value.reason == "bad_format"


def test_deferred_error_is_raised() -> None:
    with pytest.raises(SampleError) as info:
        parse_conversation({"_error": ("invalid_json", "Expecting value")})
    assert info.value.reason == "invalid_json"


def test_to_messages_roundtrip_shape() -> None:
    conv = parse_conversation(
        {
            "images": ["p.png"],
            "messages": [
                {"role": "user", "content": "<image>Hi"},
                {"role": "assistant", "content": "Yo"},
            ],
        },
        base_dir="/data",
    )
    assert conv.to_messages() == [
        {
            "role": "user",
            "content": [{"type": "image", "image": "/data/p.png"}, {"type": "text", "text": "Hi"}],
        },
        {"role": "assistant", "content": "Yo"},
    ]


def test_load_image_rgb_missing_and_corrupt(tmp_path: Path) -> None:
    gray = tmp_path / "g.png"
    Image.new("L", (5, 4), 128).save(gray)
    img = load_image(ImagePart(path=gray))
    assert img.mode == "RGB" and img.size == (5, 4) and img.getpixel((0, 0)) == (128, 128, 128)

    with pytest.raises(SampleError) as info:
        load_image(ImagePart(path=tmp_path / "missing.png"))
    assert info.value.reason == "missing_image" and "missing.png" in info.value.message

    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    with pytest.raises(SampleError) as info:
        load_image(ImagePart(path=bad))
    assert info.value.reason == "corrupt_image" and "bad.png" in info.value.message

    rgba = Image.new("RGBA", (2, 2), (1, 2, 3, 4))
    assert load_image(ImagePart(image=rgba)).mode == "RGB"
