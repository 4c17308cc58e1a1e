"""Durations as log and error messages show them."""

from __future__ import annotations

import math


def seconds(value: float | None) -> str:
    """``value`` seconds as a person reads them: three significant digits, none after the
    point from 100 s on, and no trailing zeros.

    ``12.499976594001055`` → ``"12.5 s"``, ``0.25`` → ``"0.25 s"``, ``120.0`` → ``"120 s"``,
    ``None`` or infinity → ``"no bound"``. Bounds computed from a deadline (``deadline - now``)
    would otherwise print every digit of a float.
    """
    if value is None or math.isinf(value):
        return "no bound"
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} s"
