"""The model adapter extension point: everything model-specific lives behind these classes.

:class:`ModelAdapter` is what every adapter implements. Optional capabilities are
:class:`typing.Protocol` classes an adapter satisfies by defining their methods; the features
that need one check for it with ``isinstance``: :class:`VisionEncoderAdapter` (encoder
parallelism), :class:`MoEAdapter` (expert parallelism, MoE statistics) and
:class:`ContextParallelAdapter` (context parallelism of a VL model).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

    from ..batching.types import MicroBatch, SampleFeatures
    from ..config import ModelConfig
    from ..data.conversation import Conversation
    from ..export import CheckpointLayout
    from ..parallel.load_plan import LoadPlan
    from .vision_context import VisionContext


@attrs.frozen(kw_only=True)
class VisionEncoderSpec:
    """How the vision encoder of a model is found and called (for encoder parallelism).

    ``module`` is the dotted path of the encoder inside the model; ``input_keys`` are the
    model-input keys it consumes (the patch tensor first, then per-image metadata such as
    ``image_grid_thw``). An adapter that declares one implements :class:`VisionEncoderAdapter`,
    whose :meth:`~VisionEncoderAdapter.split_vision_inputs` and
    :meth:`~VisionEncoderAdapter.call_vision_encoder` give the per-image view.
    """

    module: str
    input_keys: tuple[str, ...] = ("pixel_values", "image_grid_thw")
    #: The model-input keys of videos, for a tower that takes a video like an image (its
    #: frames' patches and metadata under these keys, in the order of :attr:`input_keys`):
    #: :meth:`~VisionEncoderAdapter.split_vision_inputs` then gives the images, then one
    #: entry per video, and :meth:`~VisionEncoderAdapter.inject_vision_outputs` takes the
    #: outputs of both. Empty: the encoder takes images only.
    video_keys: tuple[str, ...] = ()
    #: Per-image metadata the three methods read from their
    #: :class:`~hyper_core.adapters.vision_context.VisionContext` (``image_meta`` keys, e.g. a
    #: tile count): encoder parallelism sends each image's values with its pixels, so the rank
    #: that encodes an image gets its metadata. Empty: the methods read none.
    meta_keys: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ParallelPlan:
    """Which modules are sharding units (FSDP units, checkpointing units) and which is the ViT."""

    #: Dotted module paths; ``*`` matches one path component (``model.layers.*``).
    sharding_units: tuple[str, ...]
    vision_encoder: VisionEncoderSpec | None = None
    #: The MoE blocks whose routed experts ``[parallel] ep > 1`` shares out; the core's
    #: ``parallelize_model`` stage fills it from :meth:`MoEAdapter.moe_blocks`.
    moe_blocks: tuple[MoEBlock, ...] = ()
    #: How the weights arrive (the run's ``plan_load`` result), set by the core's
    #: ``parallelize_model`` stage for the strategy; None: they are in the model as built.
    load: LoadPlan | None = None
    #: With ``[parallel] cp > 1``: the adapter, when it is a :class:`ContextParallelAdapter`
    #: (the core's ``parallelize_model`` stage sets it); None: only the token inputs are split
    #: and the vision tower runs whole on every rank of a group.
    context_parallel: ContextParallelAdapter | None = None

    def match(self, model: torch.nn.Module) -> list[str]:
        """The names of ``model``'s sharding units (:attr:`sharding_units` matched)."""
        return match_modules(model, self.sharding_units)


def match_modules(model: torch.nn.Module, patterns: tuple[str, ...]) -> list[str]:
    """Names of the submodules whose dotted path matches one of ``patterns`` (``*`` = a part)."""
    names = []
    for name, _ in model.named_modules():
        parts = name.split(".")
        for pattern in patterns:
            pparts = pattern.split(".")
            if len(pparts) == len(parts) and all(
                fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pparts, strict=True)
            ):
                names.append(name)
                break
    return names


@attrs.frozen(kw_only=True)
class FlopsCount:
    """Training FLOPs (forward + backward) of one micro-batch."""

    text: float
    vision: float = 0.0

    @property
    def total(self) -> float:
        """Text plus vision."""
        return self.text + self.vision

    def hardware(self, text_recomputed: float = 0.0, vision_recomputed: float = 0.0) -> float:
        """The FLOPs the device runs when backward recomputes these fractions of each tower's
        forward (a forward is a third of the forward + backward count): HFU's numerator."""
        return self.text * (1 + text_recomputed / 3) + self.vision * (1 + vision_recomputed / 3)


@attrs.frozen(kw_only=True)
class GenerationPrompt:
    """What ``generate`` starts from: a prompt ending in the assistant header."""

    #: The prompt's features (``labels`` all ignored); ``media`` and ``token_fields`` included.
    features: SampleFeatures
    #: Ids that end the assistant's turn (e.g. ``<|im_end|>``).
    stop_token_ids: tuple[int, ...]


