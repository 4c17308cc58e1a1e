"""What the workers run in test_map.py (imported by reference; no pytest here, so that a
worker importing it stays light)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import anyio.lowlevel
import anyio.to_thread

from anywool import routine


def square(x: int) -> int:
    return x * x


@routine
async def square_routine(x: int) -> int:
    await anyio.lowlevel.checkpoint()
    return x * x


def pid_after(seconds: float) -> int:
    """Holds its worker ``seconds`` (an item of real work), then says where it ran."""
    time.sleep(seconds)
    return os.getpid()


def stop_on(bad: int, x: int) -> int:
    """Raises StopAsyncIteration for item ``bad``: what ends an ``async for`` if raised there."""
    if x == bad:
        raise StopAsyncIteration
    return x


def fail_on(bad: int, x: int) -> int:
    if x == bad:
        raise ValueError(f"item {x} is bad")
    return x


def fail_or_hold(bad: int, x: int) -> int:
    """Raises for item ``bad``; holds its worker (interruptibly) for the others."""
    if x == bad:
        raise ValueError(f"item {x} is bad")
    time.sleep(30)
    return x


def _read(fifo: str) -> str:
    with open(fifo) as released:
        return released.read()


@routine
async def wait_for(fifo: str, x: int) -> int:
    """``x``; item 0 first waits (awaiting: its worker serves other calls meanwhile) until
    something is written to the FIFO ``fifo``."""
    if x == 0:
        await anyio.to_thread.run_sync(_read, fifo)
    return x


def tell_started(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(f"started {os.getpid()}".encode())


def hold(port: int, marker: str, x: int) -> int:
    """Item 0 says it started, then holds its worker's loop in pure Python until interrupted
    (its finally writes ``marker``); the others return at once."""
    if x != 0:
        return x
    try:
        tell_started(port)
        while True:
            pass
    finally:
        Path(marker).write_text("finally ran")


@routine
async def hold_routine(port: int, marker: str, x: int) -> int:
    """:func:`hold` as a routine: never awaits once it holds."""
    return hold(port, marker, x)


@routine
async def map_inside(n: int) -> list[int]:
    """A routine that maps on the pool it was called from."""
    import anywool

    async with anywool.map(square, range(n)) as results:
        return [result async for result in results]
