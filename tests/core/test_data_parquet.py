"""Parquet and ``datasets.save_to_disk`` data: rows read lazily with the conversation schema,
images inline as bytes, the same training as JSON lines + PNG files, one-line errors."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hyper_core.cli import main
from hyper_core.data.conversation import load_images, parse_conversation
from hyper_core.data.errors import SampleError
from hyper_core.data.parquet import ArrowRows, load_hf_format, load_parquet_format
from hyper_core.testing import read_metrics
from hyper_core.testing.vl import write_test_images

REPO = Path(__file__).resolve().parents[2]
TEXT_CONFIG = str(REPO / "configs" / "text_demo.toml")
IMAGES = ["odd.png", "", "square.png,wide.png", "wide.png", "square.png", "odd.png,odd.png"]


def llava_row(i: int, images: list[str]) -> dict[str, Any]:
    """A LLaVA-style sample with ``images`` (names) and a placeholder for each."""
    question = "<image>" * len(images) + f"Question {i}: what is shown?"
    turns = [{"from": "human", "value": question}, {"from": "gpt", "value": f"answer {i % 4}"}]
    return {"conversations": turns, "images": images}


def write_pair(root: Path, n: int = 12) -> tuple[Path, Path]:
    """The same ``n`` samples as JSON lines with PNG paths and as Parquet with the PNG bytes
    inline (HF ``datasets``' Image struct), in row groups of 5."""
    images = write_test_images(root / "images")
    rows = [llava_row(i, [x for x in IMAGES[i % len(IMAGES)].split(",") if x]) for i in range(n)]
    jsonl = root / "train.jsonl"
    with_dirs = [{**r, "images": [f"images/{x}" for x in r["images"]]} for r in rows]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in with_dirs))
    inline = [
        {**r, "images": [{"bytes": (images / x).read_bytes(), "path": x} for x in r["images"]]}
        for r in rows
    ]
    parquet = root / "train.parquet"
    pq.write_table(pa.Table.from_pylist(inline), parquet, row_group_size=5)
    return jsonl, parquet


def test_rows_are_samples_with_provenance_and_inline_images(tmp_path: Path) -> None:
    _, parquet = write_pair(tmp_path)
    rows = load_parquet_format(str(parquet))
    assert len(rows) == 12 and isinstance(rows, ArrowRows)
    for i in (11, 0, 5, 4, 7):  # across row groups, out of order
        sample = rows[i]
        assert sample["_source"] == {"file": str(parquet), "index": i}
        assert sample["conversations"][0]["value"].endswith(f"Question {i}: what is shown?")
    conv = parse_conversation(rows[2])  # square.png and wide.png, inline
    assert [p.describe() for p in conv.images] == ["square.png (inline)", "wide.png (inline)"]
    expected = [
        Image.open(tmp_path / "images" / n).convert("RGB") for n in ("square.png", "wide.png")
    ]
    assert [im.tobytes() for im in load_images(conv)] == [im.tobytes() for im in expected]
    view = rows[3:9:2]
    assert [s["_source"]["index"] for s in view] == [3, 5, 7]
    copy = pickle.loads(pickle.dumps(rows))
    assert copy[7] == rows[7]
    assert len(pickle.dumps(rows)) < 1000  # the path, not the table


def test_corrupt_inline_bytes_are_a_corrupt_image(tmp_path: Path) -> None:
    row = llava_row(0, ["x"])
    row["images"] = [{"bytes": b"\x89PNG\r\n\x1a\nnot a png", "path": "x.png"}]
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "bad.parquet")
    conv = parse_conversation(load_parquet_format(str(tmp_path / "bad.parquet"))[0])
    with pytest.raises(SampleError) as info:
        load_images(conv)
    assert info.value.reason == "corrupt_image"
    assert "x.png (inline)" in str(info.value)


def test_messages_with_image_structs_and_null_columns(tmp_path: Path) -> None:
    images = write_test_images(tmp_path / "images")
    image = {"bytes": (images / "odd.png").read_bytes(), "path": None}
    rows = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": image, "text": None},
                        {"type": "text", "image": None, "text": "What is it?"},
                    ],
                },
                {"role": "assistant", "content": [{"type": "text", "image": None, "text": "x"}]},
            ],
            "image": None,  # a null column of another schema: no image
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    conv = parse_conversation(load_parquet_format(str(tmp_path / "m.parquet"))[0])
    assert [p.describe() for p in conv.images] == ["<inline image>"]
    assert load_images(conv)[0].size == (93, 57)


