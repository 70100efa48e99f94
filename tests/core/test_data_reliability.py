"""Data reading never loses a valid sample, costs a bounded amount per sample, and takes data as
users have it (JSON arrays, image lists, image directories); no usable data stops the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.types import SampleFeatures
from hyper_core.config.fields import format_options
from hyper_core.data.chat import QWEN_CHATML, check_text_length, tokenize_conversation
from hyper_core.data.conversation import ImagePart, load_image, parse_conversation
from hyper_core.data.dataset import Skipped, TransformedDataset
from hyper_core.data.errors import SampleError
from hyper_core.data.jsonl import JsonlOptions, format_source, load_jsonl_format, read_jsonl
from hyper_core.data.step_loader import StepLoader, StepSampler
from hyper_core.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]


def chat_line(question: str, answer: str = "ok", **extra: Any) -> str:
    sample = {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ],
        **extra,
    }
    return json.dumps(sample, ensure_ascii=False)


# -- JSON lines: split, decode and parse each line on its own ----------------------------------


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_line_separators_inside_strings_are_text(tmp_path: Path, separator: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(chat_line(f"a{separator}b") + "\n" + chat_line("c") + "\n", encoding="utf-8")
    samples = read_jsonl(path)
    assert [s.get("_error") for s in samples] == [None, None]
    assert samples[0]["messages"][0]["content"] == f"a{separator}b"
    assert samples[1]["_source"]["line"] == 2


def test_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + f"{chat_line('a')}\r\n{chat_line('b')}\r\n".encode())
    samples = read_jsonl(path)
    assert [s["messages"][0]["content"] for s in samples] == ["a", "b"]


def test_invalid_utf8_is_one_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    bad = b'{"prompt": "caf\xe9", "completion": "x"}'  # Latin-1, not UTF-8
    path.write_bytes(f"{chat_line('a')}\n".encode() + bad + f"\n{chat_line('b')}\n".encode())
    samples = read_jsonl(path)
    assert len(samples) == 3
    assert samples[0]["messages"][0]["content"] == "a"
    reason, message = samples[1]["_error"]
    assert reason == "invalid_utf8" and "byte 15 of the line" in message
    assert samples[1]["_source"]["line"] == 2
    assert samples[2]["messages"][0]["content"] == "b"


def test_deeply_nested_line_is_a_counted_bad_sample(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    deep = '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}"
    path.write_text(f"{deep}\n{chat_line('b')}\n", encoding="utf-8")
    samples = read_jsonl(path)
    assert samples[0]["_error"] == ("invalid_json", "nested too deeply")
    item = TransformedDataset(samples, parse_conversation, on_error="skip")[0]
    assert isinstance(item, Skipped) and item.reason == "invalid_json"
    assert parse_conversation(samples[1]).messages[1].text == "ok"


def test_integer_too_long_to_convert_is_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"n": ' + "9" * 5000 + "}\n", encoding="utf-8")
    assert read_jsonl(path)[0]["_error"][0] == "invalid_json"


def test_line_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    long = chat_line("x" * 500)
    path.write_text(f"{chat_line('a')}\n{long}\n", encoding="utf-8")
    samples = load_jsonl_format(str(path), JsonlOptions(max_line_bytes=200))
    assert "_error" not in samples[0]
    reason, message = samples[1]["_error"]
    assert reason == "too_long" and f"{len(long)} bytes > max_line_bytes 200" in message
    assert "_error" not in load_jsonl_format(str(path))[1]  # the default is large
    with pytest.raises(ConfigError) as info:
        format_options(JsonlOptions, {"max_line_bytes": 0}, "$.data.train")
    assert info.value.problems[0][0] == "$.data.train.max_line_bytes"


# -- JSON arrays ---------------------------------------------------------------------------------


def test_json_array_with_index_provenance(tmp_path: Path) -> None:
    path = tmp_path / "llava.json"
    items = [json.loads(chat_line("a")), 7, json.loads(chat_line("b"))]
    path.write_text(json.dumps(items, indent=2), encoding="utf-8")
    samples = load_jsonl_format("llava.json", JsonlOptions(max_samples=3), tmp_path)
    file = str(path.resolve())
    assert samples[0]["_source"] == {"file": file, "index": 0}
    assert samples[1]["_error"] == ("bad_format", "expected a JSON object, got int")
    assert format_source(samples[1]) == f"{file}[1]"
    assert parse_conversation(samples[2]).messages[0].text == "b"
    dataset = TransformedDataset(samples, parse_conversation, on_error="raise")
    with pytest.raises(DataError, match=r"llava\.json\[1\]: bad_format"):
        dataset[1]


def test_json_file_of_json_lines_still_works(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(f"\n{chat_line('a')}\n{chat_line('b')}\n", encoding="utf-8")
    samples = read_jsonl(path)
    assert [s["_source"]["line"] for s in samples] == [2, 3]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[{"prompt": "a", "completion": "b"},\n {"prompt": ]', r"d\.json: .*line 2 column"),
        ('{\n  "data": [{"prompt": "a", "completion": "b"}]\n}\n', r"d\.json: one JSON object"),
    ],
    ids=["broken-array", "top-level-object"],
)
def test_json_file_that_is_not_samples(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "d.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=match):
        read_jsonl(path)


# -- images --------------------------------------------------------------------------------------


def test_llava_image_list_is_several_images(tmp_path: Path) -> None:
    sample = json.loads(chat_line("<image><image>Which is brighter?", image=["a.png", "b.png"]))
    conv = parse_conversation(sample, base_dir=tmp_path)
    assert [p.path for p in conv.images] == [tmp_path / "a.png", tmp_path / "b.png"]
    one = json.loads(chat_line("<image>What is it?", image="a.png"))
    assert parse_conversation(one, base_dir=tmp_path).num_images == 1


def test_fifo_image_is_rejected_without_opening(tmp_path: Path) -> None:
    fifo = tmp_path / "image.png"
    os.mkfifo(fifo)

    def hung(*_: Any) -> None:
        raise TimeoutError("load_image opened the FIFO and blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)  # a guard against hanging the suite, not a timing assertion
    try:
        with pytest.raises(SampleError) as info:
            load_image(ImagePart(path=fifo))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert info.value.reason == "missing_image"
    assert info.value.message == f"not a regular file: {fifo}"


def _build_train(tmp_path: Path, data: Mapping[str, Any]) -> Any:
    from hyper_core.builtin.stages import build_dataset
    from hyper_core.config import load_config_dict
    from hyper_core.testing import isolated_host, tiny_text_config

    raw = tiny_text_config(tmp_path / "out", data=data)
    config = load_config_dict(raw, str(tmp_path / "run.toml"))
    registries = isolated_host().registries
    return build_dataset(config=config, transform=None, dist=None, registries=registries).train


def test_image_root_and_image_dir(tmp_path: Path) -> None:
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "t.jsonl").write_text(chat_line("<image>x", image="cat.png") + "\n")
    for name in ("pics", "other"):
        (tmp_path / name).mkdir()

    def image_path(data: Mapping[str, Any]) -> Path | None:
        sample = _build_train(tmp_path, {"train": "ann/t.jsonl", **data}).raw_samples[0]
        return parse_conversation(sample).images[0].path

    assert image_path({}) == tmp_path / "ann" / "cat.png"
    assert image_path({"image_root": "pics"}) == (tmp_path / "pics" / "cat.png").resolve()
    table = {"format": "jsonl", "path": "ann/t.jsonl", "image_dir": "other"}
    expected = (tmp_path / "other" / "cat.png").resolve()
    assert image_path({"image_root": "pics", "train": table}) == expected

    with pytest.raises(ConfigError) as info:
        _build_train(tmp_path, {"train": "ann/t.jsonl", "image_root": "nope"})
    assert info.value.problems[0][0] == "$.data.image_root"
    assert "image directory not found" in str(info.value)
    with pytest.raises(ConfigError) as info:
        _build_train(tmp_path, {"train": {**table, "image_dir": "nope"}})
    assert info.value.problems[0][0] == "$.data.train.image_dir"


def test_image_dir_round_trips_through_the_config() -> None:
    from hyper_core.config import load_config_dict
    from hyper_core.config.converter import converter
    from hyper_core.testing import tiny_text_config

    table = {"format": "jsonl", "path": "t.jsonl", "image_dir": "pics"}
    config = load_config_dict(tiny_text_config("out", data={"train": table}))
    assert config.data.train.image_dir == "pics" and config.data.train.options == {}
    assert converter.unstructure(config.data.train) == table
    with pytest.raises(ConfigError) as info:
        load_config_dict(tiny_text_config("out", data={"train": {**table, "image_dir": 3}}))
    assert info.value.problems[0][0] == "$.data.train.image_dir"


# -- bounded cost: text far over max_seq_len is rejected before tokenising -----------------------


class CountingTokenizer:
    """Wraps a tokenizer, counting ``encode`` calls and their characters."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.chars = 0

    def __len__(self) -> int:
        return len(self.inner)

    def get_vocab(self) -> dict[str, int]:
        return self.inner.get_vocab()

    @property
    def backend_tokenizer(self) -> Any:
        return self.inner.backend_tokenizer

    def encode(self, text: str, **kw: Any) -> list[int]:
        self.calls += 1
        self.chars += len(text)
        return self.inner.encode(text, **kw)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from hyper_core.data.tokenizer import CHATML_SPECIAL_TOKENS, build_offline_tokenizer

    return build_offline_tokenizer(special_tokens=CHATML_SPECIAL_TOKENS)


