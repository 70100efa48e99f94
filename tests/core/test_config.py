"""The config package: loading, defaults, overrides, plugin sections, errors, dump."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any, Literal

import attrs
import pytest

from hyper_core.config import (
    CORE_SECTIONS,
    KNOWN_PLUGIN_SECTIONS,
    CheckpointConfig,
    Config,
    DataConfig,
    DataSource,
    LoggingConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    SectionSpec,
    TrainingConfig,
    config_to_dict,
    converter,
    dump_config,
    load_config,
    load_config_dict,
    parse_overrides,
    resolve_path,
)
from hyper_core.config.loader import tomllib
from hyper_core.errors import ConfigError, PluginError

REPO = pathlib.Path(__file__).resolve().parents[2]

MINIMAL = """\
[model]
adapter = "qwen2_5_vl"
config = "tiny"

[data]
train = "data/train.jsonl"

[training]
steps = 10
global_batch_size = 8
micro_batch_size = 4
lr = 1e-3
"""

FULL = """\
[run]
output_dir = "runs/full"
seed = 7
plugins = ["my_plugin"]
deterministic = true
name = "full"

[model]
path = "/models/Qwen2.5-VL-7B-Instruct"
trust_remote_code = true
dtype = "bfloat16"
attn_implementation = "eager"
freeze = ["vision", "projector"]
min_pixels = 3136
max_pixels = 12845056
hf_overrides = { hidden_size = 64, vision_config = { depth = 2 } }

[data]
train = { format = "shapes", num_samples = 2000, seed = 1 }
eval = "data/eval.json"
max_seq_len = 512
batching = "packed"
on_error = "raise"
num_workers = 2
shuffle = false
eval_samples = 200

[training]
epochs = 3
global_batch_size = 16
micro_batch_size = 4
lr = 1
weight_decay = 0.01
betas = [0.9, 0.98]
eps = 1e-6
lr_scheduler = "linear"
warmup_steps = 50
min_lr_ratio = 0.05
max_grad_norm = 0.5
mixed_precision = "bf16"
activation_checkpointing = true
eval_every_steps = 100
no_decay_1d = false

[parallel]
strategy = "fsdp2"
dp_replicate = 2
dp_shard = 4
param_dtype = "bfloat16"
reduce_dtype = "float32"
backend = "gloo"
timeout_s = 60

[checkpoint]
every_steps = 500
keep_last = 2
resume = "none"
export_hf = true
async = true

