"""Processor exports serve stock transformers: processor_config.json, a chat template that
follows the ChatFormat (role prefixes, image placeholders), and an inference ``__call__`` that
expands images as training does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from hyper_core.adapters.processor import ImageTextProcessor
from hyper_core.data.chat import QWEN_CHATML, ChatFormat, tokenize_conversation
from hyper_core.data.conversation import parse_conversation
from hyper_core.data.multimodal import tokenize_multimodal
from hyper_core.data.tokenizer import build_offline_tokenizer

SPECIALS = ("<|im_start|>", "<image>", "<img>", "<row>", "<tile>")
USER_ASSISTANT = ChatFormat(
    message_prefix="{role}: ",
    message_suffix="<end_of_utterance>\n",
    bos="<|im_start|>",
    role_prefixes={"user": "User:", "assistant": "Assistant:"},
)


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_offline_tokenizer(special_tokens=(*SPECIALS, "<end_of_utterance>"))


def _sample(image: Path | None = None, *, system: bool = False) -> dict[str, Any]:
    question: Any = "What colour is it?"
    if image is not None:
        question = [{"type": "image", "image": str(image)}, {"type": "text", "text": question}]
    messages = [{"role": "system", "content": "Be brief."}] if system else []
    messages += [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "yes"},
    ]
    return {"messages": messages}


def test_role_prefixes_render_and_the_saved_template_gives_the_training_text(
    tok, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    conv = parse_conversation(_sample(system=True))
    text = USER_ASSISTANT.render(conv)
    assert text == (
        "<|im_start|>system: Be brief.<end_of_utterance>\n"
        "User:What colour is it?<end_of_utterance>\nAssistant:red<end_of_utterance>\n"
        "User:Sure?<end_of_utterance>\nAssistant:yes<end_of_utterance>\n"
    )
    tok.chat_template = USER_ASSISTANT.chat_template
    tok.save_pretrained(str(tmp_path))
    saved = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert saved.apply_chat_template(conv.to_messages(), tokenize=False) == text
    prompt, _ = conv.prompt_and_answer()
    rendered = saved.apply_chat_template(
        prompt.to_messages(), tokenize=False, add_generation_prompt=True
    )
    assert rendered == USER_ASSISTANT.render(prompt, add_generation_prompt=True)
    assert rendered.endswith("Sure?<end_of_utterance>\nAssistant:")
    # the loss stays on the assistant's content and end token, never on "Assistant:"
    ids = tokenize_conversation(conv, tok, USER_ASSISTANT, max_seq_len=512)
    targets = [tok.decode([t]) for t in ids.labels if t != -100]
    assert "".join(targets) == "red<end_of_utterance>yes<end_of_utterance>"


def test_role_prefixes_reject_an_unknown_role() -> None:
    with pytest.raises(ValueError, match="unknown roles \\['bot'\\]"):
        ChatFormat(message_prefix="", message_suffix="\n", role_prefixes={"bot": "Bot:"})


class _Bracketed(ChatFormat):
    """Overrides ``prefix`` instead of using ``role_prefixes``."""

    def prefix(self, role: str) -> str:
        return f"[{role.upper()}] "


def test_the_template_follows_an_overridden_prefix(tok) -> None:
    fmt = _Bracketed(message_prefix="{role}: ", message_suffix="\n", default_system="Hi.")
    conv = parse_conversation(_sample())
    tok.chat_template = fmt.chat_template
    assert tok.apply_chat_template(conv.to_messages(), tokenize=False) == fmt.render(conv)
    assert fmt.render(conv).startswith("[SYSTEM] Hi.\n[USER] What colour")


def test_a_plain_format_keeps_its_template_output(tok) -> None:
    conv = parse_conversation(_sample(system=True))
    tok.chat_template = QWEN_CHATML.chat_template
    assert tok.apply_chat_template(conv.to_messages(), tokenize=False) == QWEN_CHATML.render(conv)


class _GridProcessor(ImageTextProcessor):
    """An image is ``<tile>`` + ``<img>`` × n/2 + ``<row>`` + ``<img>`` × n/2, written as
    ``<image>`` in prompts (a tile-grid layout, like Idefics3's)."""

    image_token = "<img>"

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        super().__init__(image_processor, tokenizer)
        self.ids = {t: int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIALS}
        self.image_token_id = self.ids["<img>"]

    @property
    def image_placeholder(self) -> str:
        return "<image>"

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        pixels = [torch.full((3, 2, 2), float(i)) for i in range(len(images))]
        return {"pixel_values": torch.stack(pixels)}

    def image_token_counts(self, media: dict[str, torch.Tensor]) -> list[int]:
        return [4] * len(media["pixel_values"])

    def image_token_ids(self, num_tokens: int) -> list[int]:
        half = [self.ids["<img>"]] * (num_tokens // 2)
        return [self.ids["<tile>"], *half, self.ids["<row>"], *half]


def test_inference_call_expands_images_as_training_does(tok, tmp_path: Path) -> None:
    image = tmp_path / "red.png"
    Image.new("RGB", (8, 6), (255, 0, 0)).save(image)
    tok.chat_template = USER_ASSISTANT.template(image="<image>")
    proc = _GridProcessor(object(), tok)
    sample = _sample(image)
    trained = tokenize_multimodal(sample, proc, USER_ASSISTANT, max_seq_len=512)
    conv = parse_conversation(sample)
    text = proc.apply_chat_template(conv.to_messages())
    assert text.startswith("<|im_start|>User:<image>What colour")
    got = proc(text, images=[Image.open(image)])
    assert got["input_ids"][0].tolist() == trained.input_ids.tolist()
    assert torch.equal(got["pixel_values"], trained.media["pixel_values"])
    # a batch, padded
    both = proc([text, "User:<image>"], images=[Image.open(image)] * 2, padding=True)
    assert both["input_ids"].shape == (2, len(trained.input_ids))
    assert both["attention_mask"][1].sum() == len(tok.encode("User:")) + 1 + 4 + 1
    with pytest.raises(ValueError, match="1 images but 0 '<image>' in the text"):
        proc("no image here", images=[Image.open(image)])


class _ClipProcessor(ImageTextProcessor):
    """LLaVA-shaped: ``<image>`` × the tower's patches, loaded back as ``LlavaProcessor``."""

    image_token = "<image>"
    processor_class = "LlavaProcessor"

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        super().__init__(image_processor, tokenizer)
        self.image_token_id = int(tokenizer.convert_tokens_to_ids("<image>"))

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        out = self.image_processor(list(images), return_tensors="pt")
        return {"pixel_values": out["pixel_values"]}

    def image_token_counts(self, media: dict[str, torch.Tensor]) -> list[int]:
        return [(28 // 7) ** 2] * len(media["pixel_values"])

    def image_token_ids(self, num_tokens: int) -> list[int]:
        return [self.image_token_id] * num_tokens

    def processor_fields(self) -> dict[str, Any]:
        return {
            "patch_size": 7,
            "num_additional_image_tokens": 1,
            "vision_feature_select_strategy": "default",
        }


def test_save_pretrained_writes_what_autoprocessor_needs(tok, tmp_path: Path) -> None:
    from transformers import AutoProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image = tmp_path / "red.png"
    Image.new("RGB", (40, 30), (255, 0, 0)).save(image)
    tok.chat_template = QWEN_CHATML.template(image="<image>")
    clip = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    proc = _ClipProcessor(clip, tok)
    out = tmp_path / "export"
    proc.save_pretrained(out)
    assert json.loads((out / "processor_config.json").read_text()) == {
        "processor_class": "LlavaProcessor",
        "patch_size": 7,
        "num_additional_image_tokens": 1,
        "vision_feature_select_strategy": "default",
    }
    stock = AutoProcessor.from_pretrained(str(out), local_files_only=True)
    assert type(stock).__name__ == "LlavaProcessor"
    sample = _sample(image)
    trained = tokenize_multimodal(sample, proc, QWEN_CHATML, max_seq_len=512)
    messages = parse_conversation(sample).to_messages()
    text = stock.apply_chat_template(messages, tokenize=False)
    got = stock(text=[text], images=[Image.open(image)], return_tensors="pt")
    assert got["input_ids"][0].tolist() == trained.input_ids.tolist()
    assert torch.equal(got["pixel_values"], trained.media["pixel_values"])


def test_no_processor_config_without_a_stock_class(tok, tmp_path: Path) -> None:
    class Plain(_ClipProcessor):
        processor_class = None

    clip_free = type("NoImages", (), {"save_pretrained": lambda self, out: None})()
    Plain(clip_free, tok).save_pretrained(tmp_path)
    assert not (tmp_path / "processor_config.json").exists()
    assert (tmp_path / "tokenizer_config.json").is_file()


class _TiledProcessor(ImageTextProcessor):
    """A variable tile grid per image: a wide image is 1 × 2 tiles, a tall one 2 × 1, a square
    one 1 × 1; tiles along dim 0, the grid as metadata, 2 features per tile."""

    image_token = "<img>"
    metadata_keys = ("rows", "cols")

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(None, tokenizer)
        self.ids = {t: int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIALS}
        self.image_token_id = self.ids["<img>"]

    @property
    def image_placeholder(self) -> str:
        return "<image>"

    def process_images(self, images: Sequence[Image.Image]) -> dict[str, Any]:
        grids = [(1 + (im.height > im.width), 1 + (im.width > im.height)) for im in images]
        tiles = [
            torch.full((3, 2, 2), float(i)) for i, (r, c) in enumerate(grids) for _ in range(r * c)
        ]
        return {
            "pixel_values": torch.stack(tiles),
            "rows": [r for r, _ in grids],
            "cols": [c for _, c in grids],
        }

    def image_token_counts(self, media: dict[str, Any]) -> list[int]:
        return [2 * r * c for r, c in zip(media["rows"], media["cols"])]

    def expand_image(self, num_tokens: int, metadata: Any) -> list[int]:
        assert num_tokens == 2 * metadata["rows"] * metadata["cols"]
        tile = [self.ids["<tile>"], self.ids["<img>"], self.ids["<img>"]]
        return [*(tile * metadata["cols"] + [self.ids["<row>"]]) * metadata["rows"]]


def test_per_image_metadata_reaches_the_expansion_not_the_model(tok, tmp_path: Path) -> None:
    from hyper_core.batching.padded import concat_media

    wide, tall = tmp_path / "wide.png", tmp_path / "tall.png"
    Image.new("RGB", (20, 10), (255, 0, 0)).save(wide)
    Image.new("RGB", (10, 20), (0, 0, 255)).save(tall)
    tok.chat_template = QWEN_CHATML.template(image="<image>")
    proc = _TiledProcessor(tok)
    content = [
        {"type": "image", "image": str(wide)},
        {"type": "text", "text": "and"},
        {"type": "image", "image": str(tall)},
    ]
    sample = {
        "messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]
    }
    trained = tokenize_multimodal(sample, proc, QWEN_CHATML, max_seq_len=512)
    assert trained.image_metadata == [{"rows": 1, "cols": 2}, {"rows": 2, "cols": 1}]
    assert trained.media.keys() == {"pixel_values"}
    assert trained.image_token_counts == [4, 4]
    text = tok.decode(trained.input_ids.tolist())
    assert (
        "<tile><img><img><tile><img><img><row>and<tile><img><img><row><tile><img><img><row>" in text
    )
    features = trained.features(sample)
    assert features.media.keys() == {"pixel_values"}
    # tiles along dim 0: samples with different tile counts concatenate, no padding
    single = {"messages": [{"role": "user", "content": content[:1]}, sample["messages"][1]]}
    one = tokenize_multimodal(single, proc, QWEN_CHATML, max_seq_len=512).features(single)
    assert concat_media([features, one])["pixel_values"].shape == (4 + 2, 3, 2, 2)
    # inference expands with the same callback
    stock_text = proc.apply_chat_template(parse_conversation(sample).to_messages())
    got = proc(stock_text, images=[Image.open(wide), Image.open(tall)])
    assert got["input_ids"][0].tolist() == trained.input_ids.tolist()
    assert "rows" not in got and "cols" not in got


def test_metadata_needs_one_entry_per_image(tok) -> None:
    proc = _TiledProcessor(tok)
    with pytest.raises(ValueError, match="metadata 'cols': 1 entries for 2 images"):
        proc.image_metadata({"rows": [1, 1], "cols": [1]}, 2)
