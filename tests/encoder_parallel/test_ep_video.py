"""With an adapter whose vision encoder takes images only (no ``video_keys``), a training
forward with videos stops with one clear data error instead of ranks running the vision tower
unequal times (an FSDP hang). (Qwen-VL's videos are balanced: ``test_ep_distributed``.)"""

from __future__ import annotations

import pytest
import torch
from test_ep_host_syncs import _balancer

from hyper_core.errors import DataError


class _Tower(torch.nn.Module):
    def forward(self, **kwargs: torch.Tensor) -> None:
        return None


def test_a_forward_with_videos_is_refused() -> None:
    model = _Tower().train()
    balancer = _balancer(adapter=None, model=model)
    kwargs = {"pixel_values_videos": torch.zeros(4, 8), "input_ids": torch.zeros(1, 4)}
    with pytest.raises(DataError, match="vision encoder takes images only"):
        balancer._pre_forward(model, (), kwargs)
    model.eval()  # evaluation is not balanced: nothing to refuse
    assert balancer._pre_forward(model, (), kwargs) is None
