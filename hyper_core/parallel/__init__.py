"""Parallel strategies and the distributed environment."""

from .base import ParallelStrategy
from .env import DistEnv

__all__ = ["DistEnv", "ParallelStrategy"]
