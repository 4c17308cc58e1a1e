"""The same benchmark routines for wool, which is optional (never a dependency of this project).

Importing this module raises ``ImportError`` when wool is not installed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import wool


@wool.routine
async def echo(x: object) -> object:
    return x


@wool.routine
async def stream(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i
