"""Writing a Kimi-K2.5/K2.6 model in the layout of the published checkpoints.

transformers 5.24 holds the routed experts of each MoE layer fused in memory
(``mlp.experts.gate_up_proj`` ``(E, 2·I, H)`` and ``mlp.experts.down_proj`` ``(E, H, I)``) and
the MoonViT attention as separate ``q/k/v_proj`` in split-half RoPE order; its ``kimi_k25``
conversion mapping turns the checkpoints' keys into these on load. Its reverse on
``save_pretrained`` is not the checkpoint layout (it renames the text model's ``layers`` to
``blocks`` and leaves ``model.mm_projector.pre_norm``), so this module maps keys itself
(native, in memory → checkpoint, on disk):

* ``model.language_model.X`` → ``language_model.model.X``; ``lm_head.weight`` →
  ``language_model.lm_head.weight`` (left out when tied);
* ``….mlp.experts.gate_up_proj`` ``[e, :I]`` / ``[e, I:]`` →
  ``….mlp.experts.{e}.gate_proj.weight`` / ``….mlp.experts.{e}.up_proj.weight``;
  ``….mlp.experts.down_proj`` ``[e]`` → ``….mlp.experts.{e}.down_proj.weight``;
* ``model.vision_tower.layers.{i}.``: ``norm1``/``norm2`` → ``norm0``/``norm1``,
  ``mlp.fc1``/``mlp.fc2`` → ``mlp.fc0``/``mlp.fc1``, ``attn.proj`` → ``wo``, and
  ``attn.{q,k,v}_proj`` (weight, bias) → ``wqkv`` = cat(q, k, v) with q and k put back in
  the interleaved (complex) RoPE order, all under ``vision_tower.encoder.blocks.{i}.``;
* ``model.vision_tower.final_layernorm`` → ``vision_tower.encoder.final_layernorm``;
  ``model.vision_tower.patch_embed.proj`` → ``vision_tower.patch_embed.proj``;
  ``….patch_embed.pos_emb.position_embeddings`` → ``vision_tower.patch_embed.pos_emb.weight``;
* ``model.mm_projector.pre_norm`` → ``mm_projector.pre_norm``; ``in_proj``/``out_proj`` →
  ``mm_projector.proj.0``/``mm_projector.proj.2``.

Every rule needs only the tensors of one export group (one layer or vision block; see
:func:`hyper_core.export.group_keys`), so exports stream. ``from_pretrained`` of the native
class reads the result back through transformers' own conversion (the round trip is tested to
give equal logits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from hyper_core.export import CheckpointLayout

_LM = "model.language_model."
_VT = "model.vision_tower."

_VISION_BLOCK = re.compile(r"^model\.vision_tower\.layers\.(\d+)\.(.+)$")
_BLOCK_RENAMES = {
    "norm1.": "norm0.",
    "norm2.": "norm1.",
    "mlp.fc1.": "mlp.fc0.",
    "mlp.fc2.": "mlp.fc1.",
    "attn.proj.": "wo.",
}


def _rope_to_interleaved(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of transformers' ``PermuteForRope``: per head ``[evens…, odds…]`` back to
    interleaved pairs ``(x0, x1), (x2, x3), …`` (the checkpoints' complex-RoPE order)."""
    dim0 = tensor.shape[0]
    half = dim0 // num_heads // 2
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, 2, half, *rest).transpose(1, 2).reshape(dim0, *rest)


def to_checkpoint_layout(
    state_dict: Mapping[str, torch.Tensor], hf_config: Any
) -> dict[str, torch.Tensor]:
    """The native state dict renamed/split/fused into the published checkpoint's keys.

    Tied ``lm_head`` (``tie_word_embeddings``) is left out. Raises ``KeyError`` for a key it
    has no rule for (so nothing is silently dropped or misnamed).
    """
    import torch

    heads = hf_config.vision_config.num_attention_heads
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        if key.startswith(_LM):
            rest = key[len(_LM) :]
            if rest.endswith("mlp.experts.gate_up_proj"):
                base = "language_model.model." + rest[: -len("gate_up_proj")]
                half = tensor.shape[1] // 2
                for e in range(tensor.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = tensor[e, :half]
                    out[f"{base}{e}.up_proj.weight"] = tensor[e, half:]
            elif rest.endswith("mlp.experts.down_proj"):
                base = "language_model.model." + rest[: -len("down_proj")]
                for e in range(tensor.shape[0]):
                    out[f"{base}{e}.down_proj.weight"] = tensor[e]
            else:
                out["language_model.model." + rest] = tensor
        elif key == "lm_head.weight":
            if not tied:
                out["language_model.lm_head.weight"] = tensor
        elif (m := _VISION_BLOCK.match(key)) is not None:
            layer, rest = int(m.group(1)), m.group(2)
            attn = re.match(r"^attn\.([qkv])_proj\.(weight|bias)$", rest)
            if attn is not None:
                qkv.setdefault((layer, attn.group(2)), {})[attn.group(1)] = tensor
                continue
            for old, new in _BLOCK_RENAMES.items():
                if rest.startswith(old):
                    rest = new + rest[len(old) :]
                    break
            else:
                raise KeyError(f"no checkpoint name for {key!r}")
            out[f"vision_tower.encoder.blocks.{layer}.{rest}"] = tensor
        elif key.startswith(_VT + "final_layernorm."):
            out["vision_tower.encoder." + key[len(_VT) :]] = tensor
        elif key == _VT + "patch_embed.pos_emb.position_embeddings":
            out["vision_tower.patch_embed.pos_emb.weight"] = tensor
        elif key.startswith(_VT + "patch_embed.proj."):
            out["vision_tower." + key[len(_VT) :]] = tensor
        elif key.startswith("model.mm_projector."):
            rest = key[len("model.mm_projector.") :]
            rest = rest.replace("in_proj.", "proj.0.", 1).replace("out_proj.", "proj.2.", 1)
            out["mm_projector." + rest] = tensor
        else:
            raise KeyError(f"no checkpoint name for {key!r}")
    for (layer, kind), parts in sorted(qkv.items()):
        if set(parts) != {"q", "k", "v"}:
            raise KeyError(f"vision block {layer}: incomplete q/k/v {kind} ({sorted(parts)})")
        fused = torch.cat(
            [
                _rope_to_interleaved(parts["q"], heads),
                _rope_to_interleaved(parts["k"], heads),
                parts["v"],
            ],
            dim=0,
        )
        out[f"vision_tower.encoder.blocks.{layer}.wqkv.{kind}"] = fused
    return out


def is_native_key(key: str) -> bool:
    """Whether ``key`` is one of transformers' native names (else: a remote-code model's own
    name, written as it is)."""
    return key.startswith("model.") or key == "lm_head.weight"


def convert_group(tensors: Mapping[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """One export group (a layer, a vision block, a module) in the checkpoint layout: native
    names through :func:`to_checkpoint_layout`, a remote-code model's as they are."""
    if tensors and all(is_native_key(k) for k in tensors):
        return to_checkpoint_layout(tensors, hf_config)
    return dict(tensors)


def checkpoint_layout(hf_config: Any) -> CheckpointLayout:
    """The published layout, group by group; ``config.json`` names the architecture."""
    import copy

    from hyper_core.export import CheckpointLayout

    cfg = copy.deepcopy(hf_config)
    if not getattr(cfg, "architectures", None):
        cfg.architectures = ["Kimi_K25ForConditionalGeneration"]
    return CheckpointLayout(
        convert=lambda tensors: convert_group(tensors, cfg),
        save_config=lambda out: cfg.save_pretrained(str(out)),
    )
