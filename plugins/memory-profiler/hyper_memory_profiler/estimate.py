"""Predicting a run's memory per rank before running it (``hyper-train memory estimate``).

The model is built on the meta device (no memory, no weights read) and ``[model] freeze`` is
applied, so parameter shapes, dtypes and trainability are the run's own. With ``[peft]``
(``hyper-train-peft``) the LoRA layers are injected as the run does: the frozen base weights
have parameters only, the LoRA weights (and ``modules_to_save``) gradients and AdamW state too.
With ``[peft] quantize = "nf4"`` each quantized linear weight of ``n`` elements quantized from
``e``-byte values counts ``n/2 + n/64 + e·n/(64·s) + 17·e`` bytes (4-bit codes, int8 block
scales, one factor per ``s = 256`` scales, their mean and the code table; ~0.516 byte per
weight), by :func:`hyper_peft.quantize.nf4_bytes`; each matmul dequantizes its weight, so the
largest one's ``(8 + 3e)·n`` (torchao's int64 codes, looked-up and scaled halves, the weight)
is transient (:func:`hyper_peft.quantize.dequantize_peak_bytes`).

**Model state** (exact): per parameter, its rank-local element count times its element size.
Under a parameter-sharding strategy (``fsdp2``) with more than one rank, each parameter is
split along dim 0 over ``dp_shard`` ranks the way FSDP2 does (``torch.chunk``: rank 0 holds
``ceil(d0 / dp_shard)`` rows, the largest share); otherwise (``none``, ``ddp``) in full.
Gradients: trainable parameters, in their dtype. AdamW: ``exp_avg`` and ``exp_avg_sq`` in
the parameter's dtype (fp32 for fp32 weights) plus a 4-byte ``step`` per trainable tensor.
Buffers are never sharded. With fp32 master weights and bf16 compute (``[model] dtype =
"float32"``, ``mixed_precision = "bf16"``) that is 4 + 4 + 8 bytes per trainable parameter,
sharded; FSDP2's gathered parameters are bf16 (its default ``param_dtype`` then) and counted
as transient, below.

**Activations** (saved for backward by one micro-batch, what
:class:`~hyper_memory_profiler.activations.SavedTensorMeter` measures). Per token (language
model) or per vision patch, with ``c`` the compute element size (2 under bf16 autocast, else
the weights' size), ``r`` the residual stream's (LM: the weights' size; vision: ``c``),
``F = 4`` (fp32 statistics), ``w`` the block width, ``i`` its MLP width, ``nh``/``nkv`` the
query/key-value heads, ``d`` the head size:

* each norm: RMSNorm ``F·w + F + r·w`` (fp32 input, ``rsqrt``, the normalised input),
  LayerNorm ``x·w + 2F`` (``x`` = 4 under autocast, else ``r``), plus its output as the next
  linear's input, ``c·w`` (under autocast one cast per reading linear: q, k, v → 3; gate, up → 2);
  a norm whose output no linear reads (Gemma 3's post-attention and post-MLP norms, counted as
  a decoder layer's norms beyond two) without that output;
* attention, separate q/k/v (LM): ``c·(2·nh·d + 2·kv)`` (q, k, v, output) ``+ F·nh`` (log-sum-
  exp), ``kv = nh·d`` when the key/values are repeated for the kernel (SDPA with a mask, eager)
  else ``nkv·d``; SDPA with a mask (packed micro-batch of several samples, or padding) also
  saves the mask per layer: ``c·L`` per token for rows of length ``L``; eager saves the
  probabilities, ``F·nh·L`` (``+ c·nh·L`` under autocast) instead of the log-sum-exp and mask;
  per-head q/k RMSNorm (Qwen3) adds ``(nh + nkv)·(F·d + F + c·d)``;
* attention, fused qkv (vision): ``c·7·w + F·nh`` (qkv output, roped q and k, the per-image
  outputs and their concatenation), ``c·6·w`` with a varlen flash kernel (no concatenation);
* MLP: gated ``c·4·i`` (gate, up, act(gate), product), GELU ``c·2·i``, QuickGELU ``c·3·i``;
* the last decoder layer with logits at label positions (``n`` of ``T`` rows), for the parts
  the adapter runs on those rows only (:mod:`hyper_core.step.label_rows`): the rows' index
  ``8·n``; the query projection's gathered input ``c·h·n`` (under autocast: ``−c·h·(T − n)``,
  its cast of every row gone); the output projection's ``c·nh·d·n``; the MLP and its input's
  ``c·h`` (one cast per reading linear under autocast) at ``n`` rows instead of ``T``;
* per micro-batch once: token ids ``8`` bytes per token, labels ``8`` per logits row (+ a
  4-byte scalar; none chunked), the label-position mask ``1`` per token, RoPE
  ``cos``/``sin`` ``2·d·r`` (LM; per layer type with its own table: Gemma 3's local and global)
  and ``2·d·F`` (vision, for a tower with rotary embeddings) per position, the final norm, the
  logits (below), the image-token mask ``1`` byte per token, the pixel input
  ``c·patch_dim`` per patch, each patch merger ``norm(w) + c·2·w`` per patch.

**Logits** follow the trainer's loss path (:func:`loss_path`), with ``V`` the vocabulary, ``h``
the LM's width, ``T`` the micro-batch's tokens and ``n`` its label tokens (the profiler's
micro-batch says ``n``; otherwise ``n = label fraction × T``, the fraction measured on the
training data by ``memory estimate`` or :data:`DEFAULT_LABEL_FRACTION`):

* every position (an adapter with ``logits_at_labels_only = False``, or a model whose
  ``forward`` takes no ``logits_to_keep``): the fp32 log-softmax ``F·V·T`` saved, the logits
  ``c·V·T`` and their fp32 gradient ``F·V·T`` transient, the LM head's input ``c·h·T``;
* label positions (the default): the same over ``n`` rows, the head's input ``c·h·n`` (the
  final norm's output is gathered, not saved), the labels ``8·n`` instead of ``8·T`` and the
  positions' mask ``T`` bytes;
* chunked (``n > [training] loss_chunk_tokens``, the default loss): nothing of ``V·n`` is kept;
  the gradient buffers ``F·(n·h + V·h)`` (the hidden states' and the head weight's, fp32) are
  saved for backward, and one chunk of ``k = min(n, chunk)`` rows is transient at its peak:
  ``2F·k·V`` in fp32, else ``max((2c + 2F)·k·V, (2c + F)·k·V + c·V·h)``
  (the logits, their fp32 copy, the softmax gradient and its cast; the head weight's gradient
  product, added into the fp32 buffer as it is read, or the weight's cast: both c·V·h).

LoRA (without checkpointing) adds per token (or patch) and LoRA layer ``c·r`` (``lora_B``'s
input) and, with ``[peft] dropout``, ``(1 + c)·in`` (the dropout mask and output). What
frozen layers do not save (a frozen norm's normalised input, a frozen first layer's input)
stays counted, so a LoRA run's activations are an upper bound: 1.32× the measured ones for the
tiny Qwen2.5-VL with LoRA r=8 on every linear layer and dropout 0.1 (1.59× without dropout).

Activation checkpointing is a policy per tower (``[training] activation_checkpointing``,
``vision_activation_checkpointing``), with ``B`` a unit's bytes above, ``L`` the units:

* ``full``: the units save only their input, ``r·w`` per token (or patch) and unit;
  everything inside is recomputed in backward (one unit's ``B`` counted as transient);
* ``every_n``: ``k = ceil(L / N)`` units save their input, the other ``L − k`` their ``B``
  (one unit's ``B`` transient);
* ``selective``: each unit saves its input ``r·w`` and the outputs of its matmuls and
  attention (:func:`selective_unit_bytes`), at most ``B``; the element-wise rest, ``B`` less
  that, of one unit is transient while recomputed.

The last layer at label rows changes its bytes as above unless it is recomputed whole
(``selective``: its matmul outputs at ``n`` rows). RoPE tables count unless every unit is
recomputed, LoRA's own bytes with ``none`` only, and autocast's weight copies of recomputed
units as one unit's (in the recompute).

**Transient** (live at the peak, not saved for backward): the logits ``c·V`` per logits row held
by the outputs and the fp32 gradient of the log-softmax ``F·V`` (a chunk's peak instead when
chunked, above); under FSDP2 with several ranks the
unsharded root parameters plus two unsharded units (current + prefetch) and one unit's
unsharded gradients; under bf16 autocast of fp32 weights the bf16 weight copies autocast saves
(every Linear/Conv weight, unsharded; with checkpointing only those outside the units, plus one
unit's in the recompute). The total adds everything, as if all were live at once
(gradients and activations overlap only partly, so it is an upper bound in that respect).

Vision patches per image come from the adapter (``vision_patches``): the ``image_grid_thw`` of
a grid tower, or ``(image_size // patch_size)²`` of a tower that resizes every image
(``fixed_image_patches``: SigLIP in Gemma 3, CLIP in LLaVA).

The formula was calibrated against the saved-tensor measurement of transformers 5 Qwen2,
Qwen2-VL, Qwen2.5-VL and Qwen3-VL models (fp32 and bf16 autocast, SDPA), and checked on a tiny
Gemma 3 (``varlen``, within 25 %); see the README.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

FORMULA_VERSION = 2
F = 4  # fp32 statistics

#: Share of a micro-batch's tokens that carry a label when the data does not say: the answer
#: tokens of the bench's VL data (issue #21); ``memory estimate --label-fraction`` sets it.
DEFAULT_LABEL_FRACTION = 0.38

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchShape:
    """The tensors of one micro-batch: ``rows`` × ``seq_len`` tokens, ``patches`` vision patches."""

    rows: int
    seq_len: int
    samples: int
    patches: int = 0
    images: int = 0
    padding: int = 0
    #: Tokens with a label (the loss tokens); None: not known, see :meth:`with_labels`.
    label_tokens: int | None = None

    @property
    def tokens(self) -> int:
        """Token positions given to the model (padding included)."""
        return self.rows * self.seq_len

    def with_labels(self, fraction: float) -> BatchShape:
        """This shape with ``label_tokens`` = ``fraction`` of its non-padding tokens, unless
        known already."""
        if self.label_tokens is not None:
            return self
        labels = round(fraction * (self.tokens - self.padding))
        return replace(self, label_tokens=max(0, min(labels, self.tokens)))

    @property
    def masked(self) -> bool:
        """Whether attention needs an explicit mask (several samples in a row, or padding)."""
        return self.samples > self.rows or self.padding > 0

    @classmethod
    def from_micro_batch(cls, mb: Any, adapter: Any = None, model: Any = None) -> BatchShape:
        """The shape of a :class:`~hyper_core.batching.types.MicroBatch`; its vision patches as
        ``adapter`` counts them for ``model`` (``vision_patches``), else from
        ``image_grid_thw``."""
        ids = mb.model_inputs["input_ids"]
        rows, seq_len = (1, int(ids.shape[0])) if ids.dim() == 1 else tuple(ids.shape[:2])
        grid = mb.model_inputs.get("image_grid_thw")
        if model is not None and hasattr(adapter, "vision_patches"):
            patches = int(adapter.vision_patches(model, mb))
        else:
            patches = int(grid.prod(dim=-1).sum()) if grid is not None and len(grid) else 0
        images = len(grid) if grid is not None else int(getattr(mb, "num_images", 0))
        return cls(
            rows=int(rows),
            seq_len=int(seq_len),
            samples=int(mb.num_samples),
            patches=patches,
            images=images if patches else 0,
            padding=int(mb.num_padding),
            label_tokens=int(mb.num_loss_tokens),
        )


@dataclass(frozen=True)
class Precision:
    """Element sizes of a run's tensors."""

    weight_bytes: int  # the weights as stored (model dtype)
    compute_weight_bytes: int  # the weights as used in forward (FSDP2 param_dtype, or stored)
    compute_bytes: int  # activations of matmuls (2 under bf16 autocast)
    autocast: bool
    reduce_bytes: int  # FSDP2 gradient reduction

    @property
    def text_residual(self) -> int:
        """The LM's residual stream: the embedding output, in the weights' dtype."""
        return self.compute_weight_bytes

    @property
    def vision_residual(self) -> int:
        """The vision tower's residual stream: the patch conv's output dtype."""
        return self.compute_bytes

    @classmethod
    def from_config(cls, config: Any, sharded: bool = False) -> Precision:
        """From ``[model] dtype``, ``[training] mixed_precision`` and, when the parameters are
        sharded (FSDP2 on several ranks), FSDP2's dtypes as the run resolves them (under
        ``mixed_precision = "bf16"``: bf16 gather, fp32 reduction unless set)."""
        from hyper_core.step.precision import fsdp_precision

        weight = _DTYPE_BYTES[config.model.dtype]
        peft = config.section("peft")
        if peft is not None and peft.enabled and peft.base_dtype is not None:
            weight = _DTYPE_BYTES[peft.base_dtype]  # the frozen base (hyper-train-peft)
        mp = fsdp_precision(config.parallel, config.training)
        compute_weight = _DTYPE_BYTES[mp.param_dtype] if sharded and mp.param_dtype else weight
        autocast = config.training.mixed_precision == "bf16"
        reduce = _DTYPE_BYTES[mp.reduce_dtype] if sharded and mp.reduce_dtype else compute_weight
        return cls(
            weight_bytes=weight,
            compute_weight_bytes=compute_weight,
            compute_bytes=2 if autocast else compute_weight,
            autocast=autocast,
            reduce_bytes=reduce,
        )


