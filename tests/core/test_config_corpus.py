# ruff: noqa: E501 (the pinned messages are kept whole, one per line)
"""The corpus of bad configs and the exact message each one gives.

Every case loads a config (a file of ``bad_configs/``, ``--overrides`` on a minimal file, or a
patched dict) or calls the converter directly, and the whole :class:`ConfigError` text must equal
the pinned one. ``python tests/core/test_config_corpus.py`` prints every case and its message
(``--expected``: as the :data:`EXPECTED` literal, for a new case).
"""

from __future__ import annotations

import copy
import math
import pathlib
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import pytest

from hyper_core.config import StrictConverter, converter, load_config, load_config_dict
from hyper_core.config.loader import tomllib
from hyper_core.errors import UserError

HERE = pathlib.Path(__file__).parent
BAD_CONFIGS = HERE / "bad_configs"

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


@attrs.frozen(kw_only=True)
class Case:
    """One input: a ``bad_configs/`` file, overrides on :data:`MINIMAL`, or a patch of its dict
    (each section's keys updated); ``plugins``: with the installed plugins' sections."""

    file: str | None = None
    overrides: tuple[str, ...] = ()
    patch: Mapping[str, Any] | None = None
    plugins: bool = False

    def shown(self) -> str:
        if self.file is not None:
            return f"file {self.file}:\n" + (BAD_CONFIGS / self.file).read_text()
        where = " (plugin sections)" if self.plugins else ""
        if self.patch is not None:
            return f"patch{where}: {self.patch!r}"
        return f"overrides{where}: {' '.join(self.overrides)}"


def ov(*overrides: str, plugins: bool = False) -> Case:
    return Case(overrides=overrides, plugins=plugins)


def patch(plugins: bool = False, **sections: Any) -> Case:
    return Case(patch=sections, plugins=plugins)


@attrs.define(frozen=True, kw_only=True)
class Section:
    """A plugin-like section for the direct converter cases."""

    enabled: bool = False
    balance: Literal["greedy", "none"] = "greedy"
    ranks: list[int] = attrs.field(factory=list)


@attrs.frozen
class Port:
    number: int


def _port(value: Any, _: Any) -> Port:
    return Port(int(value))  # a plugin's own hook: int("x") raises ValueError


@attrs.define(frozen=True, kw_only=True)
class Ports:
    """A section whose values a plugin's own hook structures."""

    ports: list[Port] = attrs.field(factory=list)
    names: dict[str, int] = attrs.field(factory=dict)


