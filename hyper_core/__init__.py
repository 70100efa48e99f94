"""hyper-train's core: hook specifications, plugin manager, config, trainer and CLI.

Import cost matters: this module imports neither torch nor transformers.
"""

from .hookspecs import hookimpl, hookspec

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl", "hookspec"]
