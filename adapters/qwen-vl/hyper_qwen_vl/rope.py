"""Per-sample 3-D mRoPE position ids, as transformers' ``get_rope_index`` computes them.

transformers (5.25) computes them in a method of the model instance
(``Qwen2VLModel.get_rope_index``, and its Qwen2.5-VL and Qwen3-VL variants); the adapter needs
them per sample in the data pipeline, without a model, so that packed samples keep their own
positions. The rule:

* text tokens count on from the current position on all three rows;
* an image or video of LLM grid ``(t, h, w) = (grid_t, grid_h/m, grid_w/m)`` starting at
  position ``p`` gets rows ``(p + T(t_idx), p + h_idx, p + w_idx)`` in ``t, h, w`` row-major
  order, ``T(i) = i`` except for Qwen2.5-VL videos: ``T(i) = int(i · tokens_per_second ·
  second_per_grid_t)``;
* the text after it continues at ``p + max(h, w)`` (one past the largest spatial row).

A maximal run of image (video) tokens is one image (video); Qwen3-VL writes each temporal patch
of a video as its own run between timestamps, so its video grids are split into ``t`` grids of
``t = 1`` first (``split_video_frames``), as transformers does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def mrope_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
    video_grid_thw: torch.Tensor | None = None,
    video_token_id: int | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    tokens_per_second: float | None = None,
    split_video_frames: bool = False,
) -> torch.Tensor:
    """``(3, L)`` int64 mRoPE positions of one sample ``input_ids`` ``(L,)``.

    ``tokens_per_second`` (Qwen2.5-VL) spaces a video's temporal rows by
    ``tokens_per_second · second_per_grid_ts[v]`` (1 s per grid when that is None).
    """
    import torch

    ids = input_ids.reshape(-1)
    length = int(ids.shape[0])
    kinds = (ids == image_token_id).long()
    if video_token_id is not None:
        kinds = kinds + 2 * (ids == video_token_id).long()
    types = kinds.tolist()
    grids: dict[int, list[tuple[int, int, int]]] = {1: _grids(image_grid_thw), 2: []}
    seconds: list[Any] = []
    if video_grid_thw is not None:
        for v, (t, h, w) in enumerate(_grids(video_grid_thw)):
            second = second_per_grid_ts[v] if second_per_grid_ts is not None else 1
            repeat, t = (t, 1) if split_video_frames else (1, t)
            grids[2].extend([(t, h, w)] * repeat)
            seconds.extend([second] * repeat)
    names = {1: "image", 2: "video"}
    used = {1: 0, 2: 0}
    out = torch.empty(3, length, dtype=torch.long)
    pos = 0
    i = 0
    while i < length:
        j = i
        while j < length and types[j] == types[i]:
            j += 1
        kind = types[i]
        if kind == 0:
            out[:, i:j] = torch.arange(pos, pos + j - i)
            pos += j - i
            i = j
            continue
        index, name = used[kind], names[kind]
        if index >= len(grids[kind]):
            raise ValueError(f"more {name} token groups than {name}s ({len(grids[kind])})")
        t, h, w = grids[kind][index]
        h, w = h // spatial_merge_size, w // spatial_merge_size
        if (j - i) != t * h * w:
            raise ValueError(f"{name} {index}: {j - i} {name} tokens but its grid has {t * h * w}")
        times = torch.arange(t)
        if kind == 2 and tokens_per_second is not None:
            # Same float arithmetic as transformers: an int row times a (tensor) interval.
            times = (times * (tokens_per_second * seconds[index])).long()
        tt, hh, ww = torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")
        out[:, i:j] = torch.stack([tt, hh, ww]).reshape(3, -1) + pos
        pos += max(h, w)
        used[kind] += 1
        i = j
    for kind, name in names.items():
        if used[kind] != len(grids[kind]):
            raise ValueError(f"{len(grids[kind])} {name}s but {used[kind]} {name} token groups")
    return out


def _grids(grid_thw: torch.Tensor | None) -> list[tuple[int, int, int]]:
    if grid_thw is None:
        return []
    return [(int(g[0]), int(g[1]), int(g[2])) for g in grid_thw]


def text_and_mrope_position_ids(
    input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, **kwargs: Any
) -> torch.Tensor:
    """``(4, L)``: the text positions ``0..L-1`` first, then the three mRoPE rows
    (``kwargs``: :func:`mrope_position_ids`'s).

    Qwen-VL text models (5.24) read a 4-row ``position_ids`` as ``[text; t; h; w]`` and build
    the attention mask from the text row; without an attention mask and cache, a text row
    that restarts at 0 marks a new packed sample (``find_packed_sequence_indices``). The mRoPE
    rows cannot serve that purpose: they jump inside a sample after every image.
    """
    import torch

    mrope = mrope_position_ids(input_ids, image_grid_thw, **kwargs)
    text = torch.arange(mrope.shape[1], dtype=torch.long)[None]
    return torch.cat([text, mrope], dim=0)
