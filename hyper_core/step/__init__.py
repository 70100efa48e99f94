"""The math of one optimizer step: loss, optimizer, LR schedules, precision, rank lockstep.

The run around the steps (the loop, metrics, progress, evaluation) is `hyper_core.trainer`.
"""