@dataclass(frozen=True)
class StackShape:
    """A stack of transformer blocks (the language model's layers, or the vision blocks)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: str = "gated"  # gated | gelu | quick_gelu
    norm: str = "rms"  # rms | layer
    fused_qkv: bool = False
    qk_norm: bool = False
    #: Norms of a unit whose output no linear reads (Gemma's post-attention and post-MLP norms).
    extra_norms: int = 0
    experts_per_token: int = 0  # MoE: the routed experts per token (0: dense)
    experts: int = 0


@dataclass(frozen=True)
class ModelShape:
    """What the activation formula needs to know about a model."""

    text: StackShape
    vocab: int
    attn_implementation: str = "sdpa"
    vision: StackShape | None = None
    mergers: int = 0
    merger_norm: str = "rms"
    patch_dim: int = 0
    vision_window_index: bool = False
    vision_pos_interp: bool = False
    #: Whether the tower applies rotary position embeddings (SigLIP's learned table does not).
    vision_rope: bool = True
    #: Rotary tables the decoder computes per forward: one per layer type with its own (Gemma 3:
    #: local and global).
    rope_tables: int = 1
    #: Parameter elements of each sharding unit (FSDP2 all-gather buffers).
    unit_numels: tuple[int, ...] = ()
    root_numel: int = 0
    #: Elements of every Linear/Conv weight (autocast copies), and of those in no unit.
    matmul_weight_numel: int = 0
    matmul_root_numel: int = 0
    matmul_unit_numel: int = 0  # the largest unit's
    #: Parts of the last decoder layer that run on the label rows only when the logits do
    #: (``query``, ``output``, ``mlp``; :mod:`hyper_core.step.label_rows`).
    label_rows: tuple[str, ...] = ()


@dataclass(frozen=True)
class LossPath:
    """Where the LM head makes logits in a step, as the trainer decides (see module doc)."""

    mode: str  # every_position | label_positions | chunked
    #: Logits rows of the micro-batch: every token, or its label tokens.
    rows: int
    #: Rows of one chunk (``chunked`` only; 0 otherwise).
    chunk: int = 0
    #: The label share used for the micro-batch, and where it came from.
    label_fraction: float = DEFAULT_LABEL_FRACTION
    label_source: str = "default"


def loss_path(
    adapter: Any,
    model: Any,
    config: Any,
    batch: BatchShape,
    fraction: float = DEFAULT_LABEL_FRACTION,
    label_source: str = "default",
) -> LossPath:
    """The trainer's choice for ``batch`` (``label_tokens`` set; ``fraction`` the share they
    came from): logits at label positions when the adapter allows it and the model takes
    ``logits_to_keep``, in chunks above ``[training] loss_chunk_tokens`` label tokens with the
    default loss."""
    from hyper_core.step.label_positions import supports_label_positions
    from hyper_core.step.loss import causal_lm_loss

    labels = batch.label_tokens if batch.label_tokens is not None else batch.tokens
    if not supports_label_positions(adapter, model):
        return LossPath("every_position", batch.tokens, 0, fraction, label_source)
    chunk = config.training.loss_chunk_tokens
    default_loss = (getattr(adapter, "loss_fn", None) or causal_lm_loss) is causal_lm_loss
    if default_loss and chunk is not None and labels > chunk:
        return LossPath("chunked", labels, chunk, fraction, label_source)
    return LossPath("label_positions", labels, 0, fraction, label_source)


def chunk_peak_bytes(rows: int, vocab: int, hidden: int, prec: Precision) -> int:
    """The transient peak of one chunk of the chunked cross-entropy (see module doc)."""
    c = prec.compute_bytes
    kv = rows * vocab
    if c == F:  # the logits are their own fp32 copy; the weight gradient adds in place
        return 2 * F * kv
    # the weight gradient's half-precision product (or, as large, the weight's cast)
    return max((2 * c + 2 * F) * kv, (2 * c + F) * kv + c * vocab * hidden)


# -- model inspection ---------------------------------------------------------------------------


def _first(model: Any, suffix: str, under: str | None = None, exclude: str | None = None) -> Any:
    for name, module in model.named_modules():
        if under is not None and not name.startswith(under + "."):
            continue
        if exclude is not None and (name == exclude or name.startswith(exclude + ".")):
            continue
        if name.endswith(suffix):
            return module
    return None


def _linear_out(module: Any, *names: str) -> int | None:
    for name in names:
        sub = getattr(module, name, None)
        if sub is not None and hasattr(sub, "out_features"):
            return int(sub.out_features)
    return None


def _norm_kind(module: Any) -> str:
    name = type(module).__name__.lower() if module is not None else "rms"
    return "rms" if "rms" in name else "layer"


def _text_stack(model: Any, vision_path: str | None) -> StackShape:
    cfg = getattr(model.config, "text_config", None) or model.config
    layer = _first(model, "layers.0", exclude=vision_path)
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(cfg, "intermediate_size", 0) or 0)
    mlp_kind, qk_norm, norm = "gated", False, "rms"
    experts = per_token = extra_norms = 0
    if layer is not None:
        attn = getattr(layer, "self_attn", None)
        qk_norm = attn is not None and hasattr(attn, "q_norm")
        norm = _norm_kind(getattr(layer, "input_layernorm", None))
        norms = [m for m in layer.children() if "norm" in type(m).__name__.lower()]
        extra_norms = max(0, len(norms) - 2)  # beyond the attention's and the MLP's input norms
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "experts"):
            experts = int(getattr(cfg, "num_experts", 0) or 0)
            per_token = int(getattr(cfg, "num_experts_per_tok", 0) or 0)
            intermediate = int(getattr(cfg, "moe_intermediate_size", intermediate))
        elif mlp is not None:
            intermediate = _linear_out(mlp, "gate_proj", "up_proj", "fc1") or intermediate
            mlp_kind = "gated" if hasattr(mlp, "gate_proj") else "gelu"
    return StackShape(
        layers=int(cfg.num_hidden_layers),
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        mlp=mlp_kind,
        norm=norm,
        qk_norm=qk_norm,
        extra_norms=extra_norms,
        experts=experts,
        experts_per_token=per_token,
    )


def _vision_stack(model: Any, path: str) -> tuple[StackShape, dict[str, Any]]:
    vc = model.config.vision_config
    visual = model.get_submodule(path)
    block = _first(visual, "blocks.0") or _first(visual, "layers.0")
    hidden = int(getattr(vc, "embed_dim", None) or vc.hidden_size)
    heads = int(getattr(vc, "num_heads", None) or getattr(vc, "num_attention_heads", 1))
    intermediate = int(getattr(vc, "intermediate_size", 0) or hidden * getattr(vc, "mlp_ratio", 4))
    mlp_kind, norm, fused = "gelu", "layer", True
    if block is not None:
        mlp = getattr(block, "mlp", None)
        intermediate = _linear_out(mlp, "gate_proj", "fc1", "linear_fc1") or intermediate
        if mlp is not None and hasattr(mlp, "gate_proj"):
            mlp_kind = "gated"
        else:
            act = str(getattr(vc, "hidden_act", "gelu")).lower()
            mlp_kind = "quick_gelu" if "quick" in act else "gelu"
        norm = _norm_kind(getattr(block, "norm1", None) or getattr(block, "layer_norm1", None))
        attn = getattr(block, "attn", None)
        fused = attn is not None and hasattr(attn, "qkv")
        qkv = getattr(attn, "qkv", None)
        if qkv is not None and hasattr(qkv, "in_features"):
            hidden = int(qkv.in_features)
    deepstack = getattr(visual, "deepstack_merger_list", None)
    merger = getattr(visual, "merger", None)
    named = list(visual.named_modules())
    merger_norm_module = getattr(merger, "ln_q", None) or getattr(merger, "norm", None)
    patch = int(getattr(vc, "patch_size", 14))
    extra = {
        "mergers": (1 if merger is not None else 0) + (len(deepstack) if deepstack else 0),
        "merger_norm": _norm_kind(merger_norm_module),
        "patch_dim": int(getattr(vc, "in_channels", getattr(vc, "in_chans", 3)))
        * int(getattr(vc, "temporal_patch_size", 1))
        * patch
        * patch,
        "vision_window_index": getattr(vc, "window_size", None) is not None,
        "vision_pos_interp": hasattr(visual, "pos_embed"),
        "vision_rope": any("rot" in n.lower() or "rope" in n.lower() for n, _ in named),
    }
    stack = StackShape(
        layers=int(getattr(vc, "depth", None) or vc.num_hidden_layers),
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        mlp=mlp_kind,
        norm=norm,
        fused_qkv=fused,
    )
    return stack, extra


def _vision_path(model: Any, adapter: Any) -> str | None:
    try:
        plan = adapter.parallel_plan(model)
    except NotImplementedError:
        plan = None
    spec = getattr(plan, "vision_encoder", None)
    path = spec.module if spec is not None else getattr(adapter, "vision_module", None)
    if path is None or getattr(model.config, "vision_config", None) is None:
        return None
    try:
        model.get_submodule(path)
    except AttributeError:
        return None
    return path


def _matmul_weights(module: Any) -> list[Any]:
    import torch

    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    return [m.weight for m in module.modules() if isinstance(m, kinds)]


def _units(model: Any, adapter: Any) -> dict[str, Any]:
    """Parameter and matmul-weight elements per sharding unit and outside them (the root)."""
    from hyper_core.adapters.hf import match_modules

    try:
        patterns = adapter.parallel_plan(model).sharding_units
    except NotImplementedError:
        patterns = ()
    in_unit: set[int] = set()
    numels, matmul = [], []
    for name in match_modules(model, tuple(patterns)):
        unit = model.get_submodule(name)
        n = 0
        for p in unit.parameters():
            if id(p) not in in_unit:
                in_unit.add(id(p))
                n += p.numel()
        numels.append(n)
        matmul.append(sum(w.numel() for w in _matmul_weights(unit)))
    weights = {id(w): w for w in _matmul_weights(model)}
    return {
        "unit_numels": tuple(numels),
        "root_numel": sum(p.numel() for p in model.parameters() if id(p) not in in_unit),
        "matmul_weight_numel": sum(w.numel() for w in weights.values()),
        "matmul_root_numel": sum(w.numel() for i, w in weights.items() if i not in in_unit),
        "matmul_unit_numel": max(matmul, default=0),
    }


def unit_numels_under_ep(model: Any, adapter: Any, experts: set[int], ep: int) -> list[int]:
    """Elements each sharding unit gathers when its expert weights are split over ``ep``."""
    from hyper_core.adapters.hf import match_modules

    numels = []
    for name in match_modules(model, tuple(adapter.parallel_plan(model).sharding_units)):
        params = model.get_submodule(name).parameters()
        numels.append(sum(p.numel() // (ep if id(p) in experts else 1) for p in params))
    return numels


def model_shape(model: Any, adapter: Any, attn_implementation: str = "sdpa") -> ModelShape:
    """Inspect a (meta or real) HF model: block widths from its modules, counts from its config."""
    vision_path = _vision_path(model, adapter)
    text = _text_stack(model, vision_path)
    cfg = getattr(model.config, "text_config", None) or model.config
    vision = None
    extra: dict[str, Any] = {}
    if vision_path is not None:
        vision, extra = _vision_stack(model, vision_path)
    rotary = _first(model, "rotary_emb", exclude=vision_path)
    rope_tables = len(getattr(rotary, "layer_types", None) or [None])
    return ModelShape(
        rope_tables=rope_tables,
        text=text,
        vocab=int(cfg.vocab_size),
        attn_implementation=attn_implementation,
        vision=vision,
        label_rows=_label_row_parts(model, adapter),
        **_units(model, adapter),
        **extra,
    )


def _label_row_parts(model: Any, adapter: Any) -> tuple[str, ...]:
    """The adapter's label-row modules as parts of the formula (others are not modelled)."""
    names = adapter.label_row_modules(model) if hasattr(adapter, "label_row_modules") else []
    kinds = {"q_proj": "query", "o_proj": "output", "mlp": "mlp"}
    return tuple(kinds[leaf] for n in names if (leaf := n.rsplit(".", 1)[-1]) in kinds)


