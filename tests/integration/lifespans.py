"""Lifespans named by ``module:name`` in tests/integration/test_lifespan.py."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

NOT_CALLABLE = 1


@contextlib.asynccontextmanager
async def counter() -> AsyncIterator[dict[str, Any]]:
    yield {"pid": os.getpid(), "calls": 0}
