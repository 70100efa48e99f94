"""A base for adapters of models that ``transformers`` implements.

Subclasses name the config and model classes lazily and list their sharding units; loading
from a local HF directory, random init, meta-device construction, freezing, FLOPs and export are
shared here so that no two adapters write them again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..attention import (
    FLASH_VARLEN,
    OWN_IMPLEMENTATIONS,
    VARLEN,
    drop_varlen_kwargs,
    uses_varlen_kwargs,
)
from ..attention import register as register_attention
from ..errors import ConfigError, UserError
from ..registry import import_ref
from .base import (
    FlopsCount,
    ModelAdapter,
    MoEAdapter,
    ParallelPlan,
    VisionEncoderSpec,
    find_moe_blocks,
    match_modules,
)

if TYPE_CHECKING:
    import torch

    from ..batching.types import MicroBatch, SampleFeatures
    from ..config import ModelConfig
    from ..data.chat import ChatFormat
    from ..data.multimodal import MultimodalTokens
    from ..export import CheckpointLayout
    from .base import ModelAssets
    from .vision_context import VisionContext

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def torch_dtype(name: str | None) -> Any:
    """``"bfloat16"`` -> ``torch.bfloat16`` (None stays None)."""
    import torch

    return None if name is None else getattr(torch, _DTYPES[name])


def apply_overrides(hf_config: Any, overrides: Mapping[str, Any]) -> None:
    """Set ``[model] hf_overrides`` on an HF config; dotted keys reach sub-configs."""
    for key, value in overrides.items():
        target = hf_config
        *parents, leaf = key.split(".")
        for part in parents:
            target = getattr(target, part, None)
            if target is None:
                raise ConfigError([(f"$.model.hf_overrides.{key}", f"config has no {part!r}")])
        if isinstance(value, Mapping) and hasattr(getattr(target, leaf, None), "to_dict"):
            apply_overrides(getattr(target, leaf), value)
        else:
            setattr(target, leaf, value)


def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in (nested tables and dotted keys reach sub-configs)."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if rest:
            value, key = {rest: value}, head
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            out[key] = merge_overrides(current, value)
        else:
            out[key] = value
    return out


def _pair(value: Any) -> tuple[int, int]:
    """``(h, w)`` of a config size given as one int or a ``[h, w]`` pair."""
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def has_submodule(model: torch.nn.Module, path: str) -> bool:
    """Whether ``model`` has a submodule at the dotted ``path``."""
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def count_params(module: torch.nn.Module, *, exclude_embeddings: bool = True) -> int:
    """Parameters of ``module`` (shared tensors once), without embedding tables by default."""
    import torch

    seen: set[int] = set()
    total = 0
    embeddings = {
        id(p) for m in module.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()
    }
    for p in module.parameters():
        if id(p) in seen or (exclude_embeddings and id(p) in embeddings):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def check_tokenizer(
    cfg: Any, tokenizer: Any, path: str | None, token_fields: Mapping[str, str]
) -> None:
    """The special-token ids of the HF config must be the tokenizer's, and its ids fit the vocab.

    ``token_fields`` maps a config attribute (``image_token_id``) to its token (``<|image_pad|>``);
    the vocabulary size is ``cfg.text_config.vocab_size``. Raises :class:`UserError` naming
    ``$.model``.
    """
    vocab = tokenizer.get_vocab()
    where = f"the tokenizer of {path}" if path else "the offline demo tokenizer"
    for field, token in token_fields.items():
        cfg_id = getattr(cfg, field, None)
        tok_id = vocab.get(token)
        if cfg_id is not None and tok_id is not None and int(cfg_id) != int(tok_id):
            hint = "" if path else " (the model directory has no tokenizer files; add them)"
            raise UserError(
                f"$.model: config {field} = {cfg_id} but {where} maps {token} to {tok_id}{hint}"
            )
    vocab_size = cfg.text_config.vocab_size
    if max(vocab.values()) >= vocab_size:
        raise UserError(
            f"$.model: {where} has ids up to {max(vocab.values())} but the model's vocab_size "
            f"is {vocab_size}"
        )


class HFModelAdapter(ModelAdapter):
    """An adapter for a ``transformers`` model family.

    Subclasses set :attr:`config_class`, :attr:`model_class` (lazy ``"module:Class"``),
    :attr:`sharding_units`, and for VL models :attr:`vision_module`/:attr:`projector_module`.
    """

    config_class: ClassVar[str] = ""
    model_class: ClassVar[str] = ""
    #: Patterns of the sharding units (decoder layers, vision blocks).
    sharding_units: ClassVar[tuple[str, ...]] = ()
    #: Parameters the published model holds but its forward never uses (``fnmatch`` patterns
    #: of names, e.g. LLaVA's CLIP ``post_layernorm``): conformance accepts them without a
    #: gradient. Anything else without a gradient fails the ``train_step`` check.
    unused_parameters: ClassVar[tuple[str, ...]] = ()
    #: Dotted paths of the groups for ``[model] freeze``.
    vision_module: ClassVar[str | None] = None
    projector_module: ClassVar[str | None] = None
    language_module: ClassVar[str] = ""
    #: The model-input keys of the vision encoder: the pixel (patch) tensor first, then
    #: per-image metadata such as ``image_grid_thw``. One key alone: one image per row of the
    #: pixel tensor (a fixed-size tower: LLaVA, Gemma 3).
    vision_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "image_grid_thw")
    #: How :meth:`call_vision_encoder` calls ``get_image_features``, by keyword: vision input
    #: key -> keyword argument (a key not listed goes under its own name). None: the
    #: :attr:`vision_input_keys` positionally, in order (remote code of unknown names).
    vision_call_keywords: ClassVar[Mapping[str, str] | None] = {}
    #: Further keyword arguments of ``get_image_features`` read from the resolved config
    #: (:attr:`VisionContext.config <hyper_core.adapters.vision_context.VisionContext.config>`):
    #: keyword -> config attribute, e.g. InternVL's ``{"vision_feature_layer":
    #: "vision_feature_layer"}`` (what the model's own forward passes it).
    vision_call_config: ClassVar[Mapping[str, str]] = {}
    #: Tile-based towers (InternVL, LLaVA-NeXT-style crops): the per-image metadata key
    #: (a processor ``metadata_keys`` entry, carried as the micro-batch's ``image_meta``) that
    #: holds each image's tile count. The rows of the pixel tensor are then tiles, image after
    #: image; :meth:`split_vision_inputs` cuts them per image and :meth:`call_vision_encoder`
    #: gives each image's features as its tiles' features concatenated in order.
    vision_tile_key: ClassVar[str | None] = None
    #: The model's forward takes ``mm_encoder_outputs["image"].pooler_output`` as one tensor,
    #: the images' features concatenated (Gemma 3, InternVL), not as a sequence of one tensor
    #: per image (Qwen-VL, LLaVA): :meth:`inject_vision_outputs` concatenates them.
    vision_features_concatenated: ClassVar[bool] = False
    #: Videos' keys, for a tower that takes a video like an image
    #: (:attr:`~hyper_core.adapters.base.VisionEncoderSpec.video_keys`); empty: images only.
    vision_video_keys: ClassVar[tuple[str, ...]] = ()
    logits_at_labels_only: ClassVar[bool] = True
    #: Children of the last decoder layer that :meth:`label_row_modules` names when present
    #: (transformers' names; ``q_a_proj``/``q_b_proj``: multi-head latent attention's query);
    #: an MoE block among them is left whole (its router statistics and load-balancing loss
    #: count every token).
    label_row_children: ClassVar[tuple[str, ...]] = (
        "self_attn.q_proj",
        "self_attn.q_a_proj",
        "self_attn.q_b_proj",
        "self_attn.o_proj",
        "mlp",
    )
    #: How the default :meth:`transform` renders conversations (set by VL adapters).
    chat_format: ClassVar[ChatFormat | None] = None

    # -- config -------------------------------------------------------------------------------

    def hf_config(self, model_config: ModelConfig) -> Any:
        """Load ``config.json`` from ``path`` or instantiate the named config; apply overrides."""
        if model_config.path is not None:
            cfg = self._config_from_dir(Path(model_config.path), model_config.trust_remote_code)
        else:
            name = model_config.config
            if name not in self.named_configs:
                known = ", ".join(sorted(self.named_configs)) or "none"
                raise ConfigError(
                    [
                        (
                            "$.model.config",
                            f"adapter {self.name!r} has no config {name!r} (available: {known})",
                        )
                    ]
                )
            # Overrides go into the constructor so derived fields (e.g. per-layer
            # ``layer_types``) follow them.
            kwargs = merge_overrides(self.named_configs[name], model_config.hf_overrides)
            cfg = self._named_config(kwargs)
        if model_config.path is not None:
            apply_overrides(cfg, model_config.hf_overrides)
        if model_config.attn_implementation in OWN_IMPLEMENTATIONS:
            register_attention()
        # A name with "flash" in it makes transformers look for a flash-attn package when the
        # model is built: build with ``varlen`` (the same math), switch in build_model.
        attn = model_config.attn_implementation
        cfg._attn_implementation = VARLEN if attn == FLASH_VARLEN else attn
        return cfg

    def _named_config(self, kwargs: Mapping[str, Any]) -> Any:
        """Instantiate a named config from its (overridden) kwargs."""
        return import_ref(self.config_class)(**dict(kwargs))

    def _config_from_dir(self, path: Path, trust_remote_code: bool) -> Any:
        config_file = path / "config.json"
        if not config_file.is_file():
            raise UserError(f"$.model.path: {path} has no config.json (a local HF model directory)")
        if trust_remote_code:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(
                str(path), trust_remote_code=True, local_files_only=True
            )
        config_cls = import_ref(self.config_class)
        return config_cls.from_pretrained(str(path), local_files_only=True)

    # -- model --------------------------------------------------------------------------------

    def model_cls(self, hf_config: Any, trust_remote_code: bool) -> Any:
        """The class to instantiate (subclasses may pick remote code when allowed)."""
        return import_ref(self.model_class)

    def build_model(
        self, model_config: ModelConfig, *, device: str | torch.device = "cpu", dtype: Any = None
    ) -> torch.nn.Module:
        """Random init from the config, or safetensors weights from ``[model] path``; patch
        embeddings multiply single patches as a matmul (:mod:`.patch_conv`)."""
        import torch

        cfg = self.hf_config(model_config)
        dtype = dtype if dtype is not None else torch_dtype(model_config.dtype)
        cls = self.model_cls(cfg, model_config.trust_remote_code)
        if model_config.path is not None and str(device) != "meta":
            self.check_weights(model_config)
            model = cls.from_pretrained(
                model_config.path,
                config=cfg,
                dtype=dtype,
                local_files_only=True,
                use_safetensors=True,
                trust_remote_code=model_config.trust_remote_code,
            ).to(device)
        else:
            with torch.device(device):
                model = cls._from_config(cfg, dtype=dtype)
        self._keep_varlen_kwargs_from_vision(model)
        from .patch_conv import use_patchwise_convs

        use_patchwise_convs(model)
        if model_config.attn_implementation == FLASH_VARLEN:
            model.config._attn_implementation = FLASH_VARLEN  # sub-configs follow
        return model

    def _keep_varlen_kwargs_from_vision(self, model: torch.nn.Module) -> None:
        """Under varlen attention, stop the language model's ``cu_seq_lens_*`` at the vision
        encoder: some ``forward``s pass all kwargs on to it (Kimi-K2.5), where they would
        clash with the encoder's own per-image boundaries."""
        if not uses_varlen_kwargs(model.config._attn_implementation):
            return
        vision = self.parallel_plan(model).vision_encoder
        if vision is not None:
            drop_varlen_kwargs(model.get_submodule(vision.module))

    def checkpoint_conversions(self, model: torch.nn.Module) -> list[Any]:
        """How the checkpoint's names and layouts map onto ``model``'s parameters, for a
        sharded load (``fsdp2`` with ``[model] path``): transformers' conversion mapping for
        the model's class, the one ``from_pretrained`` applies (renamed prefixes, per-expert
        keys fused into one tensor, ...). Override to add ``WeightRenaming``/
        ``WeightConverter`` entries for checkpoints transformers does not know."""
        from transformers.conversion_mapping import get_model_conversion_mapping

        return list(get_model_conversion_mapping(model))

    def check_weights(self, model_config: ModelConfig) -> None:
        """A :class:`UserError` when the weights at ``[model] path`` cannot be loaded (no
        safetensors, quantized); before any rank reads them. A meta build (a config-only
        directory is enough for it, e.g. ``memory estimate``) does not check."""
        if model_config.path is not None:
            self._check_weights(Path(model_config.path))

    @staticmethod
    def _check_weights(path: Path) -> None:
        if not any(path.glob("*.safetensors")):
            raise UserError(
                f"$.model.path: {path} has no *.safetensors weights; hyper-train loads weights "
                "only from safetensors (convert .bin checkpoints first)"
            )
        cfg = json.loads((path / "config.json").read_text())
        quant = cfg.get("quantization_config")
        if quant:
            method = quant.get("quant_method", "?")
            raise UserError(
                f"$.model.path: {path} holds {method}-quantized weights; training needs them "
                "dequantized to bf16 first"
            )

    def freeze_groups(self, model: torch.nn.Module) -> dict[str, list[str]]:
        """Vision tower, projector and language model, as declared by the subclass."""
        groups: dict[str, list[str]] = {}
        if self.vision_module is not None:
            groups["vision"] = [self.vision_module]
        if self.projector_module is not None:
            groups["projector"] = [self.projector_module]
        groups["language"] = [self.language_module]
        return groups

    def parallel_plan(self, model: torch.nn.Module) -> ParallelPlan:
        """Sharding units from :attr:`sharding_units`; the vision encoder if declared."""
        vision = None
        if self.vision_module is not None:
            vision = VisionEncoderSpec(
                module=self.vision_module,
                input_keys=self.vision_input_keys,
                video_keys=self.vision_video_keys,
                meta_keys=() if self.vision_tile_key is None else (self.vision_tile_key,),
            )
        return ParallelPlan(sharding_units=self.sharding_units, vision_encoder=vision)

    def label_row_modules(self, model: torch.nn.Module) -> list[str]:
        """:attr:`label_row_children` of the last decoder layer: the last sharding unit outside
        the vision tower and projector; an MoE block is left out."""
        towers = [m for m in (self.vision_module, self.projector_module) if m]
        layers = [
            name
            for name in match_modules(model, self.sharding_units)
            if not any(name == t or name.startswith(f"{t}.") for t in towers)
        ]
        if not layers:
            return []
        moe = {b.module for b in self.moe_blocks(model)} if isinstance(self, MoEAdapter) else set()
        names = []
        for child in self.label_row_children:
            name = f"{layers[-1]}.{child}"
            if not has_submodule(model, name) or name in moe:
                continue
            if not find_moe_blocks(model.get_submodule(name)):
                names.append(name)
        return names

    # -- data -------------------------------------------------------------------------------

    def transform(
        self, sample: Mapping[str, Any], assets: ModelAssets, *, max_seq_len: int
    ) -> SampleFeatures:
        """Raw sample → :class:`SampleFeatures` through the core's multimodal transform
        (:func:`~hyper_core.data.multimodal.tokenize_multimodal` with :attr:`chat_format` and
        ``assets.processor``) plus :meth:`sample_fields`; ``SampleError``
        ``missing_image``/``corrupt_image``/``image_token_mismatch``/``too_long``/... if bad."""
        from ..data.multimodal import tokenize_multimodal

        if self.chat_format is None:
            raise NotImplementedError(
                f"adapter {self.name!r}: set chat_format (a VL adapter) or override transform"
            )
        tok = tokenize_multimodal(
            sample, assets.processor, self.chat_format, max_seq_len=max_seq_len
        )
        return tok.features(sample, **self.sample_fields(tok, assets))

    def sample_fields(self, tokens: MultimodalTokens, assets: ModelAssets) -> dict[str, Any]:
        """Model-specific :class:`SampleFeatures` fields of one tokenised sample
        (``position_ids``, ``token_fields``) for the default :meth:`transform`; none here."""
        return {}

    # -- vision encoder (encoder parallelism), transformers' VL conventions -----------------

    def vision_filler(self, assets: Any) -> Any:
        """A 56×56 grey image with an empty answer, through :meth:`transform`, no labels; when
        the processor takes videos (``process_videos``), also a 2-frame 56×56 grey video, so
        that the filler runs the tower for images and for videos alike."""
        if self.vision_module is None:
            return None
        import tempfile

        from PIL import Image

        from ..batching.types import IGNORE_INDEX

        image = Image.new("RGB", (56, 56), (128, 128, 128))
        content: list[dict[str, Any]] = [{"type": "image", "image": image}]
        with tempfile.TemporaryDirectory(prefix="hyper-train-filler-") as tmp:
            if callable(getattr(assets.processor, "process_videos", None)):
                frames = [str(Path(tmp) / f"{i}.png") for i in range(2)]
                for frame in frames:
                    image.save(frame)
                side = 56 * 56  # the frames' own size, whatever the model's video defaults
                content.append(
                    {"type": "video", "video": frames, "min_pixels": side, "max_pixels": side}
                )
            sample = {
                "messages": [
                    {"role": "user", "content": content},
                    {"role": "assistant", "content": ""},
                ],
                "meta": {"filler": True},
            }
            features = self.transform(sample, assets, max_seq_len=1 << 20)
        features.labels.fill_(IGNORE_INDEX)
        return features

    def split_vision_inputs(
        self, model_inputs: Mapping[str, Any], context: VisionContext
    ) -> list[dict[str, Any]]:
        """The per-image vision inputs, by the declared layout:

        * :attr:`vision_tile_key` set: the pixel tensor's rows cut per image at its tile
          count (``context.counts``), other :attr:`vision_input_keys` one row per image;
        * one :attr:`vision_input_keys` entry: one ``{"pixel_values": (1, ...)}`` per row;
        * else transformers' grid convention: ``{"pixel_values": patches_i, "image_grid_thw":
          (1, 3)}`` per image, then (with :attr:`vision_video_keys`) one per video.

        Encoder parallelism calls it with the micro-batch's host tensors, so reading the patch
        counts waits for no device."""
        if self.vision_module is None:
            raise NotImplementedError(f"adapter {self.name!r} declares no vision encoder")
        pixels_key, *rest = self.vision_input_keys
        if self.vision_tile_key is not None:
            pixels = model_inputs.get(pixels_key)
            if pixels is None:
                return []
            tiles = pixels.split(context.counts(self.vision_tile_key), dim=0)
            return [
                {pixels_key: t, **{k: model_inputs[k][i : i + 1] for k in rest}}
                for i, t in enumerate(tiles)
            ]
        if not rest:
            pixels = model_inputs.get(pixels_key)
            if pixels is None:
                return []
            return [{pixels_key: pixels[i : i + 1]} for i in range(len(pixels))]
        patches_key, grid_key = self.vision_input_keys
        items = []
        for source in (self.vision_input_keys, self.vision_video_keys):
            if not source:
                continue
            pixels, grid = model_inputs.get(source[0]), model_inputs.get(source[1])
            if pixels is None or grid is None or not len(grid):
                continue
            # one read of all the patch counts (on a device tensor, one wait, not one each)
            chunks = pixels.split(grid.prod(dim=-1).tolist(), dim=0)
            items += [
                {patches_key: chunk, grid_key: grid[i : i + 1]} for i, chunk in enumerate(chunks)
            ]
        return items

    def call_vision_encoder(
        self, model: torch.nn.Module, vision_inputs: Mapping[str, Any], context: VisionContext
    ) -> Any:
        """``model.get_image_features(..., return_dict=True)`` (tower and projector) with the
        :attr:`vision_input_keys` by keyword through :attr:`vision_call_keywords` (positionally
        when it is None) and the :attr:`vision_call_config` values of ``context.config``.

        ``.pooler_output`` is made a tuple of one ``(tokens_i, text_hidden)`` per image (the
        :class:`~.vision_outputs.FlatOutputs` contract): a tower that returns one
        ``(rows, tokens, hidden)`` tensor is split along dim 0, and with
        :attr:`vision_tile_key` each image's tiles (``context.counts``) are concatenated."""
        import torch

        if self.vision_module is None:
            raise NotImplementedError(f"adapter {self.name!r} declares no vision encoder")
        keys = [k for k in self.vision_input_keys if k in vision_inputs]
        config = context.config
        settings = {kw: getattr(config, attr) for kw, attr in self.vision_call_config.items()}
        if self.vision_call_keywords is None:
            args = (vision_inputs[k] for k in keys)
            out = model.get_image_features(*args, **settings, return_dict=True)
        else:
            names = self.vision_call_keywords
            kwargs = {names.get(k, k): vision_inputs[k] for k in keys}
            out = model.get_image_features(**kwargs, **settings, return_dict=True)
        pooled = getattr(out, "pooler_output", None)
        if isinstance(pooled, torch.Tensor) and pooled.dim() == 3:
            pooled = tuple(pooled.unbind(0))
        if self.vision_tile_key is not None and pooled is not None:
            counts = context.counts(self.vision_tile_key)
            if sum(counts) != len(pooled):
                raise ValueError(
                    f"adapter {self.name!r}: {len(pooled)} tiles encoded but the images' "
                    f"{self.vision_tile_key!r} sum to {sum(counts)}"
                )
            starts = [sum(counts[:i]) for i in range(len(counts))]
            pooled = tuple(
                torch.cat(list(pooled[a : a + n]), dim=0) for a, n in zip(starts, counts)
            )
        if pooled is not None:
            out.pooler_output = pooled
        return out

    def inject_vision_outputs(
        self, model_inputs: Mapping[str, Any], outputs: Any, context: VisionContext
    ) -> dict[str, Any]:
        """The pixels dropped, ``mm_encoder_outputs={"image": ..., "video": ...}`` added: the
        first entries of ``outputs`` are the images (as many as ``image_grid_thw`` rows), the
        rest the videos. The other keys, e.g. the grids, stay for the position ids."""
        if self.vision_module is None:
            raise NotImplementedError(f"adapter {self.name!r} declares no vision encoder")
        pixels = {self.vision_input_keys[0], *self.vision_video_keys[:1]}
        inputs = {k: v for k, v in model_inputs.items() if k not in pixels}
        video_grid = model_inputs.get(self.vision_video_keys[1]) if self.vision_video_keys else None
        if video_grid is None or not len(video_grid):
            inputs["mm_encoder_outputs"] = {"image": self._as_model_features(outputs)}
            return inputs
        image_grid = model_inputs.get(self.vision_input_keys[1])
        images = 0 if image_grid is None else len(image_grid)
        from .vision_outputs import FlatOutputs

        flat = FlatOutputs(outputs, images + len(video_grid))
        found = {"video": flat.take(images, images + len(video_grid))}
        if images:
            found["image"] = flat.take(0, images)
        inputs["mm_encoder_outputs"] = {k: self._as_model_features(v) for k, v in found.items()}
        return inputs

    def _as_model_features(self, outputs: Any) -> Any:
        """``outputs`` with its per-image ``pooler_output`` concatenated when the forward takes
        one tensor (:attr:`vision_features_concatenated`)."""
        import copy

        import torch

        pooled = getattr(outputs, "pooler_output", None)
        if not self.vision_features_concatenated or isinstance(pooled, torch.Tensor):
            return outputs
        outputs = copy.copy(outputs)
        outputs.pooler_output = torch.cat(list(pooled), dim=0)
        return outputs

    def flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> FlopsCount:
        """6·N·tokens for the language model (N without embedding tables, with the LM head's
        matmul also when it is tied to one) plus attention; the vision tower's
        6·N_vision·patches when it has one."""
        vision_params = 0
        if self.vision_module is not None:
            vision = model.get_submodule(self.vision_module)
            vision_params = count_params(vision, exclude_embeddings=False)
        text_params = count_params(model) - vision_params
        head = model.get_output_embeddings()
        if head is not None and head.weight is model.get_input_embeddings().weight:
            text_params += head.weight.numel()  # tied: excluded with the table, still a matmul
        tokens = micro_batch.num_tokens
        text = 6.0 * text_params * tokens + self._attention_flops(model, micro_batch)
        patches = self.vision_patches(model, micro_batch) if vision_params else 0
        return FlopsCount(text=text, vision=6.0 * vision_params * patches)

    def vision_patches(self, model: torch.nn.Module, micro_batch: MicroBatch) -> int:
        """Patches the tower sees in ``micro_batch``: from ``image_grid_thw`` (grid towers), else
        rows of the pixel tensor (images, or tiles) × :meth:`fixed_image_patches` (fixed-size
        towers)."""
        inputs = micro_batch.model_inputs
        grid = inputs.get("image_grid_thw")
        if grid is not None and len(grid):
            return int(grid.prod(dim=-1).sum())
        pixels = inputs.get(self.vision_input_keys[0])
        per_image = self.fixed_image_patches(model)
        if pixels is None or per_image is None or pixels.dim() != 4:
            return 0
        return len(pixels) * per_image

    def fixed_image_patches(self, model: torch.nn.Module) -> int | None:
        """Patches per image of a tower that resizes every image to one size
        (``(image_size // patch_size)²`` of the vision config); None for a tower that takes
        each image at its own size (a patch grid per image, Qwen-VL's)."""
        vc = getattr(model.config, "vision_config", None)
        size, patch = getattr(vc, "image_size", None), getattr(vc, "patch_size", None)
        if not size or not patch:
            return None
        sides = zip(_pair(size), _pair(patch), strict=True)
        return math.prod(int(s) // int(p) for s, p in sides)

    def _attention_flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> float:
        """Per sample, Σ nᵢ²: what ``varlen``/flash attention computes on a packed row (SDPA
        with the dense block mask spends (Σ nᵢ)², the extra being no useful work)."""
        cfg = getattr(model.config, "text_config", None) or model.config
        layers = getattr(cfg, "num_hidden_layers", 0)
        hidden = getattr(cfg, "hidden_size", 0)
        lengths = micro_batch.sample_lengths or [micro_batch.num_tokens]
        seq_sq = sum(n * n for n in lengths)
        # QK^T and AV, forward and backward, causal half: 4 · 2 · L · H · s² / 2 · 3
        return 6.0 * layers * hidden * seq_sq

    # -- export -------------------------------------------------------------------------------

    def checkpoint_layout(self, hf_config: Any) -> CheckpointLayout:
        """What ``save_pretrained`` writes (tied copies left out, transformers' reverse key
        conversion), group by group."""
        from ..export import hf_layout

        return hf_layout(import_ref(self.model_class), hf_config)
