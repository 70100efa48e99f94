"""Sample errors, the skip counter, JSONL reading and the text demo data."""

from __future__ import annotations

import importlib.util
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_core.config.fields import format_options
from hyper_core.data.errors import SampleError, SkipCounter
from hyper_core.data.jsonl import JsonlOptions, format_source, load_jsonl_format, read_jsonl
from hyper_core.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]


def test_sample_error_keeps_reason_and_pickles() -> None:
    err = SampleError("missing_image", "image not found: a.png")
    assert (err.reason, err.message) == ("missing_image", "image not found: a.png")
    assert str(err) == "missing_image: image not found: a.png"
    back = pickle.loads(pickle.dumps(err))
    assert (back.reason, back.message) == (err.reason, err.message)


def test_skip_counter_add_merge_summary() -> None:
    a = SkipCounter()
    a.add("missing_image")
    a.add("too_long")
    b = SkipCounter({"missing_image": 1})
    a.merge(b).merge({"bad_format": 0})
    assert a.as_dict() == {"missing_image": 2, "too_long": 1}
    assert a.total == 3
    assert a.summary_line() == "skipped 3 samples: missing_image=2, too_long=1"
    assert SkipCounter(["x"]).summary_line() == "skipped 1 sample: x=1"
    assert not SkipCounter() and SkipCounter().summary_line() == "skipped 0 samples"


def test_read_jsonl_provenance_and_deferred_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n   \n{broken\n[1, 2]\n{"b": 2}\n', encoding="utf-8")
    samples = read_jsonl(path)
    assert len(samples) == 4
    file = str(path.resolve())
    assert samples[0] == {"a": 1, "_source": {"file": file, "line": 1}}
    assert samples[1]["_source"]["line"] == 4
    assert samples[1]["_error"][0] == "invalid_json"
    assert samples[2]["_error"] == ("bad_format", "expected a JSON object, got list")
    assert samples[3]["b"] == 2 and samples[3]["_source"]["line"] == 6
    assert format_source(samples[3]) == f"{file}:6"
    assert format_source({}, 7) == "sample #7"


def test_read_jsonl_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match=r"nope\.jsonl"):
        read_jsonl(missing)


def test_load_jsonl_format_resolves_against_base_dir(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.jsonl").write_text('{"i": 0}\n{"i": 1}\n{"i": 2}\n')
    samples = load_jsonl_format("data/t.jsonl", JsonlOptions(), tmp_path)
    assert [s["i"] for s in samples] == [0, 1, 2]
    two = load_jsonl_format("data/t.jsonl", JsonlOptions(max_samples=2), tmp_path)
    assert [s["i"] for s in two] == [0, 1]
    with pytest.raises(ConfigError) as info:
        format_options(JsonlOptions, {"shuffle": True}, "$.data.eval")
    assert info.value.problems[0][0] == "$.data.eval.shuffle"


def test_data_package_imports_without_torch() -> None:
    code = (
        "import sys, hyper_core.data, hyper_core.data.errors, hyper_core.data.jsonl;"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_text_demo_files_are_generated_and_parse() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_text_demo", REPO / "configs" / "data" / "make_text_demo.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "configs/data/text_demo*.jsonl are out of date"

    from hyper_core.data.conversation import parse_conversation

    train = read_jsonl(REPO / "configs" / "data" / "text_demo.jsonl")
    evals = read_jsonl(REPO / "configs" / "data" / "text_demo_eval.jsonl")
    assert len(train) == 1000 and len(evals) == 100
    tasks = {s["meta"]["task"] for s in train}
    assert tasks == {"next_letter", "opposite", "colour", "repeat"}
    for sample in train[:50] + evals[:20]:
        conv = parse_conversation(sample)
        assert conv.prompt_and_answer()[1] == sample["meta"]["answer"]
    assert json.dumps(train[0]) != json.dumps(train[1])
