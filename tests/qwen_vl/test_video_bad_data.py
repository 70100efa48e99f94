"""Broken videos are bad samples (skipped and counted, or fatal with file:line) in a real run;
a video file without PyAV installed stops the run with the install hint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from PIL import Image
from test_video_processing import write_video

from hyper_core.cli import main
from hyper_core.testing import read_metrics


def sample(video: str | list[str]) -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": video}, {"type": "text", "text": "Moving?"}],
            },
            {"role": "assistant", "content": "yes"},
        ]
    }


def write_data(root: Path, good: int = 7) -> Path:
    write_video(root / "ok.mp4")
    Image.new("RGB", (56, 56), (200, 30, 30)).save(root / "frame.png")
    (root / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    lines = [json.dumps(sample("ok.mp4")) for _ in range(good)]
    lines[2:2] = [
        json.dumps(sample("missing.mp4")),
        json.dumps(sample("corrupt.mp4")),
        json.dumps(sample(["frame.png", "corrupt.png"])),
        json.dumps(sample(["frame.png", "frame.png"])),
    ]
    path = root / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def config(root: Path, data: Path, on_error: str, workers: int = 0) -> Path:
    path = root / "c.toml"
    path.write_text(
        f'[run]\noutput_dir = "{root / "out"}"\n[model]\nadapter = "qwen2_5_vl"\nconfig = "tiny"\n'
        "[model.options]\nvideo_min_pixels = 3136\nvideo_max_pixels = 9408\n"
        f'[data]\ntrain = "{data.name}"\nmax_seq_len = 512\non_error = "{on_error}"\n'
        f"shuffle = false\nnum_workers = {workers}\n"
        "[training]\nsteps = 2\nglobal_batch_size = 4\nmicro_batch_size = 2\nlr = 1e-3\n"
        '[logging]\nevery_steps = 1\nprogress = "none"\n[checkpoint]\nresume = "none"\n'
    )
    return path


def test_broken_videos_are_skipped_and_counted(tmp_path: Path, capsys) -> None:
    data = write_data(tmp_path)
    assert main(["run", str(config(tmp_path, data, "skip"))]) == 0
    err = capsys.readouterr().err
    metrics = [m for m in read_metrics(tmp_path / "out") if "loss" in m]
    assert metrics[-1]["skipped"] == {"corrupt_video": 2, "missing_video": 1}
    assert "corrupt_video=2" in err


def test_on_error_raise_names_file_and_line(tmp_path: Path, capsys) -> None:
    data = write_data(tmp_path)
    assert main(["run", str(config(tmp_path, data, "raise"))]) == 2
    err = capsys.readouterr().err
    assert f"{data}:3" in err and "missing_video" in err and "Traceback" not in err


def test_missing_pyav_gives_the_install_hint(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_data(tmp_path)
    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    # in a DataLoader worker (the default), it still reaches the CLI as one line
    assert main(["run", str(config(tmp_path, data, "skip", workers=1))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"hyper-train: error: video {tmp_path / 'ok.mp4'} needs PyAV: "
        "pip install 'hyper-train-qwen-vl[video]' (PyAV)"
    ]
