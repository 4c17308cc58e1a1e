"""Routines used by cross-process tests (imported by reference on workers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio

from anywool import routine


@routine
async def lifespan_state() -> object:
    """What this worker's lifespan yielded (``anywool.current_worker().state``)."""
    from anywool import current_worker

    return current_worker().state


@routine
async def whoami() -> int:
    return os.getpid()


@routine
async def whoami_nested() -> int:
    """The pid of the worker that a nested call lands on."""
    return await whoami()


@routine
async def parent_pid() -> int:
    """The worker's parent: the pool's process, or the ``anywool worker`` command's."""
    return os.getppid()


@routine
async def countdown(n: int):
    while n:
        yield n
        n -= 1


@routine
async def letters(word: str):
    for letter in word:
        yield letter


@routine
async def value_after(seconds: float, port: int) -> int:
    """Tell the test it started (a connection to ``port``), work ``seconds``, return 7."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(b"started")
    await anyio.sleep(seconds)  # the routine's work, not synchronisation
    return 7


@routine
async def hold_until_cancelled(port: int, path: str) -> None:
    """Tell the test it started, wait until cancelled; write ``path`` from its ``finally``."""
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"started")
        await anyio.sleep_forever()
    finally:
        Path(path).write_text("finally ran")


@routine
async def note_when_cancelled(port: int, path: str) -> None:
    """Tell the test it started, wait until cancelled; its ``finally`` writes ``path`` with
    ``time.monotonic()`` (one clock for every process of the host), when it ran."""
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"started")
        await anyio.sleep_forever()
    finally:
        Path(path).write_text(repr(time.monotonic()))
