"""Routines used by cross-process tests (imported by reference on workers)."""

from __future__ import annotations

import os

from anywool import routine


@routine
async def whoami() -> int:
    return os.getpid()
