"""Benchmark routines, in an importable module so workers import them by reference.

Each body is decorated once per framework: ``anywool`` always, ``wool`` only when it
can be imported (it is optional and never a dependency of this project).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anywool


# Module-level names for each decorated copy: they must be importable under the same name in
# the worker, which resolves them by module and qualified name.
@anywool.routine
async def anywool_echo(x: object) -> object:
    return x


@anywool.routine
async def anywool_stream(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


try:
    import wool
except ImportError:  # wool is optional
    wool = None  # type: ignore[assignment]
    WOOL_IMPORT_ERROR: str | None = "No module named 'wool'"
except Exception as error:  # pragma: no cover - a broken install is reported, not raised
    wool = None  # type: ignore[assignment]
    WOOL_IMPORT_ERROR = f"{type(error).__name__}: {error}"
else:
    WOOL_IMPORT_ERROR = None

    @wool.routine
    async def wool_echo(x: object) -> object:
        return x

    @wool.routine
    async def wool_stream(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i