# -- the activation formula ---------------------------------------------------------------------


def norm_inner_bytes(width: int, kind: str, residual: int, prec: Precision) -> int:
    """Saved bytes per token of one norm, without its output (see module doc)."""
    if kind == "rms":
        return F * width + F + residual * width
    return (F if prec.autocast else residual) * width + 2 * F


def norm_bytes(width: int, kind: str, residual: int, prec: Precision, readers: int) -> int:
    """Saved bytes per token of one norm and its output as linear input (see module doc)."""
    inner = norm_inner_bytes(width, kind, residual, prec)
    return inner + prec.compute_bytes * width * (readers if prec.autocast else 1)


def mlp_bytes(stack: StackShape, prec: Precision) -> int:
    """Saved bytes per token of the MLP (MoE: the routed experts' share plus router logits)."""
    per = {"gated": 4, "gelu": 2, "quick_gelu": 3}[stack.mlp]
    if stack.experts_per_token:
        return (
            prec.compute_bytes * 4 * stack.intermediate * stack.experts_per_token
            + F * stack.experts * 2
        )
    return prec.compute_bytes * per * stack.intermediate


def text_layer_bytes(stack: StackShape, prec: Precision, batch: BatchShape, impl: str) -> int:
    """Saved bytes per token of one decoder layer (mask included)."""
    c, h = prec.compute_bytes, stack.hidden
    q = stack.heads * stack.head_dim
    repeat = impl == "eager" or (impl == "sdpa" and batch.masked)
    kv = q if repeat else stack.kv_heads * stack.head_dim
    readers1 = 1 if stack.fused_qkv else 3
    readers2 = 2 if stack.mlp == "gated" else 1
    total = norm_bytes(h, stack.norm, prec.text_residual, prec, readers1)
    total += norm_bytes(h, stack.norm, prec.text_residual, prec, readers2)
    total += stack.extra_norms * norm_inner_bytes(h, stack.norm, prec.text_residual, prec)
    if impl == "eager":
        probs = F * stack.heads * batch.seq_len
        if prec.autocast:
            probs += c * stack.heads * batch.seq_len
        total += c * (2 * q + 2 * kv) + probs
    else:
        total += c * (2 * q + 2 * kv) + F * stack.heads
        if impl == "sdpa" and batch.masked:
            total += c * batch.seq_len
    if stack.qk_norm:
        d = stack.head_dim
        total += (stack.heads + stack.kv_heads) * (F * d + F + c * d)
    return total + mlp_bytes(stack, prec)


