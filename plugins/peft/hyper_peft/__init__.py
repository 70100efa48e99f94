"""hyper-train peft: LoRA fine-tuning of any adapter's model, built on the ``peft`` library.

The plugin module (:mod:`hyper_peft.plugin`) imports neither torch nor peft; :mod:`hyper_peft.lora`
loads only when a run sets ``[peft] method``.
"""

__version__ = "0.1.0"
