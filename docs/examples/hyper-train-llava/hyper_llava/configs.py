"""Named configs for ``[model] config = NAME`` (random init): LlavaConfig keyword arguments."""

from __future__ import annotations

from .tokens import OFFLINE_IDS, OFFLINE_VOCAB_SIZE

#: ~0.6M parameters: a CLIP tower of width 64 × 2 layers on 112-px images in 28-px patches
#: (16 image tokens per image), a Llama decoder of width 128 × 2 layers. (With a decoder of
#: width 64 colour accuracy was 0.51 after the demo's 300 steps; with 128 it was 0.97.)
TINY = {
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 112,
        "patch_size": 28,
    },
    "text_config": {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": OFFLINE_VOCAB_SIZE,
        "max_position_embeddings": 1024,
        "pad_token_id": OFFLINE_IDS["pad"],
        "eos_token_id": OFFLINE_IDS["eos"],
        "tie_word_embeddings": True,
    },
    "image_token_id": OFFLINE_IDS["image"],
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "default",
    "projector_hidden_act": "gelu",
}

NAMED_CONFIGS = {"tiny": TINY}
