"""The ``[preference]`` config section (no torch import here)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from hyper_core.config.schema import at_least, between, greater_than, meta
from hyper_core.errors import ConfigError

Objective = Literal["sigmoid", "simpo", "orpo"]
Reference = Literal["auto", "adapters_off", "copy", "precompute"]

#: Objectives that compare the policy with a reference model (the others are reference-free).
WITH_REFERENCE = ("sigmoid",)


def _default(attribute: attrs.Attribute) -> Any:
    default = attribute.default
    return default.factory() if isinstance(default, attrs.Factory) else default


@attrs.frozen(kw_only=True)
class PreferenceConfig:
    """``[preference]``: train on chosen/rejected pairs instead of supervised answers."""

    loss: Objective | None = attrs.field(
        default=None,
        metadata=meta(
            'Turns the plugin on: `"sigmoid"` (DPO), `"simpo"` (SimPO, reference-free, '
            'length-normalised) or `"orpo"` (ORPO: an SFT term plus an odds-ratio term, '
            "reference-free). Unset: supervised training as usual."
        ),
    )
    beta: float = attrs.field(
        default=0.1,
        validator=greater_than(0.0),
        metadata=meta(
            "DPO/SimPO: the inverse temperature of the implicit reward. ORPO: the weight of "
            "the odds-ratio term (its λ)."
        ),
    )
    label_smoothing: float = attrs.field(
        default=0.0,
        validator=between(0.0, 0.499),
        metadata=meta(
            "Conservative DPO/SimPO: the assumed probability that a pair's labels are flipped "
            "(0: plain DPO)."
        ),
    )
    simpo_gamma: float = attrs.field(
        default=0.5,
        validator=at_least(0.0),
        metadata=meta("SimPO's target reward margin γ."),
    )
    sft_weight: float = attrs.field(
        default=0.0,
        validator=at_least(0.0),
        metadata=meta(
            "Adds this times the chosen reply's mean token NLL to each pair's loss (RPO); 0: none."
        ),
    )
    reference: Reference = attrs.field(
        default="auto",
        metadata=meta(
            'The reference model of `loss = "sigmoid"`: `"adapters_off"` (with [peft]: the '
            'same model with its LoRA adapters disabled, no second copy), `"copy"` (a frozen '
            "copy of the starting weights, sharded like the policy under fsdp2), "
            '`"precompute"` (one pass before the first step writes the reference log-probs to '
            '`output_dir/preference/reference_logps.pt`; a resumed run reads them). `"auto"`: '
            "`adapters_off` with [peft], else `copy`."
        ),
    )

    encode_images_once: bool = attrs.field(
        default=True,
        metadata=meta(
            "Run the vision encoder once per pair on the prompt's images and give its output "
            "to both replies (a VL adapter with the per-image encoder view; not with videos, "
            "[parallel] cp or encoder parallelism). `false`: each sequence encodes its own."
        ),
    )

    def __attrs_post_init__(self) -> None:
        if self.loss is not None:
            return
        changed = [
            a.name
            for a in attrs.fields(type(self))
            if a.name != "loss" and getattr(self, a.name) != _default(a)
        ]
        if changed:
            raise ConfigError(
                [
                    (
                        "$.loss",  # relative: the loader prefixes the section
                        f"not set, so [preference] {', '.join(changed)} would do nothing; "
                        'set loss = "sigmoid" (or remove them)',
                    )
                ]
            )

    @property
    def enabled(self) -> bool:
        """Whether the run trains on preference pairs."""
        return self.loss is not None

    @property
    def uses_reference(self) -> bool:
        """Whether the objective needs reference log-probs."""
        return self.loss in WITH_REFERENCE

    def reference_mode(self, lora: bool) -> str:
        """``reference`` with ``auto`` resolved (``lora``: the run trains [peft] adapters)."""
        if self.reference != "auto":
            return self.reference
        return "adapters_off" if lora else "copy"
