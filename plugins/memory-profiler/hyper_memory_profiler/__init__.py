"""hyper-train memory profiler: where the memory goes, per stage and per step, and whether it fits.

The plugin module (:mod:`hyper_memory_profiler.plugin`) imports neither torch nor transformers;
the heavy modules load only when a run enables ``[memory_profiler]`` or a ``hyper-train memory``
command runs.
"""

__version__ = "0.1.0"