def conversation(text: str) -> Any:
    return parse_conversation(json.loads(chat_line(text)))


def test_huge_text_is_rejected_without_tokenising(tokenizer: Any) -> None:
    counting = CountingTokenizer(tokenizer)
    with pytest.raises(SampleError) as info:
        tokenize_conversation(
            conversation("word " * 400_000), counting, QWEN_CHATML, max_seq_len=64
        )
    assert info.value.reason == "too_long" and "not tokenised" in info.value.message
    assert counting.calls == 0


@pytest.mark.parametrize(
    "text",
    ["a" * 300, "the answer " * 60, "猫" * 200, "😀" * 120, "e\u0301" * 150, "<|im_end|>" * 40],
    ids=["letters", "words", "cjk", "emoji", "combining", "special"],
)
def test_length_bound_never_rejects_a_sample_that_fits(tokenizer: Any, text: str) -> None:
    conv = conversation(text)
    length = tokenize_conversation(conv, tokenizer, QWEN_CHATML, max_seq_len=None).length
    check_text_length(conv, tokenizer, QWEN_CHATML, length)  # fits exactly: no error
    with pytest.raises(SampleError, match="too_long"):
        tokenize_conversation(conv, tokenizer, QWEN_CHATML, max_seq_len=length - 1)


# -- no usable training data stops the run ------------------------------------------------------


