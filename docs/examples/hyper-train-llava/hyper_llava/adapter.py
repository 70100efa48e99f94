"""The LLaVA adapter: transformers' ``LlavaForConditionalGeneration`` in hyper-train.

``HFModelAdapter`` does config loading (named config or ``[model] path``), random init or
safetensors loading, meta-device builds, freezing and export; this class names the modules
and supplies what is LLaVA-specific: the processor, the transform and the FLOPs. The per-image
view of the vision tower (encoder parallelism) is ``HFModelAdapter``'s default for its one
vision input key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hyper_core.adapters.base import FlopsCount, ModelAssets
from hyper_core.adapters.hf import HFModelAdapter, count_params

from .configs import NAMED_CONFIGS
from .tokens import CHAT_FORMAT

if TYPE_CHECKING:
    import torch

    from hyper_core.batching.types import MicroBatch, SampleFeatures
    from hyper_core.config import ModelConfig


class LlavaAdapter(HFModelAdapter):
    """LLaVA: CLIP vision tower → MLP projector → decoder (Llama, Qwen2, Mistral...)."""

    name = "llava"
    config_class = "transformers:LlavaConfig"
    model_class = "transformers:LlavaForConditionalGeneration"
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = NAMED_CONFIGS
    default_batching = "packed"
    # FSDP / activation-checkpointing units: decoder layers and vision encoder layers.
    sharding_units = (
        "model.language_model.layers.*",
        "model.vision_tower.encoder.layers.*",
    )
    #: LLaVA reads a hidden layer of CLIP, never its final norm (kept as published).
    unused_parameters = ("model.vision_tower.post_layernorm.*",)
    vision_module = "model.vision_tower"
    projector_module = "model.multi_modal_projector"
    language_module = "model.language_model"
    vision_input_keys = ("pixel_values",)

    # -- data -----------------------------------------------------------------------------------

    def build_assets(self, model_config: ModelConfig) -> ModelAssets:
        """Tokenizer from ``path`` when it has one, else the offline one; the CLIP processor."""
        from hyper_core.builtin.hf_causal_lm import has_tokenizer_files, load_local_tokenizer

        from .processor import LlavaProcessor, build_image_processor
        from .tokens import CHAT_TEMPLATE, build_offline_tokenizer

        cfg = self.hf_config(model_config)
        if has_tokenizer_files(model_config.path):
            tokenizer = load_local_tokenizer(model_config.path, model_config.trust_remote_code)
            if not tokenizer.chat_template:  # exports must render prompts as training does
                tokenizer.chat_template = CHAT_TEMPLATE
        else:
            tokenizer = build_offline_tokenizer()
        processor = LlavaProcessor(
            build_image_processor(cfg.vision_config, model_config.path), tokenizer, cfg
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return ModelAssets(tokenizer=tokenizer, processor=processor, pad_token_id=int(pad))

    def transform(
        self, sample: Mapping[str, Any], assets: ModelAssets, *, max_seq_len: int
    ) -> SampleFeatures:
        """The core's multimodal transform; LLaVA needs no extra fields (1-D positions)."""
        from hyper_core.data.multimodal import tokenize_multimodal

        tok = tokenize_multimodal(sample, assets.processor, CHAT_FORMAT, max_seq_len=max_seq_len)
        return tok.features(sample)

    # -- model ----------------------------------------------------------------------------------

    def freeze_groups(self, model: torch.nn.Module) -> dict[str, list[str]]:
        """Tower, projector, and decoder with its ``lm_head``."""
        groups = super().freeze_groups(model)
        groups["language"] = [self.language_module, "lm_head"]
        return groups

    def flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> FlopsCount:
        """The core's text count; vision: 6 × (tower + projector) × patches per image."""
        text = super().flops(model, micro_batch).text
        pixel_values = micro_batch.model_inputs.get("pixel_values")
        if pixel_values is None:
            return FlopsCount(text=text)
        vision_params = count_params(
            model.get_submodule(self.vision_module), exclude_embeddings=False
        )
        vision_params += count_params(model.get_submodule(self.projector_module))
        vc = model.config.vision_config
        patches = len(pixel_values) * ((vc.image_size // vc.patch_size) ** 2 + 1)  # + CLS
        return FlopsCount(text=text, vision=6.0 * vision_params * patches)
