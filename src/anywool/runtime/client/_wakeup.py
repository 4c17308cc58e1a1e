"""A one-shot wake-up of one waiting task, native to the running backend.

Every call waits at least once for its worker's answer, and a call queued for a worker with
room once more: the hot path of dispatch. ``anyio.Event`` costs a backend lookup to create, an
``asyncio.Event`` (a deque of futures) or a ``trio.Event`` under it, and a coroutine of its own
per wait. Here, under asyncio, a wake-up is one future awaited directly; under trio, a
``trio.Event``. Both are cancellable as anyio's are: a cancelled wait raises the backend's
cancellation.

A backend shim (like ``_callgroup`` and ``_socket``): asyncio is imported under asyncio only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import sniffio

if TYPE_CHECKING:
    import asyncio


class Wakeup(Protocol):
    """Set once (further sets do nothing); awaited by one task. ``is_set()`` says whether
    ``set()`` was called, whether or not the wait had ended first (cancelled): as
    ``trio.Event``, so that a waiter leaving on cancellation can tell it was owed a wake-up."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self) -> Awaitable[object]: ...


class _FutureWakeup:
    __slots__ = ("_future", "_set")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future = loop.create_future()
        self._set = False

    def set(self) -> None:
        # A wait cancelled with its task has cancelled the future already; the wake-up still
        # counts as given (see is_set).
        self._set = True
        if not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._set

    def wait(self) -> Awaitable[object]:
        return self._future


def factory() -> Callable[[], Wakeup]:
    """What makes wake-ups in the running event loop (asked once, e.g. per connection)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.Event
    import asyncio

    loop = asyncio.get_running_loop()
    return lambda: _FutureWakeup(loop)
