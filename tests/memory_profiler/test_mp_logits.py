"""Logits in the estimate follow the trainer's loss path (issue #21): label positions only,
chunked above ``[training] loss_chunk_tokens``, every position for an adapter that opts out;
and the profiler measures what the estimate predicts on a row where ~38% of tokens are labels.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from mp_helpers import run_in_process

from hyper_core.cli import main

#: A vocabulary large enough that the logits dominate the tiny model's activations.
VOCAB = 16384
HIDDEN = 64  # tiny-qwen2's
#: 16 of a sample's 42 tokens carry a label (38.1%, ``data stats``).
ANSWER = "alpha beta gamma delta!"


def _write(root: pathlib.Path, extra: str = "") -> pathlib.Path:
    data = root / "labels.jsonl"
    with data.open("w") as f:
        for i in range(32):
            messages = [
                {"role": "user", "content": f"Say the words {i % 10}"},
                {"role": "assistant", "content": ANSWER},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    path = root / "logits.toml"
    path.write_text(
        f"""\
[run]
output_dir = "{root / "run"}"
seed = 0

[model]
adapter = "hf_causal_lm"
config = "tiny-qwen2"
hf_overrides = {{ vocab_size = {VOCAB} }}

[data]
train = "{data}"
max_seq_len = 512
batching = "packed"
shuffle = false

[training]
steps = 1
global_batch_size = 8
micro_batch_size = 8
lr = 1e-3

[checkpoint]
resume = "none"

[logging]
every_steps = 1
progress = "none"

[memory_profiler]
enabled = true
steps = [1]
plot = false
{extra}"""
    )
    return path


def _estimate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["memory", "estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_logits_rows_follow_the_loss_path(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Label positions: ``F·V`` per label row saved and ``(c + F)·V`` transient; chunked: the
    fp32 gradient buffers and one chunk's peak; every position: per token, as before."""
    config = str(_write(tmp_path))
    tokens, fraction = 1000, 0.38
    argv = [config, "--tokens", str(tokens), "--label-fraction", str(fraction)]
    label = _estimate(capsys, *argv)
    n = 380  # round(0.38 × 1000)
    assert label["loss_path"] == {
        "mode": "label_positions",
        "rows": n,
        "chunk": 0,
        "label_fraction": pytest.approx(fraction),
        "label_source": "--label-fraction",
    }
    assert label["batch"]["label_tokens"] == n
    assert label["activations"]["logits"] == 4 * VOCAB * n
    assert label["transient"]["logits"] == 4 * VOCAB * n  # fp32 run: c = 4
    assert label["transient"]["logits_grad"] == 4 * VOCAB * n

    chunked = _estimate(capsys, *argv, "--training.loss_chunk_tokens=100")
    assert chunked["loss_path"]["mode"] == "chunked" and chunked["loss_path"]["chunk"] == 100
    assert "logits" not in chunked["activations"]
    assert chunked["activations"]["loss_gradients"] == 4 * HIDDEN * (n + VOCAB)
    assert chunked["transient"] == {"logits": 2 * 4 * 100 * VOCAB, "recompute": 0}
    # bf16 autocast: the logits, their fp32 copy, the softmax gradient and its bf16 cast
    bf16 = _estimate(
        capsys, *argv, "--training.loss_chunk_tokens=100", '--training.mixed_precision="bf16"'
    )
    assert bf16["transient"]["logits"] == max(
        (2 * 2 + 2 * 4) * 100 * VOCAB, (2 * 2 + 4) * 100 * VOCAB + (2 + 4) * VOCAB * HIDDEN
    )
    # no chunks when the label rows fit one
    assert _estimate(capsys, *argv, "--training.loss_chunk_tokens=380")["loss_path"]["mode"] == (
        "label_positions"
    )


