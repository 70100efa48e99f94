"""Resume only into the same model: ``model.json`` in every checkpoint, checked before loading;
a resumed run keeps the first run's ``config.toml`` and writes ``config.step-N.toml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hyper_core.checkpoint import MODEL_FILE, ModelIdentity, run_config_for
from hyper_core.config import dump_config, load_config_dict
from hyper_core.errors import UserError
from hyper_core.testing import isolated_host, read_metrics, run_tiny_training, tiny_text_config
from hyper_core.testing.processes import hyper_train


def _config(out: Path, steps: int, **sections: Any) -> dict[str, Any]:
    checkpoint = {"every_steps": 2, "keep_last": None, "resume": "auto"}
    training = {"steps": steps, **sections.pop("training", {})}
    return tiny_text_config(out, training=training, checkpoint=checkpoint, **sections)


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-qwen2 run with checkpoints at steps 2 and 4 (copy it before resuming)."""
    out = tmp_path_factory.mktemp("qwen") / "run"
    run_tiny_training(_config(out, 4))
    return out


def _copy(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to


def test_a_checkpoint_records_its_model(qwen_run: Path) -> None:
    identity = ModelIdentity.from_json(
        (qwen_run / "checkpoints" / "step-4" / MODEL_FILE).read_text()
    )
    assert identity.adapter == "hf_causal_lm"
    assert identity.architecture == "Qwen2ForCausalLM"
    assert identity.config is not None and identity.config["model_type"] == "qwen2"
    assert "transformers_version" not in identity.config
    assert identity.shapes["model.layers.0.mlp.up_proj.weight"] == [128, 64]


def test_resuming_into_another_architecture_names_it(qwen_run: Path, tmp_path: Path) -> None:
    out = _copy(qwen_run, tmp_path / "run")
    before = (out / "metrics.jsonl").read_text()
    llama = _config(out, 6, model={"config": "tiny-llama"})
    with pytest.raises(UserError) as err:
        run_tiny_training(llama)
    message = str(err.value)
    assert message.startswith(f"$.model: checkpoint {out / 'checkpoints' / 'step-4'} holds ")
    assert "architecture Qwen2ForCausalLM → LlamaForCausalLM" in message
    assert "model_type 'qwen2' → 'llama'" in message
    assert "model.layers.0.self_attn.k_proj.bias [32] → (absent)" in message
    assert 'resume = "none", or another output_dir' in message
    assert (out / "metrics.jsonl").read_text() == before  # not a step trained


def test_resuming_with_another_hidden_size_names_the_shapes(qwen_run: Path, tmp_path: Path) -> None:
    out = _copy(qwen_run, tmp_path / "run")
    wider = _config(out, 6, model={"hf_overrides": {"hidden_size": 96}})
    with pytest.raises(UserError) as err:
        run_tiny_training(wider)
    assert "(config hidden_size 64 → 96; parameters lm_head.weight [1024, 64] → [1024, 96]" in str(
        err.value
    )


def test_an_old_checkpoint_without_an_identity_still_resumes(
    qwen_run: Path, tmp_path: Path
) -> None:
    out = _copy(qwen_run, tmp_path / "run")
    (out / "checkpoints" / "step-4" / MODEL_FILE).unlink()
    run = run_tiny_training(_config(out, 5))
    assert run.trainer.state.global_step == 5
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == [1, 2, 3, 4, 5]


def test_identity_ignores_runtime_only_config_keys() -> None:
    a = ModelIdentity(
        adapter="x", architecture="A", config={"h": 1}, config_hash="1", shapes={"w": [2]}
    )
    assert a.differences(a) == []
    b = ModelIdentity(
        adapter="x", architecture="A", config={"h": 2}, config_hash="2", shapes={"w": [2]}
    )
    assert a.differences(b) == ["config h 1 → 2"]


def _write_config(raw: dict[str, Any], path: Path) -> Path:
    path.write_text(dump_config(load_config_dict(raw)))
    return path


def test_a_resumed_run_keeps_config_toml_and_writes_config_step_n(
    qwen_run: Path, tmp_path: Path
) -> None:
    from hyper_core.trainer.run import run_training

    out = _copy(qwen_run, tmp_path / "run")
    first = _write_config(_config(out, 4), out / "config.toml")
    original = first.read_text()
    host = isolated_host()
    raw = _config(out, 5, training={"lr": 1e-3})
    run_training(load_config_dict(raw, sections=host.registries.config_sections), host)
    assert (out / "config.toml").read_text() == original
    resumed = (out / "config.step-4.toml").read_text()
    assert "lr = 0.001" in resumed and "lr = 0.001" not in original
    # export finds the config each checkpoint was saved under
    assert run_config_for(out / "checkpoints" / "step-4") == out / "config.toml"
    assert run_config_for(out / "checkpoints" / "step-5") == out / "config.step-4.toml"


def test_a_refused_resume_writes_no_config(qwen_run: Path, tmp_path: Path) -> None:
    from hyper_core.trainer.run import run_training

    out = _copy(qwen_run, tmp_path / "run")
    host = isolated_host()
    raw = _config(out, 6, model={"config": "tiny-llama"})
    with pytest.raises(UserError, match="holds another model"):
        run_training(load_config_dict(raw, sections=host.registries.config_sections), host)
    assert not list(out.glob("config*.toml"))


def test_run_config_for_prefers_the_newest_resume_before_the_step(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    for step in (4, 8, 12):
        (ckpts / f"step-{step}").mkdir(parents=True)
        (ckpts / f"step-{step}" / "COMPLETE").write_text(f"{step}\n")
    assert run_config_for(ckpts / "step-8") is None
    for name in ("config.toml", "config.step-4.toml", "config.step-8.toml"):
        (tmp_path / name).write_text("")
    assert run_config_for(ckpts / "step-4") == tmp_path / "config.toml"
    assert run_config_for(ckpts / "step-8") == tmp_path / "config.step-4.toml"
    assert run_config_for(ckpts / "step-12") == tmp_path / "config.step-8.toml"


def test_cli_resume_into_another_model_exits_2_in_one_line(qwen_run: Path, tmp_path: Path) -> None:
    out = _copy(qwen_run, tmp_path / "run")
    config = _write_config(_config(out, 6), tmp_path / "run.toml")
    proc = hyper_train(["run", str(config), "--model.config=tiny-llama"], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hyper-train: error:")]
    assert len(errors) == 1 and "architecture Qwen2ForCausalLM → LlamaForCausalLM" in errors[0]
    assert "Traceback" not in proc.stderr