def label_rows_bytes(
    stack: StackShape, prec: Precision, parts: tuple[str, ...], tokens: int, rows: int
) -> int:
    """Change of the last decoder layer's saved bytes when ``parts`` of it run on ``rows``
    label rows of ``tokens`` (negative: fewer; see module doc)."""
    if not parts:
        return 0
    c, h = prec.compute_bytes, stack.hidden
    drop = tokens - rows
    total = 8 * rows  # the rows' index
    if "query" in parts:  # its input gathered; under autocast, its cast of every row gone
        total += -c * h * drop if prec.autocast else c * h * rows
    if "output" in parts:
        total += c * stack.heads * stack.head_dim * rows
    if "mlp" in parts:
        readers = (2 if stack.mlp == "gated" else 1) if prec.autocast else 1
        total -= (mlp_bytes(stack, prec) + c * h * readers) * drop
    return total


def selective_label_rows_bytes(
    stack: StackShape, prec: Precision, parts: tuple[str, ...], tokens: int, rows: int
) -> int:
    """Change of the last decoder layer's ``selective`` bytes when ``parts`` of it run on
    ``rows`` label rows of ``tokens``: their matmul and attention outputs are kept for those
    rows only (negative)."""
    c, w, q = prec.compute_bytes, stack.hidden, stack.heads * stack.head_dim
    per = 0
    if "query" in parts:  # the query projection and the attention output per query row
        per += c * 2 * q + F * stack.heads
    if "output" in parts:
        per += c * w
    if "mlp" in parts and not stack.experts_per_token:
        per += c * ((2 if stack.mlp == "gated" else 1) * stack.intermediate + w)
    return 8 * rows - per * (tokens - rows) if parts else 0


