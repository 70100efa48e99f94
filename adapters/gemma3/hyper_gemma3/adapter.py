"""The Gemma 3 adapter: transformers' ``Gemma3ForConditionalGeneration`` in hyper-train.

``HFModelAdapter`` does the rest (configs, loading, sharding, freezing, export, the vision
encoder's per-image view); this class names the modules, the processor, and the per-token
``token_type_ids`` that open each image's soft tokens to bidirectional attention (transformers
builds that mask from them; the packed runtime turns them into attention spans).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hyper_core.adapters.base import ModelAssets
from hyper_core.adapters.hf import HFModelAdapter

from .configs import NAMED_CONFIGS
from .options import Gemma3Options
from .processor import NUM_TILES
from .tokens import CHAT_FORMAT

if TYPE_CHECKING:
    import torch

    from hyper_core.config import ModelConfig
    from hyper_core.data.multimodal import MultimodalTokens


class Gemma3Adapter(HFModelAdapter):
    """Gemma 3: SigLIP tower → pooled soft tokens → Gemma 3 decoder."""

    name = "gemma3"
    config_class = "transformers:Gemma3Config"
    model_class = "transformers:Gemma3ForConditionalGeneration"
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = NAMED_CONFIGS
    default_batching = "packed"
    sharding_units = (
        "model.language_model.layers.*",
        "model.vision_tower.encoder.layers.*",
    )
    vision_module = "model.vision_tower"
    projector_module = "model.multi_modal_projector"
    language_module = "model.language_model"
    vision_input_keys = ("pixel_values",)
    #: Each image's tiles (itself and its pan-and-scan crops) are rows of ``pixel_values``.
    vision_tile_key = NUM_TILES
    vision_features_concatenated = True
    chat_format = CHAT_FORMAT
    options: ClassVar[type[Gemma3Options]] = Gemma3Options

    def build_assets(self, model_config: ModelConfig) -> ModelAssets:
        """Tokenizer from ``path`` when it has one, else the offline one; the PIL processor with
        ``[model.options]``' pan-and-scan."""
        from hyper_core.builtin.hf_causal_lm import has_tokenizer_files, load_local_tokenizer

        from .processor import Gemma3Processor, build_image_processor
        from .tokens import CHAT_TEMPLATE, build_demo_tokenizer

        cfg = self.hf_config(model_config)
        if has_tokenizer_files(model_config.path):
            tokenizer = load_local_tokenizer(model_config.path, model_config.trust_remote_code)
            if not tokenizer.chat_template:
                tokenizer.chat_template = CHAT_TEMPLATE
        else:
            tokenizer = build_demo_tokenizer()
        processor = Gemma3Processor(
            build_image_processor(
                cfg.vision_config, model_config.path, self.parse_options(model_config)
            ),
            tokenizer,
            cfg,
        )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return ModelAssets(tokenizer=tokenizer, processor=processor, pad_token_id=int(pad))

    def sample_fields(self, tokens: MultimodalTokens, assets: ModelAssets) -> dict[str, Any]:
        """``token_type_ids`` (1 on soft image tokens), as stock ``Gemma3Processor`` gives, and
        each image's soft tokens as a bidirectional span (for packed ``varlen`` rows)."""
        from hyper_core.batching.spans import true_runs

        return {
            "token_fields": {"token_type_ids": tokens.is_image.long()},
            "bidirectional_spans": true_runs(tokens.is_image),
        }

    def build_model(
        self, model_config: ModelConfig, *, device: str | torch.device = "cpu", dtype: Any = None
    ) -> torch.nn.Module:
        """The base build; a random init (no ``[model] path``) also draws the projector's
        ``mm_input_projection_weight`` from N(0, initializer_range²): transformers zeroes it,
        which leaves the vision tower without a gradient until the projection has moved."""
        import torch

        model = super().build_model(model_config, device=device, dtype=dtype)
        if model_config.path is None and str(device) != "meta":
            projector = model.get_submodule(self.projector_module)
            std = float(model.config.text_config.initializer_range)
            with torch.no_grad():
                projector.mm_input_projection_weight.normal_(0.0, std)
        return model

    def freeze_groups(self, model: torch.nn.Module) -> dict[str, list[str]]:
        """Tower, projector, and decoder with its ``lm_head``."""
        groups = super().freeze_groups(model)
        groups["language"] = [self.language_module, "lm_head"]
        return groups
