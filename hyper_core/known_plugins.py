"""The project's first-party plugin distributions and what each provides.

The one table behind the "pip install DISTRIBUTION" hints: a config naming an adapter, a
parallel strategy or a config section that no installed plugin provides is told which of these
distributions does (or, when it is installed but filtered out by ``HYPER_TRAIN_PLUGINS``, why
it is not loaded). Third-party plugins are not listed: their names get the did-you-mean hint.
A test checks each entry against what the installed distribution registers.
"""

from __future__ import annotations

from typing import Literal

import attrs

Kind = Literal["adapters", "strategies", "sections"]


@attrs.frozen(kw_only=True)
class FirstParty:
    """One distribution of this repository and the names it registers, per kind."""

    distribution: str
    #: Model adapter names (``[model] adapter``).
    adapters: tuple[str, ...] = ()
    #: Parallel strategy names (``[parallel] strategy``).
    strategies: tuple[str, ...] = ()
    #: Top-level config sections (``[memory_profiler]``).
    sections: tuple[str, ...] = ()


FIRST_PARTY: tuple[FirstParty, ...] = (
    FirstParty(
        distribution="hyper-train-qwen-vl",
        adapters=("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"),
    ),
    FirstParty(distribution="hyper-train-kimi-k26", adapters=("kimi_k25", "kimi_k26")),
    FirstParty(distribution="hyper-train-gemma3", adapters=("gemma3",)),
    FirstParty(
        distribution="hyper-train-encoder-parallel",
        strategies=("encoder_parallel",),
        sections=("encoder_parallel",),
    ),
    FirstParty(distribution="hyper-train-memory-profiler", sections=("memory_profiler",)),
    FirstParty(distribution="hyper-train-peft", sections=("peft",)),
    FirstParty(distribution="hyper-train-preference", sections=("preference",)),
)


def known_distributions(kind: Kind) -> dict[str, str]:
    """``name -> distribution`` of the first-party names of one kind."""
    return {name: p.distribution for p in FIRST_PARTY for name in getattr(p, kind)}
