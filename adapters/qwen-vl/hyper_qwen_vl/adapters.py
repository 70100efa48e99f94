"""Model adapters for Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE on transformers' classes.

All four share one module layout (``model.visual`` = patch embed + blocks + merger(s),
``model.language_model`` = decoder, ``lm_head``) and one data path, so :class:`QwenVLAdapter`
does the work and the subclasses only name classes, configs and image defaults.

What the adapters' ``transform`` returns (per sample; :meth:`QwenVLAdapter.sample_fields`
adds the positions and token fields to the core's multimodal transform):

* ``input_ids``/``labels`` ``(L,)``: ChatML, loss on assistant turns, each image expanded to
  ``<|vision_start|>`` + ``<|image_pad|>`` × (t·h·w / merge²) + ``<|vision_end|>``, each video
  likewise with ``<|video_pad|>`` (Qwen3-VL: one ``<t seconds>`` + span per temporal patch);
* ``position_ids`` ``(4, L)``: row 0 the text positions ``0..L-1`` (transformers detects packed
  sample boundaries from it), rows 1-3 the sample's own mRoPE ``(t, h, w)`` positions;
* ``token_fields["mm_token_type_ids"]`` ``(L,)``: 1 on image tokens, 2 on video tokens (what
  the HF processor returns; the model only reads it when it must compute positions itself);
* ``media``: ``pixel_values`` ``(Σ patches, 3·2·P·P)`` float32, ``image_grid_thw``
  ``(num_images, 3)`` int64 (absent without images); ``pixel_values_videos``,
  ``video_grid_thw`` and, for Qwen2.5-VL, ``second_per_grid_ts`` ``(num_videos,)`` float32
  (absent without videos).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hyper_core.adapters.base import FlopsCount, ModelAssets, MoEBlock, find_moe_blocks
from hyper_core.adapters.hf import (
    HFModelAdapter,
    check_tokenizer,
    count_params,
    has_submodule,
    match_modules,
)
from hyper_core.data.chat import QWEN_CHATML, ChatFormat
from hyper_core.errors import ConfigError, UserError

from . import configs
from .options import QwenVLOptions
from .processor import ImageDefaults, QwenVLProcessor, VideoSettings, build_image_processor
from .tokens import CONFIG_TOKEN_FIELDS, QWEN2_VL_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE
from .video import FrameSampling

if TYPE_CHECKING:
    import torch

    from hyper_core.adapters.base import TokenSplit
    from hyper_core.batching.types import MicroBatch
    from hyper_core.config import ModelConfig
    from hyper_core.data.multimodal import MultimodalTokens

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: Qwen3-VL's own template has no default system turn (Qwen2/2.5 insert one).
QWEN3_CHATML = ChatFormat(
    message_prefix=QWEN_CHATML.message_prefix, message_suffix=QWEN_CHATML.message_suffix
)


class QwenVLAdapter(HFModelAdapter):
    """Shared implementation of the Qwen-VL adapters; subclasses set the class attributes."""

    #: ``model_type`` of the HF config this adapter serves.
    model_type: ClassVar[str] = ""
    default_batching = "packed"
    sharding_units = ("model.language_model.layers.*", "model.visual.blocks.*")
    vision_module = "model.visual"
    #: The tower takes a video's frames like an image's patches (``visual(patches, grid_thw)``).
    vision_video_keys = ("pixel_values_videos", "video_grid_thw")
    projector_module = "model.visual.merger"
    #: Every projector module (Qwen3-VL adds the deepstack mergers); absent ones are skipped.
    projector_modules: ClassVar[tuple[str, ...]] = ("model.visual.merger",)
    language_module = "model.language_model"
    chat_format: ClassVar[ChatFormat] = QWEN_CHATML
    options: ClassVar[type[QwenVLOptions]] = QwenVLOptions
    chat_template: ClassVar[str] = QWEN2_VL_CHAT_TEMPLATE
    image_defaults: ClassVar[ImageDefaults] = ImageDefaults(
        min_pixels=56 * 56, max_pixels=28 * 28 * 1280, image_mean=_CLIP_MEAN, image_std=_CLIP_STD
    )
    #: Qwen2.5-VL: videos' temporal positions follow seconds (``second_per_grid_ts``).
    video_seconds: ClassVar[bool] = False
    #: Qwen3-VL: videos are timestamped temporal patches.
    video_timestamps: ClassVar[bool] = False

    # -- config and model -----------------------------------------------------------------------

    def _config_from_dir(self, path: Path, trust_remote_code: bool) -> Any:
        config_file = path / "config.json"
        if config_file.is_file():
            model_type = json.loads(config_file.read_text()).get("model_type")
            if model_type is not None and model_type != self.model_type:
                raise UserError(
                    f"$.model.path: {path} holds a {model_type!r} model but adapter "
                    f"{self.name!r} serves {self.model_type!r}; set [model] adapter to match "
                    "(or leave it out to pick the adapter from config.json)"
                )
        return super()._config_from_dir(path, trust_remote_code)

    def freeze_groups(self, model: torch.nn.Module) -> dict[str, list[str]]:
        """``vision``: the tower without its merger(s); ``projector``: the merger(s);
        ``language``: the decoder and ``lm_head``. The groups are disjoint."""
        projector = [p for p in self.projector_modules if has_submodule(model, p)]
        visual = model.get_submodule(self.vision_module)
        vision = [
            f"{self.vision_module}.{name}"
            for name, _ in visual.named_children()
            if f"{self.vision_module}.{name}" not in projector
        ]
        language = [self.language_module, "lm_head"]
        return {"vision": vision, "projector": projector, "language": language}

    # -- FLOPs ----------------------------------------------------------------------------------

    def flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> FlopsCount:
        """Text: 6 × active decoder params (experts at top-k/E, lm_head always) × tokens plus
        causal attention. Vision: 6 × (patch embed + blocks) × patches, 6 × mergers ×
        patches/merge², plus full (or, in Qwen2.5-VL's windowed blocks, window) attention;
        video patches count like image patches."""
        lm = model.get_submodule(self.language_module)
        text_cfg = model.config.text_config
        head = model.get_output_embeddings()
        # lm_head counts even when tied to the (excluded) input embeddings: it is a matmul.
        params = count_params(lm) + head.weight.numel() - _inactive_expert_params(lm, text_cfg)
        text = 6.0 * params * micro_batch.num_tokens + self._attention_flops(model, micro_batch)
        # The tower attends within each temporal patch (``cu_seqlens`` per t): one entry each.
        patches = [
            int(h * w)
            for key in ("image_grid_thw", "video_grid_thw")
            if (grid := micro_batch.model_inputs.get(key)) is not None
            for t, h, w in grid.tolist()
            for _ in range(t)
        ]
        vision = self._vision_flops(model, patches) if patches else 0.0
        return FlopsCount(text=text, vision=vision)

    def _vision_flops(self, model: torch.nn.Module, patches: list[int]) -> float:
        visual = model.get_submodule(self.vision_module)
        vc = model.config.vision_config
        merge2 = vc.spatial_merge_size**2
        per_patch = count_params(visual.patch_embed) + count_params(visual.blocks)
        per_token = sum(
            count_params(model.get_submodule(p))
            for p in self.projector_modules
            if has_submodule(model, p)
        )
        total = sum(patches)
        dense = 6.0 * (per_patch * total + per_token * total / merge2)
        hidden = getattr(vc, "embed_dim", None) or vc.hidden_size
        attention = 0.0
        for layer in range(vc.depth):
            span = self._vision_attention_span(vc, layer)
            # QK^T and AV (2 · 2 · s · span · H), non-causal, forward + backward (× 3)
            attention += 12.0 * hidden * sum(p * min(p, span or p) for p in patches)
        return dense + attention

    def _vision_attention_span(self, vision_config: Any, layer: int) -> int | None:
        """Patches each patch attends to in vision block ``layer`` (None: the whole image)."""
        return None

    # -- data -----------------------------------------------------------------------------------

    @classmethod
    def parse_options(cls, model_config: ModelConfig) -> QwenVLOptions:
        """:class:`~hyper_qwen_vl.options.QwenVLOptions`; a bound given both in tokens and in
        pixels (``[model] min_pixels``/``max_pixels``) is a :class:`ConfigError`."""
        options: QwenVLOptions = super().parse_options(model_config)
        for side in ("min", "max"):
            tokens = getattr(options, f"{side}_image_tokens")
            if tokens is not None and getattr(model_config, f"{side}_pixels") is not None:
                raise ConfigError(
                    [
                        (
                            f"$.model.options.{side}_image_tokens",
                            f"set this or [model] {side}_pixels, not both",
                        )
                    ]
                )
        return options

    def build_assets(self, model_config: ModelConfig) -> ModelAssets:
        """Tokenizer from ``path`` when it has tokenizer files, else the offline demo tokenizer;
        the PIL image processor for the model's vision config and the image bounds
        (``[model.options]`` ``min/max_image_tokens`` or ``[model] min/max_pixels``)."""
        from hyper_core.builtin.hf_causal_lm import has_tokenizer_files

        from .tokens import build_demo_tokenizer

        options = self.parse_options(model_config)
        cfg = self.hf_config(model_config)
        vc = cfg.vision_config
        pixels_per_token = (vc.patch_size * vc.spatial_merge_size) ** 2
        min_pixels, max_pixels = options.pixel_bounds(
            pixels_per_token,
            model_config.min_pixels,
            model_config.max_pixels,
        )
        image_kwargs: dict[str, Any] = {
            "patch_size": vc.patch_size,
            "merge_size": vc.spatial_merge_size,
            "temporal_patch_size": vc.temporal_patch_size,
            "defaults": self.image_defaults,
            "min_pixels": min_pixels,
            "max_pixels": max_pixels,
        }
        video_min, video_max = options.video_pixel_bounds(pixels_per_token)
        video = VideoSettings(
            sampling=FrameSampling(
                fps=options.video_fps,
                max_frames=options.video_max_frames,
                temporal_patch_size=vc.temporal_patch_size,
            ),
            min_pixels=video_min,
            max_pixels=video_max,
            second_per_grid=self.video_seconds,
            timestamps=self.video_timestamps,
        )
        try:
            if has_tokenizer_files(model_config.path):
                processor = QwenVLProcessor.from_pretrained(
                    model_config.path,
                    trust_remote_code=model_config.trust_remote_code,
                    chat_template=self.chat_template,
                    video=video,
                    **image_kwargs,
                )
            else:
                processor = QwenVLProcessor(
                    build_image_processor(path=model_config.path, **image_kwargs),
                    build_demo_tokenizer(self.chat_template),
                    video=video,
                )
        except ValueError as exc:
            raise UserError(f"$.model.path: {exc}") from None
        check_tokenizer(cfg, processor.tokenizer, model_config.path, CONFIG_TOKEN_FIELDS)
        tok = processor.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return ModelAssets(
            tokenizer=tok,
            processor=processor,
            pad_token_id=int(pad or 0),
            extra={
                "image_token_id": processor.image_token_id,
                "merge_size": processor.merge_size,
                "tokens_per_second": getattr(vc, "tokens_per_second", None),
            },
        )

    def sample_fields(self, tokens: MultimodalTokens, assets: ModelAssets) -> dict[str, Any]:
        """mRoPE ``position_ids`` and ``mm_token_type_ids`` (see the module docstring) for the
        default :meth:`transform`; ``SampleError``
        ``image_token_mismatch`` when the image tokens do not fit the grids."""
        from hyper_core.data.errors import SampleError

        from .rope import text_and_mrope_position_ids

        processor: QwenVLProcessor = assets.processor
        seconds = self.video_seconds
        try:
            positions = text_and_mrope_position_ids(
                tokens.input_ids,
                tokens.media.get("image_grid_thw"),
                image_token_id=processor.image_token_id,
                spatial_merge_size=processor.merge_size,
                video_grid_thw=tokens.media.get("video_grid_thw"),
                video_token_id=processor.video_token_id,
                second_per_grid_ts=tokens.media.get("second_per_grid_ts"),
                tokens_per_second=assets.extra.get("tokens_per_second") if seconds else None,
                split_video_frames=self.video_timestamps,
            )
        except ValueError as exc:
            raise SampleError("image_token_mismatch", str(exc)) from None
        types = tokens.is_image.long()
        if tokens.is_video is not None:
            types = types + 2 * tokens.is_video.long()
        return {
            "position_ids": positions,
            "token_fields": {"mm_token_type_ids": types},
        }

    # -- context parallelism (the ContextParallelAdapter capability) ----------------------------

    def split_decoder_kwargs(self, kwargs: Mapping[str, Any], split: TokenSplit) -> dict[str, Any]:
        """Qwen2-VL and Qwen2.5-VL give the decoder no other per-token inputs."""
        return {}

    def vision_grid_keyword(self) -> str:
        """The tower is called as ``visual(patches, grid_thw=...)``, images and videos alike."""
        return "grid_thw"

    # -- vision encoder (encoder parallelism) ---------------------------------------------------


def _inactive_expert_params(language_model: torch.nn.Module, text_config: Any) -> int:
    """Expert parameters a token does not use: all experts' × (1 - top_k / num_experts)."""
    num_experts = getattr(text_config, "num_experts", 0) or 0
    top_k = getattr(text_config, "num_experts_per_tok", 0) or 0
    if not num_experts or not top_k:
        return 0
    experts = match_modules(language_model, ("layers.*.mlp.experts",))
    total = sum(count_params(language_model.get_submodule(n)) for n in experts)
    return int(total * (1 - top_k / num_experts))


class Qwen2VLAdapter(QwenVLAdapter):
    """Qwen2-VL (``Qwen2VLForConditionalGeneration``)."""

    name = "qwen2_vl"
    model_type = "qwen2_vl"
    config_class = "transformers:Qwen2VLConfig"
    model_class = "transformers:Qwen2VLForConditionalGeneration"
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = configs.QWEN2_VL


class Qwen25VLAdapter(QwenVLAdapter):
    """Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): windowed vision attention."""

    name = "qwen2_5_vl"
    model_type = "qwen2_5_vl"
    config_class = "transformers:Qwen2_5_VLConfig"
    model_class = "transformers:Qwen2_5_VLForConditionalGeneration"
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = configs.QWEN2_5_VL
    video_seconds = True

    def _vision_attention_span(self, vision_config: Any, layer: int) -> int | None:
        if layer in vision_config.fullatt_block_indexes:
            return None
        side = vision_config.window_size // vision_config.patch_size
        return side * side


class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL (``Qwen3VLForConditionalGeneration``): patch 16, deepstack mergers."""

    name = "qwen3_vl"
    model_type = "qwen3_vl"
    config_class = "transformers:Qwen3VLConfig"
    model_class = "transformers:Qwen3VLForConditionalGeneration"
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = configs.QWEN3_VL
    projector_modules = ("model.visual.merger", "model.visual.deepstack_merger_list")
    chat_format = QWEN3_CHATML
    chat_template = QWEN3_VL_CHAT_TEMPLATE
    video_timestamps = True
    # Offline defaults scaled to patch 16 (the released preprocessor_config.json files, used
    # when the model directory has one, ask for 256×256 at least).
    image_defaults = ImageDefaults(
        min_pixels=64 * 64,
        max_pixels=32 * 32 * 1280,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
    )

    def split_decoder_kwargs(self, kwargs: Mapping[str, Any], split: TokenSplit) -> dict[str, Any]:
        """The deepstack inputs of this rank's tokens: ``visual_pos_masks`` (B, L) split like
        the tokens, and of each ``deepstack_visual_embeds`` tensor (one row per visual token)
        the rows of this rank's visual tokens, in their order."""
        mask = kwargs.get("visual_pos_masks")
        if mask is None:
            return {}
        local_mask, keep = split.marked_rows(mask)
        out: dict[str, Any] = {"visual_pos_masks": local_mask}
        embeds = kwargs.get("deepstack_visual_embeds")
        if embeds is not None:
            out["deepstack_visual_embeds"] = [e.index_select(0, keep) for e in embeds]
        return out


class Qwen3VLMoeAdapter(Qwen3VLAdapter):
    """Qwen3-VL-MoE (``Qwen3VLMoeForConditionalGeneration``): sparse-expert decoder."""

    name = "qwen3_vl_moe"
    model_type = "qwen3_vl_moe"
    config_class = "transformers:Qwen3VLMoeConfig"
    model_class = "transformers:Qwen3VLMoeForConditionalGeneration"
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = configs.QWEN3_VL_MOE

    def moe_blocks(self, model: torch.nn.Module) -> list[MoEBlock]:
        """The sparse ``mlp`` of every decoder layer: routed ``experts`` and top-k ``gate``
        (the :class:`~hyper_core.adapters.base.MoEAdapter` capability)."""
        return find_moe_blocks(model)
