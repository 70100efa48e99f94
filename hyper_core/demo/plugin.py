"""The demo data's plugin: the ``shapes`` and ``moving_shapes`` dataset formats."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..types import Register


@hookimpl
def register_dataset_formats(register: Register) -> None:
    """``shapes`` (coloured shapes, one question each) and ``moving_shapes`` (video clips,
    which way the shape moves)."""
    demo = "hyper_core.demo"
    register("shapes", f"{demo}.shapes:load_shapes_format", options=f"{demo}.shapes:ShapesOptions")
    register(
        "moving_shapes",
        f"{demo}.moving_shapes:load_moving_shapes_format",
        options=f"{demo}.moving_shapes:MovingShapesOptions",
    )
