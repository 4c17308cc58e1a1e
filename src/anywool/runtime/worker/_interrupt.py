"""Reaching a routine that holds its worker's event loop: cancellation, deadlines, SIGTERM.

A routine that does not await (a pure-Python loop, a call into C that blocks, a plain function
run by ``anywool.run_sync``) holds the event loop: its caller's CANCEL frame, its deadline and
the worker's stop all wait for the loop, which waits for the routine. The :class:`Interrupter`
reaches it anyway, as Ctrl-C reaches a script:

* a heartbeat task notes the time every :data:`PERIOD` seconds while the loop turns;
* a watchdog thread wakes every :data:`PERIOD` seconds; when the loop has missed its beats for
  :data:`HELD_AFTER` seconds and a running call has a reason to end (its caller cancelled it,
  its deadline passed, the worker must stop now: told so, SIGTERM, or its parent exited), it
  sends the main thread :data:`SIGNAL`;
* that signal's handler, which Python runs in the main thread between two bytecodes (also when
  a blocking system call such as ``time.sleep`` is interrupted by it), raises
  :class:`Interrupted` in the call running there, if that call has a reason to end: the
  routine unwinds, its ``finally`` blocks run, and the worker answers the call as cancelled.

SIGTERM and SIGINT are handled here too, by handlers of ours rather than the event loop's, so
that they are seen while the loop is held: SIGTERM (stop now) also interrupts the call running,
SIGINT (drain) does not.

What this module must never do: raise into anything but the code a routine runs. The handler
raises only where the innermost Python frame belongs to neither anywool, AnyIO, the backend
nor the standard library's event loop, so their bookkeeping is never cut halfway (the watchdog
tries again a period later); and the thread only decides to signal: it touches no call.

A routine in C code that holds the GIL (no bytecode runs, no handler either) or that catches
:class:`Interrupted` and goes on cannot be reached: its caller stops waiting after its
``cancel_timeout``, and a pool ends the worker (see :mod:`anywool.runtime.pool._pool`).
"""

from __future__ import annotations

import contextvars
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Protocol

import anyio
import sniffio

from anywool._location import PACKAGE
from anywool.runtime import _batch

#: Seconds between heartbeats, and between the watchdog's looks.
PERIOD = 0.05
#: Seconds without a heartbeat after which the loop counts as held.
HELD_AFTER = 0.1
#: The signal the watchdog sends the main thread.
SIGNAL = signal.SIGUSR1
#: The longest wait (seconds) between two signals that ended nothing.
MAX_RETRY = 1.0


class Interrupted(BaseException):
    """Raised inside a routine that held its worker's event loop when its call had to end
    (cancelled, past its deadline, or the worker stopping now). A ``BaseException``, as
    ``KeyboardInterrupt`` is: ``except Exception`` does not catch it."""

    def __str__(self) -> str:
        return "the routine held its worker's event loop and its call had to end"


class Interruptible(Protocol):
    """A running call, as the interrupter sees it."""

    def must_end(self) -> bool:
        """Whether the call may have a reason to end now: cancelled, past its deadline, or a
        cancel frame for it has arrived (synchronous, and safe from any thread: it only
        reads; a guess from another thread, which the main thread's handler checks)."""
        ...

    def cancel_arrived(self) -> bool:
        """Whether its caller's cancel frame has arrived and is not routed yet (main thread)."""
        ...

    def cancel(self) -> None:
        """Cancel the call's scope, as routing its cancel frame would (main thread)."""
        ...

    def due(self) -> bool | None:
        """Whether the call must end now, for a call run without a cancel scope of its own
        (main thread); ``None``: the current task's cancel scopes say."""
        ...


#: The call the current task (and the tasks it starts) runs for: the one to interrupt.
current: contextvars.ContextVar[Interruptible | None] = contextvars.ContextVar(
    "anywool_interruptible_call", default=None)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is an :class:`Interrupted`, or a group of nothing else (beside
    cancellations): how an interruption comes out of a routine's task group."""
    if isinstance(exc, Interrupted):
        return True
    if not isinstance(exc, BaseExceptionGroup):
        return False
    # A walk rather than BaseExceptionGroup.split, which recurses once per level of nesting:
    # a group a routine raised may be nested deeper than the recursion limit.
    cancelled = anyio.get_cancelled_exc_class()
    found = False
    pending: list[BaseException] = [exc]
    while pending:
        each = pending.pop()
        if isinstance(each, Interrupted):
            found = True
        elif isinstance(each, BaseExceptionGroup):
            pending.extend(each.exceptions)
        elif not isinstance(each, cancelled):
            return False
    return found


def _machinery_roots() -> tuple[str, ...]:
    """Where the code lives that an interruption must never cut halfway: anywool's runtime and
    discovery, AnyIO, sniffio, the backend, the event loop and the import system of the
    standard library."""
    stdlib = os.path.dirname(os.path.abspath(os.__file__))
    # asyncio by where it is, not imported: a trio worker would pay ~20 ms for its import.
    roots = [os.path.join(PACKAGE, "runtime") + os.sep,
             os.path.join(PACKAGE, "discovery") + os.sep,
             os.path.join(stdlib, "asyncio") + os.sep]
    for module in (anyio, sniffio, *(sys.modules.get(name) for name in
                                     ("asyncio", "trio", "outcome"))):
        path = getattr(module, "__file__", None)
        if path:
            roots.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    roots += [os.path.join(stdlib, name) for name in ("selectors.py", "threading.py")]
    roots += [os.path.join(stdlib, "importlib") + os.sep, "<frozen "]
    return tuple(roots)


def invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a routine's plain function: where it is C code (``time.sleep``), this frame is the
    innermost Python one, and it counts as the routine's (it is interruptible)."""
    return fn(*args, **kwargs)


_INVOKE = invoke.__code__
# The frames counted as a routine's though they live in anywool: invoke's, and the loops of a
# batch of anywool.map (over a C function, no other frame of the routine's is there).
_ROUTINE_CODE = frozenset({_INVOKE, *_batch.LOOPS})


class Interrupter:
    """The heartbeat, the watchdog thread and the signal handlers of one worker.

    :param calls: the calls running now (called from the watchdog thread: it must return a
        snapshot, e.g. ``list`` of a set, in one C call).
    :param stopping: whether the worker must stop now (its calls all end).
    :param call_soon: schedules a function on the event loop; safe from a signal handler
        (asyncio's ``call_soon_threadsafe``, trio's ``run_sync_soon``).
    :param on_signal: called (through ``call_soon``) with SIGTERM or SIGINT.
    :param parent: a pidfd on the worker's parent (``None``: none): once it is readable (the
        parent exited), every call has a reason to end, as after SIGTERM.

    :meth:`install` in the main thread, from inside the event loop; :meth:`close` when done.
    """

    def __init__(self, calls: Callable[[], Iterable[Interruptible]],
                 stopping: Callable[[], bool],
                 call_soon: Callable[..., Any],
                 on_signal: Callable[[int], None], *, parent: int | None = None) -> None:
        self._calls = calls
        self._stopping = stopping
        self._call_soon = call_soon
        self._on_signal = on_signal
        self._parent = parent
        self._beat = time.monotonic()
        self._stop_now = False  # SIGTERM seen: every call has a reason to end
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident
        self._roots = _machinery_roots()
        self._previous: dict[int, Any] = {}

    @staticmethod
    def call_soon_here() -> Callable[..., Any]:
        """The running loop's signal-safe way to schedule a function (see ``call_soon``)."""
        if sniffio.current_async_library() == "trio":
            import trio

            return trio.lowlevel.current_trio_token().run_sync_soon
        import asyncio

        return asyncio.get_running_loop().call_soon_threadsafe

    def install(self) -> None:
        """Install the handlers of :data:`SIGNAL`, SIGTERM and SIGINT, and start the
        watchdog thread (main thread only)."""
        for signum in (SIGNAL, signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        self._thread = threading.Thread(target=self._watch, name="anywool-interrupter",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watchdog thread (joined) and restore the handlers. Idempotent."""
        self._closed.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            try:
                signal.signal(signum, handler)
            except (TypeError, ValueError):  # not the main thread, or not installable
                pass

    async def heartbeat(self) -> None:
        """Note that the loop turns, every :data:`PERIOD` seconds, until cancelled."""
        while True:
            self._beat = time.monotonic()
            await anyio.sleep(PERIOD)

    # -- the watchdog thread -------------------------------------------------------------------

    def _watch(self) -> None:
        # A signal that ends nothing (the call runs shielded cleanup, or machinery each time we
        # look, or it is not the call holding the loop that must end) is sent again less and
        # less often, up to once per MAX_RETRY seconds, until the loop turns again.
        wait = PERIOD
        while not self._closed.wait(wait):
            if time.monotonic() - self._beat < HELD_AFTER:
                wait = PERIOD
                continue
            if not self._stop_now and self._parent_gone():
                self._stop_now = True  # the loop learns it from the same pidfd once it turns
            try:
                reason = self._stop_now or self._stopping() or any(
                    call.must_end() for call in self._calls())
            except Exception:  # the main thread changed something as we looked: next time
                continue
            if reason and self._main is not None:
                try:
                    signal.pthread_kill(self._main, SIGNAL)
                except OSError:
                    return  # the main thread is gone: the worker is exiting
                wait = min(wait * 2, MAX_RETRY)

    def _parent_gone(self) -> bool:
        if self._parent is None:
            return False
        try:
            readable, _, _ = select.select([self._parent], [], [], 0)
        except (OSError, ValueError):  # closed: the worker is exiting
            return False
        return bool(readable)

    # -- the main thread -----------------------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            if signum == signal.SIGTERM:
                self._stop_now = True
            try:
                self._call_soon(self._on_signal, signum)
            except RuntimeError:  # the loop is closed: the worker is exiting anyway
                pass
            if signum == signal.SIGINT:
                return
        call = current.get()
        if call is None or not self._in_routine(frame):
            return
        if self._stop_now or self._stopping() or call.cancel_arrived():
            call.cancel()  # what the loop would do, were it free: the routine could do the same
        # Cancelled (and not shielded where it runs), or past its deadline: what its next
        # checkpoint would raise, were it to reach one. (Outside any task, in a callback the
        # routine scheduled, there is no such thing: nothing is raised.) A call run without a
        # scope of its own (a plain function's, where its frame was routed) says itself.
        due = call.due()
        if due is None:
            try:
                due = anyio.current_effective_deadline() <= anyio.current_time()
            except Exception:
                return
        if due:
            raise Interrupted

    def _in_routine(self, frame: FrameType | None) -> bool:
        """Whether the main thread was running a routine's own code (not machinery)."""
        if frame is None:
            return False
        code = frame.f_code
        if code in _ROUTINE_CODE:
            return True
        # "<frozen importlib._bootstrap>" and the like: the import system, whose locks and
        # sys.modules an interruption must not leave half done.
        return not code.co_filename.startswith(self._roots)
