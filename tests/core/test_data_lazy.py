"""Lazy JSON lines: the indexed reader equals the eager one, caches its index, pickles small."""

from __future__ import annotations

import json
import os
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from hyper_core.data import jsonl_index
from hyper_core.data.jsonl import JsonlOptions, WithImageDir, load_jsonl_format, read_jsonl
from hyper_core.data.jsonl_index import JsonlFile, scan_lines
from hyper_core.testing import run_tiny_training, tiny_text_config

MAX_LINE = 200


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("HYPER_TRAIN_CACHE", str(cache))
    return cache


class _Scans:
    count = 0


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> _Scans:
    """Counts full scans of a file (the cache exists to spare them)."""
    counter = _Scans()
    real = jsonl_index.scan_lines

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter.count += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(jsonl_index, "scan_lines", counting)
    return counter


def _sample(text: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": text}]}).encode()


def _tricky_bytes() -> bytes:
    """BOM, blank and whitespace-only lines, CRLF, U+2028/U+0085 in strings, bad UTF-8, an
    over-long line, a non-object, invalid JSON, and a last line without ``\\n`` ending in
    ``\\r``."""
    lines = [
        b"\xef\xbb\xbf" + _sample("first"),
        b"",
        b"   \t",
        _sample("crlf") + b"\r",
        json.dumps({"messages": "a\u2028b\x85c"}, ensure_ascii=False).encode(),
        b'{"messages": "\xff\xfe"}',
        _sample("x" * (2 * MAX_LINE)),
        b"[1, 2]",
        b"{not json",
        b"\r",
        _sample("last") + b"\r",
    ]
    return b"\n".join(lines)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_lazy_equals_eager_on_tricky_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _tricky_bytes())
    eager = read_jsonl(path, max_line_bytes=MAX_LINE)
    lazy = JsonlFile(path, max_line_bytes=MAX_LINE)
    assert len(lazy) == len(eager) == 8
    assert list(lazy) == eager
    assert [lazy[i] for i in range(-3, 0)] == eager[-3:]
    reasons = [s["_error"][0] for s in eager if "_error" in s]
    assert reasons == ["invalid_utf8", "too_long", "bad_format", "invalid_json"]


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64])
def test_the_scan_does_not_depend_on_chunk_boundaries(tmp_path: Path, chunk_bytes: int) -> None:
    path = _write(tmp_path / "t.jsonl", _tricky_bytes() + b"\n\n" + _sample("z") + b"\n")
    assert scan_lines(path, chunk_bytes=chunk_bytes).tolist() == scan_lines(path).tolist()


def test_edge_files(tmp_path: Path) -> None:
    for i, data in enumerate([b"", b"\n\n", b"\xef\xbb\xbf", b"\r", b"\r\n" + _sample("a")]):
        path = _write(tmp_path / f"e{i}.jsonl", data)
        assert list(JsonlFile(path)) == read_jsonl(path)


def test_the_format_reads_jsonl_lazily_and_json_eagerly(tmp_path: Path) -> None:
    lines = b"\n".join(_sample(str(i)) for i in range(10))
    _write(tmp_path / "a.jsonl", lines)
    _write(tmp_path / "b.json", lines)
    lazy = load_jsonl_format("a.jsonl", JsonlOptions(max_samples=4), tmp_path)
    assert isinstance(lazy, JsonlFile)
    assert list(lazy) == read_jsonl(tmp_path / "a.jsonl")[:4]
    assert isinstance(load_jsonl_format("b.json", JsonlOptions(), tmp_path), list)


