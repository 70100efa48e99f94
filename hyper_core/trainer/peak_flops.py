"""Dense peak FLOP/s of CUDA devices by compute dtype, for MFU.

MFU divides the model's FLOPs by the peak of the dtype the matmuls run in: bf16 when the run
computes in bf16 (``mixed_precision = "bf16"``, an FSDP ``param_dtype`` or bf16 weights), else
TF32 when fp32 matmuls may use it (``[training] tf32``), else plain fp32. Parts that share a
name differ in clocks and power: an H100 or H200 is SXM unless its name says ``PCIe`` or
``NVL``. Figures are NVIDIA's dense (no sparsity) datasheet numbers.
"""

from __future__ import annotations

from typing import Any, Literal

ComputeDtype = Literal["bf16", "tf32", "fp32"]

#: (name fragments that must all appear, peaks by dtype); the first match wins, so variants
#: come before their family's default.
PEAKS: tuple[tuple[tuple[str, ...], dict[ComputeDtype, float]], ...] = (
    (("H200", "NVL"), {"bf16": 835e12, "tf32": 418e12, "fp32": 60e12}),
    (("H200",), {"bf16": 989e12, "tf32": 494e12, "fp32": 67e12}),
    (("H100", "PCIe"), {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    (("H100", "NVL"), {"bf16": 835e12, "tf32": 418e12, "fp32": 60e12}),
    (("H100",), {"bf16": 989e12, "tf32": 494e12, "fp32": 67e12}),
    (("A100",), {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (("L40S",), {"bf16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
)


def peak_flops(device_name: str, dtype: ComputeDtype) -> float | None:
    """The dense peak of ``device_name`` (``torch.cuda.get_device_name``) in ``dtype``."""
    for fragments, peaks in PEAKS:
        if all(f in device_name for f in fragments):
            return peaks[dtype]
    return None


def compute_dtype(config: Any) -> ComputeDtype:
    """The dtype a run's matmuls run in (see the module doc)."""
    bf16 = (
        config.training.mixed_precision == "bf16"
        or config.parallel.param_dtype == "bfloat16"
        or config.model.dtype == "bfloat16"
    )
    if bf16:
        return "bf16"
    return "tf32" if config.training.tf32 else "fp32"


def device_peak_flops(device: Any, dtype: ComputeDtype) -> float | None:
    """The peak of a CUDA ``device`` in ``dtype``, when known; None on CPU."""
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    return peak_flops(torch.cuda.get_device_name(device), dtype)
