"""Bad samples are skipped and counted per reason in a real run, or fatal with file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from hyper_core.cli import main
from hyper_core.testing import read_metrics


def sample(image: str, text: str = "What colour is it?", answer: str = "red") -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": text}],
            },
            {"role": "assistant", "content": answer},
        ]
    }


def write_data(root: Path) -> Path:
    Image.new("RGB", (56, 56), (200, 30, 30)).save(root / "ok.png")
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    good = [json.dumps(sample("ok.png")) for _ in range(12)]
    bad = [
        json.dumps(sample("missing.png")),
        json.dumps(sample("corrupt.png")),
        '{"messages": [oops',
        json.dumps(sample("ok.png", text="word " * 400)),
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "<image> hi"},
                    {"role": "assistant", "content": "x"},
                ],
                "images": [],
            }
        ),
    ]
    lines = good[:4] + bad[:2] + good[4:8] + bad[2:] + good[8:]
    path = root / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def config(root: Path, data: Path, on_error: str) -> Path:
    path = root / "c.toml"
    path.write_text(
        f'[run]\noutput_dir = "{root / "out"}"\n[model]\nadapter = "qwen2_5_vl"\nconfig = "tiny"\n'
        f'[data]\ntrain = "{data.name}"\nmax_seq_len = 256\non_error = "{on_error}"\n'
        "shuffle = false\nnum_workers = 0\n"
        "[training]\nsteps = 2\nglobal_batch_size = 8\nmicro_batch_size = 4\nlr = 1e-3\n"
        '[logging]\nevery_steps = 1\nprogress = "none"\n[checkpoint]\nresume = "none"\n'
    )
    return path


def test_bad_samples_are_skipped_and_counted(tmp_path: Path, capsys) -> None:
    data = write_data(tmp_path)
    assert main(["run", str(config(tmp_path, data, "skip"))]) == 0
    err = capsys.readouterr().err
    metrics = [m for m in read_metrics(tmp_path / "out") if "loss" in m]
    skipped = metrics[-1]["skipped"]
    assert skipped == {
        "missing_image": 1,
        "corrupt_image": 1,
        "invalid_json": 1,
        "too_long": 1,
        "image_token_mismatch": 1,
    }
    assert "samples skipped" in err and "missing_image=1" in err


@pytest.mark.parametrize("on_error", ["raise"])
def test_on_error_raise_names_file_and_line(tmp_path: Path, capsys, on_error: str) -> None:
    data = write_data(tmp_path)
    assert main(["run", str(config(tmp_path, data, on_error))]) == 2
    err = capsys.readouterr().err
    assert f"{data}:5" in err and "missing_image" in err and "Traceback" not in err
