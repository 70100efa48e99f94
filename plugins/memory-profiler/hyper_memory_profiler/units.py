"""Byte sizes: parsing ``80GiB``/``80GB``/``81920MiB`` and printing MiB (no torch)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")

MIB = 2**20
GIB = 2**30


def parse_size(text: str) -> int:
    """``"80GiB"`` -> bytes. Decimal (``GB``) and binary (``GiB``) units; a bare number is bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 80GiB, 80GB, 24576MiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def mib(n: float | None) -> float | None:
    """Bytes -> MiB (None stays None)."""
    return None if n is None else n / MIB


def fmt_mib(n: float | None, width: int = 0) -> str:
    """Bytes as a MiB figure with sensible precision (``-`` for None)."""
    if n is None:
        return "-".rjust(width)
    value = n / MIB
    text = (
        f"{value:,.0f}"
        if abs(value) >= 1000
        else f"{value:.3f}"
        if abs(value) < 1
        else (f"{value:.2f}")
    )
    return text.rjust(width)
