"""The config schema: one frozen attrs class per TOML section.

Every field carries ``metadata["help"]`` (used to generate the reference docs); a field whose TOML
key differs from its name has ``metadata["key"]``; fields that are not read from TOML have
``metadata["toml"] = False``. Cross-field rules live in ``_problems`` and raise a
:class:`ConfigError` with ``$``-rooted paths on construction; the converter re-roots them at the
section's path.
"""

import json
import pathlib
import typing
from typing import Any, Literal

import attrs

from hyper_core.config.converter import Invalid, converter, describe, show

# The field helpers are importable from here too (plugins written before config.fields).
from hyper_core.config.fields import at_least, between, greater_than, meta, not_empty
from hyper_core.errors import ConfigError

Dtype = Literal["float32", "bfloat16", "float16"]
CheckpointPolicy = Literal["none", "full", "every_n", "selective"]

CORE_SECTIONS = ("run", "model", "data", "training", "parallel", "checkpoint", "logging")
"""The core top-level sections, in the order they are dumped."""


def _check_step_window(value: list[int] | None) -> None:
    """``None`` or ``[first, last]`` with ``1 <= first <= last``."""
    if value is None:
        return
    if len(value) != 2 or not 1 <= value[0] <= value[1]:
        raise ValueError(f"must be [first, last] with 1 <= first <= last, got {show(value)}")


def _check_betas(_inst: Any, _attr: attrs.Attribute, value: list[float]) -> None:
    if len(value) != 2:
        raise ValueError(f"expected 2 values (beta1, beta2), got {len(value)}")
    if not all(0.0 <= b < 1.0 for b in value):
        raise ValueError(f"each beta must be in [0, 1), got {show(value)}")


def _check_dp_shard(_inst: Any, _attr: attrs.Attribute, value: int) -> None:
    if value != -1 and value < 1:
        raise ValueError(f"must be -1 (the rest of the world) or >= 1, got {value}")


class _Section:
    """Base of the section classes: runs the cross-field rules after construction."""

    __slots__ = ()

    def _problems(self) -> list[tuple[str, str]]:
        return []

    def __attrs_post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise ConfigError(problems)


@attrs.define(frozen=True, kw_only=True)
class RunConfig(_Section):
    """``[run]``: where the run writes, its seed and extra plugins."""

    output_dir: str = attrs.field(
        default="runs/default",
        validator=not_empty,
        metadata=meta("Output directory, relative to the working directory."),
    )
    seed: int = attrs.field(
        default=0,
        validator=at_least(0),
        metadata=meta("Seed for every RNG (Python, NumPy, torch)."),
    )
    plugins: list[str] = attrs.field(
        factory=list,
        metadata=meta(
            "Installed plugins (entry-point or distribution names) the run requires; a config "
            "never names code to import."
        ),
    )
    deterministic: bool = attrs.field(
        default=False, metadata=meta("Use deterministic algorithms (slower).")
    )
    name: str | None = attrs.field(
        default=None, metadata=meta("A name for the run (logs, trackers).")
    )


