"""Run configs: TOML loaded strictly into frozen attrs classes (no torch import here)."""

from hyper_core.config.converter import StrictConverter, converter
from hyper_core.config.dump import config_to_dict, dump_config
from hyper_core.config.loader import (
    KNOWN_PLUGIN_SECTIONS,
    apply_overrides,
    load_config,
    load_config_dict,
    parse_overrides,
    read_toml,
    resolve_path,
)
from hyper_core.config.schema import (
    CORE_SECTIONS,
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
)

__all__ = [
    "CORE_SECTIONS",
    "KNOWN_PLUGIN_SECTIONS",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "DataSource",
    "LoggingConfig",
    "ModelConfig",
    "ParallelConfig",
    "RunConfig",
    "SectionSpec",
    "StrictConverter",
    "TrainingConfig",
    "apply_overrides",
    "config_to_dict",
    "converter",
    "dump_config",
    "load_config",
    "load_config_dict",
    "parse_overrides",
    "read_toml",
    "resolve_path",
]
