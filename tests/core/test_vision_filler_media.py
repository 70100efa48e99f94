"""The vision filler covers each kind of media: a micro-batch gets it unless it already has
every kind the filler has (images, videos), so every rank runs the tower equally often."""

from __future__ import annotations

import pytest
import torch

from hyper_core.batching.base import BatchingOptions, needs_filler
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.types import IGNORE_INDEX, SampleFeatures


def sample(length: int, *, images: int = 0, videos: int = 0) -> SampleFeatures:
    ids = torch.arange(1, length + 1)
    return SampleFeatures(input_ids=ids, labels=ids.clone(), num_images=images, num_videos=videos)


def filler(*, videos: int) -> SampleFeatures:
    f = sample(5, images=1, videos=videos)
    f.labels.fill_(IGNORE_INDEX)
    f.meta = {"filler": True}
    return f


@pytest.mark.parametrize(
    ("kinds", "appended"),
    [
        ([(0, 0), (0, 0)], True),  # text only
        ([(1, 0), (0, 0)], True),  # images, no video: the tower would run once
        ([(0, 0), (0, 2)], True),  # videos, no image
        ([(1, 1)], False),  # one sample with both
        ([(2, 0), (0, 1)], False),  # both, in different samples
    ],
)
def test_filler_is_appended_unless_images_and_videos_are_present(
    kinds: list[tuple[int, int]], appended: bool
) -> None:
    group = [sample(3 + i, images=im, videos=vid) for i, (im, vid) in enumerate(kinds)]
    runtime = PackedRuntime(BatchingOptions(micro_batch_size=8, max_seq_len=64, pad_token_id=0))
    runtime.vision_filler = filler(videos=1)
    assert needs_filler(group, runtime.vision_filler) is appended
    (mb,) = runtime.collate(group)
    assert (mb.meta[-1] == {"filler": True}) is appended
    assert mb.num_samples == len(group)
    assert mb.num_images == sum(im for im, _ in kinds)
    assert mb.num_tokens == sum(f.length for f in group)
    assert mb.num_padding == (5 if appended else 0)
    assert mb.num_loss_tokens == sum(f.num_loss_tokens for f in group)


def test_an_image_only_filler_ignores_videos() -> None:
    """A model that takes no video (filler without one): only image-less groups get it."""
    image_only = filler(videos=0)
    assert not needs_filler([sample(3, images=1)], image_only)
    assert needs_filler([sample(3)], image_only)
    assert needs_filler([sample(3, videos=1)], image_only)
