"""Per-sample 3-D mRoPE position ids, as transformers' ``get_rope_index`` computes them.

transformers (5.24) computes them in a method of the model instance
(``Qwen2VLModel.get_rope_index``, same logic for images in Qwen2.5-VL and Qwen3-VL); the
adapter needs them per sample in the data pipeline, without a model, so that packed samples
keep their own positions. The rule, for images (``t = 1``):

* text tokens count on from the current position on all three rows;
* an image of LLM grid ``(t, h, w) = (grid_t, grid_h/m, grid_w/m)`` starting at position ``p``
  gets rows ``(p + t_idx, p + h_idx, p + w_idx)`` in ``t, h, w`` row-major order;
* the text after it continues at ``p + max(h, w)`` (one past the image's largest row).

Consecutive image tokens form one image, as in transformers (``<|vision_start|>``/``end``
always separate two images).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def mrope_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
) -> torch.Tensor:
    """``(3, L)`` int64 mRoPE positions of one sample ``input_ids`` ``(L,)``."""
    import torch

    ids = input_ids.reshape(-1)
    length = int(ids.shape[0])
    is_image = (ids == image_token_id).tolist()
    grids = [] if image_grid_thw is None else [tuple(int(v) for v in g) for g in image_grid_thw]
    out = torch.empty(3, length, dtype=torch.long)
    pos = 0
    i = 0
    image = 0
    while i < length:
        j = i
        while j < length and is_image[j] == is_image[i]:
            j += 1
        if not is_image[i]:
            out[:, i:j] = torch.arange(pos, pos + j - i)
            pos += j - i
        else:
            if image >= len(grids):
                raise ValueError(f"more image token groups than images ({len(grids)})")
            t, h, w = grids[image]
            h, w = h // spatial_merge_size, w // spatial_merge_size
            if (j - i) != t * h * w:
                raise ValueError(
                    f"image {image}: {j - i} image tokens but its grid has {t * h * w}"
                )
            tt, hh, ww = torch.meshgrid(
                torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"
            )
            out[:, i:j] = torch.stack([tt, hh, ww]).reshape(3, -1) + pos
            pos += max(h, w)
            image += 1
        i = j
    if image != len(grids):
        raise ValueError(f"{len(grids)} images but {image} image token groups")
    return out


def text_and_mrope_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
) -> torch.Tensor:
    """``(4, L)``: the text positions ``0..L-1`` first, then the three mRoPE rows.

    Qwen-VL text models (5.24) read a 4-row ``position_ids`` as ``[text; t; h; w]`` and build
    the attention mask from the text row; without an attention mask and cache, a text row
    that restarts at 0 marks a new packed sample (``find_packed_sequence_indices``). The mRoPE
    rows cannot serve that purpose: they jump inside a sample after every image.
    """
    import torch

    mrope = mrope_position_ids(
        input_ids,
        image_grid_thw,
        image_token_id=image_token_id,
        spatial_merge_size=spatial_merge_size,
    )
    text = torch.arange(mrope.shape[1], dtype=torch.long)[None]
    return torch.cat([text, mrope], dim=0)
