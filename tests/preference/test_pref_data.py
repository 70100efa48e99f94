"""Preference data: the accepted pair shapes, JSON arrays and Parquet, bad pairs counted by
reason in ``data stats`` and in a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pref_helpers import PLUGIN, dpo_config, train, write_text_pairs

from hyper_core.config import load_config_dict
from hyper_core.testing import isolated_host
from hyper_core.trainer.data_stats import data_stats
from hyper_preference.data import PairFeatures


def _stats(tmp_path: Path, source: dict[str, Any], max_seq_len: int = 128) -> Any:
    host = isolated_host([PLUGIN])
    raw = dpo_config(tmp_path / "out", tmp_path / "unused.jsonl")
    raw["data"]["train"] = source
    raw["data"]["max_seq_len"] = max_seq_len
    config = load_config_dict(raw, sections=host.registries.config_sections)
    return data_stats(config, host, limit=None)


def _pairs(tmp_path: Path, style: str) -> list[PairFeatures]:
    """The transformed pairs of a file in ``style``, through the run's dataset stage."""
    from hyper_core.trainer.data_stats import prepare_data

    host = isolated_host([PLUGIN])
    path = write_text_pairs(tmp_path / f"{style}.jsonl", 6, style=style)
    config = load_config_dict(
        dpo_config(tmp_path / "out", path), sections=host.registries.config_sections
    )
    splits = prepare_data(config, host).datasets
    return [splits.train[i] for i in range(len(splits.train))]


def test_pair_shapes_give_the_same_sequences(tmp_path: Path) -> None:
    """Replies as strings beside ``messages``, LLaMA-Factory's ShareGPT ``conversations`` with
    reply messages, and TRL's prompt/chosen/rejected: the same two tokenised conversations."""
    shapes = {style: _pairs(tmp_path, style) for style in ("messages", "sharegpt", "prompt")}
    reference = shapes["messages"]
    assert len(reference) == 6 and all(isinstance(p, PairFeatures) for p in reference)
    for style, pairs in shapes.items():
        for mine, other in zip(reference, pairs, strict=True):
            for side in ("chosen", "rejected"):
                a, b = getattr(mine, side), getattr(other, side)
                assert torch.equal(a.input_ids, b.input_ids), style
                assert torch.equal(a.labels, b.labels), style
            assert mine.length == mine.chosen.length + mine.rejected.length
    first = reference[0]
    assert not torch.equal(first.chosen.labels, first.rejected.labels)
    # the prompt is shared: the sides differ only in the reply
    prompt = int((first.chosen.labels != -100).nonzero()[0])
    assert torch.equal(first.chosen.input_ids[:prompt], first.rejected.input_ids[:prompt])


def test_json_array_and_parquet(tmp_path: Path) -> None:
    rows = [
        json.loads(line)
        for line in write_text_pairs(tmp_path / "p.jsonl", 5).read_text().splitlines()
    ]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq  # the core's parquet extra, installed by scripts/setup.sh

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    for name in ("p.jsonl", "p.json", "p.parquet"):
        stats = _stats(tmp_path, {"format": "preference", "path": str(tmp_path / name)})
        assert (stats.samples_total, len(stats.samples), stats.bad) == (5, 5, ()), name


def test_bad_pairs_are_counted_by_reason(tmp_path: Path) -> None:
    rows = [
        json.loads(line)
        for line in write_text_pairs(tmp_path / "p.jsonl", 4).read_text().splitlines()
    ]
    rows[0].pop("rejected")  # a missing side
    rows[1]["chosen"] = "word " * 200  # a side longer than max_seq_len
    rows[2]["messages"][0]["content"] = "<image> What is this?"  # a placeholder, no image
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = _stats(tmp_path, {"format": "preference", "path": str(path)})
    bad = stats.bad_by_reason()
    assert {k: v["count"] for k, v in bad.items()} == {
        "image_token_mismatch": 1,
        "missing_pair_side": 1,
        "too_long": 1,
    }
    assert bad["missing_pair_side"]["first"] == [f"{path}:1"]
    assert len(stats.samples) == 1

    # a run skips them and counts them in metrics.jsonl
    good = write_text_pairs(tmp_path / "good.jsonl", 8)
    raw = dpo_config(tmp_path / "run", good, training={"steps": 1})
    raw["data"]["train"] = [
        {"format": "preference", "path": str(good)},
        {"format": "preference", "path": str(path)},
    ]
    run = train(raw)
    skipped = [m["skipped"] for m in run.metrics if "skipped" in m]
    assert skipped and set(skipped[-1]) <= {"image_token_mismatch", "missing_pair_side", "too_long"}


def test_token_budget_counts_both_sides(tmp_path: Path) -> None:
    """With ``[data] max_tokens_per_micro_batch`` a pair micro-batch holds whole pairs whose
    two sides together fit the budget."""
    from hyper_core.batching.base import BatchingOptions
    from hyper_core.batching.packed import PackedRuntime
    from hyper_core.batching.token_budget import TokenBudgetCollate
    from hyper_preference.batching import PAIRS_KEY, SEQUENCE_FIELD, pair_collate

    pairs = _pairs(tmp_path, "messages")
    budget = max(p.length for p in pairs) + 1  # one pair at least, rarely two
    runtime = PackedRuntime(BatchingOptions(micro_batch_size=4, max_seq_len=128, pad_token_id=0))
    collate = pair_collate(TokenBudgetCollate(runtime, budget), runtime)
    micro_batches = collate(pairs)
    assert sum(mb.loss_inputs[PAIRS_KEY] for mb in micro_batches) == len(pairs)
    assert len(micro_batches) > len(pairs) / 4  # the budget, not micro_batch_size, split them
    for mb in micro_batches:
        assert mb.num_tokens <= budget
        n = mb.loss_inputs[PAIRS_KEY]
        assert mb.num_loss_tokens == mb.num_samples == n
        assert set(mb.loss_inputs[SEQUENCE_FIELD].unique().tolist()) == set(range(1, 2 * n + 1))


def test_data_show_renders_each_side_of_a_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyper_core.cli import main
    from hyper_core.config import dump_config

    host = isolated_host([PLUGIN])
    pairs = write_text_pairs(tmp_path / "pairs.jsonl", 2)
    raw = dpo_config(tmp_path / "out", pairs)
    config_file = tmp_path / "dpo.toml"
    config_file.write_text(
        dump_config(load_config_dict(raw, sections=host.registries.config_sections))
    )
    row = json.loads(pairs.read_text().splitlines()[0])
    code = main(["data", "show", str(config_file), "--index", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    chosen, rejected = out.split("--- chosen ---")[1].split("--- rejected ---")
    # each side is its own conversation, its own reply trained
    assert f"[[{row['chosen']}" in chosen and f"[[{row['rejected']}" not in chosen
    assert f"[[{row['rejected']}" in rejected and f"[[{row['chosen']}" not in rejected
    pair = _pairs(tmp_path, "messages")[0]
    assert out.splitlines()[1].startswith(f"{pair.length} tokens")  # both sides counted
    code = main(["data", "show", str(config_file), "--index", "0", "--json"])
    report = json.loads(capsys.readouterr()[0])
    assert [p["name"] for p in report["parts"]] == ["chosen", "rejected"]
