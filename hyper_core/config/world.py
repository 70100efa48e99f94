"""What a config needs of the world size, checked before any process starts.

Every rank is a data-parallel rank, or one of the ``cp`` ranks of a context-parallel group,
which read the same data (``DistEnv.dp_size == world_size / cp``), so the world size
``nproc_per_node × nnodes`` must match the ``[parallel]`` mesh ``dp_replicate × dp_shard × cp``
(and ``ep``, which divides ``dp_shard``) and ``world / cp`` must split ``global_batch_size``
into micro-batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from hyper_core.config.schema import Config
from hyper_core.errors import ConfigError, UserError

if TYPE_CHECKING:
    from hyper_core.parallel.base import ParallelStrategy


@attrs.frozen
class NodeRange:
    """``--nnodes N`` or ``MIN:MAX`` (elastic: any node count in between may start)."""

    min: int
    max: int

    @classmethod
    def parse(cls, value: str | int | None) -> NodeRange:
        """Read ``--nnodes``; None is one node."""
        if value is None:
            return cls(1, 1)
        lo, _, hi = str(value).partition(":")
        try:
            nodes = cls(int(lo), int(hi or lo))
        except ValueError:
            raise UserError(f"--nnodes: expected N or MIN:MAX, got {value!r}") from None
        if nodes.min < 1 or nodes.max < nodes.min:
            raise UserError(f"--nnodes: expected 1 <= MIN <= MAX, got {value!r}")
        return nodes


def context_parallel_problem(
    config: Config, strategy: type[ParallelStrategy] | ParallelStrategy | None
) -> tuple[str, str] | None:
    """What makes ``[parallel] cp`` unusable with ``config``, as ``($.path, message)``; None
    when ``cp`` is 1 or can run (the world size and the heads are checked elsewhere).
    ``strategy`` is the resolved ``[parallel] strategy``, asked whether it splits rows
    (:attr:`ParallelStrategy.context_parallel`); None leaves that to a later check."""
    par = config.parallel
    cp = par.cp
    if cp == 1:
        return None
    if strategy is not None and not strategy.context_parallel:
        return (
            "$.parallel.cp",
            f"{cp}: strategy {par.strategy!r} has no context parallelism; use fsdp2",
        )
    attn = config.model.attn_implementation
    if attn not in ("varlen", "flash_varlen"):
        return (
            "$.parallel.cp",
            f'{cp} needs [model] attn_implementation = "varlen" or "flash_varlen" (the '
            f"attention it runs over the whole row), got {attn!r}",
        )
    return None


def check_world(
    config: Config,
    nproc_per_node: int | None,
    nnodes: str | int | None = None,
    *,
    source: str | None = None,
    strategy: type[ParallelStrategy] | None = None,
) -> None:
    """Raise :class:`ConfigError` (with values that work) unless ``config`` can run on
    ``nproc_per_node`` processes on each of ``nnodes`` nodes; ``source`` names the config and
    ``strategy`` is the class ``[parallel] strategy`` names (see
    :func:`context_parallel_problem`).

    With ``MIN:MAX`` nodes every world size in the range is checked, as any of them may start.
    """
    nproc = 1 if nproc_per_node is None else nproc_per_node
    if nproc < 1:
        raise UserError(f"--nproc-per-node: expected at least 1, got {nproc}")
    nodes = NodeRange.parse(nnodes)
    for n in range(nodes.min, nodes.max + 1):
        world = n * nproc
        if world == 1:
            if config.parallel.cp > 1 and nproc_per_node is not None:
                cp = config.parallel.cp
                raise ConfigError(
                    [("$.parallel.cp", f"{cp} needs {cp} ranks or a multiple, got 1")], source
                )
            if config.parallel.ep > 1 and nproc_per_node is not None:
                raise ConfigError(
                    [
                        (
                            "$.parallel.ep",
                            f"{config.parallel.ep} needs at least {config.parallel.ep} "
                            "ranks, got 1 (one process holds every expert: use ep = 1)",
                        )
                    ],
                    source,
                )
            continue
        launch = f"--nproc-per-node {nproc}"
        if nodes.max > nodes.min:
            launch = f"{n} nodes of --nnodes {nnodes} × {launch}"
        elif n > 1:
            launch = f"--nnodes {n} × {launch}"
        problem = _problem(config, world, strategy)
        if problem is not None:
            path, message = problem
            raise ConfigError([(path, f"with {world} ranks ({launch}): {message}")], source)


def _problem(
    config: Config, world: int, strategy: type[ParallelStrategy] | None
) -> tuple[str, str] | None:
    """The first thing ``config`` gets wrong at this world size, as ``($.path, message)``."""
    par = config.parallel
    if par.strategy == "none":
        return ("$.parallel.strategy", "'none' runs one process; use 'ddp' or 'fsdp2'")
    cp_problem = context_parallel_problem(config, strategy)
    if cp_problem is not None:
        return cp_problem
    if world % (par.dp_replicate * par.cp):
        if par.cp > 1:
            return (
                "$.parallel.cp",
                f"dp_replicate ({par.dp_replicate}) × cp ({par.cp}) does not divide the world "
                f"size {world}; try cp "
                + " or ".join(str(d) for d in _nearest_divisors(world // par.dp_replicate, par.cp)),
            )
        return (
            "$.parallel.dp_replicate",
            f"{par.dp_replicate} does not divide the world size {world}; try dp_replicate "
            + " or ".join(str(d) for d in _nearest_divisors(world, par.dp_replicate)),
        )
    shard = par.dp_shard if par.dp_shard != -1 else world // (par.dp_replicate * par.cp)
    if par.dp_replicate * shard * par.cp != world:
        cp = f" × cp ({par.cp})" if par.cp > 1 else ""
        return (
            "$.parallel.dp_shard",
            f"dp_replicate ({par.dp_replicate}) × dp_shard ({shard}){cp} must equal the world "
            f"size ({world}); try dp_shard {world // (par.dp_replicate * par.cp)} or -1",
        )
    sharded = shard * par.cp  # FSDP2 shards over the cp ranks too
    if sharded % par.ep:
        over = (
            f"dp_shard ({shard}) × cp ({par.cp}) = {sharded}"
            if par.cp > 1
            else f"dp_shard ({shard})"
        )
        return (
            "$.parallel.ep",
            f"{par.ep} does not divide {over}: each group of ep ranks shares out "
            "the experts within one FSDP shard group; try ep "
            + " or ".join(str(d) for d in _nearest_divisors(sharded, par.ep)),
        )
    t = config.training
    return _batch_problem(t.global_batch_size, t.micro_batch_size, world // par.cp)


def _batch_problem(global_bs: int, micro: int, dp: int) -> tuple[str, str] | None:
    """``global = micro × accumulation × dp`` or what to change."""
    per_rank, rem = divmod(global_bs, dp)
    if not rem and not per_rank % micro:
        return None
    tries = []
    if not rem:
        fit = _nearest_divisors(per_rank, micro)[0]
        tries.append(f"micro_batch_size {fit} (accumulation {per_rank // fit})")
    step = micro * dp
    for g in sorted({max(step, global_bs // step * step), -(-global_bs // step) * step}):
        tries.append(f"global_batch_size {g} (accumulation {g // step})")
    return (
        "$.training.global_batch_size",
        f"{global_bs} is not micro_batch_size ({micro}) × accumulation × data-parallel size "
        f"({dp}); try " + " or ".join(tries),
    )


def _nearest_divisors(n: int, target: int) -> list[int]:
    """The divisors of ``n`` next to ``target``: the largest below it, then the smallest above."""
    below = next(d for d in range(min(target, n), 0, -1) if not n % d)
    above = next((d for d in range(target + 1, n + 1) if not n % d), None)
    return [below] if above is None else [below, above]
