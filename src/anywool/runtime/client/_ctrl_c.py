"""A second Ctrl-C hurries a pool's exit (or a cancelled call's wait for its worker) rather than
cutting it halfway.

Under asyncio, the first Ctrl-C cancels the main task; the next one raises ``KeyboardInterrupt``
from the signal handler, wherever the main thread is at that moment: inside a cancel scope's
``__enter__``, halfway through spawning a process, in the middle of routing a frame. What it cuts
there is left inconsistent, and the files and processes the exit would have removed stay. So,
while :func:`hurried` is in force, a Ctrl-C calls the hurry callbacks instead (in the event
loop: ending the waits for workers, killing them), and once the last such region ends it is
handed to the handler it displaced (asyncio's, which then raises ``KeyboardInterrupt`` there,
at a point where nothing is half done). A Ctrl-C never goes missing, and the exit it hurries
only gets shorter.

Under trio there is nothing to do: trio delivers ``KeyboardInterrupt`` at a checkpoint, where
anywool's waits handle it (a cancelled call counts its worker as stuck at once, an exit goes on
with its forceful steps). Outside the main thread, or when SIGINT is not handled by Python code
(ignored, or the default action), nothing is changed either.

What this module must never do: lose a Ctrl-C, or keep its handler installed once the last
region has ended.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sniffio

_callbacks: dict[int, tuple[Callable[..., Any], Callable[[], object]]] = {}
_previous: Any = None
_depth = 0
_swallowed = False


@contextmanager
def hurried(on_hurry: Callable[[], object]) -> Iterator[None]:
    """Within the block, a Ctrl-C calls ``on_hurry`` (in the event loop, soon) rather than
    raising ``KeyboardInterrupt`` in the middle of anything; the Ctrl-C itself is handed on
    when the last such block ends. Under asyncio in the main thread only (elsewhere, the block
    runs as it is)."""
    global _depth, _previous, _swallowed
    if not _applies():
        yield
        return
    import asyncio

    key = id(on_hurry)
    _callbacks[key] = (asyncio.get_running_loop().call_soon_threadsafe, on_hurry)
    if _depth == 0:
        _previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, _handle)
    _depth += 1
    try:
        yield
    finally:
        _callbacks.pop(key, None)
        _depth -= 1
        if _depth == 0:
            previous, _previous = _previous, None
            if signal.getsignal(signal.SIGINT) is _handle:
                signal.signal(signal.SIGINT, previous)
            if _swallowed:
                _swallowed = False
                previous(signal.SIGINT, sys._getframe())  # asyncio's: may raise it here


def _applies() -> bool:
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if sniffio.current_async_library() != "asyncio":
            return False
    except sniffio.AsyncLibraryNotFoundError:
        return False
    if _depth:
        return True
    current = signal.getsignal(signal.SIGINT)
    return callable(current)


def _handle(signum: int, frame: object) -> None:
    global _swallowed
    _swallowed = True
    for call_soon, on_hurry in list(_callbacks.values()):
        try:
            call_soon(on_hurry)
        except RuntimeError:  # the loop is closed
            pass