@attrs.define(kw_only=True)
class ModelAssets:
    """What turns raw samples into tokens: tokenizer, optional (image) processor."""

    tokenizer: Any
    processor: Any = None
    pad_token_id: int = 0
    extra: dict[str, Any] = attrs.field(factory=dict)

    def save(self, out_dir: str | Path) -> None:
        """Write the tokenizer/processor files in the HF layout."""
        target = self.processor if self.processor is not None else self.tokenizer
        target.save_pretrained(str(out_dir))


class ModelAdapter:
    """Base class of model adapters: the API every adapter implements. Subclasses set
    :attr:`name` and override what differs.

    Registered with ``register_model_adapters``; instantiated without arguments. Optional
    capabilities: :class:`VisionEncoderAdapter`, :class:`MoEAdapter`.
    """

    name: ClassVar[str] = ""
    #: Batching runtime used when ``[data] batching`` is not set.
    default_batching: ClassVar[str] = "packed"
    #: Named configs for ``[model] config = NAME`` (random init): name -> HF config kwargs.
    named_configs: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: The attrs class of this adapter's ``[model.options]`` (e.g. processor settings such as
    #: a tile size), validated with the config; None: the adapter takes no options.
    options: ClassVar[type | None] = None

    @classmethod
    def parse_options(cls, model_config: ModelConfig) -> Any:
        """``[model.options]`` as an instance of :attr:`options` (None when the adapter declares
        none); a :class:`~hyper_core.errors.ConfigError` naming ``$.model.options.KEY`` when
        they do not fit. Needs no torch (``config validate`` calls it)."""
        from ..config.converter import converter
        from ..errors import ConfigError

        raw = dict(model_config.options)
        if cls.options is None:
            if raw:
                keys = ", ".join(sorted(raw))
                raise ConfigError(
                    [("$.model.options", f"adapter {cls.name!r} takes no options (got {keys})")]
                )
            return None
        return converter.structure_at(raw, cls.options, "$.model.options")

    # -- model --------------------------------------------------------------------------------

    def hf_config(self, model_config: ModelConfig) -> Any:
        """The ``transformers`` config: from ``path``/config.json or a named config."""
        raise NotImplementedError

    def build_model(
        self, model_config: ModelConfig, *, device: str | torch.device = "cpu", dtype: Any = None
    ) -> torch.nn.Module:
        """Build the model: weights from ``path`` or random init; ``device="meta"`` for sharding."""
        raise NotImplementedError

    def freeze_groups(self, model: torch.nn.Module) -> dict[str, list[str]]:
        """Module paths of the groups ``[model] freeze`` may name (vision, projector, language)."""
        return {"language": [""]}

    def parallel_plan(self, model: torch.nn.Module) -> ParallelPlan:
        """The sharding units and the vision encoder of ``model``."""
        raise NotImplementedError

    #: The model computes logits only where labels are when its ``forward`` is given
    #: ``logits_to_keep`` as a ``(batch, seq)`` boolean mask (transformers ≥ 5 models do; see
    #: :mod:`hyper_core.step.label_positions`). False for a model whose head or loss needs
    #: every position.
    logits_at_labels_only: ClassVar[bool] = False

    def label_row_modules(self, model: torch.nn.Module) -> list[str]:
        """Submodules of ``model`` that may run at label positions only when the LM head does
        (:mod:`hyper_core.step.label_rows`): modules of the last decoder layer that act on each
        token alone and whose output feeds only that token's final hidden state (its query
        and output projections, a dense MLP). Default: none."""
        return []

    def forward_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments for every training forward (``use_cache=False``)."""
        return {"use_cache": False}

    def flops(self, model: torch.nn.Module, micro_batch: MicroBatch) -> FlopsCount:
        """Training FLOPs of one micro-batch (6 × active params × tokens + attention by default)."""
        raise NotImplementedError

    # -- data ---------------------------------------------------------------------------------

    def build_assets(self, model_config: ModelConfig) -> ModelAssets:
        """Tokenizer and processor: from ``path`` when it has them, else offline defaults."""
        raise NotImplementedError

    def transform(
        self, sample: Mapping[str, Any], assets: ModelAssets, *, max_seq_len: int
    ) -> SampleFeatures:
        """Turn one raw sample into :class:`SampleFeatures`; raise ``SampleError`` if bad."""
        raise NotImplementedError

    def generation_prompt(
        self, conversation: Conversation, assets: ModelAssets
    ) -> GenerationPrompt:
        """``conversation`` (without the answer to generate) followed by the assistant header.

        By default :meth:`transform` renders the conversation plus an empty assistant turn, and
        the prompt is cut before that turn's loss tokens (the last run of them), which are its
        end-of-turn token(s): so the prompt is tokenised exactly as in training, images and
        positions included.
        """
        from ..batching.types import IGNORE_INDEX

        sample = {"messages": [*conversation.to_messages(), {"role": "assistant", "content": ""}]}
        features = self.transform(sample, assets, max_seq_len=1 << 30)
        loss_at = (features.labels != IGNORE_INDEX).nonzero().flatten()
        if not len(loss_at):
            raise NotImplementedError(
                f"adapter {self.name!r}: its transform takes no loss on an assistant turn's end; "
                "override generation_prompt"
            )
        gaps = (loss_at[1:] - loss_at[:-1] != 1).nonzero().flatten()
        cut = int(loss_at[int(gaps[-1]) + 1 if len(gaps) else 0]) + 1
        stop = int(features.labels[cut - 1])
        features.input_ids = features.input_ids[:cut]
        features.labels = features.labels[:cut].fill_(IGNORE_INDEX)
        if features.position_ids is not None:
            features.position_ids = features.position_ids[..., :cut]
        features.token_fields = {k: v[:cut] for k, v in features.token_fields.items()}
        features.bidirectional_spans = tuple(
            (a, min(b, cut)) for a, b in features.bidirectional_spans if a < cut
        )
        return GenerationPrompt(features=features, stop_token_ids=(stop,))

    def vision_filler(self, assets: ModelAssets) -> SampleFeatures | None:
        """A sample with one small image and no loss tokens, or None for a text model.

        With several ranks, the runtime appends it to micro-batches without images so that
        every rank runs the vision encoder in every forward (DDP/FSDP need the same
        parameters used on every rank).
        """
        return None

    # -- export -------------------------------------------------------------------------------

    def checkpoint_layout(self, hf_config: Any) -> CheckpointLayout:
        """How exports write the weights: a per-group key conversion to the checkpoint's names
        and the config files. The default writes the native names and ``config.json``.

        ``convert`` sees one export group at a time (:func:`hyper_core.export.group_keys`: one
        numbered layer/block, or one module outside them), so a conversion may combine tensors
        of one layer (fused q/k/v, stacked experts) but not across layers.
        """
        from ..export import CheckpointLayout

        return CheckpointLayout(
            convert=dict, save_config=lambda out: hf_config.save_pretrained(str(out))
        )

    def export_hf(
        self,
        state_dict: Mapping[str, torch.Tensor],
        hf_config: Any,
        out_dir: str | Path,
        assets: ModelAssets | None = None,
    ) -> None:
        """Write an in-memory ``state_dict`` as an HF checkpoint (safetensors shards through
        :meth:`checkpoint_layout`, config.json, tokenizer)."""
        from ..export import export_state_dict

        export_state_dict(self, state_dict, hf_config, out_dir, assets=assets)


@runtime_checkable
class ContextParallelAdapter(Protocol):
    """Capability: what context parallelism (``[parallel] cp``) needs to know of a model beyond
    its decoder's token inputs (``input_ids``/``inputs_embeds``, ``position_ids``), which the
    core splits itself. The Qwen-VL and Kimi adapters implement it.
    """

    def split_decoder_kwargs(self, kwargs: Mapping[str, Any], split: TokenSplit) -> dict[str, Any]:
        """The model's other per-token keyword arguments of the decoder's forward, cut to this
        rank's tokens with ``split`` (``split.take``, ``split.marked_rows``); only those
        returned replace ``kwargs``' (an empty dict when there are none)."""
        ...

    def vision_grid_keyword(self) -> str | None:
        """The keyword argument of the vision tower's call that holds the ``(n, 3)`` grid of
        ``t, h, w`` patches per image or video, the patches of entry ``i`` being the
        ``t·h·w`` rows after entry ``i-1``'s: each rank of a group then encodes a share of the
        entries (:mod:`hyper_core.parallel.cp_vision`). None: the tower runs whole."""
        ...


