"""Benchmarks of hyper-train against its baselines (``python -m bench``)."""
