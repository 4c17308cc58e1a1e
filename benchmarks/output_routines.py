"""The routines of ``output.py``, importable by reference on the workers."""

from __future__ import annotations

import logging

import anyio.lowlevel

import anywool

log = logging.getLogger("benchmarks.flood")


@anywool.routine
async def echo(x: object) -> object:
    return x


@anywool.routine
async def flood(lines: int) -> int:
    """Log ``lines`` INFO records as fast as it can, letting its loop run every 10."""
    for i in range(lines):
        log.info("flood line %d of %d", i, lines)
        if i % 10 == 9:
            await anyio.lowlevel.checkpoint()
    return lines
