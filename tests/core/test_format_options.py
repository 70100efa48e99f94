"""Dataset formats declare their options as an attrs class when they register
(``register(name, ref, options=Cls)``): validated with the config, given to the format as an
instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from hyper_core import hookimpl
from hyper_core.builtin.stages import _load_source
from hyper_core.config import load_config_dict
from hyper_core.errors import ConfigError, PluginError
from hyper_core.testing import isolated_host, tiny_text_config

SEEN: list[Any] = []


@attrs.frozen(kw_only=True)
class CountOptions:
    count: int = 1
    label: str = "x"


def load_count(path: str | None, options: CountOptions, base_dir: Path) -> list[dict[str, Any]]:
    SEEN.append(options)
    return [{"prompt": options.label, "completion": "y"} for _ in range(options.count)]


class CountFormat:
    @hookimpl
    def register_dataset_formats(self, register: Any) -> None:
        register("count", load_count, options=CountOptions)


def config_with(tmp_path: Path, train: dict[str, Any]) -> dict[str, Any]:
    raw = tiny_text_config(tmp_path)
    raw["data"]["train"] = train
    return raw


def test_a_plugin_format_s_options_are_validated_at_load_time(tmp_path: Path) -> None:
    host = isolated_host([CountFormat()])
    sections = host.registries.config_sections
    with pytest.raises(ConfigError) as info:
        load_config_dict(
            config_with(tmp_path, {"format": "count", "count": "many", "lable": "z"}),
            sections=sections,
        )
    problems = dict(info.value.problems)
    assert problems["$.data.train.count"] == "expected int, got str ('many')"
    assert problems["$.data.train.lable"] == "unknown key; did you mean 'label'?"


def test_the_format_gets_an_instance_of_its_options(tmp_path: Path) -> None:
    host = isolated_host([CountFormat()])
    config = load_config_dict(
        config_with(tmp_path, {"format": "count", "count": 3}),
        sections=host.registries.config_sections,
    )
    SEEN.clear()
    samples = _load_source(config.data.train, config, host.registries, "train")
    assert SEEN == [CountOptions(count=3)] and len(samples) == 3


def test_built_in_formats_are_checked_with_the_registries_given(tmp_path: Path) -> None:
    raw = config_with(tmp_path, {"format": "shapes", "num_samples": "lots"})
    with pytest.raises(ConfigError) as info:
        load_config_dict(raw, registries=isolated_host().registries)
    assert dict(info.value.problems) == {
        "$.data.train.num_samples": "expected int, got str ('lots')"
    }
    # Without registries the config layer knows no format: the run checks the options.
    assert load_config_dict(raw).data.train.options == {"num_samples": "lots"}


def test_a_format_declaring_options_as_an_attribute_is_told_how_to_register(
    tmp_path: Path,
) -> None:
    def load_old(path: str | None, options: Any, base_dir: Path) -> list[dict[str, Any]]:
        return []

    load_old.options = CountOptions  # type: ignore[attr-defined]

    class OldFormat:
        @hookimpl
        def register_dataset_formats(self, register: Any) -> None:
            register("old", load_old)

    host = isolated_host([OldFormat()])
    config = load_config_dict(
        config_with(tmp_path, {"format": "old", "count": 2}), registries=host.registries
    )
    with pytest.raises(PluginError, match=r"register\('old', ref, options=CountOptions\)"):
        _load_source(config.data.train, config, host.registries, "train")


def test_only_dataset_formats_declare_options() -> None:
    class Odd:
        @hookimpl
        def register_batching_runtimes(self, register: Any) -> None:
            register("odd", "x:Y", options=CountOptions)

    with pytest.raises(PluginError, match="only dataset formats declare options"):
        isolated_host([Odd()])


def test_an_unknown_format_is_left_to_the_run(tmp_path: Path) -> None:
    config = load_config_dict(config_with(tmp_path, {"format": "arrow_x", "path": "x", "n": 1}))
    assert config.data.train.options == {"n": 1}
