"""Argument checks shared by every public constructor.

Each check raises ``TypeError`` for a value of the wrong type and ``ValueError`` for one out of
range, naming the parameter and the value, and returns the value normalised.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

#: The longest duration any parameter accepts (one week): longer ones are mistakes, and some
#: overflow the system calls they reach (``poll`` takes at most about 24.8 days).
MAX_SECONDS = 7 * 24 * 3600.0
#: The shortest interval of repeated background work (polling, reaping): shorter ones only burn
#: CPU (a reap_interval of 1e-9 s halved publish throughput).
MIN_INTERVAL = 0.01


def seconds(name: str, value: object, *, allow_zero: bool, optional: bool = False,
            floor: float = 0.0) -> float | None:
    """A duration in seconds: a finite real number ≥ 0 (> 0 unless ``allow_zero``; at least
    ``floor`` when given, for intervals of work repeated every that many seconds) and at most
    :data:`MAX_SECONDS`, or ``None`` when ``optional`` (where ``None`` means "no limit")."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number of seconds or None" if optional else "a number of seconds"
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    lower = ">= 0" if allow_zero else "> 0"
    if (isinstance(value, float) and math.isnan(value)) or value < 0 \
            or (value == 0 and not allow_zero) or value > MAX_SECONDS:
        raise ValueError(
            f"{name} must be {lower} and at most {MAX_SECONDS:.0f} seconds (a week)"
            + (" or None for no limit" if optional else "") + f", got {value!r}")
    if value < floor:
        raise ValueError(f"{name} must be at least {floor} seconds (it is an interval of "
                         f"repeated work), got {value!r}")
    return float(value)


def duration(name: str, value: object, *, allow_zero: bool, floor: float = 0.0) -> float:
    """:func:`seconds` for a parameter that cannot be ``None``."""
    checked = seconds(name, value, allow_zero=allow_zero, floor=floor)
    assert checked is not None
    return checked


def namespace(value: object) -> str:
    """A discovery namespace: any ``str`` (every backend hashes it into its keys)."""
    if not isinstance(value, str):
        raise TypeError(f"namespace must be a str, got {value!r}")
    return value


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
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name} must be an iterable of str, got {value!r}") from None
    bad = [item for item in items if not isinstance(item, str)]
    if bad:
        raise TypeError(f"{name} must contain only str, got {bad[0]!r} in {value!r}")
    return frozenset(items)


def _missing(module: str) -> bool:
    import importlib.util  # here: a worker's start-up imports this module, and never asks

    return importlib.util.find_spec(module) is None


def backend(value: object) -> str | None:
    """``None``, ``"asyncio"`` or ``"trio"``.

    :raises ValueError: another value.
    :raises ImportError: ``"trio"`` where trio is not installed (it is the ``anywool[trio]``
        extra: a plain ``pip install anywool`` does not bring it).
    """
    if value not in (None, "asyncio", "trio"):
        raise ValueError(f"backend must be None, 'asyncio' or 'trio', got {value!r}")
    if value == "trio":
        installed("trio", needed_by="backend='trio'", extra="trio")
    return value  # type: ignore[return-value]


def installed(module: str, *, needed_by: str, extra: str) -> None:
    """Check that ``module``, which the ``anywool[extra]`` extra installs, is importable.

    :raises ImportError: it is not; the message names ``needed_by`` and the ``pip install``
        that brings it, and ``name`` is ``module``.
    """
    if module not in sys.modules and _missing(module):
        raise ImportError(f"{needed_by} needs {module}, which is not installed here: "
                          f"pip install 'anywool[{extra}]'", name=module)
