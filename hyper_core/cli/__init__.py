"""The ``hyper-train`` command line. Importing it loads neither torch nor transformers."""

from .main import console_main, main

__all__ = ["console_main", "main"]