def test_an_adapter_that_opts_out_keeps_every_position(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_core.adapters.hf import HFModelAdapter

    monkeypatch.setattr(HFModelAdapter, "logits_at_labels_only", False)
    argv = [str(_write(tmp_path)), "--tokens", "1000", "--label-fraction", "0.38"]
    est = _estimate(capsys, *argv, "--training.loss_chunk_tokens=100")
    assert est["loss_path"]["mode"] == "every_position" and est["loss_path"]["rows"] == 1000
    assert est["activations"]["logits"] == 4 * VOCAB * 1000
    assert est["transient"]["logits"] + est["transient"]["logits_grad"] == 8 * VOCAB * 1000


def test_the_label_share_comes_from_the_data_else_the_default(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_write(tmp_path))
    capsys.readouterr()
    assert main(["data", "stats", config, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["per_sample"]
    share = stats["loss_tokens"]["total"] / stats["tokens"]["total"]
    assert 0.37 < share < 0.39  # 16 label tokens of 42 or 43
    measured = _estimate(capsys, config)["loss_path"]
    assert measured["label_fraction"] == pytest.approx(share)
    assert measured["label_source"] == "measured on 32 training samples"
    capsys.readouterr()
    assert main(["memory", "estimate", config]) == 0
    out = capsys.readouterr().out
    rows = round(share * 4096)  # micro_batch_size × max_seq_len
    assert f"\nlogits: at label positions only, {rows:,} of 4,096 rows\n" in out
    assert f"\nlabels: {100 * share:.1f}% of the tokens, measured on 32 training samples\n" in out
    # the data can't be read: the documented default, and why
    missing = str(tmp_path / "missing.jsonl")
    capsys.readouterr()
    assert main(["memory", "estimate", config, f'--data.train="{missing}"']) == 0
    out = capsys.readouterr().out
    assert "\nlabels: 38.0% of the tokens, the default; the data was not read: " in out
    assert "missing.jsonl" in out and out.count("; set --label-fraction\n") == 1


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One profiled step of the tiny model (vocabulary 16k) per loss path."""
    from hyper_core.adapters.hf import HFModelAdapter

    out: dict[str, dict[str, Any]] = {}
    for name in ("label_positions", "every_position", "chunked"):
        root = tmp_path_factory.mktemp(name)
        config = _write(root)
        overrides = ["--training.loss_chunk_tokens=32"] if name == "chunked" else []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(HFModelAdapter, "logits_at_labels_only", name != "every_position")
            run_in_process(config, overrides)
        out[name] = json.loads((root / "run" / "memory" / "summary.json").read_text())
        out[name]["report.md"] = (root / "run" / "memory" / "report.md").read_text()
    return out


def _measured(summary: dict[str, Any]) -> int:
    return int(summary["ranks"][0]["steps"][0]["activations"])


def test_the_profiler_measures_the_logits_the_estimate_predicts(
    profiled: dict[str, dict[str, Any]],
) -> None:
    """On a packed row of 8 samples with 38% label tokens, the saved-for-backward bytes fall
    with logits at label positions only, and each path's estimate (for the measured
    micro-batch, its label tokens counted) is within 1% of its logits term of the measurement."""
    every, label = profiled["every_position"], profiled["label_positions"]
    batch = label["ranks"][0]["steps"][0]["batch"]
    share = batch["label_tokens"] / batch["seq_len"]
    assert batch["rows"] == 1 and batch["samples"] == 8 and 0.35 < share < 0.40
    tokens, labels = batch["seq_len"], batch["label_tokens"]
    assert (
        f"\n- logits: at label positions only, {labels} of {tokens} rows\n"
        f"- labels: {100 * share:.1f}% of the tokens, counted in the micro-batch\n"
    ) in label["report.md"]
    for name, summary in profiled.items():
        est = summary["estimate"]
        assert est["loss_path"]["mode"] == name
        assert est["loss_path"]["label_source"] == "micro-batch"
        term = est["activations"].get("logits") or est["activations"]["loss_gradients"]
        assert abs(_measured(summary) - est["activations"]["total"]) <= 0.01 * term, name
    # the logits dominate: the measured drop is the estimated one (1%), more than half
    drop = _measured(every) - _measured(label)
    predicted = (
        every["estimate"]["activations"]["total"] - label["estimate"]["activations"]["total"]
    )
    assert drop == pytest.approx(predicted, rel=0.01)
    assert _measured(label) < 0.6 * _measured(every)
    # chunked: nothing of (label rows × vocabulary) is kept, only the fp32 gradient buffers
    assert _measured(profiled["chunked"]) < _measured(label)


#: One chunked loss forward per precision in a fresh process, every large block mmapped (so the
#: RSS follows the live tensors), the peak reset before: the rise of ``VmHWM`` over ``VmRSS``.
_CHUNK_PEAK = """
import contextlib, functools, json, pathlib, re, sys
import torch
from hyper_core.step.chunked_loss import chunked_causal_lm_loss

def status(field):
    text = pathlib.Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\\s+(\\d+) kB", text, re.MULTILINE).group(1)) * 1024

V, h, n, k = (int(a) for a in sys.argv[1:5])
out = {}
for name, dtype, autocast in [("fp32", torch.float32, False), ("bf16", torch.bfloat16, True)]:
    head = torch.nn.Linear(h, V, bias=False).to(dtype)
    hidden = torch.randn(n, h, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, V, (n,))
    bf16 = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    ctx = bf16 if autocast else contextlib.nullcontext
    chunked_causal_lm_loss(hidden[:4].detach().requires_grad_(), head, labels[:4], 4.0, 2, ctx)
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    loss = chunked_causal_lm_loss(hidden, head, labels, float(n), k, ctx)
    out[name] = status("VmHWM") - before
    del loss, head, hidden
print(json.dumps(out))
"""


def test_a_chunk_peak_is_what_the_estimate_says() -> None:
    """The chunked loss's forward peak (one chunk's logits, fp32 copy, softmax gradient and,
    under bf16, the head weight's gradient product; plus the fp32 gradient buffers) measured
    in RSS is the estimate's ``logits`` transient + ``loss_gradients`` within 10%, in fp32 and
    under bf16 autocast of bf16 weights (FSDP2's gathered head). On CPU only, adding the bf16
    product into the fp32 buffer makes an fp32 copy of it first (CPU TensorIterator promotes
    inputs by temporaries; CUDA casts as it reads): the CPU peak holds ``F·V·h`` more than the
    device estimate."""
    import os
    import subprocess
    import sys

    from hyper_memory_profiler.estimate import F, Precision, chunk_peak_bytes

    vocab, hidden, rows, chunk = 32768, 512, 2048, 256
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", _CHUNK_PEAK, *map(str, (vocab, hidden, rows, chunk))]
    measured = json.loads(subprocess.run(argv, env=env, capture_output=True, check=True).stdout)
    buffers = F * hidden * (rows + vocab)
    for name, c in [("fp32", 4), ("bf16", 2)]:
        prec = Precision(
            weight_bytes=c, compute_weight_bytes=c, compute_bytes=c, autocast=c == 2, reduce_bytes=4
        )
        estimate = chunk_peak_bytes(chunk, vocab, hidden, prec) + buffers
        cpu_only = F * vocab * hidden if c == 2 else 0
        assert measured[name] == pytest.approx(estimate + cpu_only, rel=0.10), name
    # the bf16 peak holds the head weight's gradient product (and, on CPU, its fp32 copy)
    assert measured["bf16"] > measured["fp32"] + 4 * vocab * hidden
