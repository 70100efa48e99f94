"""The ``kimi_k25`` model adapter (aliases ``kimi_k26``, ``Kimi(K25|K26)ForConditionalGeneration``).

On transformers' native ``Kimi_K25ForConditionalGeneration``: ``model.vision_tower`` (MoonViT:
patch embed + learned position table, 2-D RoPE blocks, final LayerNorm, 2×2 temporal/spatial
merge), ``model.mm_projector`` (LayerNorm + MLP, 4·1152 → text hidden) and
``model.language_model`` (DeepSeek-V3: MLA attention, MoE with routed + shared experts),
``lm_head``. With ``[model] trust_remote_code = true`` and an ``auto_map`` in the directory's
``config.json``, the directory's own modeling code is used instead; with the flag off it is
never imported.

What ``KimiK25Adapter.transform`` returns (per sample; the core's multimodal transform,
:meth:`HFModelAdapter.transform <hyper_core.adapters.hf.HFModelAdapter.transform>`, with
:attr:`~KimiK25Adapter.chat_format`):

* ``input_ids``/``labels`` ``(L,)``: the Kimi chat format (:mod:`hyper_kimi_k26.tokens`), loss
  on the assistant answers and their ``<|im_end|>``; each image is
  ``<|media_begin|>image<|media_content|>`` + ``<|media_pad|>`` × (h·w / 4) + ``<|media_end|>``;
* ``position_ids``: none (``0..L-1``: the text model has plain 1-D RoPE; images carry their own
  2-D positions inside the vision tower, from ``image_grid_thw``); the packed runtime restarts
  them per sample, which is how transformers finds the sample boundaries;
* ``media``: ``pixel_values`` ``(Σ patches, 3, 14, 14)`` float32 and ``image_grid_thw``
  ``(num_images, 3)`` = ``(1, gh, gw)`` int64 (absent for text-only samples).
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from hyper_core.adapters import hf
from hyper_core.adapters.base import (
    FlopsCount,
    ModelAssets,
    MoEBlock,
    ParallelPlan,
    VisionEncoderSpec,
    find_moe_blocks,
)
from hyper_core.adapters.hf import HFModelAdapter, check_tokenizer, count_params, match_modules
from hyper_core.errors import UserError

from . import configs
from .tokens import CONFIG_TOKEN_FIELDS, KIMI_CHAT, KIMI_CHAT_TEMPLATE

if TYPE_CHECKING:
    import torch

    from hyper_core.adapters.base import TokenSplit
    from hyper_core.batching.types import MicroBatch
    from hyper_core.config import ModelConfig
    from hyper_core.export import CheckpointLayout

log = logging.getLogger("hyper_train.kimi_k26")

#: ``auto_map`` entries that name a model class, in order of preference.
_AUTO_MODEL_KEYS = (
    "AutoModelForImageTextToText",
    "AutoModelForCausalLM",
    "AutoModelForVision2Seq",
    "AutoModel",
)


@attrs.frozen(kw_only=True)
class Layout:
    """Where the parts of a Kimi model live (native transformers or the hub's remote code)."""

    decoder_layers: str
    vision_blocks: str
    vision: str
    projector: str
    language: tuple[str, ...]


NATIVE = Layout(
    decoder_layers="model.language_model.layers.*",
    vision_blocks="model.vision_tower.layers.*",
    vision="model.vision_tower",
    projector="model.mm_projector",
    language=("model.language_model", "lm_head"),
)
#: The hub's ``modeling_kimi_k25.py`` (``trust_remote_code``): checkpoint names in memory.
REMOTE = Layout(
    decoder_layers="language_model.model.layers.*",
    vision_blocks="vision_tower.encoder.blocks.*",
    vision="vision_tower",
    projector="mm_projector",
    language=("language_model",),
)


def layout_of(model: torch.nn.Module) -> Layout:
    """:data:`NATIVE` or :data:`REMOTE`, from the model's module names."""
    return REMOTE if hf.has_submodule(model, "language_model.model") else NATIVE


class KimiK25Adapter(HFModelAdapter):
    """Kimi-K2.5 / Kimi-K2.6 (``model_type = "kimi_k25"``)."""

    name = "kimi_k25"
    model_type: ClassVar[str] = "kimi_k25"
    config_class = "transformers:Kimi_K25Config"
    model_class = "transformers:Kimi_K25ForConditionalGeneration"
    default_batching = "packed"
    sharding_units = (NATIVE.decoder_layers, NATIVE.vision_blocks)
    vision_module = NATIVE.vision
    projector_module = NATIVE.projector
    language_module = "model.language_model"
    vision_input_keys = ("pixel_values", "image_grid_thw")
    #: Positional: a checkpoint's remote code (``trust_remote_code``) may name them otherwise.
    vision_call_keywords = None
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = configs.KIMI_K25
    chat_format = KIMI_CHAT
    chat_template = KIMI_CHAT_TEMPLATE

    def __init__(self) -> None:
        self._param_cache: weakref.WeakKeyDictionary[Any, dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )

    # -- config -------------------------------------------------------------------------------

    def _config_from_dir(self, path: Path, trust_remote_code: bool) -> Any:
        config_file = path / "config.json"
        raw: dict[str, Any] = {}
        if config_file.is_file():
            raw = json.loads(config_file.read_text())
            model_type = raw.get("model_type")
            if model_type is not None and model_type != self.model_type:
                raise UserError(
                    f"$.model.path: {path} holds a {model_type!r} model but adapter "
                    f"{self.name!r} serves {self.model_type!r}; set [model] adapter to match "
                    "(or leave it out to pick the adapter from config.json)"
                )
            self._check_quantization(path, raw)
        cfg = super()._config_from_dir(path, trust_remote_code)
        # Kimi's lm_head is not tied to the embeddings; a config.json that states it only in
        # text_config must not fall back to the native class's top-level default (True).
        text = raw.get("text_config") or {}
        if "tie_word_embeddings" not in raw and "tie_word_embeddings" in text:
            cfg.tie_word_embeddings = bool(text["tie_word_embeddings"])
        return cfg

    @staticmethod
    def _check_quantization(path: Path, raw: Mapping[str, Any]) -> None:
        """A quantized checkpoint (the published INT4 compressed-tensors one) is a user error."""
        quant = raw.get("quantization_config") or (raw.get("text_config") or {}).get(
            "quantization_config"
        )
        if not quant:
            return
        method = quant.get("quant_method", "?")
        detail = ""
        if method == "compressed-tensors":
            groups = quant.get("config_groups") or {}
            weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, Mapping)]
            bits = sorted({w.get("num_bits") for w in weights if w.get("num_bits")})
            size = sorted({w.get("group_size") for w in weights if w.get("group_size")})
            fmt = quant.get("format")
            parts = [f"INT{b}" for b in bits] + ([fmt] if fmt else [])
            parts += [f"group size {s}" for s in size]
            detail = f" ({', '.join(parts)})" if parts else ""
        raise UserError(
            f"$.model.path: {path} holds {method}-quantized weights{detail}, as the published "
            "Kimi-K2.5/K2.6 checkpoints do; training needs the weights dequantized to BF16 "
            "first: convert the checkpoint to bf16 safetensors (its config.json without "
            "quantization_config) and point [model] path at that directory"
        )

    @staticmethod
    def _check_weights(path: Path) -> None:
        if (path / "config.json").is_file():
            KimiK25Adapter._check_quantization(path, json.loads((path / "config.json").read_text()))
        HFModelAdapter._check_weights(path)

    # -- model --------------------------------------------------------------------------------

    def model_cls(self, hf_config: Any, trust_remote_code: bool) -> Any:
        """The native class; with ``trust_remote_code`` and an ``auto_map`` model entry in the
        directory's config, the directory's own class (its code is imported only then)."""
        from hyper_core.registry import import_ref

        native = import_ref(self.model_class)
        if not trust_remote_code:
            return native
        auto_map = getattr(hf_config, "auto_map", None) or {}
        ref = next((auto_map[k] for k in _AUTO_MODEL_KEYS if auto_map.get(k)), None)
        path = getattr(hf_config, "_name_or_path", None) or getattr(hf_config, "name_or_path", "")
        if ref is None or not path or not Path(path).is_dir():
            log.info(
                "trust_remote_code: no auto_map model class in %s; using the native class", path
            )
            return native
        if isinstance(ref, (list, tuple)):
            ref = ref[0]
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        cls = get_class_from_dynamic_module(ref, str(path), local_files_only=True)
        log.info("trust_remote_code: using %s from %s", cls.__qualname__, path)
        return cls

    def freeze_groups(self, model: torch.nn.Module) -> dict[str, list[str]]:
        """``vision``: the MoonViT tower; ``projector``: ``mm_projector``; ``language``: the
        DeepSeek-V3 decoder and ``lm_head``. Disjoint, together every parameter."""
        lay = layout_of(model)
        language = [p for p in lay.language if hf.has_submodule(model, p)]
        return {"vision": [lay.vision], "projector": [lay.projector], "language": language}

    def parallel_plan(self, model: torch.nn.Module) -> ParallelPlan:
        """Decoder layers and vision blocks as sharding units; the tower for encoder-parallel."""
        lay = layout_of(model)
        return ParallelPlan(
            sharding_units=(lay.decoder_layers, lay.vision_blocks),
            vision_encoder=VisionEncoderSpec(module=lay.vision, input_keys=self.vision_input_keys),
        )

    # -- context parallelism (the ContextParallelAdapter capability) ----------------------------

    def split_decoder_kwargs(self, kwargs: Mapping[str, Any], split: TokenSplit) -> dict[str, Any]:
        """The DeepSeek-V3 decoder takes no other per-token inputs."""
        return {}

    def vision_grid_keyword(self) -> str:
        """MoonViT is called as ``vision_tower(patches, grid_thw=...)``."""
        return "grid_thw"

    # -- parameters and FLOPs -------------------------------------------------------------------

    def param_counts(self, model: torch.nn.Module) -> dict[str, int]:
        """``total`` (every parameter once), ``active`` (what one token uses: routed experts at
        top_k / E), ``text_matmul`` (active decoder matmul params + lm_head, no embedding
        table), ``vision_patch`` (tower params applied per patch, position table excluded) and
        ``projector`` (applied per merged token)."""
        total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        lay = layout_of(model)
        text_cfg = model.config.text_config
        lm = model.get_submodule(lay.language[0])
        expert_modules = match_modules(lm, ("layers.*.mlp.experts", "model.layers.*.mlp.experts"))
        experts = sum(count_params(lm.get_submodule(n)) for n in expert_modules)
        e, k = int(text_cfg.n_routed_experts), int(text_cfg.num_experts_per_tok)
        inactive = experts - experts * k // e
        head = model.get_output_embeddings().weight
        tied = head is model.get_input_embeddings().weight
        # lm_head is a matmul even when tied to the (excluded) embedding table
        head_counted = not tied and any(p is head for p in lm.parameters())
        text_matmul = count_params(lm) + (0 if head_counted else head.numel()) - inactive
        vision = model.get_submodule(lay.vision)
        pos = sum(p.numel() for n, p in vision.named_parameters() if "pos_emb" in n)
        vision_patch = count_params(vision, exclude_embeddings=False) - pos
        projector = count_params(model.get_submodule(lay.projector), exclude_embeddings=False)
        return {
            "total": total,
            "active": total - inactive,
            "text_matmul": text_matmul,
            "vision_patch": vision_patch,
            "projector": projector,
        }

    def _cached_counts(self, model: torch.nn.Module) -> dict[str, int]:
        counts = self._param_cache.get(model)
        if counts is None:
            counts = self._param_cache[model] = self.param_counts(model)
        return counts

    def flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> FlopsCount:
        """Text: 6 × active matmul params (routed experts at top_k / E, shared experts, MLA,
        lm_head; not the embedding table) × tokens + causal MLA attention. Vision:
        6 × tower params × patches + 6 × projector params × patches / 4 + full attention
        within each image."""
        counts = self._cached_counts(model)
        text = 6.0 * counts["text_matmul"] * micro_batch.num_tokens
        text += self._attention_flops(model, micro_batch)
        grid = micro_batch.model_inputs.get("image_grid_thw")
        vision = 0.0
        if grid is not None and len(grid):
            vc = model.config.vision_config
            merge = int(vc.merge_kernel_size[0]) * int(vc.merge_kernel_size[1])
            patches = [int(n) for n in grid.prod(dim=-1)]
            total = sum(patches)
            vision = 6.0 * (counts["vision_patch"] * total + counts["projector"] * total / merge)
            # QK^T and AV (2 · 2 · p² · hidden), non-causal, forward + backward (× 3), per block
            vision += 12.0 * vc.hidden_size * vc.num_hidden_layers * sum(p * p for p in patches)
        return FlopsCount(text=text, vision=vision)

    def _attention_flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> float:
        """MLA: QK^T over ``qk_nope + qk_rope`` dims and AV over ``v_head_dim``, per head,
        causal (half), forward + backward: 3 · s² · H · (d_qk + d_v) per layer."""
        cfg = model.config.text_config
        lengths = micro_batch.sample_lengths or [micro_batch.num_tokens]
        seq_sq = sum(n * n for n in lengths)
        d_qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        return (
            3.0 * cfg.num_hidden_layers * cfg.num_attention_heads * (d_qk + cfg.v_head_dim) * seq_sq
        )

    def moe_blocks(self, model: torch.nn.Module) -> list[MoEBlock]:
        """The ``DeepseekV3MoE`` ``mlp`` of the decoder's sparse layers (the first
        ``first_k_dense_replace`` are dense): routed ``experts``, top-k ``gate`` and
        ``shared_experts`` (the :class:`~hyper_core.adapters.base.MoEAdapter` capability)."""
        return find_moe_blocks(model, shared_experts="shared_experts")

    # -- data -----------------------------------------------------------------------------------

    def build_assets(self, model_config: ModelConfig) -> ModelAssets:
        """Tokenizer from ``path`` when it has tokenizer files, else the offline demo tokenizer
        (Kimi's special tokens; ids in :data:`~hyper_kimi_k26.tokens.OFFLINE_IDS`); the
        torchvision-free image processor for the model's vision config and min/max_pixels."""
        from hyper_core.builtin.hf_causal_lm import has_tokenizer_files

        from .processor import KimiImageProcessor, KimiProcessor
        from .tokens import build_demo_tokenizer

        cfg = self.hf_config(model_config)
        vc = cfg.vision_config
        merge = vc.merge_kernel_size
        if int(merge[0]) != int(merge[1]):
            raise UserError(f"$.model: non-square merge_kernel_size {list(merge)} is not supported")
        image_processor = KimiImageProcessor.build(
            path=model_config.path,
            patch_size=int(vc.patch_size),
            merge_size=int(merge[0]),
            min_pixels=model_config.min_pixels,
            max_pixels=model_config.max_pixels,
        )
        if has_tokenizer_files(model_config.path):
            tokenizer = self._load_tokenizer(model_config)
        else:
            tokenizer = build_demo_tokenizer(self.chat_template)
        try:
            processor = KimiProcessor(image_processor, tokenizer)
        except ValueError as exc:
            raise UserError(f"$.model.path: {exc}") from None
        check_tokenizer(cfg, tokenizer, model_config.path, CONFIG_TOKEN_FIELDS)
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        return ModelAssets(
            tokenizer=tokenizer,
            processor=processor,
            pad_token_id=int(pad or 0),
            extra={"image_token_id": processor.image_token_id, "merge_size": processor.merge_size},
        )

    def _load_tokenizer(self, model_config: ModelConfig) -> Any:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(model_config.path),
                local_files_only=True,
                trust_remote_code=model_config.trust_remote_code,
            )
        except Exception as exc:  # e.g. the hub's tiktoken tokenizer is remote code
            raise UserError(
                f"$.model.path: cannot load the tokenizer of {model_config.path} ({exc}); the "
                "published Kimi tokenizer is remote code (tokenization_kimi.py): add a "
                "tokenizer.json (fast tokenizer) to the directory, or set "
                "[model] trust_remote_code = true"
            ) from None
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = self.chat_template
        return tokenizer

    # -- export ---------------------------------------------------------------------------------

    def checkpoint_layout(self, hf_config: Any) -> CheckpointLayout:
        """The published checkpoint layout (per-expert keys, fused ``wqkv``; see
        :mod:`hyper_kimi_k26.export`) and ``config.json``."""
        from .export import checkpoint_layout

        return checkpoint_layout(hf_config)
