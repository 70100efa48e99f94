"""The ``[peft]`` config section (no torch or peft import here)."""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

import attrs

from hyper_core.config.fields import at_least, greater_than, meta
from hyper_core.errors import ConfigError

#: ``target`` entries that name a part of the model (``adapter.freeze_groups``).
PARTS = ("language", "vision", "projector")
#: The ``target`` entry for every linear layer but the output head.
ALL_LINEAR = "all-linear"
#: How to install what ``quantize = "nf4"`` needs.
INSTALL_HINT = "pip install 'hyper-train-peft[qlora]'"


def _default(attribute: attrs.Attribute) -> Any:
    default = attribute.default
    return default.factory() if isinstance(default, attrs.Factory) else default


def _check_dropout(_inst: Any, _attr: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"must be in [0, 1), got {value}")


def _check_names(_inst: Any, _attr: attrs.Attribute, value: list[str] | str) -> None:
    names = [value] if isinstance(value, str) else value
    if not names:
        raise ValueError("must name at least one part or module")
    if any(not n.strip() for n in names):
        raise ValueError("entries must not be empty")


@attrs.frozen(kw_only=True)
class PeftConfig:
    """``[peft]``: train low-rank adapters (LoRA) instead of the model's weights."""

    method: Literal["lora", "dora"] | None = attrs.field(
        default=None,
        metadata=meta(
            'Turns the plugin on: `"lora"`, or `"dora"` (weight-decomposed LoRA). Unset: full '
            "fine-tuning."
        ),
    )
    r: int = attrs.field(default=8, validator=at_least(1), metadata=meta("LoRA rank."))
    alpha: float = attrs.field(
        default=16.0,
        validator=greater_than(0.0),
        metadata=meta("LoRA scaling numerator: the update is scaled by `alpha / r`."),
    )
    dropout: float = attrs.field(
        default=0.0, validator=_check_dropout, metadata=meta("Dropout on the LoRA input.")
    )
    target: list[str] | str = attrs.field(
        default=ALL_LINEAR,
        validator=_check_names,
        metadata=meta(
            "Where LoRA goes: parts of the model (`language`, `vision`, `projector`, as in "
            "`[model] freeze`) restrict the scope, module names (`q_proj`, or a dotted suffix "
            'such as `self_attn.q_proj`; `*` wildcards allowed) select layers, `"all-linear"` '
            "every linear layer but the output head. Parts alone mean every linear layer of "
            'those parts, e.g. `["language", "q_proj", "v_proj"]`.'
        ),
    )
    modules_to_save: list[str] = attrs.field(
        factory=list,
        metadata=meta(
            "Modules trained in full besides the adapters (names as in `target`), e.g. "
            '`["lm_head", "embed_tokens"]` when tokens were added.'
        ),
    )
    base_dtype: Literal["bfloat16", "float16", "float32"] | None = attrs.field(
        default=None,
        metadata=meta(
            "The frozen base weights' dtype, with the trainable parameters (the adapters, "
            "`modules_to_save`) and so their gradients and AdamW state in fp32: `bfloat16` "
            "halves the base of an fp32 run (LLaMA-Factory's default for LoRA), e.g. a 7B "
            "model on one 24 GB GPU. Unset: every weight in [model] `dtype`, as before (the "
            "default does not depend on the device, so one config trains the same math on "
            "CPU and GPU). Compute follows the weights: a bf16 base computes in bf16 with or "
            "without autocast."
        ),
    )
    quantize: Literal["none", "nf4"] = attrs.field(
        default="none",
        metadata=meta(
            'QLoRA: `"nf4"` stores the frozen linear layers of the language model in 4-bit '
            "NormalFloat (torchao's NF4, blocks of 64 with double-quantized scales, about 0.52 "
            "byte per weight), dequantized to `base_dtype` (else [model] `dtype`) for each "
            "matmul; the vision tower, projector, embeddings and output head stay in "
            "`base_dtype`. Needs `pip install 'hyper-train-peft[qlora]'`; one process only "
            "(no `ddp`/`fsdp2` over several ranks)."
        ),
    )
    init_from: str | None = attrs.field(
        default=None,
        metadata=meta(
            "A PEFT adapter directory (`adapter_model.safetensors`) whose LoRA weights the "
            "run starts from (its rank and targets must match)."
        ),
    )

    def __attrs_post_init__(self) -> None:
        if self.method is not None:
            self._check_quantize()
            return
        changed = [
            a.name
            for a in attrs.fields(type(self))
            if a.name != "method" and getattr(self, a.name) != _default(a)
        ]
        if changed:
            raise ConfigError(
                [
                    (
                        "$.method",  # relative: the loader prefixes the section
                        f"not set, so [peft] {', '.join(changed)} would do nothing; "
                        'set method = "lora" (or remove them)',
                    )
                ]
            )

    def _check_quantize(self) -> None:
        """NF4 needs torchao (looked up, not imported: validating stays torch-free)."""
        if self.quantize == "nf4" and importlib.util.find_spec("torchao") is None:
            raise ConfigError(
                [("$.quantize", f"nf4 needs torchao, which is not installed; {INSTALL_HINT}")]
            )

    @property
    def enabled(self) -> bool:
        """Whether the run trains adapters."""
        return self.method is not None

    @property
    def targets(self) -> list[str]:
        """``target`` as a list."""
        return [self.target] if isinstance(self.target, str) else list(self.target)
