"""The routines of ``observability.py``, importable by reference on the workers. Nothing here
imports OpenTelemetry."""

from __future__ import annotations

import logging

import anyio.lowlevel

import anywool

#: The logger of the flood; the caller counts what reaches its own logger of that name.
FLOOD_LOGGER = "benchmarks.flood"
log = logging.getLogger(FLOOD_LOGGER)


@anywool.routine
async def echo(x: object) -> object:
    return x


@anywool.routine
async def flood(lines: int, *, made: bool = False, every: int = 10) -> int:
    """Log ``lines`` INFO records as fast as it can, letting its loop run every ``every``;
    with ``made``, its logger passes INFO whatever the worker's level (the records are made
    even where nothing forwards them)."""
    if made:
        log.setLevel(logging.INFO)
    for i in range(lines):
        log.info("flood line %d of %d", i, lines)
        if i % every == every - 1:
            await anyio.lowlevel.checkpoint()
    return lines


@anywool.routine
async def spans_exported() -> tuple[int, int | None]:
    """(this worker's pid, the spans its exporter was given so far, after a flush; ``None``:
    this worker traces nothing)."""
    import os
    import sys

    setup = sys.modules.get("observability_setup")
    provider = getattr(setup, "provider", None)
    if provider is None:
        return os.getpid(), None
    provider.force_flush()
    return os.getpid(), setup.exported  # type: ignore[union-attr]