def transform(sample: Mapping[str, Any]) -> SampleFeatures:
    if sample.get("bad"):
        raise SampleError(sample["bad"], "bad")
    ids = torch.tensor([sample["i"] + 1] * 2)
    return SampleFeatures(input_ids=ids, labels=ids.clone(), meta={"i": sample["i"]})


def make_loader(n: int, g: int, bad: Mapping[int, str], **kw: Any) -> StepLoader:
    raw = [{"i": i, **({"bad": bad[i]} if i in bad else {})} for i in range(n)]
    dataset = TransformedDataset(raw, transform, on_error="skip")
    runtime = PaddedRuntime(BatchingOptions(micro_batch_size=2, max_seq_len=8, pad_token_id=0))
    sampler = StepSampler(n, g, shuffle=kw.pop("shuffle", False), seed=0)
    return StepLoader(dataset, runtime.collate, sampler, **kw)


def first_steps(loader: StepLoader, k: int) -> Iterator[Any]:
    it = iter(loader)
    return (next(it) for _ in range(k))


@pytest.mark.parametrize("workers", [0, 1])
def test_no_usable_sample_is_a_data_error_with_counts(workers: int) -> None:
    bad = {i: "invalid_json" if i % 3 else "too_long" for i in range(12)}
    loader = make_loader(12, 4, bad, num_workers=workers)
    with pytest.raises(DataError) as info:
        list(first_steps(loader, 1))
    assert str(info.value) == (
        "the training data has 0 usable samples of 12, fewer than one global batch (4): "
        "skipped 12 samples: invalid_json=8, too_long=4"
    )


def test_fewer_usable_samples_than_a_batch_stop_at_the_end_of_the_epoch() -> None:
    bad = {i: "missing_image" for i in range(12) if i not in (0, 5, 9)}
    loader = make_loader(12, 4, bad)
    it = iter(loader)
    assert [b.num_samples for b in (next(it), next(it))] == [1, 1]
    with pytest.raises(DataError, match=r"has 3 usable samples of 12.*missing_image=9"):
        next(it)  # the last step of the epoch would have told


def test_an_unlucky_first_step_does_not_stop_a_good_run() -> None:
    loader = make_loader(12, 4, {i: "too_long" for i in range(4)})
    batches = list(first_steps(loader, 6))
    assert [b.num_samples for b in batches] == [0, 4, 4, 0, 4, 4]
    assert batches[0].skipped == {"too_long": 4}


def test_all_bad_training_file_via_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f"{{not json {i}\n" for i in range(20)) + "[1]\n" * 4)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyper_core",
            "run",
            str(REPO / "configs" / "text_demo.toml"),
            f"--data.train={data}",
            f"--run.output_dir={tmp_path / 'out'}",
            "--training.steps=3",
            "--training.global_batch_size=8",
            "--training.micro_batch_size=4",
            "--checkpoint.resume=none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hyper-train: error")]
    assert errors == [
        "hyper-train: error: the training data has 0 usable samples of 24, fewer than one "
        "global batch (8): skipped 24 samples: invalid_json=20, bad_format=4"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