def test_slices_and_image_dir_stay_lazy(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", b"\n".join(_sample(str(i)) for i in range(10)))
    eager = read_jsonl(path)
    lazy = JsonlFile(path)
    assert list(lazy[2:8:2]) == eager[2:8:2]
    assert list(lazy[5:][1:3]) == eager[6:8]
    with_dir = WithImageDir(lazy, "/pics")[3:]
    assert isinstance(with_dir.samples, JsonlFile)
    assert [s["_image_dir"] for s in with_dir] == ["/pics"] * 7
    assert with_dir[0] == {**eager[3], "_image_dir": "/pics"}
    assert "_image_dir" not in lazy[3]


def test_the_index_is_cached_and_invalidated(tmp_path: Path, _cache: Path, scans: _Scans) -> None:
    path = _write(tmp_path / "t.jsonl", _sample("a") + b"\n")
    before = scans.count
    assert len(JsonlFile(path)) == 1
    assert len(JsonlFile(path)) == 1
    assert scans.count == before + 1

    _write(path, _sample("a") + b"\n" + _sample("b") + b"\n")  # size changes
    assert len(JsonlFile(path)) == 2
    assert scans.count == before + 2

    stat = path.stat()
    _write(path, _sample("a") + b"\n" + _sample("c") + b"\n")  # same size, new mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert JsonlFile(path)[1]["messages"][0]["content"] == "c"
    assert scans.count == before + 3
    assert len(list((_cache / "jsonl_index").glob("*.npy"))) == 1  # stale ones removed


def test_a_file_changed_after_indexing_is_a_data_error(tmp_path: Path) -> None:
    from hyper_core.errors import DataError

    path = _write(tmp_path / "t.jsonl", _sample("a") + b"\n")
    lazy = JsonlFile(path)
    _write(path, _sample("bb") + b"\n")
    with pytest.raises(DataError, match="changed"):
        lazy[0]


def test_pickles_small_and_without_a_rescan(tmp_path: Path, scans: _Scans) -> None:
    sizes = []
    for n in (10, 20_000):
        path = _write(tmp_path / f"n{n:05d}.jsonl", b"\n".join(_sample("s") for _ in range(n)))
        lazy = JsonlFile(path)
        lazy[0]  # opens the file: the handle must not travel
        before = scans.count
        blob = pickle.dumps(lazy[1:])
        sizes.append(len(blob))
        copy = pickle.loads(blob)
        assert scans.count == before
        assert len(copy) == n - 1 and copy[0] == lazy[1]
    assert sizes[1] - sizes[0] < 64


def test_lazy_and_eager_training_give_the_same_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []

    class Spy(JsonlFile):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(jsonl_index, "JsonlFile", Spy)
    lazy = run_tiny_training(tiny_text_config(tmp_path / "lazy"), steps=5)
    assert made, "the lazy reader was not used"
    monkeypatch.setattr(jsonl_index, "JsonlFile", lambda path, *, max_line_bytes: read_jsonl(path))
    eager = run_tiny_training(tiny_text_config(tmp_path / "eager"), steps=5)
    assert len(lazy.losses) == 5
    assert lazy.losses == pytest.approx(eager.losses, abs=1e-6)


def test_loading_200k_lines_takes_far_less_memory_than_reading_them(tmp_path: Path) -> None:
    line = _sample("describe the picture in a few words, please") + b"\n"
    path = _write(tmp_path / "big.jsonl", line * 200_000)

    def peak(load: Any) -> int:
        tracemalloc.start()
        try:
            kept = load(path)
            return tracemalloc.get_traced_memory()[1] if len(kept) == 200_000 else -1
        finally:
            tracemalloc.stop()

    lazy, eager = peak(JsonlFile), peak(read_jsonl)
    assert 0 < lazy < eager / 10, (lazy, eager)


def test_a_forked_worker_reads_with_its_own_handle(tmp_path: Path) -> None:
    import multiprocessing

    pad = b', "pad": "' + b"x" * 100_000 + b'"}'  # lines larger than a read buffer
    lines = (_sample(str(i))[:-1] + pad for i in range(5))
    path = _write(tmp_path / "t.jsonl", b"\n".join(lines))
    lazy = JsonlFile(path)
    assert lazy[0]["messages"][0]["content"] == "0"  # the parent's handle is open
    parent_fd = lazy._handle.fileno()  # type: ignore[union-attr]
    offset = os.lseek(parent_fd, 0, os.SEEK_CUR)
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()

    def work() -> None:
        queue.put([lazy[i]["messages"][0]["content"] for i in (4, 1)])

    child = context.Process(target=work)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and queue.get() == ["4", "1"]
    assert os.lseek(parent_fd, 0, os.SEEK_CUR) == offset  # no shared file offset to race on
    assert lazy[2]["messages"][0]["content"] == "2"


def test_an_unwritable_cache_only_costs_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scans: _Scans
) -> None:
    not_a_dir = _write(tmp_path / "cache-file", b"")
    monkeypatch.setenv("HYPER_TRAIN_CACHE", str(not_a_dir))
    path = _write(tmp_path / "t.jsonl", b"\n".join(_sample(str(i)) for i in range(5)))
    lazy = JsonlFile(path)
    assert list(lazy) == read_jsonl(path)
    before = scans.count
    assert list(pickle.loads(pickle.dumps(lazy))) == read_jsonl(path)  # the index travels
    assert scans.count == before
