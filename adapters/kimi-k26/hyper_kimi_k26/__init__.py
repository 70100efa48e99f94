"""hyper-train adapter for the Kimi-K2.5 / Kimi-K2.6 family (``model_type = "kimi_k25"``).

Importing this package is cheap (no torch/transformers): the adapter lives in
:mod:`hyper_kimi_k26.adapter`, the torchvision-free image processor in
:mod:`hyper_kimi_k26.processor`, the chat format and special tokens in
:mod:`hyper_kimi_k26.tokens`, the export key mapping in :mod:`hyper_kimi_k26.export` and the
MoE router statistics in :mod:`hyper_kimi_k26.moe`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
