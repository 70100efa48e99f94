"""``hyper-train chat`` and ``predict`` (and ``export``) from every way of naming a trained
model, full fine-tuning and LoRA alike: the run folder, ``checkpoints/step-N``, the ``latest``
pointer and an export (for LoRA the adapter directory of a base built from a named config,
which records its run's config). Each gives the trained model's logits and its answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from peft_helpers import lora_config, train, write_toml

from hyper_core.cli import main
from hyper_core.generation import ChatModel, GenerationSettings
from hyper_core.plugins import get_plugin_host
from hyper_core.testing import run_tiny_training, tiny_text_config
from hyper_core.trained_model import load_chat_model

IDS = torch.arange(3, 40)[None]
PROMPT = "Tell me a story."
KINDS = ("full", "lora")
WHERES = ("run", "step", "latest", "export")


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def _greedy(model: Any) -> list[int]:
    """Six greedy tokens whatever they are (the 2-step models answer the chat prompt with the
    end-of-turn token at once, so the CLI's answers are empty)."""
    with torch.no_grad():
        out = model.eval().generate(
            input_ids=IDS[:, :8], max_new_tokens=6, min_new_tokens=6, do_sample=False
        )
    return [int(t) for t in out[0, 8:]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """A 2-step run of each kind, its export (of ``latest``), its trained model's logits and
    answer; for LoRA also the untrained base's logits."""
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        work = tmp_path_factory.mktemp(kind)
        training = {"steps": 2, "lr": 2e-2}
        if kind == "lora":
            raw = lora_config(work / "run", training=training)
            run = train(raw)
        else:
            raw = tiny_text_config(work / "run", training=training)
            run = run_tiny_training(raw)
        write_toml(raw, work / "run" / "config.toml")  # as `hyper-train run` writes it
        model = run.trainer.unwrapped_model
        export = work / "export"
        assert main(["export", str(work / "run/checkpoints/latest"), "--out", str(export)]) == 0
        chat = ChatModel(
            adapter=run.trainer.adapter,
            model=model,
            assets=run.trainer.adapter.build_assets(run.trainer.config.model),
        )
        answer = chat.answer(
            [{"role": "user", "content": PROMPT}], GenerationSettings(max_new_tokens=6)
        )
        paths = {
            "run": work / "run",
            "step": work / "run/checkpoints/step-2",
            "latest": work / "run/checkpoints/latest",
            "export": export,
        }
        out[kind] = {
            "paths": paths,
            "logits": _logits(model),
            "greedy": _greedy(model),
            "answer": answer,
        }
    return out


def test_the_lora_runs_adapters_change_the_model(runs: dict[str, dict[str, Any]]) -> None:
    """What the LoRA cases compare is not the base alone: without the adapters (B = 0) the
    logits differ."""
    loaded = load_chat_model(runs["lora"]["paths"]["step"], get_plugin_host(), device="cpu")
    with torch.no_grad():
        for name, param in loaded.model.named_parameters():
            if ".lora_B." in name:
                param.zero_()
    assert (_logits(loaded.model) - runs["lora"]["logits"]).abs().max() > 1e-3


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("kind", KINDS)
def test_chat_answers_with_the_trained_model(
    kind: str, where: str, runs: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs[kind]
    path = run["paths"][where]
    loaded = load_chat_model(path, get_plugin_host(), device="cpu")
    torch.testing.assert_close(_logits(loaded.model), run["logits"], atol=1e-5, rtol=1e-5)
    assert _greedy(loaded.model) == run["greedy"]
    capsys.readouterr()
    code = main(["chat", str(path), "--prompt", PROMPT, "--max-new-tokens", "6"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out == f"{run['answer']}\n"


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("kind", KINDS)
def test_predict_answers_with_the_trained_model(
    kind: str,
    where: str,
    runs: dict[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = runs[kind]
    data = tmp_path / "test.jsonl"
    turns = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "once"}]
    data.write_text(json.dumps({"messages": turns}) + "\n")
    out = tmp_path / "preds.jsonl"
    capsys.readouterr()
    path = str(run["paths"][where])
    code = main(["predict", path, "--data", str(data), "--out", str(out), "--max-new-tokens=6"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["prediction"] == run["answer"] and record["reference"] == "once"


@pytest.mark.parametrize("command", ["chat", "export"])
def test_a_broken_latest_pointer_names_its_step(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latest = tmp_path / "checkpoints" / "latest"
    latest.parent.mkdir(parents=True)
    latest.write_text("step-9\n")
    (tmp_path / "checkpoints" / "step-9").mkdir()  # never completed
    args = ["--prompt", "hi"] if command == "chat" else ["--out", str(tmp_path / "x")]
    capsys.readouterr()
    code = main([command, str(latest), *args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"hyper-train: error: {latest}: points to 'step-9' ({latest.parent / 'step-9'}), "
        "which is not a complete checkpoint (no COMPLETE marker); pass a checkpoints/step-N "
        "folder or the run's output_dir"
    ]


def test_the_adapter_export_says_how_to_rebuild_its_base(
    runs: dict[str, dict[str, Any]],
) -> None:
    export = runs["lora"]["paths"]["export"]
    recorded = json.loads((export / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] is None  # a named config: no weights to name
    readme = (export / "README.md").read_text()
    assert "`tiny-qwen2` with the random init of `[run] seed = 0`" in readme
    assert (export / "hyper_train.toml").is_file() and (export / "tokenizer.json").is_file()


def test_a_lora_checkpoint_loaded_as_a_full_model_is_a_user_error(
    runs: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint of adapters with a config that sets no [peft] (the core loads it in full):
    one line, exit 2, no traceback."""
    step = runs["lora"]["paths"]["step"]
    config = runs["full"]["paths"]["run"] / "config.toml"
    capsys.readouterr()
    code = main(["chat", str(step), "--config", str(config), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"hyper-train: error: {step}: ") and "holds part of the model" in line


def test_a_lora_checkpoint_without_the_plugin_names_its_section(
    runs: dict[str, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYPER_TRAIN_PLUGINS", "")
    capsys.readouterr()
    code = main(["chat", str(runs["lora"]["paths"]["step"]), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "$.peft: section of plugin hyper-train-peft" in err