CASES: dict[str, Case] = {
    **{f"file:{p.stem}": Case(file=p.name) for p in sorted(BAD_CONFIGS.glob("*.toml"))},
    # test_bad_configs' overrides
    "ov:lr_abc": ov("--training.lr=abc"),
    "ov:lr_quoted": ov('--training.lr="1e-4"'),
    "ov:lr_inf": ov("--training.lr=inf"),
    "ov:eps_nan": ov("--training.eps=nan"),
    "ov:steps_float": ov("--training.steps=3.5"),
    "ov:steps_bool": ov("training.steps=true"),
    "ov:unknown_section": ov("--nosuchsection.x=1"),
    "ov:section_typo": ov("--trainig.lr=1"),
    "ov:key_typo": ov("--training.lrr=1"),
    "ov:steps_and_epochs": ov("--training.epochs=3"),
    "ov:dtype_fp16": ov("--model.dtype=fp16"),
    "ov:csv_no_format": ov("--data.train=data.csv"),
    "ov:encoder_parallel_not_installed": ov("--encoder_parallel.enabled=true"),
    "ov:into_scalar": ov("--training.lr.value=1"),
    "ov:no_value": ov("--training.lr"),
    "ov:empty_key": ov("--=1"),
    "ov:double_dot": ov("--training..lr=1"),
    "ov:three": ov("--training.lr=abc", "--run.seed=x", "--logging.every_steps=0"),
    # test_config's dict cases
    "dict:steps_float": patch(training={"steps": 3.0}),
    "dict:steps_str": patch(training={"steps": "3"}),
    "dict:steps_false": patch(training={"steps": False}),
    "dict:lr_true": patch(training={"lr": True}),
    "dict:shuffle_int": patch(data={"shuffle": 0}),
    "dict:output_dir_list": patch(run={"output_dir": ["a"]}),
    "dict:output_dir_table": patch(run={"output_dir": {"a": 1}}),
    "dict:progress_int": patch(logging={"progress": 1}),
    "dict:list_indexes": patch(training={"betas": ["0.9", 0.99]}, run={"plugins": ["ok", 1, None]}),
    "dict:all_together": patch(
        training={"lr": "fast", "steps": 0, "lrr": 1},
        model={"dtype": "fp8"},
        checkpoint={"async": 1},
        trainig={},
    ),
    "dict:did_you_mean": patch(
        trainig={}, logging={"every_step": 3, "colour": True}, training={"lrr": 1.0}
    ),
    "dict:literal_did_you_mean": patch(training={"lr_scheduler": "cosin"}),
    "dict:non_bare_key": patch(run={"my key": 1}),
    "dict:adapter_required": patch(model={"adapter": None}),
    "dict:none_for_required": patch(training={"lr": None}),
    "dict:nan_for_int": patch(training={"steps": math.nan}),
    "dict:tuple_for_list": patch(run={"plugins": ("a", 2)}),
    "dict:hf_overrides_int_key": patch(model={"hf_overrides": {1: 2, "ok": 3}}),
    "dict:config_is_a_list": Case(patch={"__root__": [1]}),
    # unknown keys at every level
    "own:unknown_top_and_nested": ov("--modle.path=x", "--model.pth=x", "--run.sed=1"),
    "own:unknown_in_source_table": ov(
        '--data.train={ format = "jsonl", path = "a.jsonl", max_sampels = 3 }'
    ),
    "own:unknown_in_source_list": ov(
        '--data.train=["a.jsonl", { format = "shapes", nmu_samples = 3, zzz = 1 }]'
    ),
    "own:nested_table_in_options": ov('--data.train={ format = "shapes", extra = { a = 1 } }'),
    "own:non_bare_option_key": ov('--data.train={ format = "shapes", "my key" = 1 }'),
    "own:unknown_in_every_section": ov(
        "--run.sede=1",
        "--model.adaptor=x",
        "--data.trian=x",
        "--training.warmup=1",
        "--parallel.strategie=x",
        "--checkpoint.x=1",
        "--logging.x=1",
    ),
    "own:async_save_key": ov("--checkpoint.async_save=true"),
    # wrong types in lists, dicts, unions, optionals
    "own:plugins_nested_list": ov("--run.plugins=[[1], 'a']"),
    "own:freeze_typo": ov("--model.freeze=['visoin', 3]"),
    "own:freeze_str": ov("--model.freeze=vision"),
    "own:hf_overrides_array": ov("--model.hf_overrides=[1]"),
    "own:optional_float_str": ov("--training.max_grad_norm=x"),
    "own:optional_int_array": ov("--training.eval_every_steps=[1]"),
    "own:optional_literal": ov("--parallel.param_dtype=fp8", "--parallel.reduce_dtype=1"),
    "own:literal_array": ov("--logging.progress=['bar']"),
    "own:section_is_array": ov("--model=[1]"),
    "own:section_is_string": ov("--training=fast"),
    "own:eval_int": ov("--data.eval=3"),
    "own:eval_empty_list": ov("--data.eval=[]"),
    "own:train_list_int": ov("--data.train=['a.jsonl', 3, true]"),
    "own:train_list_of_lists": ov("--data.train=[['a.jsonl']]"),
    "own:betas_table": ov("--training.betas={ a = 1 }"),
    "own:cross_field_after_field_error": ov("--training.epochs=2", "--training.lr=x"),
    "own:cross_field_two_sections": ov(
        "--training.epochs=2", "--model.path=/m", "--model.min_pixels=9", "--model.max_pixels=4"
    ),
    "own:dp_shard_and_timeout": ov("--parallel.dp_shard=-2", "--parallel.timeout_s=0"),
    # data sources: weights, paths and per-format options
    "own:weights_bad": ov(
        '--data.train=[{ path = "a.jsonl", weight = 0 }, { format = "shapes", weight = "2" }, '
        '{ path = "b.jsonl", weight = inf }]'
    ),
    "own:weight_nan": ov('--data.train={ path = "a.jsonl", weight = nan }'),
    "own:path_empty": ov('--data.train=""', '--data.eval={ format = "jsonl", path = "" }'),
    "own:path_int": ov("--data.train={ format = 'jsonl', path = 3 }"),
    "own:no_format_no_ext": ov('--data.train={ path = "x.csv" }'),
    "own:image_dir_int": ov('--data.train={ path = "a.jsonl", image_dir = 1 }'),
    "own:image_root_empty": ov('--data.image_root=" "'),
    "own:jsonl_options": ov(
        '--data.train={ path = "a.jsonl", max_line_bytes = true, max_samples = 1.5 }'
    ),
    "own:shapes_options": ov(
        '--data.train={ format = "shapes", image_size = 8, split = 3, seed = "x" }',
        '--data.eval=[{ format = "shapes", question_mix = { colour = "x" } }]',
    ),
    "own:shapes_mix_str": ov('--data.train={ format = "shapes", question_mix = "x" }'),
    "own:shapes_mix_list_str": ov('--data.train={ format = "shapes", question_mix = [1, "a", 2] }'),
    "own:parquet_options": ov(
        '--data.train=[{ format = "parquet", path = "x.parquet", max_samples = 0 }, '
        '{ format = "hf", path = "d", revision = "main" }]'
    ),
    "own:format_options_and_core_error": ov(
        '--data.train={ format = "shapes", num_samples = "lots" }', "--training.lr=x"
    ),
    "own:format_options_beside_a_bad_source": ov(
        '--data.train=[{ path = "a.jsonl", weight = 0 }, { format = "shapes", num_samples = "x" }]'
    ),
    "own:format_empty": ov('--data.train={ format = "" }'),
    "own:format_table": ov("--data.train={ format = { a = 1 } }"),
    # plugin sections (the installed plugins)
    "plugin:peft_values": ov(
        "--peft.method=ia3", '--peft.r="8"', "--peft.target=[1]", "--peft.alpah=8", plugins=True
    ),
    "plugin:peft_without_method": ov("--peft.r=16", "--peft.dropout=0.5", plugins=True),
    "plugin:peft_ranges": ov(
        "--peft.method=lora", "--peft.r=0", "--peft.dropout=1.0", "--peft.target=[]", plugins=True
    ),
    "plugin:peft_target_union": ov("--peft.method=lora", "--peft.target=3", plugins=True),
    "plugin:peft_empty_entry": ov(
        "--peft.method=lora", "--peft.target=['q_proj', ' ']", plugins=True
    ),
    "plugin:peft_scalar": ov("--peft=3", plugins=True),
    "plugin:encoder_parallel": ov(
        "--encoder_parallel.enable=true",
        "--encoder_parallel.cost_model=flops",
        "--encoder_parallel.min_imbalance=0.5",
        "--encoder_parallel.attention_patches=1.5",
        plugins=True,
    ),
    "plugin:memory_profiler": ov(
        "--memory_profiler.steps=x",
        "--memory_profiler.sample_interval_ms=0",
        "--memory_profiler.snapshot=false",
        plugins=True,
    ),
    "plugin:memory_profiler_steps": ov("--memory_profiler.steps=[0, 2]", plugins=True),
    "plugin:memory_profiler_steps_mixed": ov("--memory_profiler.steps=[1, 'a']", plugins=True),
    "plugin:section_typo": ov("--pef.method=lora", plugins=True),
    "plugin:with_core_errors": ov(
        "--peft.method=lora", "--peft.r=x", "--training.steps=0", "--data.train=[]", plugins=True
    ),
}


