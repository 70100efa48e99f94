"""Named configs (``[model] config = NAME``): the tiny CPU model and the real-size shapes.

Plain dicts of ``Kimi_K25Config`` kwargs (no imports of torch/transformers).

* ``tiny``: text hidden 64 × 2 layers (layer 0 dense, layer 1 MoE: 4 routed experts, top-2,
  1 shared; MLA with q/kv LoRA ranks 32/16), vision hidden 32 × 2 blocks, a 16×16 learned
  position table; a 512-token vocabulary whose special-token ids are the offline tokenizer's
  (:data:`hyper_kimi_k26.tokens.OFFLINE_IDS`). About 250k parameters.
* ``kimi-k2.6`` (= ``kimi-k2.5``): the published architecture, for meta-device construction,
  parameter counts and sharding plans (the weights come from ``[model] path``): DeepSeek-V3
  text model (hidden 7168, 61 layers, 64 heads, MLA q_lora 1536 / kv_lora 512, qk 128+64,
  v 128, 384 routed experts + 1 shared, 8 per token, first layer dense, sigmoid ``noaux_tc``
  routing, vocabulary 163840) and the MoonViT tower (patch 14, 27 blocks, hidden 1152, MLP
  4304, 16 heads, 2×2 merge, 64×64 learned positions), projector 4608 → 7168.
"""

from __future__ import annotations

from typing import Any

from .tokens import (
    BOS_TOKEN,
    CHECKPOINT_IDS,
    CHECKPOINT_VOCAB_SIZE,
    IM_END,
    MEDIA_BEGIN,
    MEDIA_END,
    MEDIA_PAD,
    OFFLINE_IDS,
    OFFLINE_VOCAB_SIZE,
    PAD_TOKEN,
    VIDEO_PLACEHOLDER,
)

_TINY_TEXT: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "vocab_size": OFFLINE_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.827,
    "norm_topk_prob": True,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "num_mtp_layers": 0,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "pad_token_id": OFFLINE_IDS[PAD_TOKEN],
    "bos_token_id": OFFLINE_IDS[BOS_TOKEN],
    "eos_token_id": OFFLINE_IDS[IM_END],
}

_TINY_VISION: dict[str, Any] = {
    "patch_size": 14,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "pos_emb_height": 16,
    "pos_emb_width": 16,
    "pos_emb_time": 4,
    "merge_kernel_size": [2, 2],
    "hidden_act": "gelu_pytorch_tanh",
}

TINY: dict[str, Any] = {
    "text_config": _TINY_TEXT,
    "vision_config": _TINY_VISION,
    "projection_hidden_size": _TINY_VISION["hidden_size"],
    "image_token_id": OFFLINE_IDS[MEDIA_PAD],
    "video_token_id": OFFLINE_IDS[VIDEO_PLACEHOLDER],
    "vision_start_token_id": OFFLINE_IDS[MEDIA_BEGIN],
    "vision_end_token_id": OFFLINE_IDS[MEDIA_END],
    "tie_word_embeddings": False,
}

_FULL_TEXT: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "vocab_size": CHECKPOINT_VOCAB_SIZE,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.827,
    "norm_topk_prob": True,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_mtp_layers": 0,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "pad_token_id": CHECKPOINT_IDS[PAD_TOKEN],
    "bos_token_id": CHECKPOINT_IDS[BOS_TOKEN],
    "eos_token_id": CHECKPOINT_IDS[IM_END],
}

_FULL_VISION: dict[str, Any] = {
    "patch_size": 14,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "pos_emb_height": 64,
    "pos_emb_width": 64,
    "pos_emb_time": 4,
    "merge_kernel_size": [2, 2],
    "hidden_act": "gelu_pytorch_tanh",
}

FULL: dict[str, Any] = {
    "text_config": _FULL_TEXT,
    "vision_config": _FULL_VISION,
    "projection_hidden_size": 1152,
    "image_token_id": CHECKPOINT_IDS[MEDIA_PAD],
    "video_token_id": CHECKPOINT_VOCAB_SIZE,  # the published placeholder id (outside the vocab)
    "vision_start_token_id": CHECKPOINT_IDS[MEDIA_BEGIN],
    "vision_end_token_id": CHECKPOINT_IDS[MEDIA_END],
    "tie_word_embeddings": False,
}

KIMI_K25: dict[str, dict[str, Any]] = {"tiny": TINY, "kimi-k2.6": FULL, "kimi-k2.5": FULL}
