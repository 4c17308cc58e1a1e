"""The asyncio worker's event loop: a task's ``SystemExit`` or ``KeyboardInterrupt`` stays the
task's outcome and does not end the loop.

When a task's coroutine raises one of those two, asyncio stores it as the task's outcome, where
whoever waits for the task (a task group) finds it, and then raises it out of the event loop as
well, which ends ``run()`` (CPython gh-102572, still open; seen here on 3.11). A routine whose
child task raised ``SystemExit`` would take down its worker and every call running there; under
trio the exception goes to the nursery only, and that call alone fails. This loop gives asyncio
workers trio's behaviour.

Only an exception that a task's step raised is kept in the loop, and only once that task has
stored it as its outcome, so nothing is lost: the loop asks the task itself, found through the
callback that raised (a task's step or wake-up, bound to the task). Two still end the loop as
asyncio's does: the outcome of what ``run_until_complete`` waits for (``anyio.run``'s main task:
asyncio stops the loop for it by this raise alone, and would otherwise never stop), and one that
no task stored (a callback calling ``sys.exit()``).

It relies on names private to asyncio, the same in every supported Python: the loop's
``_run_once``, which it wraps, ``Handle._run`` and ``Handle._callback``, where it finds the
callback, and ``Future._exception``, read rather than ``exception()`` so that an outcome nobody
retrieves is still reported as asyncio reports it. On a Python without the first two workers
run the plain loop, and this project's tests fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._asyncio_loop")

_T = TypeVar("_T")

_HANDLE_RUN = getattr(getattr(asyncio.Handle, "_run", None), "__code__", None)
# Called directly, not through super(): once per loop iteration, it is the loop's hot path.
_base_run_once: Callable[[asyncio.AbstractEventLoop], None] | None = getattr(
    asyncio.SelectorEventLoop, "_run_once", None)


class WorkerEventLoop(asyncio.SelectorEventLoop):
    """The selector event loop (asyncio's default on Linux), but for what is described above."""

    _waited: asyncio.Future[Any] | None = None

    def run_until_complete(self, future: Generator[Any, None, _T] | Awaitable[_T]) -> _T:
        made = not asyncio.isfuture(future)
        waited = asyncio.ensure_future(cast("Awaitable[_T]", future), loop=self)
        self._waited = waited
        try:
            return super().run_until_complete(waited)
        except BaseException:
            if made and waited.done() and not waited.cancelled():
                waited.exception()  # as asyncio does for a task it made: raised here, retrieved
            raise
        finally:
            self._waited = None

    def _run_once(self) -> None:
        try:
            _base_run_once(self)  # type: ignore[misc]  # never None where the class is used
        except (SystemExit, KeyboardInterrupt) as exc:
            task = _task_that_stored(exc)
            if task is None or task is self._waited:
                raise
            # The task's waiter (its task group, the call that awaits it) raises it.
            log.debug("a task ended with %r; it stays that task's outcome", exc)


def _task_that_stored(exc: BaseException) -> asyncio.Future[Any] | None:
    """The task (or future) whose callback raised ``exc`` and which holds it as its outcome, or
    ``None``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code is not _HANDLE_RUN:
        tb = tb.tb_next
    if tb is None:
        return None
    handle = tb.tb_frame.f_locals.get("self")
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    # isfuture, not isinstance: the pure-Python task derives from the pure-Python future.
    if (asyncio.isfuture(owner) and owner.done() and not owner.cancelled()
            and getattr(owner, "_exception", None) is exc):
        return cast("asyncio.Future[Any]", owner)
    return None


#: What the asyncio worker runs on (``anyio.run``'s ``loop_factory``).
loop_factory: Callable[[], asyncio.AbstractEventLoop] = (
    asyncio.SelectorEventLoop if _base_run_once is None or _HANDLE_RUN is None
    else WorkerEventLoop)