#: Direct converter calls, as a plugin structures its own values: name → (shown input, call).
API_CASES: dict[str, tuple[str, Callable[[], Any]]] = {
    "api:int_from_str": ('structure("3", int)', lambda: converter.structure("3", int)),
    "api:section": (
        'structure({"enabled": "yes", "ranks": [1.5]}, Section)',
        lambda: converter.structure({"enabled": "yes", "ranks": [1.5]}, Section),
    ),
    "api:structure_at": (
        'structure_at({"enabled": 1, "x": 2}, Section, path="$.plug")',
        lambda: converter.structure_at({"enabled": 1, "x": 2}, Section, path="$.plug"),
    ),
    "api:list": (
        'structure([1, "a", 2.0], list[int])',
        lambda: converter.structure([1, "a", 2.0], list[int]),
    ),
    "api:dict": (
        'structure({"a": "x", "b": 1}, dict[str, int])',
        lambda: converter.structure({"a": "x", "b": 1}, dict[str, int]),
    ),
    "api:union": ("structure(1.5, int | str)", lambda: converter.structure(1.5, int | str)),
    "api:optional": ('structure("x", int | None)', lambda: converter.structure("x", int | None)),
    "api:literal": (
        'structure("c", Literal["a", "b"])',
        lambda: converter.structure("c", Literal["a", "b"]),
    ),
    "api:section_not_table": ("structure(3, Section)", lambda: converter.structure(3, Section)),
}


def _own_converter() -> StrictConverter:
    conv = StrictConverter()
    conv.register_structure_hook(Port, _port)
    return conv


API_CASES |= {
    "api:hook_value_error": (
        'structure({"ports": [1, "x"], "names": {"a": 1, 2: "b", 3: "c"}}, Ports) with a hook int(value) for Port',
        lambda: _own_converter().structure(
            {"ports": [1, "x"], "names": {"a": 1, 2: "b", 3: "c"}}, Ports
        ),
    ),
}


