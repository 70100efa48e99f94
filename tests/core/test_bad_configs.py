"""Every file in bad_configs/ must fail to load with the problems its ``# expect:`` lines name.

An expectation that is a bare ``$.path`` must be the path of one of the reported problems;
any other expectation must appear in the error message.
"""

from __future__ import annotations

import pathlib

import pytest

from hyper_core.config import load_config
from hyper_core.errors import ConfigError, UserError
from hyper_core.testing import isolated_host

CORPUS = pathlib.Path(__file__).parent / "bad_configs"
FILES = sorted(CORPUS.glob("*.toml"))

GOOD = """\
[model]
adapter = "qwen2_5_vl"
config = "tiny"

[data]
train = "train.jsonl"

[training]
steps = 10
global_batch_size = 8
micro_batch_size = 4
lr = 1e-3
"""


def expectations(path: pathlib.Path) -> list[str]:
    return [
        line.removeprefix("# expect:").strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    ]


def is_path(expectation: str) -> bool:
    return expectation.startswith("$") and " " not in expectation


def check(err: ConfigError, expected: list[str]) -> None:
    paths = [path for path, _ in err.problems]
    message = str(err)
    for item in expected:
        if is_path(item):
            assert item in paths, f"{item} not among {paths}\n{message}"
        else:
            assert item in message, f"{item!r} not in:\n{message}"


def test_corpus_is_large_and_annotated() -> None:
    assert len(FILES) >= 30
    for path in FILES:
        lines = path.read_text().splitlines()
        assert lines[0].startswith("# expect: "), path.name
        assert expectations(path), path.name


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_config_is_rejected(path: pathlib.Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(path, registries=isolated_host().registries)  # the core's formats
    assert isinstance(info.value, UserError)
    assert info.value.source == str(path)
    check(info.value, expectations(path))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["--training.lr=abc"], ["$.training.lr", "expected float, got str ('abc')"]),
        (['--training.lr="1e-4"'], ["$.training.lr", "got str ('1e-4')"]),
        (["--training.lr=inf"], ["$.training.lr", "must be a finite number, got inf"]),
        (["--training.eps=nan"], ["$.training.eps", "must be a finite number, got nan"]),
        (["--training.steps=3.5"], ["$.training.steps", "expected int, got float (3.5)"]),
        (["training.steps=true"], ["$.training.steps", "got bool (true)"]),
        (["--nosuchsection.x=1"], ["$.nosuchsection", "unknown key"]),
        (["--trainig.lr=1"], ["$.trainig", "did you mean 'training'?"]),
        (["--training.lrr=1"], ["$.training.lrr", "did you mean 'lr'?"]),
        (["--training.epochs=3"], ["$.training", "only one of 'steps' and 'epochs'"]),
        (["--model.dtype=fp16"], ["$.model.dtype", "'bfloat16'"]),
        (["--data.train=data.csv"], ["$.data.train", "cannot infer the format"]),
        (["--encoder_parallel.enabled=true"], ["$.encoder_parallel", "pip install"]),
        (["--training.lr.value=1"], ["$.training.lr", "not a table"]),
        (["--training.lr"], ["$.training.lr", "has no value"]),
        (["--=1"], ["--=1", "malformed override"]),
        (["--training..lr=1"], ["--training..lr=1", "malformed override"]),
        (
            ["--training.lr=abc", "--run.seed=x", "--logging.every_steps=0"],
            ["$.training.lr", "$.run.seed", "$.logging.every_steps", "3 problems"],
        ),
    ],
)
def test_bad_override_is_rejected(
    tmp_path: pathlib.Path, overrides: list[str], expected: list[str]
) -> None:
    path = tmp_path / "good.toml"
    path.write_text(GOOD)
    load_config(path)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    check(info.value, expected)


def test_missing_file(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(missing)
    assert str(missing) in str(info.value)


def test_directory_instead_of_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="directory"):
        load_config(tmp_path)


def test_not_utf8(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[run]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(path)