def test_a_save_to_disk_directory_reads_like_the_parquet_file(tmp_path: Path) -> None:
    _, parquet = write_pair(tmp_path)
    table = pq.read_table(parquet)
    directory = tmp_path / "hf"
    directory.mkdir()
    for k, part in enumerate((table.slice(0, 7), table.slice(7))):
        with pa.ipc.new_stream(directory / f"data-0000{k}-of-00002.arrow", part.schema) as out:
            out.write_table(part)
    files = [{"filename": f"data-0000{k}-of-00002.arrow"} for k in range(2)]
    (directory / "state.json").write_text(json.dumps({"_data_files": files}))
    rows, hf = load_parquet_format(str(parquet)), load_hf_format(str(directory))
    strip = lambda s: {k: v for k, v in s.items() if k != "_source"}  # noqa: E731
    assert [strip(s) for s in hf] == [strip(s) for s in rows]
    assert hf[8]["_source"] == {"file": str(directory / "data-00001-of-00002.arrow"), "index": 1}


def vl_config(root: Path, name: str, train: str) -> Path:
    """A 5-step tiny Qwen2.5-VL run; ``train`` is the TOML value of ``[data] train``."""
    path = root / f"{name}.toml"
    path.write_text(
        f'[run]\noutput_dir = "{root / name}"\n[model]\nadapter = "qwen2_5_vl"\nconfig = "tiny"\n'
        f"[data]\ntrain = {train}\nmax_seq_len = 256\nnum_workers = 1\n"
        "[training]\nsteps = 5\nglobal_batch_size = 4\nmicro_batch_size = 2\nlr = 1e-3\n"
        '[logging]\nevery_steps = 1\nprogress = "none"\n[checkpoint]\nresume = "none"\n'
    )
    return path


def losses(out: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(out) if "loss" in m}


def test_parquet_with_inline_images_trains_like_jsonl_and_png_files(tmp_path: Path) -> None:
    jsonl, parquet = write_pair(tmp_path)
    assert main(["run", str(vl_config(tmp_path, "jsonl", json.dumps(jsonl.name)))]) == 0
    assert (
        main(
            [
                "run",
                str(
                    vl_config(
                        tmp_path, "parquet", f'{{ format = "parquet", path = "{parquet.name}" }}'
                    )
                ),
            ]
        )
        == 0
    )
    expected = losses(tmp_path / "jsonl")
    assert sorted(expected) == [1, 2, 3, 4, 5]
    assert losses(tmp_path / "parquet") == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_without_pyarrow_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, parquet = write_pair(tmp_path, n=2)
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(sys.modules, name, None)
    train = f'{{ format = "parquet", path = "{parquet}" }}'
    code = main(["data", "stats", TEXT_CONFIG, f"--data.train={train}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "hyper-train: error: reading Parquet/Arrow data needs pyarrow: "
        "pip install 'hyper-train[parquet]'"
    ]


def test_data_stats_reads_parquet_and_names_bad_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"messages": [{"role": "user", "content": "Repeat: tea"}]}
    good["messages"].append({"role": "assistant", "content": "tea"})
    bad = {"messages": [{"role": "user", "content": "no answer"}]}
    data = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([good, good, bad, good]), data, row_group_size=2)
    train = f'[{{ format = "parquet", path = "{data}" }}, '
    train += f'{{ format = "parquet", path = "{data}", weight = 2 }}]'
    code = main(["data", "stats", TEXT_CONFIG, f"--data.train={train}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0] == "samples: 12 read of 12, 9 usable, 3 bad"
    assert f"  bad_format: 3 ({data}[2], {data}[2], {data}[2])" in out.splitlines()


def test_a_parquet_path_or_directory_needs_no_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(5)
    ]
    single = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pylist(rows[:2]), single)
    table = tmp_path / "table.parquet"  # a partitioned table, as Spark writes one
    (table / "part=b").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[2:4]), table / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), table / "part=b" / "part-1.parquet")
    (table / "_SUCCESS").write_text("")
    for path, n in ((single, 2), (table, 3)):
        code = main(["data", "stats", TEXT_CONFIG, f"--data.train={path}", "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(out)["samples"]["usable"] == n
    # Rows in the files' sorted order, each with its own file as provenance.
    loaded = load_parquet_format(str(table))
    sources = [loaded[i]["_source"] for i in range(len(loaded))]
    assert sources == [
        {"file": str(table / "part-0.parquet"), "index": 0},
        {"file": str(table / "part-0.parquet"), "index": 1},
        {"file": str(table / "part=b" / "part-1.parquet"), "index": 0},
    ]
    assert [loaded[i]["messages"][0]["content"] for i in range(3)] == ["Q2", "Q3", "Q4"]
