"""Named configs (``[model] config = NAME``, random init): ``Gemma3Config`` keyword arguments.

Plain dicts (no imports of torch or transformers); the special-token ids are the offline
tokenizer's (:data:`hyper_gemma3.tokens.OFFLINE_IDS`).
"""

from __future__ import annotations

from typing import Any

from .tokens import BOI, BOS, EOI, EOS, IMAGE_SOFT, OFFLINE_IDS, OFFLINE_VOCAB_SIZE, PAD

#: ~150k parameters: a SigLIP tower of width 32 × 2 layers on 64-px images in 8-px patches
#: (8×8 patches pooled to 4×4 = 16 soft tokens per image), a Gemma 3 decoder of width 64 ×
#: 2 layers (one sliding-window layer of 16 tokens, one global), tied embeddings.
TINY: dict[str, Any] = {
    "text_config": {
        "model_type": "gemma3_text",
        "vocab_size": OFFLINE_VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 4096,
        "pad_token_id": OFFLINE_IDS[PAD],
        "eos_token_id": OFFLINE_IDS[EOS],
        "bos_token_id": OFFLINE_IDS[BOS],
    },
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
        "vision_use_head": False,  # as published: Gemma 3 reads the patch states, not a pooled head
    },
    "mm_tokens_per_image": 16,
    "boi_token_index": OFFLINE_IDS[BOI],
    "eoi_token_index": OFFLINE_IDS[EOI],
    "image_token_index": OFFLINE_IDS[IMAGE_SOFT],
    "tie_word_embeddings": True,
}

#: The shapes demo's (``configs/gemma3_demo.toml``): a decoder of width 128 × 2 layers, a SigLIP
#: tower of width 64 × 2 layers on 112-px images in 14-px patches (8×8 pooled to 16 tokens).
DEMO: dict[str, Any] = {
    **TINY,
    "text_config": {
        **TINY["text_config"],
        "hidden_size": 128,
        "intermediate_size": 256,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 64,
    },
    "vision_config": {
        **TINY["vision_config"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "image_size": 112,
        "patch_size": 14,
    },
}

NAMED_CONFIGS: dict[str, dict[str, Any]] = {"tiny": TINY, "demo": DEMO}
