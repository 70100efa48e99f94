"""``python -m hyper_core`` is ``hyper-train`` (used under torchrun)."""

from .cli import console_main

console_main()
