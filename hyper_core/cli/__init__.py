"""The ``hyper-train`` command line. Importing it loads neither torch nor transformers."""

from .main import main

__all__ = ["main"]
