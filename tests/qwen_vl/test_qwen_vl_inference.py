"""Inference: the processor's left-padded ``generate``, the adapter's generation prompt,
``hyper-train chat`` on an export, and the user guide's plain-transformers snippet."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from qwen_vl_helpers import ADAPTERS, cached_assets, model_config

from hyper_core.adapters.base import ModelAssets
from hyper_core.cli import main
from hyper_core.generation import GenerationSettings, build_prompt, prompt_conversation
from hyper_core.testing import isolated_host
from hyper_core.trained_model import load_chat_model
from hyper_qwen_vl.adapters import QwenVLAdapter


def test_left_padded_batch_matches_single(assets: ModelAssets, tiny_model: torch.nn.Module) -> None:
    proc = assets.processor
    side = proc.tokenizer.padding_side
    proc.tokenizer.padding_side = "left"
    try:
        conversations = [
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Shape?"}]}],
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Describe"}, {"type": "image"}],
                }
            ],
        ]
        images = [
            Image.new("RGB", (93, 57), (255, 0, 0)),
            Image.new("RGB", (112, 112), (0, 0, 255)),
        ]
        texts = [proc.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        assert texts[0].endswith("<|im_start|>assistant\n")
        batch = proc(text=texts, images=images, padding=True)
        assert (batch["attention_mask"][:, 0] == 0).any()  # one prompt is left-padded
        tiny_model.eval()
        with torch.no_grad():
            # the model computes its own mRoPE positions from mm_token_type_ids here
            batched = tiny_model(**batch).logits[:, -1]
            for i, (text, image) in enumerate(zip(texts, images)):
                single = tiny_model(**proc(text=text, images=[image])).logits[0, -1]
                assert torch.allclose(batched[i], single, atol=1e-4)
            out = tiny_model.generate(**batch, max_new_tokens=3, do_sample=False)
        assert out.shape == (2, batch["input_ids"].shape[1] + 3)
    finally:
        proc.tokenizer.padding_side = side


# -- the generation prompt, hyper-train chat and the user guide's transformers snippet ----------

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user-guide.md"
QUESTION = "What colour is the shape?"
QUESTION_PART = {"type": "text", "text": QUESTION}


def guide_snippet() -> str:
    """The python block of the user guide's "Inference with transformers" section."""
    section = GUIDE.read_text().split("### Inference with transformers", 1)[1]
    match = re.search(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    assert match, "no python block in 'Inference with transformers'"
    return match.group(1)


def test_generation_prompt_is_the_training_prefix(
    family: str, adapter: QwenVLAdapter, assets: ModelAssets, image_dir: Path
) -> None:
    user = [{"type": "image", "image": str(image_dir / "odd.png")}, {"type": "text", "text": "Hi"}]
    history = [
        {"role": "user", "content": "Before"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": user},
    ]
    full = adapter.transform(
        {"messages": [*history, {"role": "assistant", "content": "a red circle"}]},
        assets,
        max_seq_len=4096,
    )
    prompt = adapter.generation_prompt(prompt_conversation(history), assets)
    f = prompt.features
    n = f.length
    assert torch.equal(f.input_ids, full.input_ids[:n])
    assert torch.equal(f.position_ids, full.position_ids[:, :n])
    types = full.token_fields["mm_token_type_ids"]
    assert torch.equal(f.token_fields["mm_token_type_ids"], types[:n])
    assert all(torch.equal(f.media[k], v) for k, v in full.media.items())
    assert (f.labels == -100).all()
    assert assets.tokenizer.decode(f.input_ids).endswith("Hi<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.stop_token_ids == (assets.tokenizer.convert_tokens_to_ids("<|im_end|>"),)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-VL export whose (perturbed) weights answer something."""
    adapter = ADAPTERS["qwen2_5_vl"]()
    torch.manual_seed(0)
    model = adapter.build_model(model_config("qwen2_5_vl"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    out = tmp_path_factory.mktemp("export") / "hf"
    adapter.export_hf(model.state_dict(), model.config, out, assets=cached_assets("qwen2_5_vl"))
    return out


def test_guide_snippet_runs_without_torchvision(
    export: Path,
    image_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copy(image_dir / "odd.png", tmp_path / "shape.png")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "torchvision", None)  # importing it fails
    code = guide_snippet()
    assert '"runs/qwen2_5_vl_demo/hf"' in code
    namespace: dict[str, Any] = {}
    capsys.readouterr()
    exec(code.replace('"runs/qwen2_5_vl_demo/hf"', repr(str(export))), namespace)
    printed = capsys.readouterr().out.strip()
    # the same inputs as hyper-train's own prompt (so the same positions), the same answer
    chat = load_chat_model(export, isolated_host(["hyper_qwen_vl.plugin"]))
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "shape.png"}, QUESTION_PART]}
    ]
    prompt = build_prompt(chat.adapter, prompt_conversation(messages), chat.assets)
    f = prompt.features
    inputs, vision = namespace["inputs"], namespace["vision"]
    assert torch.equal(inputs["input_ids"][0], f.input_ids)
    assert torch.equal(inputs["mm_token_type_ids"][0], f.token_fields["mm_token_type_ids"])
    assert torch.equal(vision["image_grid_thw"], f.media["image_grid_thw"])
    assert torch.allclose(vision["pixel_values"].float(), f.media["pixel_values"])
    answer = chat.answer(messages, GenerationSettings(max_new_tokens=32))
    assert answer and printed == answer


def test_chat_command_on_a_vl_export(
    export: Path, image_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = str(image_dir / "square.png")
    capsys.readouterr()
    assert main(["chat", str(export), "--image", image, "--prompt", QUESTION]) == 0
    printed = capsys.readouterr().out
    chat = load_chat_model(export, isolated_host(["hyper_qwen_vl.plugin"]))
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, QUESTION_PART]}]
    assert printed == chat.answer(messages) + "\n"
