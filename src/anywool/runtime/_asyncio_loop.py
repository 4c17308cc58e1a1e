"""The asyncio worker's event loop: a task's ``SystemExit`` or ``KeyboardInterrupt`` stays the
task's outcome and does not end the loop.

When a task's coroutine raises one of those two, asyncio stores it as the task's outcome, where
whoever waits for the task (a task group) finds it, and then raises it out of the event loop as
well, which ends ``run()`` (CPython gh-102572, still open; seen here on 3.11). A routine whose
child task raised ``SystemExit`` would take down its worker and every call running there; under
trio the exception goes to the nursery only, and that call alone fails. This loop gives asyncio
workers trio's behaviour.

Only an exception that a task's step raised is kept in the loop: the task has stored it, so
nothing is lost. The step is told apart by the frame that the loop's callback ran, which is the
task's coroutine. Two still end the loop as asyncio's does: one that is the outcome of what
``run_until_complete`` waits for (``anyio.run``'s main task: asyncio stops the loop for it by
this raise alone, and would otherwise never stop), and one that no task raised (a callback
calling ``sys.exit()``). Under the pure-Python task the step's own frame comes first and the
exception ends the loop, as before; CPython always has the C task.

It relies on two names private to asyncio, the same in every supported Python: the loop's
``_run_once``, which it wraps, and ``Handle._run``, the frame it looks past. On a Python without
them workers run the plain loop, and this project's tests fail.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, TypeVar, cast

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_HANDLE_RUN = getattr(getattr(asyncio.Handle, "_run", None), "__code__", None)
_COROUTINE_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
# Called directly, not through super(): once per loop iteration, it is the loop's hot path.
_base_run_once: Callable[[asyncio.AbstractEventLoop], None] | None = getattr(
    asyncio.SelectorEventLoop, "_run_once", None)


class WorkerEventLoop(asyncio.SelectorEventLoop):
    """The selector event loop (asyncio's default on Linux), but for what is described above."""

    _waited: asyncio.Future[Any] | None = None

    def run_until_complete(self, future: Generator[Any, None, _T] | Awaitable[_T]) -> _T:
        waited = asyncio.ensure_future(cast("Awaitable[_T]", future), loop=self)
        self._waited = waited
        try:
            return super().run_until_complete(waited)
        finally:
            self._waited = None

    def _run_once(self) -> None:
        try:
            _base_run_once(self)  # type: ignore[misc]  # never None where the class is used
        except (SystemExit, KeyboardInterrupt) as exc:
            if not _raised_by_a_task_step(exc.__traceback__) or self._outcome_of_waited(exc):
                raise
            # The task's waiter (its task group, the call that awaits it) raises it.
            log.debug("a task ended with %r; it stays that task's outcome", exc)

    def _outcome_of_waited(self, exc: BaseException) -> bool:
        """Whether ``exc`` ended what ``run_until_complete`` waits for (the main task): that one
        must end the loop, whose stop callback leaves it to this very raise (it does not stop
        the loop for these two exceptions)."""
        waited = self._waited
        return (waited is not None and waited.done() and not waited.cancelled()
                and waited.exception() is exc)


def _raised_by_a_task_step(tb: TracebackType | None) -> bool:
    while tb is not None and tb.tb_frame.f_code is not _HANDLE_RUN:
        tb = tb.tb_next
    called = tb.tb_next if tb is not None else None
    return called is not None and bool(called.tb_frame.f_code.co_flags & _COROUTINE_FLAGS)


#: What the asyncio worker runs on (``anyio.run``'s ``loop_factory``).
loop_factory: Callable[[], asyncio.AbstractEventLoop] = (
    asyncio.SelectorEventLoop if _base_run_once is None or _HANDLE_RUN is None
    else WorkerEventLoop)
