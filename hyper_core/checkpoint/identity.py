"""Which model a checkpoint holds: ``model.json`` (:class:`ModelIdentity`).

It records the adapter, the architecture, the HF config without runtime-only keys, and every
parameter's full shape; a resume into another model is an error naming what differs, before any
weight is read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

#: HF config keys that say how a model runs or where it came from, not which model it is.
_RUNTIME_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "architectures",
        "dtype",
        "torch_dtype",
        "_attn_implementation",
        "attn_implementation",
        "_attn_implementation_autoset",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)
#: Differences named in a mismatch message (the rest are counted).
_SHOWN_DIFFERENCES = 3


def _runtime_free(config: Any) -> Any:
    """``config`` (an HF config dict) without runtime-only keys, at any depth (VL sub-configs)."""
    if isinstance(config, Mapping):
        return {
            str(k): _runtime_free(v) for k, v in config.items() if k not in _RUNTIME_CONFIG_KEYS
        }
    if isinstance(config, list | tuple):
        return [_runtime_free(v) for v in config]
    return config


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, Mapping) or not config:
        return {prefix: config}
    flat: dict[str, Any] = {}
    for k, v in config.items():
        flat.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return flat


def _architecture(model: Any) -> str:
    """The model's class, not FSDP2's per-instance subclass of it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return type(model).__name__
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    return cls.__name__


_UNSET = object()


def _value(values: Mapping[str, Any], key: str) -> str:
    return repr(values[key]) if key in values else "(absent)"


def _more(items: list[str]) -> str:
    shown = "; ".join(items[:_SHOWN_DIFFERENCES])
    if len(items) > _SHOWN_DIFFERENCES:
        shown += f" (and {len(items) - _SHOWN_DIFFERENCES} more)"
    return shown


@attrs.frozen(kw_only=True)
class ModelIdentity:
    """Which model a checkpoint holds (``model.json``): a resume must build the same one."""

    adapter: str | None
    architecture: str
    #: The HF config without runtime-only keys (JSON types), None for a model without one.
    config: dict[str, Any] | None
    config_hash: str | None
    #: Every state-dict entry's full (unsharded) shape.
    shapes: dict[str, list[int]]

    @classmethod
    def of(
        cls, model: torch.nn.Module, adapter: str | None, model_state: Mapping[str, Any]
    ) -> ModelIdentity:
        """The identity of ``model`` (unwrapped) built by the adapter named ``adapter``;
        ``model_state`` is its checkpoint state dict (DTensor shapes are global, so any number
        of ranks gives the same identity)."""
        hf_config = getattr(model, "config", None)
        config = None
        if hf_config is not None and hasattr(hf_config, "to_dict"):
            config = json.loads(json.dumps(_runtime_free(hf_config.to_dict()), default=str))
        digest = None
        if config is not None:
            text = json.dumps(config, sort_keys=True)
            digest = hashlib.sha256(text.encode()).hexdigest()
        return cls(
            adapter=adapter,
            architecture=_architecture(model),
            config=config,
            config_hash=digest,
            shapes={k: list(v.shape) for k, v in model_state.items() if hasattr(v, "shape")},
        )

    def to_json(self) -> str:
        """``model.json``'s text."""
        return json.dumps(attrs.asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ModelIdentity:
        """Read ``model.json`` (``ValueError``/``KeyError``/``TypeError`` if it is not one)."""
        raw = json.loads(text)
        return cls(
            adapter=raw["adapter"],
            architecture=str(raw["architecture"]),
            config=raw["config"],
            config_hash=raw["config_hash"],
            shapes={str(k): [int(d) for d in v] for k, v in raw["shapes"].items()},
        )

    def differences(self, now: ModelIdentity) -> list[str]:
        """What differs from ``now``, saved → now; empty when it is the same model."""
        diffs = []
        if self.adapter != now.adapter:
            diffs.append(f"adapter {self.adapter} → {now.adapter}")
        if self.architecture != now.architecture:
            diffs.append(f"architecture {self.architecture} → {now.architecture}")
        if self.config_hash != now.config_hash:
            old, new = _flatten(self.config or {}), _flatten(now.config or {})
            keys = [k for k in old.keys() | new.keys() if old.get(k, _UNSET) != new.get(k, _UNSET)]
            keys.sort(key=lambda k: (k != "model_type", k))
            shown = [f"{k} {_value(old, k)} → {_value(new, k)}" for k in keys]
            diffs.append(f"config {_more(shown)}")
        shape_diffs = []
        for name in sorted(self.shapes.keys() | now.shapes.keys()):
            a, b = self.shapes.get(name), now.shapes.get(name)
            if a != b:
                shape_diffs.append(
                    f"{name} {_value(self.shapes, name)} → {_value(now.shapes, name)}"
                )
        if shape_diffs:
            diffs.append(f"parameters {_more(shape_diffs)}")
        return diffs