def vision_block_bytes(stack: StackShape, prec: Precision, impl: str) -> int:
    """Saved bytes per patch of one vision block."""
    c, w = prec.compute_bytes, stack.hidden
    readers2 = 2 if stack.mlp == "gated" else 1
    total = norm_bytes(w, stack.norm, prec.vision_residual, prec, 1 if stack.fused_qkv else 3)
    total += norm_bytes(w, stack.norm, prec.vision_residual, prec, readers2)
    if stack.fused_qkv:
        total += c * (6 if impl.startswith("flash") else 7) * w + F * stack.heads
    else:
        total += c * 4 * w + F * stack.heads
    return total + mlp_bytes(stack, prec)


def selective_unit_bytes(stack: StackShape, prec: Precision, residual: int) -> int:
    """Saved bytes per token (or patch) of one unit under ``selective``: its input and the
    outputs of its matmuls (q/k/v, output projection, MLP and router) and attention."""
    c, w = prec.compute_bytes, stack.hidden
    q, kv = stack.heads * stack.head_dim, stack.kv_heads * stack.head_dim
    qkv = 3 * w if stack.fused_qkv else q + 2 * kv
    attention = c * (qkv + q + w) + F * stack.heads  # projections, output (+ logsumexp), o_proj
    if stack.experts_per_token:
        k = stack.experts_per_token
        mlp = c * k * (2 * stack.intermediate + w) + F * stack.experts
    else:
        up = 2 * stack.intermediate if stack.mlp == "gated" else stack.intermediate
        mlp = c * (up + w)
    return residual * w + attention + mlp


def checkpointed_count(layers: int, policy: str, every: int) -> int:
    """How many of ``layers`` units ``policy`` recomputes whole (``full``/``every_n``)."""
    if policy == "full":
        return layers
    if policy == "every_n":
        return math.ceil(layers / every)
    return 0


def stack_bytes(
    layers: int, unit: int, inputs: int, selective: int, policy: str, every: int
) -> tuple[int, int]:
    """``(saved, recomputed)`` bytes per token of a stack of ``layers`` units under
    ``policy``: ``unit`` a unit's saved bytes, ``inputs`` its input's, ``selective`` what
    ``selective`` keeps of it; ``recomputed`` is one unit's rebuilt bytes (transient)."""
    if policy == "selective":
        kept = min(selective, unit)
        return layers * kept, unit - kept
    k = checkpointed_count(layers, policy, every)
    return k * inputs + (layers - k) * unit, unit if k else 0


