"""``hyper-train chat``, :mod:`hyper_core.generation` and :mod:`hyper_core.trained_model` on a
tiny text model.

A tiny model trained until it has memorised one answer must give that answer through every
way of naming the model (run folder, checkpoint, export), one-shot and interactively; the
prompt must be the training tokenisation up to the assistant header, and the answer what a
hand-written greedy loop decodes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.cli import main
from hyper_core.generation import (
    GenerationSettings,
    build_prompt,
    decode,
    generate_answer_ids,
    prompt_conversation,
)
from hyper_core.testing import isolated_host
from hyper_core.trained_model import load_chat_model

QUESTION = "What colour is the sky?"
ANSWER = "blue"

RUN_CONFIG = """
[run]
output_dir = "out"
seed = 0

[model]
adapter = "hf_causal_lm"
config = "tiny-qwen2"

[data]
train = "train.jsonl"
max_seq_len = 64

[training]
steps = 40
global_batch_size = 8
micro_batch_size = 8
lr = 3e-3
warmup_steps = 0

[logging]
every_steps = 10
progress = "none"

[checkpoint]
resume = "none"
export_hf = true
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose tiny model has memorised QUESTION -> ANSWER (about 10 s)."""
    work = tmp_path_factory.mktemp("memorise")
    sample = {
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": ANSWER},
        ]
    }
    (work / "train.jsonl").write_text((json.dumps(sample) + "\n") * 8)
    (work / "cfg.toml").write_text(RUN_CONFIG)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("HYPER_TRAIN_PLUGINS", "")
        assert main(["run", "cfg.toml"]) == 0
    return work / "out"


@pytest.fixture
def core_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "")


@pytest.mark.parametrize(
    "where", ["out", "out/checkpoints/step-40", "out/checkpoints/latest", "out/hf"]
)
def test_chat_answers_what_training_taught(
    where: str, trained: Path, core_only: None, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = main(["chat", str(trained.parent / where), "--prompt", QUESTION])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == f"{ANSWER}\n"


def test_interactive_chat_reads_stdin_until_exit(
    trained: Path,
    core_only: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = f"{QUESTION}\n\n/clear\n{QUESTION}\nexit\n{QUESTION}\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    capsys.readouterr()
    assert main(["chat", str(trained / "hf")]) == 0
    assert capsys.readouterr().out == f"{ANSWER}\n{ANSWER}\n"  # nothing after exit


def test_answer_is_greedy_decoding_of_the_training_prompt(trained: Path) -> None:
    chat = load_chat_model(trained, isolated_host())
    conversation = prompt_conversation([{"role": "user", "content": QUESTION}])
    prompt = build_prompt(chat.adapter, conversation, chat.assets)
    # the prompt is the training tokenisation of the sample up to the assistant header
    sample = {
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": ANSWER},
        ]
    }
    full = chat.adapter.transform(sample, chat.assets, max_seq_len=64)
    n = prompt.features.length
    assert torch.equal(prompt.features.input_ids, full.input_ids[:n])
    assert int(full.labels[n - 1]) != -100 and int(full.labels[n - 2]) == -100
    assert chat.assets.tokenizer.decode(prompt.features.input_ids).endswith(
        "<|im_start|>assistant\n"
    )
    assert prompt.stop_token_ids == (chat.assets.tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    # generate == a greedy loop by hand, up to <|im_end|>
    ids = prompt.features.input_ids[None]
    expected: list[int] = []
    with torch.no_grad():
        for _ in range(8):
            token = int(chat.model(input_ids=ids).logits[0, -1].argmax())
            if token in prompt.stop_token_ids:
                break
            expected.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    settings = GenerationSettings(max_new_tokens=8)
    got = generate_answer_ids(chat.model, prompt, settings, chat.assets)
    assert got == expected and decode(chat.assets, got) == ANSWER
    # a fixed number of forwards (ranks of a sharded model) gives the same answer
    forwards: list[int] = []
    hook = chat.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        fixed = generate_answer_ids(chat.model, prompt, settings, chat.assets, fixed_length=True)
        assert fixed == expected and len(forwards) == settings.max_new_tokens
        forwards.clear()
        assert generate_answer_ids(chat.model, prompt, settings, chat.assets) == expected
        assert len(forwards) == len(expected) + 1  # stopped at <|im_end|>
    finally:
        hook.remove()


def test_system_message_and_history_reach_the_prompt(trained: Path) -> None:
    chat = load_chat_model(trained / "hf", isolated_host())
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": QUESTION},
    ]
    prompt = build_prompt(chat.adapter, prompt_conversation(messages), chat.assets)
    text = chat.assets.tokenizer.decode(prompt.features.input_ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert f"Hello<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chat", "{out}/nowhere", "--prompt", "hi"], "{out}/nowhere: no such checkpoint"),
        (["chat", "{out}", "--image", "nope.png", "--prompt", "hi"], "--image nope.png: no such"),
        (["chat", "{out}/checkpoints", "--config", "no.toml", "--prompt", "hi"], "no.toml: no"),
        (["chat", "{out}", "--max-new-tokens", "0", "--prompt", "hi"], "--max-new-tokens"),
    ],
)
def test_chat_user_errors_are_one_line(
    args: list[str],
    message: str,
    trained: Path,
    core_only: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    code = main([a.format(out=trained) for a in args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("hyper-train: error: ") and "Traceback" not in err
    assert message.format(out=trained) in lines[-1]


def test_an_image_for_a_text_model_is_a_user_error(
    trained: Path, tmp_path: Path, core_only: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(image)
    capsys.readouterr()
    code = main(["chat", str(trained), "--image", str(image), "--prompt", QUESTION])
    err = capsys.readouterr().err
    assert code == 2 and "hyper-train: error: prompt: bad_format" in err, err


def test_the_deprecated_module_warns_and_reexports() -> None:
    import importlib
    import sys

    sys.modules.pop("hyper_core.inference", None)
    with pytest.warns(DeprecationWarning, match="hyper_core.generation"):
        old = importlib.import_module("hyper_core.inference")
    assert old.load_chat_model is load_chat_model
    assert old.GenerationSettings is GenerationSettings
