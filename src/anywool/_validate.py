"""Argument checks shared by every public constructor.

Each check raises ``TypeError`` for a value of the wrong type and ``ValueError`` for one out of
range, naming the parameter and the value, and returns the value normalised.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["backend", "count", "duration", "seconds", "tag_set"]


def seconds(name: str, value: object, *, allow_zero: bool, optional: bool = False) -> float | None:
    """A duration in seconds: a real number ≥ 0 (> 0 unless ``allow_zero``), or ``None`` when
    ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number of seconds or None" if optional else "a number of seconds"
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}")
    return float(value)


def duration(name: str, value: object, *, allow_zero: bool) -> float:
    """:func:`seconds` for a parameter that cannot be ``None``."""
    checked = seconds(name, value, allow_zero=allow_zero)
    assert checked is not None
    return checked


def count(name: str, value: object, *, upper: int, lower: int = 1) -> int:
    """An ``int`` (not ``bool``) between ``lower`` and ``upper`` inclusive."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not lower <= value <= upper:
        raise ValueError(f"{name} must be between {lower} and {upper}, got {value!r}")
    return value


def tag_set(name: str, value: Iterable[str]) -> frozenset[str]:
    """An iterable of ``str`` (a lone ``str`` is refused: it would split into characters)."""
    if isinstance(value, str):
        raise TypeError(f"{name} must be an iterable of str, not a str: {value!r}")
    tags = frozenset(value)
    if not all(isinstance(tag, str) for tag in tags):
        raise TypeError(f"{name} must contain only str, got {sorted(map(repr, tags))}")
    return tags


def backend(value: object) -> str | None:
    """``None``, ``"asyncio"`` or ``"trio"``."""
    if value not in (None, "asyncio", "trio"):
        raise ValueError(f"backend must be None, 'asyncio' or 'trio', got {value!r}")
    return value  # type: ignore[return-value]