@attrs.define(frozen=True, kw_only=True)
class ModelConfig(_Section):
    """``[model]``: which model to build; exactly one of ``path`` and ``config``."""

    adapter: str | None = attrs.field(
        default=None,
        metadata=meta(
            "Registered model adapter; optional when `path` has a config.json with a model_type."
        ),
    )
    path: str | None = attrs.field(
        default=None, metadata=meta("A local Hugging Face model directory.")
    )
    config: str | None = attrs.field(
        default=None,
        metadata=meta("A named config shipped by the adapter (random init), e.g. `tiny`."),
    )
    trust_remote_code: bool = attrs.field(
        default=False, metadata=meta("Allow the model directory's own Python code.")
    )
    dtype: Dtype = attrs.field(
        default="float32",
        metadata=meta(
            "Dtype the weights are created/loaded in, and the parameters and AdamW state keep "
            "(the master weights). Train at bf16 with `float32` here and [training] "
            '`mixed_precision = "bf16"`; `bfloat16` is pure bf16 training (an opt-in: the run '
            "warns once when more than half the weights would not change by a step of `lr`)."
        ),
    )
    attn_implementation: str = attrs.field(
        default="sdpa",
        metadata=meta(
            "Attention implementation: transformers' (`sdpa`, `eager`, `flash_attention_2`...) "
            "or `varlen`, SDPA paid per sample of a packed row (exact, any device), or "
            "`flash_varlen`: torch's varlen flash kernel on CUDA, one call per layer for the "
            "decoder and the vision tower (`varlen` on CPU), or `flex_varlen`: torch's "
            "`flex_attention` over a packed row with a block mask of its samples and "
            "bidirectional spans (`varlen` for a CPU backward). With `varlen`, `flash_varlen`, "
            "`flex_varlen` and `flash_*`, packed micro-batches carry each sample's boundaries "
            "(`cu_seq_lens_q`...) and bidirectional spans (Gemma 3's image tokens)."
        ),
    )
    freeze: list[Literal["vision", "projector", "language"]] = attrs.field(
        factory=list, metadata=meta("Parts of the model whose parameters are not trained.")
    )
    min_pixels: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Smallest image area (pixels) the processor resizes to."),
    )
    max_pixels: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Largest image area (pixels) the processor resizes to."),
    )
    hf_overrides: dict[str, Any] = attrs.field(
        factory=dict,
        metadata=meta("Keys set on the Hugging Face model config, e.g. `hidden_size = 64`."),
    )
    options: dict[str, Any] = attrs.field(
        factory=dict,
        metadata=meta(
            "The adapter's own options (`[model.options]`), checked against the attrs class it "
            "declares (`ModelAdapter.options`, listed in its README), e.g. Qwen-VL's "
            "`max_image_tokens = 256` or Gemma 3's `pan_and_scan = true`. An adapter that "
            "declares none takes none."
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if self.path is None and self.config is None:
            problems.append(
                (
                    "$",
                    "set 'path' (a local HF directory) or 'config' (a named config of the adapter)",
                )
            )
        elif self.path is not None and self.config is not None:
            problems.append(("$", "set only one of 'path' and 'config'"))
        elif self.path is None and self.adapter is None:
            problems.append(("$.adapter", "required when 'path' is not set"))
        if (
            self.min_pixels is not None
            and self.max_pixels is not None
            and self.min_pixels > self.max_pixels
        ):
            problems.append(
                (
                    "$.max_pixels",
                    f"must be >= min_pixels ({self.min_pixels}), got {self.max_pixels}",
                )
            )
        return problems


_INFERRED_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def infer_format(path: str) -> str | None:
    """The data format implied by a file name (``.jsonl``/``.json`` → ``jsonl``, which reads
    JSON lines or a JSON array; ``.parquet`` → ``parquet``, a file or a directory of them),
    else None."""
    return _INFERRED_FORMATS.get(pathlib.PurePath(path).suffix.lower())


@attrs.define(frozen=True, kw_only=True)
class DataSource:
    """A dataset: a registered ``format``, an optional ``path`` and format-specific options.

    In TOML, either a path string (format inferred from the extension) or a table
    ``{ format = "shapes", path = "...", image_dir = "...", weight = 1.0, ...options }``
    (``format`` may be left out when the path's extension implies it).
    """

    format: str = attrs.field(
        validator=not_empty, metadata=meta("A registered dataset format, e.g. `jsonl`.")
    )
    path: str | None = attrs.field(
        default=None,
        validator=not_empty,
        metadata=meta("File or directory, relative to the config file."),
    )
    image_dir: str | None = attrs.field(
        default=None,
        validator=not_empty,
        metadata=meta(
            "Directory that relative image paths of these samples resolve against, relative to "
            "the config file; wins over `[data] image_root`."
        ),
    )
    weight: float = attrs.field(
        default=1.0,
        validator=greater_than(0.0),
        metadata=meta(
            "Mixing weight: each sample of this source appears `weight` times per epoch; the "
            "fractional part is a subset seeded by `[run] seed` (e.g. 0.5: half of the samples, "
            "the same half every epoch)."
        ),
    )
    options: dict[str, Any] = attrs.field(
        factory=dict, metadata=meta("The table's other keys, passed to the format.")
    )

    @property
    def is_plain_path(self) -> bool:
        """True when this source can be written as just its path."""
        return (
            self.path is not None
            and not self.options
            and self.image_dir is None
            and self.weight == 1.0
            and infer_format(self.path) == self.format
        )


def _structure_data_source(value: Any, _: Any) -> DataSource:
    if isinstance(value, str):
        if not value.strip():
            raise Invalid("must not be empty")
        fmt = infer_format(value)
        if fmt is None:
            raise Invalid(
                f"cannot infer the format of {value!r} from its extension (.jsonl, .json or "
                ".parquet); "
                f'use a table like {{ format = "...", path = {json.dumps(value)} }}'
            )
        return DataSource(format=fmt, path=value)
    if not isinstance(value, dict):
        raise Invalid(f"expected a path string or a table, got {describe(value)}")
    fields = ("format", "path", "image_dir", "weight")
    raw = {k: value[k] for k in fields if k in value}
    if "format" not in raw and isinstance(raw.get("path"), str):
        fmt = infer_format(raw["path"])
        if fmt is not None:  # { path = "a.jsonl", weight = 2 }
            raw["format"] = fmt
    raw["options"] = {k: v for k, v in value.items() if k not in fields}
    return converter.structure_table(raw, DataSource)


def _unstructure_data_source(source: DataSource) -> str | dict[str, Any]:
    if source.is_plain_path:
        return source.path
    table: dict[str, Any] = {"format": source.format}
    if source.path is not None:
        table["path"] = source.path
    if source.image_dir is not None:
        table["image_dir"] = source.image_dir
    if source.weight != 1.0:
        table["weight"] = source.weight
    return table | converter.unstructure(source.options)


converter.register_structure_hook(DataSource, _structure_data_source)


def _structure_checkpoint_policy(value: Any, cl: Any) -> str:
    """A policy name; the booleans of older configs mean ``full`` and ``none``."""
    if type(value) is bool:
        return "full" if value else "none"
    if value in typing.get_args(CheckpointPolicy):
        return value
    choices = ", ".join(show(a) for a in typing.get_args(CheckpointPolicy))
    raise Invalid(f"expected one of {choices} (or true = full, false = none), got {show(value)}")


converter.register_structure_hook_func(
    lambda cl: cl == CheckpointPolicy, _structure_checkpoint_policy
)
converter.register_unstructure_hook(DataSource, _unstructure_data_source)

#: ``[data] train``/``eval``: one source, or a list of sources read one after the other.
DataSources = DataSource | list[DataSource]


def _structure_data_sources(value: Any, _: Any) -> DataSource | list[DataSource] | None:
    if value is None:  # only from a default (TOML has no null)
        return None
    if isinstance(value, list):
        if not value:
            raise Invalid("must not be an empty array")
        return converter.structure(value, list[DataSource])
    return converter.structure(value, DataSource)


converter.register_structure_hook_func(
    lambda cl: cl in (DataSources, DataSources | None), _structure_data_sources
)


def source_list(sources: DataSources, where: str) -> list[tuple[str, DataSource]]:
    """``(config path, source)`` of each source: ``$.data.train`` for a single source,
    ``$.data.train[i]`` for each element of a list."""
    if isinstance(sources, DataSource):
        return [(where, sources)]
    return [(f"{where}[{i}]", source) for i, source in enumerate(sources)]


@attrs.define(frozen=True, kw_only=True)
class DataConfig(_Section):
    """``[data]``: training and evaluation data and how samples become batches."""

    train: DataSources = attrs.field(
        metadata=meta(
            "Training data: a `.jsonl`/`.json` path (JSON lines, or a JSON array in `.json`) or a "
            "`.parquet` path (a file, or a directory of `*.parquet` files), "
            "a `{ format = ... }` table, or an array of these, read one after the other. A "
            "path may be a glob (`b/*.jsonl`, its files in sorted order). A table's `weight` "
            "(default 1) is how many times each of its samples appears per epoch; a "
            "fractional part takes a subset seeded by `[run] seed`."
        )
    )
    eval: DataSources | None = attrs.field(
        default=None, metadata=meta("Held-out data, same forms as `train`.")
    )
    image_root: str | None = attrs.field(
        default=None,
        validator=not_empty,
        metadata=meta(
            "Directory that relative image paths resolve against, relative to the config file "
            "(default: each data file's directory); a source's `image_dir` wins."
        ),
    )
    max_seq_len: int = attrs.field(
        default=2048, validator=at_least(1), metadata=meta("Longest sample, in tokens.")
    )
    batching: str | None = attrs.field(
        default=None,
        metadata=meta("Registered batching runtime (`padded`, `packed`); default: the adapter's."),
    )
    on_error: Literal["skip", "raise"] = attrs.field(
        default="skip",
        metadata=meta("What a bad sample does: skip it (counted and logged) or stop the run."),
    )
    num_workers: int = attrs.field(
        default=1,
        validator=at_least(0),
        metadata=meta(
            "DataLoader worker processes preparing batches ahead of the step (0: in the "
            "training process, no overlap)."
        ),
    )
    shuffle: bool = attrs.field(
        default=True, metadata=meta("Shuffle the training data each epoch.")
    )
    eval_samples: int | None = attrs.field(
        default=None, validator=at_least(1), metadata=meta("Evaluate on at most this many samples.")
    )
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta(
            "Packed batching only: fill each micro-batch with up to this many tokens (and at "
            "most `micro_batch_size` samples) instead of exactly `micro_batch_size` samples. A "
            "step still takes `global_batch_size` samples; its samples are shared among the "
            "ranks by tokens (each rank prepares all of them), so the number of micro-batches "
            "varies by rank and step. At least `max_seq_len`: a longer sample is skipped as "
            "`too_long`."
        ),
    )
    buffer_size: int = attrs.field(
        default=1,
        validator=at_least(1),
        metadata=meta(
            "Look-ahead buffer, in steps (`global_batch_size` samples each, so it suits any "
            "batch or world size): the training samples of this many steps are regrouped into "
            "as many steps, run in a seeded shuffled order: of similar lengths (less padding), "
            "or with `max_tokens_per_micro_batch` to fill the budget (fewer micro-batches). "
            "Every rank prepares the whole buffer. 1: no regrouping. Needs `shuffle`."
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        budget = self.max_tokens_per_micro_batch
        if budget is not None and budget < self.max_seq_len:
            problems.append(
                (
                    "$.max_tokens_per_micro_batch",
                    f"{budget} is less than max_seq_len ({self.max_seq_len}), so a sample of "
                    "max_seq_len tokens would not fit; raise it or lower max_seq_len",
                )
            )
        if self.buffer_size > 1 and not self.shuffle:
            problems.append(
                (
                    "$.buffer_size",
                    f"{self.buffer_size} regroups the samples by length, but shuffle = false "
                    "keeps them in file order; set shuffle = true or buffer_size = 1",
                )
            )
        return problems


@attrs.define(frozen=True, kw_only=True)
class TrainingConfig(_Section):
    """``[training]``: length, batch sizes, optimizer and schedule; one of ``steps``/``epochs``."""

    steps: int | None = attrs.field(
        default=None, validator=at_least(1), metadata=meta("Optimizer steps to train for.")
    )
    epochs: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Passes over the training data (instead of `steps`)."),
    )
    global_batch_size: int = attrs.field(
        validator=at_least(1), metadata=meta("Samples per optimizer step across all ranks.")
    )
    micro_batch_size: int = attrs.field(
        validator=at_least(1),
        metadata=meta(
            "Samples per forward/backward on one rank (at most this many with [data] "
            "`max_tokens_per_micro_batch`)."
        ),
    )
    lr: float = attrs.field(validator=at_least(0.0), metadata=meta("Peak learning rate."))
    weight_decay: float = attrs.field(
        default=0.0, validator=at_least(0.0), metadata=meta("AdamW weight decay.")
    )
    betas: list[float] = attrs.field(
        factory=lambda: [0.9, 0.999],
        validator=_check_betas,
        metadata=meta("AdamW betas `[beta1, beta2]`."),
    )
    eps: float = attrs.field(
        default=1e-8, validator=greater_than(0.0), metadata=meta("AdamW epsilon.")
    )
    optimizer: Literal["adamw"] = attrs.field(default="adamw", metadata=meta("Optimizer."))
    lr_scheduler: Literal["constant", "linear", "cosine"] = attrs.field(
        default="cosine", metadata=meta("Learning-rate decay after warmup.")
    )
    warmup_steps: int = attrs.field(
        default=0, validator=at_least(0), metadata=meta("Linear warmup steps from 0 to `lr`.")
    )
    min_lr_ratio: float = attrs.field(
        default=0.0,
        validator=between(0.0, 1.0),
        metadata=meta("Final lr as a fraction of `lr` (linear/cosine)."),
    )
    max_grad_norm: float | None = attrs.field(
        default=1.0,
        validator=greater_than(0.0),
        metadata=meta("Clip the global gradient norm to this; unset: no clipping."),
    )
    mixed_precision: Literal["no", "bf16"] = attrs.field(
        default="no",
        metadata=meta(
            "Compute dtype: `bf16` runs forward/backward under bf16 autocast and, with fsdp2, "
            "gathers bf16 parameters and reduces gradients in fp32 (unless [parallel] "
            "`param_dtype`/`reduce_dtype` are set); the parameters stay in [model] `dtype`."
        ),
    )
    activation_checkpointing: CheckpointPolicy = attrs.field(
        default="none",
        metadata=meta(
            "Recompute activations in backward, per sharding unit (decoder layer, vision "
            "block): `none`; `selective` saves matmul and attention outputs and recomputes the "
            "element-wise ops; `every_n` recomputes every `activation_checkpointing_every`-th "
            "unit whole; `full` recomputes every unit (keeps only their inputs). From least "
            "to most recompute: none, selective, every_n, full. `true` means "
            "`full` and `false` `none`."
        ),
    )
    vision_activation_checkpointing: CheckpointPolicy | None = attrs.field(
        default=None,
        metadata=meta(
            "The policy of the vision tower's blocks (values as `activation_checkpointing`); "
            "unset: as `activation_checkpointing`."
        ),
    )
    activation_checkpointing_every: int = attrs.field(
        default=2,
        validator=at_least(1),
        metadata=meta("With `every_n`: recompute the 1st, N+1-th, ... unit of each tower."),
    )
    tf32: bool = attrs.field(
        default=True,
        metadata=meta(
            "On CUDA, let fp32 matmuls use TF32 tensor cores (10-bit mantissa inputs, fp32 "
            "accumulation); MFU then uses the TF32 peak. No effect on CPU or bf16 compute."
        ),
    )
    compile: bool = attrs.field(
        default=False,
        metadata=meta(
            "Compile each decoder layer and vision block with `torch.compile` (dynamic "
            "shapes). Costs a compile at the first steps; the run's end logs the graph and "
            "recompile counts. On CPU measured 24% faster per step on the tiny text model after "
            "~30 s of compiling, 4% on the ~27M Qwen2.5-VL bench model (1.94 s against 2.03 "
            "s, after 40 s); made for GPUs."
        ),
    )
    liger_kernel: bool = attrs.field(
        default=False,
        metadata=meta(
            "Run RMSNorm/LayerNorm, (m)RoPE and SwiGLU through liger-kernel's fused Triton "
            "kernels (CUDA only; `pip install 'hyper-train[liger]'`), for the model types "
            "liger-kernel supports. For element-wise work `compile` does not fuse; the loss "
            "keeps hyper-train's label-position path."
        ),
    )
    loss_chunk_tokens: int | None = attrs.field(
        default=4096,
        validator=at_least(1),
        metadata=meta(
            "Above this many label tokens in a micro-batch, the LM head and cross-entropy run "
            "in chunks of this many rows, gradients computed chunk by chunk (at most "
            "`chunk × vocab` logits at a time; same loss). Unset: never chunk. Applies to the "
            "default loss with adapters that compute logits at label positions only."
        ),
    )
    eval_every_steps: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Evaluate every N steps (and at the end) when `data.eval` is set."),
    )
    eval_generate_samples: int = attrs.field(
        default=0,
        validator=at_least(0),
        metadata=meta(
            "Per evaluation, generate answers for the first N eval samples and log them with "
            "prompt and reference (`metrics.jsonl`, `eval_samples.jsonl`, TensorBoard); 0: off."
        ),
    )
    no_decay_1d: bool = attrs.field(
        default=True, metadata=meta("No weight decay on 1-D parameters (norms, biases).")
    )
    max_bad_steps: int = attrs.field(
        default=5,
        validator=at_least(1),
        metadata=meta(
            "A step whose loss or gradient norm is not finite skips its update (counted as "
            "`bad_steps`); this many in a row stop the run (exit 1) without saving."
        ),
    )
    stall_timeout_s: int = attrs.field(
        default=300,
        validator=at_least(0),
        metadata=meta(
            "Step watchdog: when a rank makes no progress for this many seconds (no step "
            "finished and no stage begun: data, step, log, eval, checkpoint; counted from the "
            "start of training, after setup and resume), it writes every thread's Python "
            "stack to `output_dir/stacks/rank-R.txt` and exits 1, and the launcher names the "
            "stalled rank, its step and stage. Must exceed the longest step, evaluation or "
            "checkpoint save; keep it below [parallel] `timeout_s` so that a stall is named "
            "before a collective times out. 0: no watchdog."
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if self.steps is None and self.epochs is None:
            problems.append(("$", "set one of 'steps' or 'epochs'"))
        elif self.steps is not None and self.epochs is not None:
            problems.append(("$", "set only one of 'steps' and 'epochs'"))
        if self.global_batch_size % self.micro_batch_size:
            problems.append(
                (
                    "$.global_batch_size",
                    f"must be a multiple of micro_batch_size ({self.micro_batch_size}), "
                    f"got {self.global_batch_size}",
                )
            )
        return problems


@attrs.define(frozen=True, kw_only=True)
class ParallelConfig(_Section):
    """``[parallel]``: the parallel strategy and its device mesh."""

    strategy: str = attrs.field(
        default="none",
        validator=not_empty,
        metadata=meta("Registered parallel strategy: `none`, `ddp`, `fsdp2`, ..."),
    )
    dp_replicate: int = attrs.field(
        default=1,
        validator=at_least(1),
        metadata=meta("Data-parallel replicas (HSDP when > 1 with fsdp2)."),
    )
    dp_shard: int = attrs.field(
        default=-1,
        validator=_check_dp_shard,
        metadata=meta("Ranks each replica is sharded over; -1: the rest of the world."),
    )
    ep: int = attrs.field(
        default=1,
        validator=at_least(1),
        metadata=meta(
            "Expert parallelism (MoE models, `fsdp2`): the routed experts of each MoE block "
            "are split over groups of `ep` ranks, which exchange tokens all-to-all; expert "
            "weights are FSDP-sharded over the other `dp_shard × cp / ep` ranks. Must divide "
            "`dp_shard × cp` and the expert count; with `cp`, an ep group may span cp ranks."
        ),
    )
    cp: int = attrs.field(
        default=1,
        validator=at_least(1),
        metadata=meta(
            "Context (sequence) parallelism (`fsdp2`, `varlen` attention): each packed row's "
            "tokens are split over groups of `cp` consecutive ranks, which read the same data; "
            "attention is exact by all-to-all over heads (Ulysses), so `cp` must divide the "
            "attention and key/value head counts. The world is `dp_replicate × dp_shard × cp`; "
            "FSDP shards over `dp_shard × cp`."
        ),
    )
    param_dtype: Dtype | None = attrs.field(
        default=None,
        metadata=meta(
            "FSDP mixed-precision parameter dtype (the gathered parameters); unset: `bfloat16` "
            'with [training] `mixed_precision = "bf16"`, else the weights\' dtype.'
        ),
    )
    reduce_dtype: Dtype | None = attrs.field(
        default=None,
        metadata=meta(
            "FSDP gradient-reduction dtype; unset: `float32` with [training] "
            '`mixed_precision = "bf16"`, else the parameter dtype.'
        ),
    )
    backend: Literal["auto", "gloo", "nccl"] = attrs.field(
        default="auto", metadata=meta("torch.distributed backend; auto: nccl on CUDA, else gloo.")
    )
    timeout_s: int = attrs.field(
        default=600,
        validator=at_least(1),
        metadata=meta(
            "Collective timeout in seconds (the process group's): a collective that waits "
            "longer for a rank fails on every rank that waits, and the launch ends."
        ),
    )


@attrs.define(frozen=True, kw_only=True)
class CheckpointConfig(_Section):
    """``[checkpoint]``: when to save, what to keep, how to resume."""

    every_steps: int | None = attrs.field(
        default=None,
        validator=at_least(1),
        metadata=meta("Save every N steps; unset: only at the end or on a signal."),
    )
    keep_last: int | None = attrs.field(
        default=3,
        validator=at_least(1),
        metadata=meta("Keep this many newest checkpoints; unset: keep all."),
    )
    resume: str = attrs.field(
        default="auto",
        validator=not_empty,
        metadata=meta("`auto` (latest in output_dir), `none`, or a checkpoint path."),
    )
    save_final: bool = attrs.field(
        default=True,
        metadata=meta(
            "Save when training reaches its last step. `false` (benchmarks) saves only every "
            "`every_steps`; a run stopped by a signal still saves."
        ),
    )
    export_hf: bool = attrs.field(
        default=False,
        metadata=meta(
            "At the end of training, also export the model to `output_dir/hf`: HF safetensors, "
            "or what a plugin's `export_checkpoint` writes for the final checkpoint (a LoRA "
            "run: the PEFT adapter directory, which needs `save_final`)."
        ),
    )
    export_dtype: Literal["auto", "bf16", "fp32", "fp16"] = attrs.field(
        default="auto",
        metadata=meta(
            "Dtype of the `export_hf` weights; `auto`: the trained parameters' (a plugin's "
            "export reads it as `hyper-train export --dtype`)."
        ),
    )
    async_save: bool = attrs.field(
        default=False, metadata=meta("Save in the background.", key="async")
    )


@attrs.define(frozen=True, kw_only=True)
class LoggingConfig(_Section):
    """``[logging]``: how often and where metrics go."""

    every_steps: int = attrs.field(
        default=10, validator=at_least(1), metadata=meta("Log metrics every N steps.")
    )
    tensorboard: bool = attrs.field(default=False, metadata=meta("Also write TensorBoard events."))
    progress: Literal["auto", "bar", "lines", "none"] = attrs.field(
        default="auto", metadata=meta("Console progress: a bar on a TTY, lines otherwise (auto).")
    )
    profile_steps: list[int] | None = attrs.field(
        default=None,
        validator=lambda _inst, _attr, value: _check_step_window(value),
        metadata=meta(
            "`[FIRST, LAST]`: run `torch.profiler` over training steps FIRST to LAST (numbered "
            "as in `metrics.jsonl`); each rank writes a trace (`trace-rankN.json`, for Perfetto "
            "or chrome://tracing) and an op table (`ops-rankN.txt`) to `output_dir/profile/`."
        ),
    )


@attrs.define(frozen=True, kw_only=True)
class SectionSpec:
    """A top-level config section registered by a plugin (``register_config_sections``)."""

    name: str = attrs.field(metadata={"help": "The top-level TOML key, e.g. `encoder_parallel`."})
    cls: type = attrs.field(metadata={"help": "The attrs class the section is structured into."})
    plugin: str = attrs.field(metadata={"help": "The plugin that registered it."})


@attrs.define(frozen=True, kw_only=True)
class Config:
    """A whole, validated run config (load it with :func:`load_config`)."""

    run: RunConfig = attrs.field(factory=RunConfig, metadata=meta("See `[run]`."))
    model: ModelConfig = attrs.field(metadata=meta("See `[model]`."))
    data: DataConfig = attrs.field(metadata=meta("See `[data]`."))
    training: TrainingConfig = attrs.field(metadata=meta("See `[training]`."))
    parallel: ParallelConfig = attrs.field(
        factory=ParallelConfig, metadata=meta("See `[parallel]`.")
    )
    checkpoint: CheckpointConfig = attrs.field(
        factory=CheckpointConfig, metadata=meta("See `[checkpoint]`.")
    )
    logging: LoggingConfig = attrs.field(factory=LoggingConfig, metadata=meta("See `[logging]`."))
    plugin_sections: dict[str, object] = attrs.field(
        factory=dict, metadata=meta("Structured plugin sections, by section name.", toml=False)
    )
    source_path: str | None = attrs.field(
        default=None,
        eq=False,
        metadata=meta("The config file, for resolving relative paths.", toml=False),
    )

    def section(self, name: str) -> Any:
        """A core or plugin section by name; None for a plugin section that is absent."""
        if name in CORE_SECTIONS:
            return getattr(self, name)
        return self.plugin_sections.get(name)