[logging]
every_steps = 1
tensorboard = true
progress = "lines"
"""


@attrs.define(frozen=True, kw_only=True)
class EncoderParallelSection:
    """A plugin section whose fields all have defaults."""

    enabled: bool = False
    balance: Literal["greedy", "none"] = "greedy"
    ranks: list[int] = attrs.field(factory=list)


@attrs.define(frozen=True, kw_only=True)
class NeedsKeySection:
    """A plugin section with a required field."""

    token_file: str
    retries: int = attrs.field(default=1)


SECTIONS = {
    "encoder_parallel": SectionSpec(
        name="encoder_parallel", cls=EncoderParallelSection, plugin="encoder-parallel"
    ),
    "vault": SectionSpec(name="vault", cls=NeedsKeySection, plugin="vault"),
}


def write(tmp_path: pathlib.Path, text: str, name: str = "config.toml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def raw(text: str = MINIMAL) -> dict[str, Any]:
    return tomllib.loads(text)


def problems_of(exc: pytest.ExceptionInfo[ConfigError]) -> dict[str, str]:
    return dict(exc.value.problems)


# --- loading and defaults -------------------------------------------------------------------


def test_minimal_config_gets_every_default(tmp_path: pathlib.Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.run == RunConfig()
    assert config.run.output_dir == "runs/default"
    assert config.run.seed == 0 and config.run.plugins == [] and config.run.name is None
    assert config.model == ModelConfig(adapter="qwen2_5_vl", config="tiny")
    assert config.model.dtype == "float32" and config.model.attn_implementation == "sdpa"
    assert config.model.trust_remote_code is False and config.model.hf_overrides == {}
    assert config.data.train == DataSource(format="jsonl", path="data/train.jsonl")
    assert config.data.eval is None and config.data.max_seq_len == 2048
    assert config.data.on_error == "skip" and config.data.shuffle is True
    t = config.training
    assert (t.steps, t.epochs, t.global_batch_size, t.micro_batch_size) == (10, None, 8, 4)
    assert t.betas == [0.9, 0.999] and t.eps == 1e-8 and t.optimizer == "adamw"
    assert t.lr_scheduler == "cosine" and t.max_grad_norm == 1.0 and t.no_decay_1d is True
    assert config.parallel == ParallelConfig()
    assert (config.parallel.strategy, config.parallel.dp_shard) == ("none", -1)
    assert config.checkpoint == CheckpointConfig()
    assert config.checkpoint.keep_last == 3 and config.checkpoint.resume == "auto"
    assert config.checkpoint.async_save is False
    assert config.logging == LoggingConfig(every_steps=10, tensorboard=False, progress="auto")
    assert config.plugin_sections == {}
    assert config.source_path == str(tmp_path / "config.toml")


def test_full_config_reads_every_key(tmp_path: pathlib.Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.run == RunConfig(
        output_dir="runs/full", seed=7, plugins=["my_plugin"], deterministic=True, name="full"
    )
    assert config.model.path == "/models/Qwen2.5-VL-7B-Instruct" and config.model.adapter is None
    assert config.model.freeze == ["vision", "projector"]
    assert config.model.hf_overrides == {"hidden_size": 64, "vision_config": {"depth": 2}}
    assert config.data.train == DataSource(
        format="shapes", path=None, options={"num_samples": 2000, "seed": 1}
    )
    assert config.data.eval == DataSource(format="jsonl", path="data/eval.json")
    assert config.training.epochs == 3 and config.training.steps is None
    assert config.training.lr == 1.0 and type(config.training.lr) is float
    assert config.training.betas == [0.9, 0.98]
    assert config.parallel.param_dtype == "bfloat16" and config.parallel.dp_replicate == 2
    assert config.checkpoint.async_save is True and config.checkpoint.keep_last == 2
    assert config.logging.progress == "lines"


def test_config_is_frozen(tmp_path: pathlib.Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.training.lr = 1.0  # type: ignore[misc]


def test_section_helper() -> None:
    config = load_config_dict(raw(), sections=SECTIONS)
    assert config.section("training") is config.training
    assert config.section("encoder_parallel") == EncoderParallelSection()
    assert config.section("vault") is None
    assert config.section("nope") is None


def test_every_field_has_help() -> None:
    classes = [
        RunConfig, ModelConfig, DataConfig, DataSource, TrainingConfig, ParallelConfig,
        CheckpointConfig, LoggingConfig, Config, SectionSpec,
    ]  # fmt: skip
    for cls in classes:
        assert cls.__doc__, cls
        for field in attrs.fields(cls):
            assert field.metadata.get("help"), f"{cls.__name__}.{field.name}"
    assert set(CORE_SECTIONS) == {f.name for f in attrs.fields(Config)} - {
        "plugin_sections",
        "source_path",
    }


def test_direct_construction_checks_cross_field_rules() -> None:
    with pytest.raises(ConfigError) as info:
        TrainingConfig(steps=1, epochs=1, global_batch_size=6, micro_batch_size=4, lr=1e-3)
    assert set(problems_of(info)) == {"$", "$.global_batch_size"}


# --- paths ----------------------------------------------------------------------------------


def test_resolve_path_is_relative_to_the_config_file(tmp_path: pathlib.Path) -> None:
    sub = tmp_path / "configs"
    sub.mkdir()
    config = load_config(write(sub, MINIMAL))
    assert resolve_path(config, config.data.train.path) == sub / "data/train.jsonl"
    assert resolve_path(config, "/abs/x.jsonl") == pathlib.Path("/abs/x.jsonl")
    assert config.run.output_dir == "runs/default"


def test_resolve_path_without_source_is_relative_to_cwd() -> None:
    config = load_config_dict(raw())
    assert config.source_path is None
    assert resolve_path(config, "a/b.jsonl") == pathlib.Path("a/b.jsonl")


def test_relative_config_path_is_stored_absolute(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, MINIMAL)
    monkeypatch.chdir(tmp_path)
    config = load_config("config.toml")
    assert config.source_path == str(tmp_path / "config.toml")


def test_data_source_forms() -> None:
    def train(value: Any) -> DataSource:
        return load_config_dict(raw() | {"data": {"train": value}}).data.train

    assert train("a.JSONL") == DataSource(format="jsonl", path="a.JSONL")
    assert train({"format": "jsonl", "path": "x.jsonl"}) == DataSource(
        format="jsonl", path="x.jsonl"
    )
    assert train({"format": "shapes", "path": "dir", "image_size": 112}) == DataSource(
        format="shapes", path="dir", options={"image_size": 112}
    )
    assert train({"format": "shapes"}).path is None


# --- strictness -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("training", "steps", 3.0, "expected int, got float (3.0)"),
        ("training", "steps", "3", "expected int, got str ('3')"),
        ("training", "steps", False, "expected int, got bool (false)"),
        ("training", "lr", "0.001", "expected float, got str ('0.001')"),
        ("training", "lr", True, "expected float, got bool (true)"),
        ("data", "shuffle", "false", "expected bool, got str ('false')"),
        ("data", "shuffle", 0, "expected bool, got int (0)"),
        ("run", "output_dir", 5, "expected str, got int (5)"),
        ("run", "output_dir", ["a"], "expected str, got array (['a'])"),
        ("run", "output_dir", {"a": 1}, "expected str, got table"),
        ("run", "plugins", "a", "expected an array, got str ('a')"),
        ("logging", "progress", "pretty", "expected one of 'auto', 'bar', 'lines', 'none'"),
        ("logging", "progress", 1, "expected one of 'auto', 'bar', 'lines', 'none', got int"),
    ],
)
def test_strict_scalars(section: str, key: str, value: Any, message: str) -> None:
    data = raw()
    data.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as info:
        load_config_dict(data)
    assert problems_of(info) == {f"$.{section}.{key}": problems_of(info)[f"$.{section}.{key}"]}
    assert message in str(info.value)


def test_list_elements_have_index_paths() -> None:
    data = raw()
    data["training"]["betas"] = ["0.9", 0.99]
    data["run"] = {"plugins": ["ok", 1, None]}
    with pytest.raises(ConfigError) as info:
        load_config_dict(data)
    assert set(problems_of(info)) == {
        "$.training.betas[0]",
        "$.run.plugins[1]",
        "$.run.plugins[2]",
    }


def test_all_problems_reported_together() -> None:
    data = raw()
    data["training"].update(lr="fast", steps=0, lrr=1)
    data["model"]["dtype"] = "fp8"
    data["checkpoint"] = {"async": 1}
    data["trainig"] = {}
    with pytest.raises(ConfigError) as info:
        load_config_dict(data, source="my.toml")
    problems = problems_of(info)
    assert set(problems) == {
        "$.trainig",
        "$.training.lr",
        "$.training.steps",
        "$.training.lrr",
        "$.model.dtype",
        "$.checkpoint.async",
    }
    message = str(info.value)
    assert message.startswith("my.toml: 6 problems\n")
    assert "  $.training.lr: expected float, got str ('fast')" in message.splitlines()


def test_did_you_mean() -> None:
    data = raw() | {"trainig": {}, "logging": {"every_step": 3, "colour": True}}
    data["training"]["lrr"] = 1.0
    with pytest.raises(ConfigError) as info:
        load_config_dict(data)
    problems = problems_of(info)
    assert problems["$.trainig"] == "unknown key; did you mean 'training'?"
    assert problems["$.training.lrr"] == "unknown key; did you mean 'lr'?"
    assert problems["$.logging.every_step"] == "unknown key; did you mean 'every_steps'?"
    assert problems["$.logging.colour"] == (
        "unknown key; valid keys: every_steps, tensorboard, progress, profile_steps"
    )


def test_literal_did_you_mean() -> None:
    data = raw()
    data["training"]["lr_scheduler"] = "cosin"
    with pytest.raises(ConfigError) as info:
        load_config_dict(data)
    assert problems_of(info)["$.training.lr_scheduler"] == (
        "invalid value 'cosin'; expected one of 'constant', 'linear', 'cosine'; "
        "did you mean 'cosine'?"
    )


def test_missing_required_sections_name_their_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_dict({})
    problems = problems_of(info)
    assert problems["$.model"].startswith("set 'path'")
    assert problems["$.data.train"] == "required key is missing"
    for key in ("global_batch_size", "micro_batch_size", "lr"):
        assert problems[f"$.training.{key}"] == "required key is missing"


def test_non_bare_keys_are_quoted_in_paths() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_dict(raw() | {"run": {"my key": 1}})
    assert '$.run["my key"]' in problems_of(info)


def test_path_and_adapter_rules() -> None:
    assert load_config_dict(raw() | {"model": {"path": "/m"}}).model.adapter is None
    with pytest.raises(ConfigError) as info:
        load_config_dict(raw() | {"model": {"config": "tiny"}})
    assert problems_of(info) == {"$.model.adapter": "required when 'path' is not set"}


def test_toml_syntax_error_names_file_and_line(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, '[run]\nseed = 1\nname = "unterminated\n', "broken.toml")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "line 3" in str(info.value)


# --- overrides ------------------------------------------------------------------------------


def test_parse_overrides_values() -> None:
    parsed = parse_overrides(
        [
            "--training.lr=1e-4",
            "training.steps=20",
            "--run.deterministic=true",
            "--run.name=demo run",
            '--run.output_dir="runs/x"',
            "--training.betas=[0.8, 0.9]",
            "--data.train={ format = 'shapes' }",
            "--run.seed=1",
            "--run.seed=2",
        ]
    )
    assert parsed == {
        "training.lr": 1e-4,
        "training.steps": 20,
        "run.deterministic": True,
        "run.name": "demo run",
        "run.output_dir": "runs/x",
        "training.betas": [0.8, 0.9],
        "data.train": {"format": "shapes"},
        "run.seed": 2,
    }
    assert type(parsed["training.steps"]) is int


def test_overrides_apply_before_validation(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, MINIMAL)
    config = load_config(
        path,
        [
            "--training.lr=1e-4",
            "--training.lr_scheduler=linear",
            "--model.hf_overrides.text_config.hidden_size=64",
            "--logging.tensorboard=true",
            "--data.train={ format = 'shapes', num_samples = 10 }",
            "checkpoint.async=true",
        ],
    )
    assert config.training.lr == 1e-4 and config.training.lr_scheduler == "linear"
    assert config.model.hf_overrides == {"text_config": {"hidden_size": 64}}
    assert config.logging.tensorboard is True
    assert config.data.train == DataSource(format="shapes", options={"num_samples": 10})
    assert config.checkpoint.async_save is True
    assert load_config(path).training.lr == 1e-3


def test_override_can_replace_steps_with_epochs(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, MINIMAL.replace("steps = 10\n", ""))
    assert load_config(path, ["--training.epochs=2"]).training.epochs == 2


def test_override_creates_plugin_section(tmp_path: pathlib.Path) -> None:
    config = load_config(
        write(tmp_path, MINIMAL), ["--encoder_parallel.enabled=true"], sections=SECTIONS
    )
    assert config.plugin_sections["encoder_parallel"] == EncoderParallelSection(enabled=True)


# --- plugin sections ------------------------------------------------------------------------


def test_plugin_section_structured_and_defaulted() -> None:
    data = raw() | {"encoder_parallel": {"enabled": True, "ranks": [0, 1]}}
    config = load_config_dict(data, sections=SECTIONS)
    assert config.plugin_sections == {
        "encoder_parallel": EncoderParallelSection(enabled=True, ranks=[0, 1])
    }
    config = load_config_dict(raw(), sections=SECTIONS)
    assert config.plugin_sections["encoder_parallel"].enabled is False
    assert "vault" not in config.plugin_sections
    config = load_config_dict(raw() | {"vault": {"token_file": "t"}}, sections=SECTIONS)
    assert config.plugin_sections["vault"] == NeedsKeySection(token_file="t")


def test_plugin_section_errors_have_paths() -> None:
    data = raw() | {
        "encoder_parallel": {"enabld": True, "balance": "random", "ranks": [0, "1"]},
        "vault": {"retries": 2},
    }
    data["training"]["lr"] = "x"
    with pytest.raises(ConfigError) as info:
        load_config_dict(data, sections=SECTIONS)
    problems = problems_of(info)
    assert set(problems) == {
        "$.training.lr",
        "$.encoder_parallel.enabld",
        "$.encoder_parallel.balance",
        "$.encoder_parallel.ranks[1]",
        "$.vault.token_file",
    }
    assert problems["$.encoder_parallel.enabld"] == "unknown key; did you mean 'enabled'?"


def test_uninstalled_known_plugin_section() -> None:
    assert KNOWN_PLUGIN_SECTIONS["encoder_parallel"] == "hyper-train-encoder-parallel"
    with pytest.raises(ConfigError) as info:
        load_config_dict(raw() | {"encoder_parallel": {}, "memory_profiler": {}})
    assert problems_of(info) == {
        "$.encoder_parallel": "section of a plugin that is not installed; "
        "pip install hyper-train-encoder-parallel",
        "$.memory_profiler": "section of a plugin that is not installed; "
        "pip install hyper-train-memory-profiler",
    }


def test_unknown_section_suggests_registered_sections() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_dict(raw() | {"vaul": {}}, sections=SECTIONS)
    assert problems_of(info) == {"$.vaul": "unknown key; did you mean 'vault'?"}


def test_bad_section_specs() -> None:
    with pytest.raises(PluginError, match="core section"):
        spec = SectionSpec(name="training", cls=NeedsKeySection, plugin="p")
        load_config_dict(raw(), sections={"training": spec})
    with pytest.raises(PluginError, match="not an attrs class"):
        load_config_dict(raw(), sections={"x": SectionSpec(name="x", cls=dict, plugin="p")})


def test_converter_for_plugins() -> None:
    assert converter.structure({"enabled": True}, EncoderParallelSection).enabled is True
    with pytest.raises(ConfigError) as info:
        converter.structure({"enabled": "yes", "ranks": [1.5]}, EncoderParallelSection)
    assert set(problems_of(info)) == {"$.enabled", "$.ranks[0]"}
    with pytest.raises(ConfigError) as info:
        converter.structure_at({"enabled": 1}, EncoderParallelSection, path="$.encoder_parallel")
    assert set(problems_of(info)) == {"$.encoder_parallel.enabled"}
    with pytest.raises(ConfigError) as info:
        converter.structure("3", int)
    assert problems_of(info) == {"$": "expected int, got str ('3')"}


# --- dump -----------------------------------------------------------------------------------

ROUND_TRIP_CASES = {
    "minimal": (MINIMAL, []),
    "full": (FULL, []),
    "table_source_with_path": (
        MINIMAL.replace(
            '"data/train.jsonl"', '{ format = "jsonl", path = "x.data", max_samples = 3 }'
        ),
        ["--data.eval=held.jsonl"],
    ),
    "plugin_sections": (MINIMAL, ["--vault.token_file=t", "--encoder_parallel.ranks=[2, 3]"]),
    "floats_and_nesting": (
        MINIMAL,
        ["--training.lr=3e-5", "--training.eps=1", "--model.hf_overrides.a.b.c=[1, 2]"],
    ),
}


@pytest.mark.parametrize("case", ROUND_TRIP_CASES, ids=list(ROUND_TRIP_CASES))
def test_dump_round_trips(tmp_path: pathlib.Path, case: str) -> None:
    text, overrides = ROUND_TRIP_CASES[case]
    config = load_config(write(tmp_path, text), overrides, sections=SECTIONS)
    dumped = dump_config(config)
    again = load_config_dict(tomllib.loads(dumped), sections=SECTIONS)
    assert again == config
    assert again.source_path is None and config.source_path is not None
    assert attrs.evolve(again, source_path=config.source_path) == config
    assert dump_config(again) == dumped


def test_dump_fills_defaults_and_spells_keys() -> None:
    config = load_config_dict(raw(MINIMAL), sections=SECTIONS)
    data = config_to_dict(config)
    assert list(data) == [*CORE_SECTIONS, "encoder_parallel"]
    assert data["checkpoint"] == {
        "keep_last": 3,
        "resume": "auto",
        "save_final": True,
        "export_hf": False,
        "export_dtype": "auto",
        "async": False,
    }
    assert data["data"]["train"] == "data/train.jsonl"
    assert "eval" not in data["data"] and "name" not in data["run"]
    assert data["training"]["warmup_steps"] == 0 and data["training"]["betas"] == [0.9, 0.999]
    assert data["encoder_parallel"] == {"enabled": False, "balance": "greedy", "ranks": []}
    assert "source_path" not in dump_config(config) and "plugin_sections" not in data
    assert "async = false" in dump_config(config)


def test_dump_writes_table_sources() -> None:
    data = raw() | {"data": {"train": {"format": "shapes", "image_size": 112}, "eval": "e.json"}}
    dumped = config_to_dict(load_config_dict(data))["data"]
    assert dumped["train"] == {"format": "shapes", "image_size": 112}
    assert dumped["eval"] == "e.json"
    data["data"]["train"] = {"format": "shapes", "path": "p.jsonl"}
    assert config_to_dict(load_config_dict(data))["data"]["train"] == {
        "format": "shapes",
        "path": "p.jsonl",
    }


# --- import cost ----------------------------------------------------------------------------


def test_config_package_imports_no_torch() -> None:
    code = (
        "import sys, hyper_core.config; "
        "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