def activation_bytes(
    shape: ModelShape,
    batch: BatchShape,
    prec: Precision,
    checkpointing: bool | str = False,
    loss: LossPath | None = None,
    vision_checkpointing: str | None = None,
    every: int = 2,
) -> dict[str, int]:
    """Bytes saved for backward by one micro-batch, by part; ``total`` sums them. ``loss``
    says where the logits are made (default: every position). ``checkpointing`` is the
    decoder's policy (``True``: ``full``), ``vision_checkpointing`` the tower's (None: the
    decoder's), ``every`` the ``every_n`` period.

    Also returns ``recompute``: one unit's activations rebuilt in backward (transient, not in
    ``total``).
    """
    policy = {True: "full", False: "none"}.get(checkpointing, checkpointing)  # type: ignore[call-overload]
    vision_policy = vision_checkpointing or policy
    impl = shape.attn_implementation
    t, tokens = shape.text, batch.tokens
    c, r = prec.compute_bytes, prec.text_residual
    loss = loss or LossPath("every_position", tokens)
    n = loss.rows
    layer = text_layer_bytes(t, prec, batch, impl)
    parts: dict[str, int] = {}
    saved, recompute = stack_bytes(
        t.layers, layer, r * t.hidden, selective_unit_bytes(t, prec, r), policy, every
    )
    parts["language_layers"] = saved * tokens
    recompute *= tokens
    if loss.mode != "every_position":  # the last layer at label rows, unless recomputed
        if policy == "selective":
            rows = selective_label_rows_bytes(t, prec, shape.label_rows, tokens, n)
            parts["language_layers"] += rows
        elif policy == "none" or (policy == "every_n" and (t.layers - 1) % every):
            parts["language_layers"] += label_rows_bytes(t, prec, shape.label_rows, tokens, n)
    if policy != "full":
        parts["rope"] = 2 * t.head_dim * r * tokens * shape.rope_tables
    # the final norm without its output, which the LM head saves for its rows (none chunked)
    head_input = 0 if loss.mode == "chunked" else c * t.hidden * n
    parts["final_norm"] = (norm_bytes(t.hidden, t.norm, r, prec, 1) - c * t.hidden) * tokens
    parts["final_norm"] += head_input
    if loss.mode == "chunked":  # the hidden states' and the head weight's gradients, fp32
        parts["loss_gradients"] = F * t.hidden * (n + shape.vocab)
    else:
        parts["logits"] = F * shape.vocab * n
    # token ids (int64), the image-token mask; the loss's labels (int64) and normaliser, or
    # none (chunked: its gradients are computed already); the label-position mask (bool)
    parts["inputs"] = 8 * tokens + (tokens if batch.patches else 0)
    parts["inputs"] += 0 if loss.mode == "chunked" else 8 * n + 4
    parts["inputs"] += 0 if loss.mode == "every_position" else tokens
    v = shape.vision
    if v is not None and batch.patches:
        p = batch.patches
        block = vision_block_bytes(v, prec, impl)
        rv = prec.vision_residual
        vsaved, vrecompute = stack_bytes(
            v.layers, block, rv * v.hidden, selective_unit_bytes(v, prec, rv), vision_policy, every
        )
        parts["vision_blocks"] = vsaved * p
        if vision_policy != "full" and shape.vision_rope:
            parts["vision_rope"] = 2 * v.head_dim * F * p
        parts["vision_inputs"] = shape.patch_dim * c * p
        merger = norm_bytes(v.hidden, shape.merger_norm, rv, prec, 1) + 2 * c * v.hidden
        parts["projector"] = shape.mergers * merger * p
        if shape.vision_window_index:
            parts["vision_inputs"] += 16 * math.ceil(p / 4)
        if shape.vision_pos_interp:
            parts["vision_inputs"] += 48 * p
        recompute = max(recompute, vrecompute * p)
    parts["total"] = sum(parts.values())
    parts["recompute"] = recompute
    return parts


def lora_activation_bytes(
    model: Any, prec: Precision, batch: BatchShape, vision_path: str | None
) -> int:
    """Bytes the LoRA layers of ``model`` (peft's ``lora_A``/``lora_dropout``) save for
    backward in one micro-batch, besides the formula's (see module doc)."""
    import torch

    total = 0
    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if not isinstance(lora_a, torch.nn.ModuleDict):
            continue
        in_vision = vision_path is not None and name.startswith(vision_path + ".")
        count = batch.patches if in_vision else batch.tokens
        for key, a in lora_a.items():
            rank, width = int(a.weight.shape[0]), int(a.weight.shape[1])
            per = prec.compute_bytes * rank
            dropout = module.lora_dropout[key]
            if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                per += (1 + prec.compute_bytes) * width
            total += per * count
    return total


# -- model state --------------------------------------------------------------------------------


def local_rows(dim0: int, shards: int, rank: int = 0) -> int:
    """Rows of a dim-0 ``torch.chunk`` that ``rank`` holds (FSDP2's sharding)."""
    if shards <= 1:
        return dim0
    chunk = math.ceil(dim0 / shards)
    return max(0, min(chunk, dim0 - rank * chunk))