def message(name: str) -> str:
    """The error a case gives, as the CLI would print it (file paths shortened), or ``ok``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "config.toml"
        try:
            if name in API_CASES:
                API_CASES[name][1]()
            else:
                _load(CASES[name], path)
        except UserError as exc:
            text = str(exc).replace(f"{BAD_CONFIGS}/", "").replace(str(path), "config.toml")
            return f"{type(exc).__name__}: {text}"
    return "ok"


def _load(case: Case, path: pathlib.Path) -> Any:
    # The core's registries (its dataset formats check their options); a case with plugins
    # gets the installed ones' (their config sections).
    from hyper_core.plugins import get_plugin_host
    from hyper_core.testing import isolated_host

    registries = (get_plugin_host() if case.plugins else isolated_host()).registries
    if case.file is not None:
        return load_config(BAD_CONFIGS / case.file, registries=registries)
    if case.patch is not None:
        if "__root__" in case.patch:
            return load_config_dict(case.patch["__root__"], registries=registries)
        data = tomllib.loads(MINIMAL)
        for section, keys in case.patch.items():
            data.setdefault(section, {}).update(copy.deepcopy(keys))
        return load_config_dict(data, registries=registries)
    path.write_text(MINIMAL)
    return load_config(path, case.overrides, registries=registries)


EXPECTED: dict[str, str] = {
    "file:async_str": "ConfigError: async_str.toml: $.checkpoint.async: expected bool, got str ('yes')",
    "file:bad_backend": "ConfigError: bad_backend.toml: $.parallel.backend: invalid value 'mpi'; expected one of 'auto', 'gloo', 'nccl'",
    "file:bad_dtype": "ConfigError: bad_dtype.toml: $.model.dtype: invalid value 'fp16'; expected one of 'float32', 'bfloat16', 'float16'",
    "file:bad_on_error": "ConfigError: bad_on_error.toml: $.data.on_error: invalid value 'ignore'; expected one of 'skip', 'raise'",
    "file:bad_optimizer": "ConfigError: bad_optimizer.toml: $.training.optimizer: invalid value 'sgd'; expected one of 'adamw'",
    "file:bad_progress": "ConfigError: bad_progress.toml: $.logging.progress: invalid value 'fancy'; expected one of 'auto', 'bar', 'lines', 'none'",
    "file:bad_scheduler": "ConfigError: bad_scheduler.toml: $.training.lr_scheduler: invalid value 'cosin'; expected one of 'constant', 'linear', 'cosine'; did you mean 'cosine'?",
    "file:batch_not_divisible": "ConfigError: batch_not_divisible.toml: $.training.global_batch_size: must be a multiple of micro_batch_size (3), got 8",
    "file:betas_element_str": "ConfigError: betas_element_str.toml: $.training.betas[1]: expected float, got str ('0.999')",
    "file:betas_length": "ConfigError: betas_length.toml: $.training.betas: expected 2 values (beta1, beta2), got 3",
    "file:betas_nan": "ConfigError: betas_nan.toml: $.training.betas: each beta must be in [0, 1), got [0.9, nan]",
    "file:betas_one": "ConfigError: betas_one.toml: $.training.betas: each beta must be in [0, 1), got [0.9, 1.0]",
    "file:betas_out_of_range": "ConfigError: betas_out_of_range.toml: $.training.betas: each beta must be in [0, 1), got [0.9, 1.5]",
    "file:both_path_config": "ConfigError: both_path_config.toml: $.model: set only one of 'path' and 'config'",
    "file:both_steps_epochs": "ConfigError: both_steps_epochs.toml: $.training: set only one of 'steps' and 'epochs'",
    "file:config_without_adapter": "ConfigError: config_without_adapter.toml: $.model.adapter: required when 'path' is not set",
    "file:data_eval_empty": "ConfigError: data_eval_empty.toml: $.data.eval: must not be empty",
    "file:data_format_int": "ConfigError: data_format_int.toml: $.data.train.format: expected str, got int (3)",
    "file:data_train_csv": 'ConfigError: data_train_csv.toml: $.data.train: cannot infer the format of \'train.csv\' from its extension (.jsonl, .json or .parquet); use a table like { format = "...", path = "train.csv" }',
    "file:data_train_int": "ConfigError: data_train_int.toml: $.data.train: expected a path string or a table, got int (5)",
    "file:data_train_no_format": "ConfigError: data_train_no_format.toml: $.data.train.format: required key is missing",
    "file:deterministic_str": "ConfigError: deterministic_str.toml: $.run.deterministic: expected bool, got str ('false')",
    "file:dp_shard_zero": "ConfigError: dp_shard_zero.toml: $.parallel.dp_shard: must be -1 (the rest of the world) or >= 1, got 0",
    "file:encoder_parallel_not_installed": "ConfigError: encoder_parallel_not_installed.toml: $.encoder_parallel: section of a plugin that is not installed; pip install hyper-train-encoder-parallel",
    "file:eps_inf": "ConfigError: eps_inf.toml: $.training.eps: must be a finite number, got inf",
    "file:eps_zero": "ConfigError: eps_zero.toml: $.training.eps: must be > 0.0, got 0.0",
    "file:eval_every_zero": "ConfigError: eval_every_zero.toml: $.training.eval_every_steps: must be >= 1, got 0",
    "file:freeze_bad_element": "ConfigError: freeze_bad_element.toml: $.model.freeze[1]: invalid value 'visoin'; expected one of 'vision', 'projector', 'language'; did you mean 'vision'?",
    "file:hf_overrides_scalar": "ConfigError: hf_overrides_scalar.toml: $.model.hf_overrides: expected a table, got int (64)",
    "file:jsonl_max_samples_zero": "ConfigError: jsonl_max_samples_zero.toml: $.data.train.max_samples: must be >= 1, got 0",
    "file:jsonl_options": "ConfigError: jsonl_options.toml: 2 problems\n  $.data.train.shuffle: unknown key; valid keys: max_samples, max_line_bytes\n  $.data.train.max_line_bytes: expected int, got str ('1MB')",
    "file:keep_last_zero": "ConfigError: keep_last_zero.toml: $.checkpoint.keep_last: must be >= 1, got 0",
    "file:literal_wrong_type": "ConfigError: literal_wrong_type.toml: $.training.mixed_precision: expected one of 'no', 'bf16', got bool (true)",
    "file:lr_inf": "ConfigError: lr_inf.toml: $.training.lr: must be a finite number, got inf",
    "file:lr_nan": "ConfigError: lr_nan.toml: $.training.lr: must be a finite number, got nan",
    "file:lr_str": "ConfigError: lr_str.toml: $.training.lr: expected float, got str ('0.001')",
    "file:lr_table": "ConfigError: lr_table.toml: $.training.lr: expected float, got table",
    "file:max_bad_steps_zero": "ConfigError: max_bad_steps_zero.toml: $.training.max_bad_steps: must be >= 1, got 0",
    "file:max_grad_norm_inf": "ConfigError: max_grad_norm_inf.toml: $.training.max_grad_norm: must be a finite number, got inf",
    "file:max_grad_norm_zero": "ConfigError: max_grad_norm_zero.toml: $.training.max_grad_norm: must be > 0.0, got 0.0",
    "file:memory_profiler_not_installed": "ConfigError: memory_profiler_not_installed.toml: $.memory_profiler: section of a plugin that is not installed; pip install hyper-train-memory-profiler",
    "file:min_lr_ratio_nan": "ConfigError: min_lr_ratio_nan.toml: $.training.min_lr_ratio: must be a finite number, got nan",
    "file:min_lr_ratio_range": "ConfigError: min_lr_ratio_range.toml: $.training.min_lr_ratio: must be between 0.0 and 1.0, got 1.5",
    "file:missing_lr": "ConfigError: missing_lr.toml: $.training.lr: required key is missing",
    "file:missing_train": "ConfigError: missing_train.toml: $.data.train: required key is missing",
    "file:missing_training_section": "ConfigError: missing_training_section.toml: 3 problems\n  $.training.global_batch_size: required key is missing\n  $.training.micro_batch_size: required key is missing\n  $.training.lr: required key is missing",
    "file:multiple_errors": "ConfigError: multiple_errors.toml: 5 problems\n  $.run.seed: expected int, got float (1.5)\n  $.model.dtype: invalid value 'fp32'; expected one of 'float32', 'bfloat16', 'float16'\n  $.training.lr: expected float, got str ('1e-3')\n  $.training.warmup_steps: must be >= 0, got -1\n  $.logging.every_step: unknown key; did you mean 'every_steps'?",
    "file:name_list": "ConfigError: name_list.toml: $.run.name: expected str, got array (['demo'])",
    "file:negative_lr": "ConfigError: negative_lr.toml: $.training.lr: must be >= 0.0, got -0.001",
    "file:negative_steps": "ConfigError: negative_steps.toml: $.training.steps: must be >= 1, got -10",
    "file:negative_warmup": "ConfigError: negative_warmup.toml: $.training.warmup_steps: must be >= 0, got -5",
    "file:neither_path_config": "ConfigError: neither_path_config.toml: $.model: set 'path' (a local HF directory) or 'config' (a named config of the adapter)",
    "file:neither_steps_epochs": "ConfigError: neither_steps_epochs.toml: $.training: set one of 'steps' or 'epochs'",
    "file:pixels_inverted": "ConfigError: pixels_inverted.toml: $.model.max_pixels: must be >= min_pixels (1000), got 10",
    "file:plugins_element_int": "ConfigError: plugins_element_int.toml: $.run.plugins[1]: expected str, got int (2)",
    "file:plugins_str": "ConfigError: plugins_str.toml: $.run.plugins: expected an array, got str ('my_plugin')",
    "file:section_scalar": "ConfigError: section_scalar.toml: $.logging: expected a table, got int (5)",
    "file:seed_str": "ConfigError: seed_str.toml: $.run.seed: expected int, got str ('3')",
    "file:shapes_eval_options": "ConfigError: shapes_eval_options.toml: 2 problems\n  $.data.eval.num_sampels: unknown key; did you mean 'num_samples'?\n  $.data.eval.image_size: must be between 16 and 2048, got 8",
    "file:shapes_num_samples_str": "ConfigError: shapes_num_samples_str.toml: $.data.train.num_samples: expected int, got str ('lots')",
    "file:shapes_question_mix_length": "ConfigError: shapes_question_mix_length.toml: $.data.train.question_mix: expected 3 non-negative weights (colour, shape, describe) with a positive sum, got [1.0, 2.0]",
    "file:shuffle_int": "ConfigError: shuffle_int.toml: $.data.shuffle: expected bool, got int (1)",
    "file:steps_bool": "ConfigError: steps_bool.toml: $.training.steps: expected int, got bool (true)",
    "file:steps_float": "ConfigError: steps_float.toml: $.training.steps: expected int, got float (3.7)",
    "file:syntax_duplicate_key": "ConfigError: syntax_duplicate_key.toml: $: invalid TOML: Cannot overwrite a value (at line 5, column 17)",
    "file:syntax_error": "ConfigError: syntax_error.toml: $: invalid TOML: Invalid value (at line 6, column 10)",
    "file:syntax_unclosed_array": "ConfigError: syntax_unclosed_array.toml: $: invalid TOML: Unclosed array (at end of document, line 5)",
    "file:timeout_str": "ConfigError: timeout_str.toml: $.parallel.timeout_s: expected int, got str ('600')",
    "file:unknown_async_save": "ConfigError: unknown_async_save.toml: $.checkpoint.async_save: unknown key; did you mean 'async'?",
    "file:unknown_nested_close": "ConfigError: unknown_nested_close.toml: 2 problems\n  $.training.lrr: unknown key; did you mean 'lr'?\n  $.training.lr: required key is missing",
    "file:unknown_nested_far": "ConfigError: unknown_nested_far.toml: $.logging.wandb: unknown key; valid keys: every_steps, tensorboard, progress, profile_steps",
    "file:unknown_top_close": "ConfigError: unknown_top_close.toml: $.trainig: unknown key; did you mean 'training'?",
    "file:unknown_top_far": "ConfigError: unknown_top_far.toml: $.zzz: unknown key; valid keys: run, model, data, training, parallel, checkpoint, logging",
    "file:unknown_top_scalar": "ConfigError: unknown_top_scalar.toml: $.learning_rate: unknown key; valid keys: run, model, data, training, parallel, checkpoint, logging",
    "file:weight_decay_inf": "ConfigError: weight_decay_inf.toml: $.training.weight_decay: must be a finite number, got inf",
    "file:weight_decay_negative": "ConfigError: weight_decay_negative.toml: $.training.weight_decay: must be >= 0.0, got -0.1",
    "file:zero_micro_batch": "ConfigError: zero_micro_batch.toml: $.training.micro_batch_size: must be >= 1, got 0",
    "ov:lr_abc": "ConfigError: config.toml: $.training.lr: expected float, got str ('abc')",
    "ov:lr_quoted": "ConfigError: config.toml: $.training.lr: expected float, got str ('1e-4')",
    "ov:lr_inf": "ConfigError: config.toml: $.training.lr: must be a finite number, got inf",
    "ov:eps_nan": "ConfigError: config.toml: $.training.eps: must be a finite number, got nan",
    "ov:steps_float": "ConfigError: config.toml: $.training.steps: expected int, got float (3.5)",
    "ov:steps_bool": "ConfigError: config.toml: $.training.steps: expected int, got bool (true)",
    "ov:unknown_section": "ConfigError: config.toml: $.nosuchsection: unknown key; valid keys: run, model, data, training, parallel, checkpoint, logging",
    "ov:section_typo": "ConfigError: config.toml: $.trainig: unknown key; did you mean 'training'?",
    "ov:key_typo": "ConfigError: config.toml: $.training.lrr: unknown key; did you mean 'lr'?",
    "ov:steps_and_epochs": "ConfigError: config.toml: $.training: set only one of 'steps' and 'epochs'",
    "ov:dtype_fp16": "ConfigError: config.toml: $.model.dtype: invalid value 'fp16'; expected one of 'float32', 'bfloat16', 'float16'",
    "ov:csv_no_format": 'ConfigError: config.toml: $.data.train: cannot infer the format of \'data.csv\' from its extension (.jsonl, .json or .parquet); use a table like { format = "...", path = "data.csv" }',
    "ov:encoder_parallel_not_installed": "ConfigError: config.toml: $.encoder_parallel: section of a plugin that is not installed; pip install hyper-train-encoder-parallel",
    "ov:into_scalar": "ConfigError: command line: $.training.lr: is float (0.001), not a table, so it cannot take the override training.lr.value=1",
    "ov:no_value": "ConfigError: command line: $.training.lr: override has no value; write --training.lr=VALUE",
    "ov:empty_key": "ConfigError: command line: --=1: malformed override: expected --KEY.PATH=VALUE",
    "ov:double_dot": "ConfigError: command line: --training..lr=1: malformed override: expected --KEY.PATH=VALUE",
    "ov:three": "ConfigError: config.toml: 3 problems\n  $.run.seed: expected int, got str ('x')\n  $.training.lr: expected float, got str ('abc')\n  $.logging.every_steps: must be >= 1, got 0",
    "dict:steps_float": "ConfigError: $.training.steps: expected int, got float (3.0)",
    "dict:steps_str": "ConfigError: $.training.steps: expected int, got str ('3')",
    "dict:steps_false": "ConfigError: $.training.steps: expected int, got bool (false)",
    "dict:lr_true": "ConfigError: $.training.lr: expected float, got bool (true)",
    "dict:shuffle_int": "ConfigError: $.data.shuffle: expected bool, got int (0)",
    "dict:output_dir_list": "ConfigError: $.run.output_dir: expected str, got array (['a'])",
    "dict:output_dir_table": "ConfigError: $.run.output_dir: expected str, got table",
    "dict:progress_int": "ConfigError: $.logging.progress: expected one of 'auto', 'bar', 'lines', 'none', got int (1)",
    "dict:list_indexes": "ConfigError: 3 problems\n  $.run.plugins[1]: expected str, got int (1)\n  $.run.plugins[2]: expected str, got None\n  $.training.betas[0]: expected float, got str ('0.9')",
    "dict:all_together": "ConfigError: 6 problems\n  $.trainig: unknown key; did you mean 'training'?\n  $.model.dtype: invalid value 'fp8'; expected one of 'float32', 'bfloat16', 'float16'\n  $.training.lrr: unknown key; did you mean 'lr'?\n  $.training.steps: must be >= 1, got 0\n  $.training.lr: expected float, got str ('fast')\n  $.checkpoint.async: expected bool, got int (1)",
    "dict:did_you_mean": "ConfigError: 4 problems\n  $.trainig: unknown key; did you mean 'training'?\n  $.training.lrr: unknown key; did you mean 'lr'?\n  $.logging.every_step: unknown key; did you mean 'every_steps'?\n  $.logging.colour: unknown key; valid keys: every_steps, tensorboard, progress, profile_steps",
    "dict:literal_did_you_mean": "ConfigError: $.training.lr_scheduler: invalid value 'cosin'; expected one of 'constant', 'linear', 'cosine'; did you mean 'cosine'?",
    "dict:non_bare_key": 'ConfigError: $.run["my key"]: unknown key; valid keys: output_dir, seed, plugins, deterministic, name',
    "dict:adapter_required": "ConfigError: $.model.adapter: required when 'path' is not set",
    "dict:none_for_required": "ConfigError: $.training.lr: expected float, got None",
    "dict:nan_for_int": "ConfigError: $.training.steps: expected int, got float (nan)",
    "dict:tuple_for_list": "ConfigError: $.run.plugins[1]: expected str, got int (2)",
    "dict:hf_overrides_int_key": "ConfigError: $.model.hf_overrides: keys must be strings, got int (1)",
    "dict:config_is_a_list": "ConfigError: $: expected a table, got array ([1])",
    "own:unknown_top_and_nested": "ConfigError: config.toml: 3 problems\n  $.modle: unknown key; did you mean 'model'?\n  $.run.sed: unknown key; did you mean 'seed'?\n  $.model.pth: unknown key; did you mean 'path'?",
    "own:unknown_in_source_table": "ConfigError: config.toml: $.data.train.max_sampels: unknown key; did you mean 'max_samples'?",
    "own:unknown_in_source_list": "ConfigError: config.toml: 2 problems\n  $.data.train[1].nmu_samples: unknown key; did you mean 'num_samples'?\n  $.data.train[1].zzz: unknown key; valid keys: num_samples, image_size, seed, split, question_mix",
    "own:nested_table_in_options": "ConfigError: config.toml: $.data.train.extra: unknown key; valid keys: num_samples, image_size, seed, split, question_mix",
    "own:non_bare_option_key": 'ConfigError: config.toml: $.data.train["my key"]: unknown key; valid keys: num_samples, image_size, seed, split, question_mix',
    "own:unknown_in_every_section": "ConfigError: config.toml: 7 problems\n  $.run.sede: unknown key; did you mean 'seed'?\n  $.model.adaptor: unknown key; did you mean 'adapter'?\n  $.data.trian: unknown key; did you mean 'train'?\n  $.training.warmup: unknown key; did you mean 'warmup_steps'?\n  $.parallel.strategie: unknown key; did you mean 'strategy'?\n  $.checkpoint.x: unknown key; valid keys: every_steps, keep_last, resume, save_final, export_hf, export_dtype, async\n  $.logging.x: unknown key; valid keys: every_steps, tensorboard, progress, profile_steps",
    "own:async_save_key": "ConfigError: config.toml: $.checkpoint.async_save: unknown key; did you mean 'async'?",
    "own:plugins_nested_list": "ConfigError: config.toml: $.run.plugins[0]: expected str, got array ([1])",
    "own:freeze_typo": "ConfigError: config.toml: 2 problems\n  $.model.freeze[0]: invalid value 'visoin'; expected one of 'vision', 'projector', 'language'; did you mean 'vision'?\n  $.model.freeze[1]: expected one of 'vision', 'projector', 'language', got int (3)",
    "own:freeze_str": "ConfigError: config.toml: $.model.freeze: expected an array, got str ('vision')",
    "own:hf_overrides_array": "ConfigError: config.toml: $.model.hf_overrides: expected a table, got array ([1])",
    "own:optional_float_str": "ConfigError: config.toml: $.training.max_grad_norm: expected float, got str ('x')",
    "own:optional_int_array": "ConfigError: config.toml: $.training.eval_every_steps: expected int, got array ([1])",
    "own:optional_literal": "ConfigError: config.toml: 2 problems\n  $.parallel.param_dtype: invalid value 'fp8'; expected one of 'float32', 'bfloat16', 'float16'\n  $.parallel.reduce_dtype: expected one of 'float32', 'bfloat16', 'float16', got int (1)",
    "own:literal_array": "ConfigError: config.toml: $.logging.progress: expected one of 'auto', 'bar', 'lines', 'none', got array (['bar'])",
    "own:section_is_array": "ConfigError: config.toml: $.model: expected a table, got array ([1])",
    "own:section_is_string": "ConfigError: config.toml: $.training: expected a table, got str ('fast')",
    "own:eval_int": "ConfigError: config.toml: $.data.eval: expected a path string or a table, got int (3)",
    "own:eval_empty_list": "ConfigError: config.toml: $.data.eval: must not be an empty array",
    "own:train_list_int": "ConfigError: config.toml: 2 problems\n  $.data.train[1]: expected a path string or a table, got int (3)\n  $.data.train[2]: expected a path string or a table, got bool (true)",
    "own:train_list_of_lists": "ConfigError: config.toml: $.data.train[0]: expected a path string or a table, got array (['a.jsonl'])",
    "own:betas_table": "ConfigError: config.toml: $.training.betas: expected an array, got table",
    "own:cross_field_after_field_error": "ConfigError: config.toml: $.training.lr: expected float, got str ('x')",
    "own:cross_field_two_sections": "ConfigError: config.toml: 3 problems\n  $.model: set only one of 'path' and 'config'\n  $.model.max_pixels: must be >= min_pixels (9), got 4\n  $.training: set only one of 'steps' and 'epochs'",
    "own:dp_shard_and_timeout": "ConfigError: config.toml: 2 problems\n  $.parallel.dp_shard: must be -1 (the rest of the world) or >= 1, got -2\n  $.parallel.timeout_s: must be >= 1, got 0",
    "own:weights_bad": "ConfigError: config.toml: 3 problems\n  $.data.train[0].weight: must be > 0.0, got 0.0\n  $.data.train[1].weight: expected float, got str ('2')\n  $.data.train[2].weight: must be a finite number, got inf",
    "own:weight_nan": "ConfigError: config.toml: $.data.train.weight: must be a finite number, got nan",
    "own:path_empty": "ConfigError: config.toml: 2 problems\n  $.data.train: must not be empty\n  $.data.eval.path: must not be empty",
    "own:path_int": "ConfigError: config.toml: $.data.train.path: expected str, got int (3)",
    "own:no_format_no_ext": "ConfigError: config.toml: $.data.train.format: required key is missing",
    "own:image_dir_int": "ConfigError: config.toml: $.data.train.image_dir: expected str, got int (1)",
    "own:image_root_empty": "ConfigError: config.toml: $.data.image_root: must not be empty",
    "own:jsonl_options": "ConfigError: config.toml: 2 problems\n  $.data.train.max_samples: expected int, got float (1.5)\n  $.data.train.max_line_bytes: expected int, got bool (true)",
    "own:shapes_options": "ConfigError: config.toml: 4 problems\n  $.data.train.image_size: must be between 16 and 2048, got 8\n  $.data.train.seed: expected int, got str ('x')\n  $.data.train.split: expected str, got int (3)\n  $.data.eval[0].question_mix: expected an array or a table, got table",
    "own:shapes_mix_str": "ConfigError: config.toml: $.data.train.question_mix: expected an array or a table, got str ('x')",
    "own:shapes_mix_list_str": "ConfigError: config.toml: $.data.train.question_mix: expected an array or a table, got array ([1, 'a', 2])",
    "own:parquet_options": "ConfigError: config.toml: 2 problems\n  $.data.train[0].max_samples: must be >= 1, got 0\n  $.data.train[1].revision: unknown key; valid keys: max_samples",
    # Changed on purpose: format options are checked also when other keys have problems.
    "own:format_options_and_core_error": "ConfigError: config.toml: 2 problems\n  $.training.lr: expected float, got str ('x')\n  $.data.train.num_samples: expected int, got str ('lots')",
    # Changed on purpose: a good source's options are checked beside a bad source.
    "own:format_options_beside_a_bad_source": "ConfigError: config.toml: 2 problems\n  $.data.train[0].weight: must be > 0.0, got 0.0\n  $.data.train[1].num_samples: expected int, got str ('x')",
    "own:format_empty": "ConfigError: config.toml: $.data.train.format: must not be empty",
    "own:format_table": "ConfigError: config.toml: $.data.train.format: expected str, got table",
    "plugin:peft_values": "ConfigError: config.toml: 4 problems\n  $.peft.alpah: unknown key; did you mean 'alpha'?\n  $.peft.method: invalid value 'ia3'; expected one of 'lora', 'dora'\n  $.peft.r: expected int, got str ('8')\n  $.peft.target: expected an array or str, got array ([1])",
    "plugin:peft_without_method": 'ConfigError: config.toml: $.peft.method: not set, so [peft] r, dropout would do nothing; set method = "lora" (or remove them)',
    "plugin:peft_ranges": "ConfigError: config.toml: 3 problems\n  $.peft.r: must be >= 1, got 0\n  $.peft.dropout: must be in [0, 1), got 1.0\n  $.peft.target: must name at least one part or module",
    "plugin:peft_target_union": "ConfigError: config.toml: $.peft.target: expected an array or str, got int (3)",
    "plugin:peft_empty_entry": "ConfigError: config.toml: $.peft.target: entries must not be empty",
    "plugin:peft_scalar": "ConfigError: config.toml: $.peft: expected a table, got int (3)",
    "plugin:encoder_parallel": "ConfigError: config.toml: 4 problems\n  $.encoder_parallel.enable: unknown key; did you mean 'enabled'?\n  $.encoder_parallel.cost_model: invalid value 'flops'; expected one of 'patches', 'patches+attention'\n  $.encoder_parallel.attention_patches: expected int, got float (1.5)\n  $.encoder_parallel.min_imbalance: must be >= 1.0, got 0.5",
    "plugin:memory_profiler": "ConfigError: config.toml: 3 problems\n  $.memory_profiler.snapshot: unknown key; did you mean 'snapshots'?\n  $.memory_profiler.steps: expected a list of steps, 'A-B' or 'all', got 'x'\n  $.memory_profiler.sample_interval_ms: must be > 0.0, got 0.0",
    "plugin:memory_profiler_steps": "ConfigError: config.toml: $.memory_profiler.steps: steps are 1-based, got 0",
    "plugin:memory_profiler_steps_mixed": "ConfigError: config.toml: $.memory_profiler.steps: expected an array or str, got array ([1, 'a'])",
    "plugin:section_typo": "ConfigError: config.toml: $.pef: unknown key; did you mean 'peft'?",
    "plugin:with_core_errors": "ConfigError: config.toml: 3 problems\n  $.data.train: must not be an empty array\n  $.training.steps: must be >= 1, got 0\n  $.peft.r: expected int, got str ('x')",
    "api:int_from_str": "ConfigError: $: expected int, got str ('3')",
    "api:section": "ConfigError: 2 problems\n  $.enabled: expected bool, got str ('yes')\n  $.ranks[0]: expected int, got float (1.5)",
    "api:structure_at": "ConfigError: 2 problems\n  $.plug.x: unknown key; valid keys: enabled, balance, ranks\n  $.plug.enabled: expected bool, got int (1)",
    "api:list": "ConfigError: 2 problems\n  $[1]: expected int, got str ('a')\n  $[2]: expected int, got float (2.0)",
    "api:dict": "ConfigError: $.a: expected int, got str ('x')",
    "api:union": "ConfigError: $: expected int or str, got float (1.5)",
    "api:optional": "ConfigError: $: expected int, got str ('x')",
    "api:literal": "ConfigError: $: invalid value 'c'; expected one of 'a', 'b'",
    "api:section_not_table": "ConfigError: $: expected a table, got int (3)",
    "api:hook_value_error": "ConfigError: 3 problems\n  $.ports[1]: invalid value 'x': invalid literal for int() with base 10: 'x'\n  $.names: keys must be strings, got int (2)\n  $.names: keys must be strings, got int (3)",
}


def test_every_case_is_pinned() -> None:
    assert set(EXPECTED) == set(CASES) | set(API_CASES)
    assert len(CASES) + len(API_CASES) >= 150


@pytest.mark.parametrize("name", [*CASES, *API_CASES])
def test_message(name: str) -> None:
    assert message(name) == EXPECTED[name]


def _broken(value: Any, _: Any) -> Port:
    return value.number  # a bug for a dict: AttributeError


def test_a_bug_in_a_hook_is_not_a_config_error() -> None:
    conv = StrictConverter()
    conv.register_structure_hook(Port, _broken)
    with pytest.raises(AttributeError):
        conv.structure({"ports": [{"number": 1}]}, Ports)


def test_untyped_values_are_copies_of_the_input() -> None:
    table = {"a": {"b": [1]}}
    for structured in (
        converter.structure(table, dict[str, Any])["a"],
        converter.structure([table["a"]], list[Any])[0],
        load_config_dict(
            tomllib.loads(MINIMAL)
            | {"model": {"config": "tiny", "adapter": "x", "hf_overrides": table}}
        ).model.hf_overrides["a"],
    ):
        assert structured == {"b": [1]} and structured is not table["a"]
        assert structured["b"] is not table["a"]["b"]


def main() -> None:
    """Print every case, its input and its message (``--expected``: as the EXPECTED literal)."""
    names = [*CASES, *API_CASES]
    if "--expected" in sys.argv:
        print("EXPECTED: dict[str, str] = {")
        for name in names:
            print(f"    {name!r}: {message(name)!r},")
        print("}")
        return
    for name in names:
        shown = API_CASES[name][0] if name in API_CASES else CASES[name].shown()
        print(f"## {name}\n{shown.rstrip()}\n→ {message(name)}\n")


if __name__ == "__main__":
    main()
