"""The jobs of ``workloads.py``: plain functions and the anywool routines around them.

Workers import everything here by reference: ``anyio.to_process`` and ``trio_parallel`` unpickle
the plain functions, anywool's workers the routines. Importing this module starts nothing; it
imports the standard library, AnyIO and anywool (whose runtime a to_process or trio_parallel
worker therefore imports once, when it first unpickles a function of this module).

Each CPU-bound function returns the pid of the process that ran it and the CPU seconds it spent
(``time.process_time()`` around its own work), so that the caller can tell how the work was
spread over the workers.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import zlib

import anyio

import anywool

# ---------------------------------------------------------------------------------------------
# Plain functions (run as they are by every peer; the routines below call them in their body)
# ---------------------------------------------------------------------------------------------


def hash_file(path: str) -> tuple[int, str, int, float]:
    """Read ``path``, compress it, hash the compressed bytes: (bytes read, sha256 hex digest of
    the compressed bytes, pid, CPU seconds)."""
    start = time.process_time()
    with open(path, "rb") as file:
        data = file.read()
    digest = hashlib.sha256(zlib.compress(data)).hexdigest()
    return len(data), digest, os.getpid(), time.process_time() - start


def spin(n: int) -> tuple[int, float]:
    """``n`` rounds of integer arithmetic in pure Python: (pid, CPU seconds)."""
    start = time.process_time()
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return os.getpid(), time.process_time() - start


#: Rounds of :func:`small`: about 7 µs of CPU on the project's machine.
SMALL_ROUNDS = 120


def small(x: int) -> int:
    """A small item of work: ``SMALL_ROUNDS`` rounds of integer arithmetic on ``x``."""
    s = x
    for i in range(SMALL_ROUNDS):
        s = (s * 31 + i) % 1_000_003
    return s


def echo_bytes_sync(data: bytes) -> bytes:
    return data


def sleep_sync(seconds: float) -> int:
    """Block in ``time.sleep``: (pid)."""
    time.sleep(seconds)
    return os.getpid()


def backtrack(length: int) -> bool:
    """A regular expression that backtracks catastrophically: about 2**length steps in one C
    call that holds the GIL and checks no signal until it returns."""
    return re.fullmatch(r"(a+)+$", "a" * length + "b") is not None


def pid() -> int:
    return os.getpid()


# ---------------------------------------------------------------------------------------------
# anywool routines
# ---------------------------------------------------------------------------------------------


@anywool.routine
async def pid_routine() -> int:
    return os.getpid()


@anywool.routine
async def hash_file_routine(path: str) -> tuple[int, str, int, float]:
    return hash_file(path)


@anywool.routine
async def spin_routine(n: int) -> tuple[int, float]:
    return spin(n)


@anywool.routine
async def nap(seconds: float) -> tuple[int, float]:
    """Await ``anyio.sleep(seconds)``: (pid, 0.0). It spends no CPU of its own worth counting
    (its worker runs other calls meanwhile, so a ``process_time()`` delta would count theirs)."""
    await anyio.sleep(seconds)
    return os.getpid(), 0.0


@anywool.routine
async def small_routine(x: int) -> int:
    return small(x)


@anywool.routine
async def echo_bytes(data: bytes) -> bytes:
    return data


@anywool.routine
async def sleep_routine(seconds: float) -> int:
    return sleep_sync(seconds)


@anywool.routine
async def backtrack_routine(length: int) -> bool:
    return backtrack(length)
