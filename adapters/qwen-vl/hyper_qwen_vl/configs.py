"""Tiny named configs (``[model] config = "tiny"``) for random-init CPU runs and tests.

Shaped like the CPU demo recipe: text hidden 64 × 2 layers, vision hidden 32 × depth 2, MLPs as
wide as their hidden size (160k parameters for Qwen2.5-VL), tied embeddings, a 512-token
vocabulary whose special-token ids match the offline demo tokenizer
(:data:`hyper_qwen_vl.tokens.OFFLINE_IDS`). Plain dicts of HF config kwargs (no imports).
"""

from __future__ import annotations

from typing import Any

from .tokens import (
    EOS_TOKEN,
    IMAGE_PAD,
    OFFLINE_IDS,
    OFFLINE_VOCAB_SIZE,
    PAD_TOKEN,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
)

_TOKEN_IDS: dict[str, int] = {
    "image_token_id": OFFLINE_IDS[IMAGE_PAD],
    "video_token_id": OFFLINE_IDS[VIDEO_PAD],
    "vision_start_token_id": OFFLINE_IDS[VISION_START],
    "vision_end_token_id": OFFLINE_IDS[VISION_END],
}


def _text(
    hidden: int,
    heads: int,
    mrope_section: list[int],
    *,
    intermediate: int | None = None,
    interleaved: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": mrope_section,
    }
    if interleaved:  # Qwen3-VL interleaves the t/h/w frequencies
        rope["mrope_interleaved"] = True
    return {
        "vocab_size": OFFLINE_VOCAB_SIZE,
        "hidden_size": hidden,
        "intermediate_size": intermediate or hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_parameters": rope,
        "pad_token_id": OFFLINE_IDS[PAD_TOKEN],
        "eos_token_id": OFFLINE_IDS[EOS_TOKEN],
        "bos_token_id": None,
        **extra,
    }


def _top(text: dict[str, Any], vision: dict[str, Any]) -> dict[str, Any]:
    return {"text_config": text, "vision_config": vision, "tie_word_embeddings": True, **_TOKEN_IDS}


# head_dim 16 → 8 rotary frequencies, split over (t, h, w).
_QWEN2_SECTION = [2, 3, 3]
# Interleaved (Qwen3-VL): h and w take 2 each of the 8, t the rest.
_QWEN3_SECTION = [4, 2, 2]

QWEN2_VL: dict[str, dict[str, Any]] = {
    "tiny": _top(
        _text(64, 4, _QWEN2_SECTION),
        {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 1,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    ),
}


def _qwen25_vision(hidden: int, out: int, intermediate: int | None = None) -> dict[str, Any]:
    return {
        "depth": 2,
        "hidden_size": hidden,
        "intermediate_size": intermediate or hidden,
        "num_heads": 2,
        "out_hidden_size": out,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
    }


# The published Qwen2.5-VL-7B-Instruct architecture (its config.json): for memory estimates and
# meta-device builds without the checkpoint.
QWEN2_5_VL_7B: dict[str, Any] = {
    "model_type": "qwen2_5_vl",
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen2_5_vl_text",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [16, 24, 24],
        },
    },
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
}

QWEN2_5_VL: dict[str, dict[str, Any]] = {
    "tiny": _top(_text(64, 4, _QWEN2_SECTION), _qwen25_vision(32, 64)),
    # The demo's more robust recipe: 558k parameters; head_dim 32 → 16 frequencies.
    "tiny-558k": _top(_text(128, 4, [4, 6, 6], intermediate=192), _qwen25_vision(64, 128, 96)),
    "qwen2.5-vl-7b": QWEN2_5_VL_7B,
}


def _qwen3_vision(hidden: int, out: int) -> dict[str, Any]:
    return {
        "depth": 2,
        "hidden_size": hidden,
        "intermediate_size": hidden,
        "num_heads": 2,
        "out_hidden_size": out,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    }


_QWEN3_TEXT: dict[str, Any] = {"head_dim": 16, "interleaved": True}

QWEN3_VL: dict[str, dict[str, Any]] = {
    "tiny": _top(_text(64, 4, _QWEN3_SECTION, **_QWEN3_TEXT), _qwen3_vision(32, 64)),
}

# 4 experts, top-2, every layer sparse.
_MOE: dict[str, Any] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
}

# The published Qwen3-VL-30B-A3B-Instruct architecture (its config.json): for memory estimates
# and meta-device builds without the checkpoint. 128 routed experts, 8 per token.
QWEN3_VL_30B_A3B: dict[str, Any] = {
    "model_type": "qwen3_vl_moe",
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_vl_moe_text",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": [24, 20, 20],
            "mrope_interleaved": True,
        },
    },
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
    },
}

QWEN3_VL_MOE: dict[str, dict[str, Any]] = {
    "tiny": _top(_text(64, 4, _QWEN3_SECTION, **_QWEN3_TEXT, **_MOE), _qwen3_vision(32, 64)),
    "qwen3-vl-30b-a3b": QWEN3_VL_30B_A3B,
}
