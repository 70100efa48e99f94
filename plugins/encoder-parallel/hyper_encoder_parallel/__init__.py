"""hyper-train-encoder-parallel: balance vision-encoder work across data-parallel ranks.

Importing the package imports no torch; the balancing runtime lives in
:mod:`hyper_encoder_parallel.balancer` and is imported when a run enables it.
"""

__version__ = "0.1.0"