def _local_numel(p: Any, shards: int, rank: int, ep: int = 1) -> int:
    """Elements of ``p`` on ``rank``: dim 0 chunked over ``shards``; an expert weight under
    ``ep > 1`` has ``E / ep`` experts (dim 0) and dim 1 chunked over ``shards / ep``."""
    shape = tuple(p.shape)
    if shards <= 1 or not shape:
        return int(p.numel())
    if ep > 1:
        efsdp = max(shards // ep, 1)
        if len(shape) == 1:
            return shape[0] // ep
        return shape[0] // ep * local_rows(shape[1], efsdp, rank % efsdp) * math.prod(shape[2:])
    rest = math.prod(shape[1:])
    return local_rows(shape[0], shards, rank) * rest


def expert_parameter_ids(model: Any, adapter: Any) -> set[int]:
    """``id`` of every routed-expert weight of the adapter's MoE blocks (none for a dense
    model or an adapter without the ``MoEAdapter`` capability)."""
    from hyper_core.adapters.base import routed_expert_parameter_ids

    return routed_expert_parameter_ids(adapter, model)


def state_bytes(
    model: Any,
    groups: Mapping[str, Any],
    shards: int = 1,
    rank: int = 0,
    ep: int = 1,
    experts: set[int] | None = None,
    packed: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Predicted bytes of parameters, gradients, AdamW state and buffers on ``rank``.

    ``groups`` is the adapter's ``freeze_groups``; ``experts`` the ids of the expert weights
    split over ``ep`` ranks; ``packed`` the bytes of the frozen weights stored 4-bit
    (``[peft] quantize``, counted as ``nf4``); the result has the shape of
    :func:`hyper_memory_profiler.accounting.account`'s.
    """
    packed = packed or {}
    experts = experts or set()
    from .accounting import CATEGORIES, GroupMap

    gmap = GroupMap(groups)
    out: dict[str, dict[str, Any]] = {
        c: {"total": 0, "by_dtype": {}, "by_group": {}, "count": 0} for c in CATEGORIES
    }

    def add(cat: str, nbytes: int, dtype: str, group: str) -> None:
        entry = out[cat]
        entry["total"] += nbytes
        entry["count"] += 1
        entry["by_dtype"][dtype] = entry["by_dtype"].get(dtype, 0) + nbytes
        entry["by_group"][group] = entry["by_group"].get(group, 0) + nbytes

    for name, p in model.named_parameters():
        group = gmap.group_of(name)
        dtype = str(p.dtype).removeprefix("torch.")
        split = ep if id(p) in experts else 1
        nbytes = _local_numel(p, shards, rank, split) * p.element_size()
        if name in packed:  # its share of the packed bytes
            dtype = "nf4"
            nbytes = packed[name] * _local_numel(p, shards, rank, split) // max(p.numel(), 1)
        add("params", nbytes, dtype, group)
        if p.requires_grad:
            add("grads", nbytes, dtype, group)
            add("optimizer", nbytes, dtype, group)  # exp_avg
            add("optimizer", nbytes, dtype, group)  # exp_avg_sq
            add("optimizer", 4, "float32", group)  # step
    for name, b in model.named_buffers():
        add(
            "buffers",
            b.numel() * b.element_size(),
            str(b.dtype).removeprefix("torch."),
            gmap.group_of(name),
        )
    return out


# -- the whole estimate -------------------------------------------------------------------------


@dataclass
class Layout:
    """How the job is laid out: ranks, sharding."""

    world_size: int
    dp_replicate: int
    dp_shard: int
    strategy: str
    shards_parameters: bool
    #: ``[parallel] ep``: ranks the routed experts are split over.
    ep: int = 1
    #: ``[parallel] cp``: ranks each row's decoder tokens are split over.
    cp: int = 1

    @property
    def param_shards(self) -> int:
        """Ranks each parameter is split over (1: replicated); FSDP2 shards over the cp
        ranks too."""
        return self.dp_shard * self.cp if self.shards_parameters and self.world_size > 1 else 1


def layout_for(config: Any, strategy: Any, world_size: int) -> Layout:
    """The layout of ``config`` on ``world_size`` ranks (``dp_shard = -1``: the rest)."""
    par = config.parallel
    rest = max(world_size // (par.dp_replicate * par.cp), 1)
    shard = par.dp_shard if par.dp_shard != -1 else rest
    return Layout(
        world_size=world_size,
        dp_replicate=par.dp_replicate,
        dp_shard=shard,
        strategy=par.strategy,
        shards_parameters=bool(getattr(strategy, "shards_parameters", False)),
        ep=par.ep,
        cp=par.cp,
    )


def context_parallel_share(batch: BatchShape, cp: int) -> BatchShape:
    """One of ``cp`` ranks' share of ``batch``: each row padded to a multiple of ``2·cp``
    and split (:class:`~hyper_core.parallel.context_parallel.RowSplit`), the labels, images
    and patches split evenly (rounded up; the tower's share,
    :mod:`~hyper_core.parallel.cp_vision`)."""
    if cp == 1:
        return batch
    step = 2 * cp
    local = max(step, -(-batch.seq_len // step) * step) // cp
    labels = None if batch.label_tokens is None else -(-batch.label_tokens // cp)
    return replace(
        batch,
        seq_len=local,
        padding=-(-batch.padding // cp),
        label_tokens=labels,
        patches=-(-batch.patches // cp),
        images=-(-batch.images // cp),
    )


def default_batch(config: Any, adapter: Any, shape: ModelShape, model: Any) -> BatchShape:
    """The worst-case micro-batch of ``config``: ``micro_batch_size`` samples of
    ``max_seq_len`` tokens (one packed row, or that many padded rows), one image per sample of
    ``[model] max_pixels`` (or the adapter's default; a fixed-size tower's own size) when the
    model has a vision tower."""
    mbs, seq = config.training.micro_batch_size, config.data.max_seq_len
    batching = (config.data.batching or getattr(adapter, "default_batching", "packed")).lower()
    packed = batching == "packed"
    rows, seq_len = (1, mbs * seq) if packed else (mbs, seq)
    patches = images = 0
    if shape.vision is not None:
        vc = model.config.vision_config
        patch = int(getattr(vc, "patch_size", 14))
        merge = int(getattr(vc, "spatial_merge_size", 1))
        defaults = getattr(adapter, "image_defaults", None)
        max_pixels = config.model.max_pixels or getattr(defaults, "max_pixels", None)
        sized = getattr(adapter, "fixed_image_patches", None)
        fixed = sized(model) if sized is not None else None
        if fixed is not None:  # every image resized to the tower's size
            per_image = fixed
        else:
            per_image = max_pixels // (patch * patch) if max_pixels else seq * merge * merge // 2
            per_image = min(per_image, seq * merge * merge)  # image tokens fit in the sample
        images, patches = mbs, mbs * per_image
    return BatchShape(rows=rows, seq_len=seq_len, samples=mbs, patches=patches, images=images)


@dataclass
class Estimate:
    """A per-rank memory prediction (bytes); :meth:`to_json` for the summary."""

    layout: Layout
    precision: Precision
    batch: BatchShape
    #: The decoder's activation-checkpointing policy and the vision tower's.
    checkpointing: str
    loss: LossPath
    state: dict[str, dict[str, Any]]
    activations: dict[str, int]
    transient: dict[str, int]
    #: Parameter elements (the whole model, not per rank): ``total``, ``trainable``.
    parameters: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    vision_checkpointing: str | None = None

    def __post_init__(self) -> None:
        self.rows = {
            "params": self.state["params"]["total"],
            "grads": self.state["grads"]["total"],
            "optimizer": self.state["optimizer"]["total"],
            "buffers": self.state["buffers"]["total"],
            "activations": self.activations["total"],
            "weight_copies": self.transient.get("weight_copies", 0),
            "transient": sum(v for k, v in self.transient.items() if k != "weight_copies"),
        }
        self.rows["total"] = sum(self.rows.values())

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {
            "formula_version": FORMULA_VERSION,
            "layout": asdict(self.layout),
            "precision": asdict(self.precision),
            "batch": {
                **asdict(self.batch),
                "tokens": self.batch.tokens,
                "masked": self.batch.masked,
            },
            "activation_checkpointing": self.checkpointing,
            "vision_activation_checkpointing": self.vision_checkpointing or self.checkpointing,
            "loss_path": asdict(self.loss),
            "per_rank": dict(self.rows),
            "parameters": {
                **self.parameters,
                "trainable_share": self.parameters.get("trainable", 0)
                / max(self.parameters.get("total", 0), 1),
            },
            "state": self.state,
            "activations": dict(self.activations),
            "transient": dict(self.transient),
        }


def estimate_model(
    model: Any,
    adapter: Any,
    config: Any,
    layout: Layout,
    batch: BatchShape | None = None,
    rank: int = 0,
    label_fraction: float = DEFAULT_LABEL_FRACTION,
    label_source: str = "default",
) -> Estimate:
    """Estimate for an already built (meta) ``model`` with ``[model] freeze`` applied; a
    ``batch`` without ``label_tokens`` gets ``label_fraction`` of its tokens as labels
    (``label_source`` says where that came from, for the report)."""
    prec = Precision.from_config(config, sharded=layout.param_shards > 1)
    shape = model_shape(model, adapter, config.model.attn_implementation)
    if batch is None:
        batch = default_batch(config, adapter, shape, model)
    groups = adapter.freeze_groups(model)
    experts = expert_parameter_ids(model, adapter) if layout.ep > 1 else set()
    packed = quantized_parameter_bytes(model, adapter, config)
    state = state_bytes(model, groups, layout.param_shards, rank, layout.ep, experts, packed)
    if batch.label_tokens is not None:  # counted: the share of this micro-batch
        label_fraction = batch.label_tokens / max(batch.tokens - batch.padding, 1)
    batch = batch.with_labels(label_fraction)
    local = context_parallel_share(batch, layout.cp)  # this rank's decoder tokens
    loss = loss_path(adapter, model, config, local, label_fraction, label_source)
    training = config.training
    policy = training.activation_checkpointing
    vision_policy = training.vision_activation_checkpointing
    every = training.activation_checkpointing_every
    acts = activation_bytes(shape, local, prec, policy, loss, vision_policy, every)
    lora = 0
    if policy == "none":
        lora = lora_activation_bytes(model, prec, local, _vision_path(model, adapter))
    if lora:
        acts["lora"] = lora
        acts["total"] += lora
    tokens = local.tokens
    if loss.mode == "chunked":
        rows = min(loss.rows, loss.chunk)
        transient = {"logits": chunk_peak_bytes(rows, shape.vocab, shape.text.hidden, prec)}
    else:
        transient = {
            "logits": prec.compute_bytes * shape.vocab * loss.rows,
            "logits_grad": F * shape.vocab * loss.rows,
        }
    transient["recompute"] = acts.pop("recompute")
    if packed:  # one NF4 weight dequantized for its matmul at a time: the largest
        from hyper_peft.quantize import dequantize_peak_bytes

        largest = max((model.get_parameter(n) for n in packed), key=lambda p: p.numel())
        transient["nf4_dequantize"] = dequantize_peak_bytes(largest.numel(), largest.element_size())
    if layout.param_shards > 1:
        unit = max(shape.unit_numels, default=0)
        if experts:  # a unit gathers only its E / ep experts
            unit = max(unit_numels_under_ep(model, adapter, experts, layout.ep), default=0)
            top_k = max(b.top_k for b in adapter.moe_blocks(model))
            routed = top_k * tokens * shape.text.hidden
            transient["ep_all_to_all"] = 2 * prec.compute_bytes * routed  # sent + received
        transient["fsdp_unsharded"] = (
            shape.root_numel + 2 * unit
        ) * prec.compute_weight_bytes + unit * prec.reduce_bytes
    if prec.autocast and prec.compute_weight_bytes != prec.compute_bytes:
        # chunked, the LM head runs outside autograd: its weight's copy is not saved
        head = shape.vocab * shape.text.hidden if loss.mode == "chunked" else 0
        units = shape.matmul_weight_numel - shape.matmul_root_numel
        # a recomputed unit's (full, every_n) or recomputed cast (selective) copy is not kept
        kept = 1.0 - (
            1.0
            if policy == "selective"
            else checkpointed_count(shape.text.layers, policy, every) / max(shape.text.layers, 1)
        )
        copies = shape.matmul_root_numel + int(kept * units) - head
        transient["weight_copies"] = prec.compute_bytes * copies
        if policy != "none":
            transient["recompute"] += prec.compute_bytes * shape.matmul_unit_numel
    return Estimate(
        layout=layout,
        precision=prec,
        batch=batch,
        checkpointing=policy,
        vision_checkpointing=vision_policy,
        loss=loss,
        state=state,
        activations=acts,
        transient=transient,
        parameters={
            "total": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        },
    )


def quantized_parameter_bytes(model: Any, adapter: Any, config: Any) -> dict[str, int]:
    """``{name: bytes}`` of the frozen weights ``[peft] quantize = "nf4"`` stores in NF4
    (:func:`hyper_peft.quantize.nf4_bytes`: ~0.516 byte per weight), none otherwise."""
    peft = config.section("peft")
    if peft is None or not peft.enabled or peft.quantize == "none":
        return {}
    from hyper_peft.quantize import nf4_parameter_bytes

    return nf4_parameter_bytes(model, adapter)


def build_meta_model(config: Any, adapter: Any) -> Any:
    """The run's model on the meta device, with ``[model] freeze`` applied, and LoRA injected
    when the run sets ``[peft] method`` (as the peft plugin's ``build_model`` does)."""
    from hyper_core.builtin.stages import freeze

    model = adapter.build_model(config.model, device="meta")
    freeze(model, adapter, config.model.freeze)
    peft = config.section("peft")
    if peft is not None and peft.enabled:  # the section exists only with hyper-train-peft
        from hyper_peft.lora import apply_lora

        apply_lora(model, adapter, peft)
    return model


def estimate_config(
    config: Any,
    registries: Any,
    world_size: int,
    batch: BatchShape | None = None,
    rank: int = 0,
    label_fraction: float = DEFAULT_LABEL_FRACTION,
    label_source: str = "default",
) -> Estimate:
    """Build ``config``'s model on meta and estimate one rank of a ``world_size`` job."""
    from hyper_core.resolve import resolve_adapter, resolve_strategy

    adapter = resolve_adapter(config.model, registries)
    strategy = resolve_strategy(config, registries)
    model = build_meta_model(config, adapter)
    layout = layout_for(config, strategy, world_size)
    return estimate_model(model, adapter, config, layout, batch, rank, label_fraction, label_source)
