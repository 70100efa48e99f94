"""``[model.options]``: checked against the options class the adapter declares, without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError, UserError

if TYPE_CHECKING:
    from ..registry import Registries
    from .schema import Config


def check_adapter_options(
    config: Config, registries: Registries, source: str | None = None
) -> None:
    """Raise the adapter's :class:`~hyper_core.errors.ConfigError` (``$.model.options.KEY``,
    naming the config file ``source``) when ``[model.options]`` does not fit
    :attr:`ModelAdapter.options <hyper_core.adapters.base.ModelAdapter.options>`. An adapter
    that cannot be resolved here (unknown, or its model directory absent) is left to the run,
    which names the problem."""
    from ..resolve import resolve_adapter

    try:
        adapter = resolve_adapter(config.model, registries)
    except UserError:
        return
    try:
        adapter.parse_options(config.model)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=source) from None
