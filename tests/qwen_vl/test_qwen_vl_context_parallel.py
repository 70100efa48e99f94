"""The Qwen-VL adapters tell context parallelism what the core does not know of their models:
Qwen3-VL's deepstack inputs are split like the tokens, the towers take a ``grid_thw``."""

from __future__ import annotations

import pytest
import torch

from hyper_core.adapters import ContextParallelAdapter
from hyper_core.parallel.context_parallel import RowSplit
from hyper_qwen_vl.adapters import (
    Qwen2VLAdapter,
    Qwen3VLAdapter,
    Qwen3VLMoeAdapter,
    Qwen25VLAdapter,
)

ADAPTERS = [Qwen2VLAdapter, Qwen25VLAdapter, Qwen3VLAdapter, Qwen3VLMoeAdapter]


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.name)
def test_every_qwen_vl_adapter_is_a_context_parallel_adapter(cls: type) -> None:
    adapter = cls()
    assert isinstance(adapter, ContextParallelAdapter)
    assert adapter.vision_grid_keyword() == "grid_thw"


@pytest.mark.parametrize("cp", [2, 3])
def test_qwen3_vl_deepstack_rows_follow_the_visual_tokens_of_each_rank(cp: int) -> None:
    # two rows of 9 tokens (padded to a multiple of 2·cp), 7 visual tokens in all
    mask = torch.tensor(
        [[0, 1, 1, 0, 1, 0, 0, 1, 1], [1, 0, 0, 0, 0, 0, 1, 0, 0]], dtype=torch.bool
    )
    visual = int(mask.sum())
    # one row per visual token, in row-major order: row i holds i (and 10·i)
    embeds = [torch.arange(visual, dtype=torch.float32)[:, None] * k for k in (1, 10)]
    ordinal = (torch.cumsum(mask.flatten().long(), 0) - 1).view(mask.shape)
    seen: list[int] = []
    for rank in range(cp):
        split = RowSplit(cp, rank)
        out = Qwen3VLAdapter().split_decoder_kwargs(
            {"visual_pos_masks": mask, "deepstack_visual_embeds": embeds, "other": 1}, split
        )
        assert set(out) == {"visual_pos_masks", "deepstack_visual_embeds"}
        local_mask = split.take(mask, 1, False)
        assert torch.equal(out["visual_pos_masks"], local_mask)
        expected = split.take(ordinal, 1, -1)[local_mask]  # this rank's visual tokens, in order
        for k, rows in zip((1, 10), out["deepstack_visual_embeds"], strict=True):
            assert torch.equal(rows[:, 0], expected.float() * k)
        seen += expected.tolist()
    assert sorted(seen) == list(range(visual))  # every visual token's row on exactly one rank


def test_models_without_deepstack_split_nothing_more() -> None:
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert Qwen25VLAdapter().split_decoder_kwargs({"visual_pos_masks": mask}, RowSplit(2, 0)) == {}
    assert Qwen3VLAdapter().split_decoder_kwargs({}, RowSplit(2, 0)) == {}
