"""hyper-train adapters for the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE).

Importing this package is cheap (no torch/transformers); the adapters live in
:mod:`hyper_qwen_vl.adapters`, the image-only processor in :mod:`hyper_qwen_vl.processor` and the
per-sample mRoPE positions in :mod:`hyper_qwen_vl.rope`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
