"""Measuring activation memory: the bytes autograd saves for backward during a forward.

:class:`SavedTensorMeter` installs ``torch.autograd.graph.saved_tensors_hooks`` whose pack hook
only looks at each saved tensor and returns it unchanged (no copy, no reference kept, so the
run's memory and numerics are untouched). Saved tensors are counted by their *storage*, once
per storage, so views (``q``/``k``/``v`` splits of one projection, transposes, RoPE tables
shared by every layer) are not double-counted. Three buckets:

* ``activations``: everything that is not a parameter;
* ``param_copies``: tensors derived from a trainable parameter only through casts and views
  (the bf16 weight copies autocast saves for backward);
* parameters and views of parameters are skipped (they are counted as parameters).

A frozen parameter's autocast copy has no autograd history and counts as an activation.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

#: Autograd nodes that only cast or re-view their single input.
_PASSTHROUGH = frozenset(
    {
        "ToCopyBackward0",
        "TBackward0",
        "ViewBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "ExpandBackward0",
        "UnsafeViewBackward0",
        "AliasBackward0",
        "ReshapeAliasBackward0",
    }
)


def _is_parameter(t: torch.Tensor) -> bool:
    if isinstance(t, torch.nn.Parameter):
        return True
    base = getattr(t, "_base", None)
    return base is not None and isinstance(base, torch.nn.Parameter)


def _is_param_copy(t: torch.Tensor) -> bool:
    fn = t.grad_fn
    for _ in range(6):
        if fn is None:
            return False
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return isinstance(getattr(fn, "variable", None), torch.nn.Parameter)
        if name not in _PASSTHROUGH:
            return False
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


def _storage_key(t: torch.Tensor) -> tuple[Any, int, int]:
    local = t.to_local() if hasattr(t, "to_local") else t
    try:
        storage = local.untyped_storage()
        return (str(local.device), storage.data_ptr(), storage.nbytes())
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage
        return (str(local.device), id(local), local.numel() * local.element_size())


def _current_hooks() -> tuple[Any, Any] | None:
    """The innermost saved-tensor hooks installed on this thread, if any (private API)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return None
    try:
        return top(False)
    except Exception:
        return None


class SavedTensorMeter:
    """Counts saved-for-backward bytes between :meth:`start` and :meth:`stop` (one thread)."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self._activations: dict[tuple[Any, int], int] = {}
        self._copies: dict[tuple[Any, int], int] = {}
        self._saved = 0

    @property
    def active(self) -> bool:
        """Whether the hooks are installed."""
        return self._ctx is not None

    def _count(self, t: torch.Tensor) -> None:
        self._saved += 1
        if _is_parameter(t):
            return
        device, ptr, nbytes = _storage_key(t)
        bucket = self._copies if _is_param_copy(t) else self._activations
        key = (device, ptr)
        if key not in self._activations and key not in self._copies:
            bucket[key] = nbytes

    def start(self) -> None:
        """Install the hooks (on the calling thread).

        Saved-tensor hooks don't nest (the innermost pair alone runs), so hooks already
        installed by someone else (activation offloading, say) are chained: ours count the
        tensor and hand it to theirs, and their unpack gets back what their pack returned.
        """
        if self._ctx is not None:
            return
        self._activations.clear()
        self._copies.clear()
        self._saved = 0
        outer = _current_hooks()
        if outer is None:

            def pack(t: torch.Tensor) -> Any:
                self._count(t)
                return t

            def unpack(packed: Any) -> Any:
                return packed

        else:
            outer_pack, outer_unpack = outer

            def pack(t: torch.Tensor) -> Any:
                self._count(t)
                return outer_pack(t)

            def unpack(packed: Any) -> Any:
                return outer_unpack(packed)

        from hyper_core.parallel.checkpointing import observe_selective_saves

        self._ctx = contextlib.ExitStack()
        self._ctx.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
        # selective checkpointing keeps matmul outputs in its cache, not as saved tensors
        self._ctx.enter_context(observe_selective_saves(self._count))

    def stop(self) -> dict[str, int]:
        """Remove the hooks; ``{"activations", "param_copies", "saved_tensors", "storages"}``."""
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.close()
        return {
            "activations": sum(self._activations.values()),
            "param_copies": sum(self._copies.values()),
            "saved_tensors": self._saved,
            "storages": len(self._activations) + len(self._copies),
        }
