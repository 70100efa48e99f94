"""Patchwise convolutions: the matmul path equals the convolution, and nothing else changes."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from hyper_core.adapters.patch_conv import PatchwiseConv2d, PatchwiseConv3d, use_patchwise_convs


class Tower(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch3d = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))
        self.patch2d = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4, bias=False)
        self.overlap = torch.nn.Conv2d(3, 8, kernel_size=4, stride=2)
        self.padded = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4, padding=1)
        self.grouped = torch.nn.Conv2d(4, 8, kernel_size=4, stride=4, groups=2)


def _grads(conv: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    conv.zero_grad()
    x = x.clone().requires_grad_(True)
    out = conv(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    grads = [x.grad, conv.weight.grad]
    if conv.bias is not None:
        grads.append(conv.bias.grad)
    return (out.detach(), *grads)


def test_only_plain_non_overlapping_convs_change() -> None:
    tower = Tower()
    keys = {k: v.clone() for k, v in tower.state_dict().items()}
    changed = use_patchwise_convs(tower)
    assert changed == ["patch3d", "patch2d"]
    assert type(tower.patch3d) is PatchwiseConv3d and isinstance(tower.patch3d, torch.nn.Conv3d)
    assert type(tower.patch2d) is PatchwiseConv2d
    assert type(tower.overlap) is torch.nn.Conv2d
    assert type(tower.padded) is torch.nn.Conv2d
    assert type(tower.grouped) is torch.nn.Conv2d
    after = tower.state_dict()
    assert after.keys() == keys.keys()
    assert all(torch.equal(after[k], keys[k]) for k in keys)


@pytest.mark.parametrize("name", ["patch3d", "patch2d"])
def test_single_patch_inputs_match_the_convolution(name: str) -> None:
    torch.manual_seed(0)
    plain = getattr(Tower(), name)
    fast = copy.deepcopy(plain)
    use_patchwise_convs(fast)
    assert type(fast) is not type(plain)
    x = torch.randn(37, 3, *plain.kernel_size)
    for want, got in zip(_grads(plain, x), _grads(fast, x), strict=True):
        assert want.shape == got.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_larger_inputs_take_the_convolution_unchanged() -> None:
    torch.manual_seed(0)
    plain = Tower().patch2d
    fast = copy.deepcopy(plain)
    use_patchwise_convs(fast)
    x = torch.randn(2, 3, 16, 12)  # a whole image: 4 × 3 patches each
    assert torch.equal(fast(x), plain(x))


def test_meta_modules_and_pickling() -> None:
    with torch.device("meta"):
        tower = Tower()
    assert use_patchwise_convs(tower) == ["patch3d", "patch2d"]
    out = tower.patch3d(torch.empty(5, 3, 2, 4, 4, device="meta"))
    assert out.shape == (5, 8, 1, 1, 1)
    restored = pickle.loads(pickle.dumps(Tower()))
    use_patchwise_convs(restored)
    assert type(pickle.loads(pickle.dumps(restored)).patch2d) is PatchwiseConv2d
