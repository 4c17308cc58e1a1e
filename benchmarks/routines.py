"""The anywool benchmark routines, in an importable module so workers import them by reference.

Kept apart from ``wool_routines`` so that a worker's first call imports only its own framework.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anywool


@anywool.routine
async def echo(x: object) -> object:
    return x


@anywool.routine
async def stream(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


#: Set by the "what travels" measurements of run.py: one short value per call.
TAG = anywool.ContextVar("benchmarks.tag")


@anywool.routine
async def relay(x: object) -> object:
    """A routine awaiting a trivial routine: the nested round trip."""
    return await echo(x)