class TokenSplit(Protocol):
    """How this rank of a context-parallel group keeps its share of a row's tokens (given to
    :meth:`ContextParallelAdapter.split_decoder_kwargs`)."""

    def take(self, x: torch.Tensor, dim: int, pad: Any) -> torch.Tensor:
        """This rank's tokens of ``x`` along ``dim`` (the row padded with ``pad``)."""
        ...

    def marked_rows(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For a ``(batch, length)`` boolean ``mask`` of tokens and tensors holding one row
        per marked token (row-major order): this rank's share of ``mask`` and the indices of
        the rows of its marked tokens, in their order."""
        ...


@runtime_checkable
class VisionEncoderAdapter(Protocol):
    """Capability: the vision encoder runs per image, outside the model's forward.

    Encoder parallelism needs it, together with a :class:`ParallelPlan` whose
    ``vision_encoder`` is set. :class:`~hyper_core.adapters.hf.HFModelAdapter` implements it
    from declared attributes (grid, fixed-size and tile-based towers). Each method gets a
    :class:`~hyper_core.adapters.vision_context.VisionContext`: the model's resolved config and
    the per-image metadata (host tensors, one row per image) of exactly the images at hand.
    """

    def split_vision_inputs(
        self, model_inputs: Mapping[str, Any], context: VisionContext
    ) -> list[dict[str, Any]]:
        """Per-image vision inputs of a micro-batch (for encoder parallelism).

        One dict per image with the :attr:`VisionEncoderSpec.input_keys`; concatenating the
        dicts' tensors along dim 0 gives back the inputs of several images. With
        :attr:`VisionEncoderSpec.video_keys`, one dict per video follows the images, under the
        same keys. Encoder parallelism calls it with the micro-batch's host (CPU) tensors, so
        it must work on them; ``context.image_meta`` has a row per image of the micro-batch.
        """
        ...

    def call_vision_encoder(
        self, model: torch.nn.Module, vision_inputs: Mapping[str, Any], context: VisionContext
    ) -> Any:
        """Run the vision encoder (and projector) of ``model`` on the inputs of some images.

        ``vision_inputs`` is :meth:`split_vision_inputs`' per-image dicts concatenated, and
        ``context.image_meta`` holds those images' rows, in the same order. The result holds
        one tensor per image in sequences (``transformers``' ``get_image_features``
        convention: ``.pooler_output`` a tuple of ``(tokens_i, hidden)``, optional further
        per-image fields such as ``.deepstack_features``): what
        :class:`~hyper_core.adapters.vision_outputs.FlatOutputs` takes and
        :meth:`inject_vision_outputs` accepts.
        """
        ...

    def inject_vision_outputs(
        self, model_inputs: Mapping[str, Any], outputs: Any, context: VisionContext
    ) -> dict[str, Any]:
        """Model inputs that carry precomputed encoder ``outputs`` instead of the pixels.

        ``outputs`` holds every entry of :meth:`split_vision_inputs` in its order (images, then
        videos); ``context`` is the micro-batch's. :class:`~hyper_core.adapters.hf.HFModelAdapter`
        implements ``transformers``' convention (``mm_encoder_outputs``).
        """
        ...


@attrs.frozen(kw_only=True)
class MoEBlock:
    """One sparse mixture-of-experts block of a model (dotted module paths from the model)."""

    #: The block (router, routed experts and any shared experts), e.g. ``...layers.3.mlp``.
    module: str
    #: The routed experts: one module holding all ``num_experts`` of them.
    experts: str
    #: The top-k router (``top_k`` experts chosen per token).
    router: str
    num_experts: int
    top_k: int
    #: Experts every token goes through, when the block has them.
    shared_experts: str | None = None


@runtime_checkable
class MoEAdapter(Protocol):
    """Capability: the model has sparse MoE blocks (expert parallelism, router statistics)."""

    def moe_blocks(self, model: torch.nn.Module) -> list[MoEBlock]:
        """The MoE blocks of ``model`` in module order; empty for a dense model."""
        ...


def routed_expert_parameter_ids(adapter: object, model: torch.nn.Module) -> set[int]:
    """``id`` of every routed-expert parameter of ``adapter``'s MoE blocks in ``model`` (none
    for a dense model or an adapter without the :class:`MoEAdapter` capability)."""
    if not isinstance(adapter, MoEAdapter):
        return set()
    return {
        id(p)
        for block in adapter.moe_blocks(model)
        for p in model.get_submodule(block.experts).parameters()
    }


def find_moe_blocks(
    model: torch.nn.Module,
    *,
    experts: str = "experts",
    router: str = "gate",
    shared_experts: str | None = None,
) -> list[MoEBlock]:
    """The modules of ``model`` with an ``experts`` child and a ``router`` child that has
    ``num_experts`` and ``top_k`` (``transformers``' sparse-MoE convention), as
    :class:`MoEBlock`; ``shared_experts`` names the shared-experts child where there is one."""
    blocks = []
    for name, module in model.named_modules():
        gate = getattr(module, router, None)
        if getattr(module, experts, None) is None or not hasattr(gate, "top_k"):
            continue
        prefix = f"{name}." if name else ""
        has_shared = shared_experts is not None and hasattr(module, shared_experts)
        blocks.append(
            MoEBlock(
                module=name,
                experts=prefix + experts,
                router=prefix + router,
                num_experts=int(gate.num_experts),
                top_k=int(gate.top_k),
                shared_experts=f"{prefix}{shared_experts}" if has_shared else None,
            )
        )
    return blocks
