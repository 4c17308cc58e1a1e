"""``@routine``: mark an async function or async generator function as runnable on workers.

A routine called while a :class:`~anywool.WorkerPool` or :class:`~anywool.WorkerProxy` is active
in the current context is dispatched to a worker through that proxy; called with none active it
raises :class:`RuntimeError`. The active proxy lives in a :class:`contextvars.ContextVar` that the
proxy sets on entry and resets on exit, so tasks started inside the ``async with`` block inherit
it and nothing outside sees it.

The decorated function keeps its name, module and qualified name (``functools.wraps``), so it
pickles by reference like any module-level function. The worker receives the *decorated*
function and runs its :attr:`__wrapped__` body directly. A routine that calls a routine on a
worker calls the decorated function there: the worker makes the proxy of the pool the call
tree started from the active dispatcher of the call's task (see :mod:`anywool.runtime.worker._nested`).

This module holds no event loop state besides the context variable.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, TypeVarTuple, Unpack, overload

P = ParamSpec("P")
T = TypeVar("T")
Y = TypeVar("Y")
S = TypeVar("S")
Ts = TypeVarTuple("Ts")

_MARKER = "__anywool_routine__"


class RoutineDispatcher(Protocol):
    """What ``@routine`` and :func:`run_sync` need from the active proxy."""

    async def dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                       *, plain: bool = False) -> Any:
        ...

    def stream(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncGenerator[Any, Any]:
        ...


_active: contextvars.ContextVar[RoutineDispatcher | None] = contextvars.ContextVar(
    "anywool_active_proxy", default=None
)


def active_dispatcher() -> RoutineDispatcher:
    """The proxy routines dispatch through in the current context.

    :raises RuntimeError: no pool or proxy is active here.
    """
    proxy = _active.get()
    if proxy is None:
        raise RuntimeError(
            "cannot dispatch a routine: no WorkerPool or WorkerProxy is active in this context; "
            "call it inside `async with anywool.WorkerPool(...)` (or a WorkerProxy)"
        )
    return proxy


def set_active(proxy: RoutineDispatcher | None) -> contextvars.Token[RoutineDispatcher | None]:
    """Make ``proxy`` the active dispatcher; reset with the returned token (same context)."""
    return _active.set(proxy)


def reset_active(token: contextvars.Token[RoutineDispatcher | None]) -> None:
    _active.reset(token)


@overload
def routine(fn: Callable[P, AsyncGenerator[Y, S]]) -> Callable[P, AsyncGenerator[Y, S]]: ...


@overload
def routine(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]: ...


# An async generator function annotated by what it gives rather than what it is
# (``-> AsyncIterator[int]``, ``-> AsyncIterable[int]``), as typing's docs suggest.
@overload
def routine(fn: Callable[P, AsyncIterator[Y]]) -> Callable[P, AsyncIterator[Y]]: ...


@overload
def routine(fn: Callable[P, AsyncIterable[Y]]) -> Callable[P, AsyncIterable[Y]]: ...


def routine(fn: Callable[P, Any]) -> Callable[P, Any]:
    """Decorate an ``async def`` or async generator function so that calls run on a worker.

    A coroutine routine, awaited, returns the worker's return value or raises the exception the
    routine raised (type, message and traceback preserved; see :mod:`anywool.runtime.wire._serializer`).
    An async generator routine returns an async generator whose ``__anext__``, ``asend``,
    ``athrow`` and ``aclose`` each drive the remote generator by one step.

    Arguments and return values must be picklable by cloudpickle; the function itself must be
    importable on the worker by module and qualified name (or live in ``__main__``).

    :param fn: an ``async def`` function or async generator function.
    :raises TypeError: ``fn`` is neither.

    The decorated function raises :class:`RuntimeError` when called with no pool or proxy active
    (a coroutine routine when awaited, an async generator routine when called). Cancelling the
    caller's await cancels the routine on the worker and waits (bounded) until the routine has
    finished unwinding, so its ``finally`` blocks have run when the cancellation reaches the
    caller. A routine cancelled on the worker by anything else (e.g. the worker stopping) raises
    :class:`~anywool.errors.RoutineCancelled` in the caller.
    """
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def stream_wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Any]:
            return active_dispatcher().stream(stream_wrapper, args, kwargs)

        setattr(stream_wrapper, _MARKER, True)
        return stream_wrapper

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def call_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return await active_dispatcher().dispatch(call_wrapper, args, kwargs)

        setattr(call_wrapper, _MARKER, True)
        return call_wrapper

    raise TypeError(
        f"@routine needs an async def function or async generator function, got {fn!r}"
    )


async def run_sync(fn: Callable[[Unpack[Ts]], T], *args: Unpack[Ts]) -> T:
    """Run the plain (synchronous) function ``fn(*args)`` on a worker of the active pool and
    return its result: ``anyio.to_process.run_sync`` for anywool's workers.

    ``fn`` and its arguments travel pickled (cloudpickle: lambdas and closures too, and
    functions of ``__main__``); the result and the exception come back as a routine's do
    (type, message, traceback). Pass keyword arguments with :func:`functools.partial`.

    On the worker, ``fn`` runs in the event loop's own thread, so the worker runs nothing else
    until it returns; the pool then gives its other calls to other workers (see "How calls are
    spread" in the README). A local worker runs it where it reads the call, without a task of
    its own (it needs none: it never awaits): ``anywool.current_task()``, context variables,
    ``sniffio`` and AnyIO's clock work there as in a routine, AnyIO's cancel scopes do not
    (under asyncio there is no task to scope). Its running there is also what lets a
    cancellation reach it:

    Cancellation: cancelling the await cancels the call on its worker, which interrupts
    ``fn`` (it raises there an exception that is not an ``Exception``, as ``KeyboardInterrupt``
    is, at its next Python bytecode or when a blocking system call such as ``time.sleep``
    returns), so its ``finally`` blocks run, and the cancellation reaches the caller once they
    have. If ``fn`` cannot be interrupted (C code holding the GIL, or it catches that exception
    and goes on) the caller waits no longer than the pool's ``cancel_grace`` (1 s by
    default): a worker the pool spawned is then ended and replaced.

    :param fn: a plain callable; not a coroutine function or async generator function.
    :raises TypeError: ``fn`` is not callable, or is async (use :func:`routine` for those).
    :raises RuntimeError: no pool or proxy is active in this context.
    :raises Exception: whatever ``fn`` raised, rebuilt in this process;
        :class:`~anywool.errors.SerializationError` for a function, argument or result that
        cannot cross; :class:`~anywool.errors.WorkerError` when the worker is lost mid-call.
    """
    if not callable(fn):
        raise TypeError(f"run_sync needs a callable, got {fn!r}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn) or is_routine(fn):
        raise TypeError(f"run_sync runs plain functions; {fn!r} is async: decorate it with "
                        "@anywool.routine and await it instead")
    return await active_dispatcher().dispatch(fn, args, {}, plain=True)  # type: ignore[no-any-return]


def is_routine(fn: object) -> bool:
    """Whether ``fn`` was produced by :func:`routine`."""
    return bool(getattr(fn, _MARKER, False))


def routine_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a worker runs for ``fn``: the undecorated body of a routine, else ``fn``."""
    return fn.__wrapped__ if is_routine(fn) else fn  # type: ignore[attr-defined]


# -- the running call ------------------------------------------------------------------------


@dataclass(frozen=True)
class RoutineTask:
    """The call a routine is running for, on its worker (see :func:`current_task`).

    :param id: the call's id: an unsigned 64-bit integer its caller's connection chose, unique
        among that connection's calls.
    :param caller_id: the id of the call this one was made from, for a routine called by a
        routine; ``None`` for a call made outside any routine.
    :param name: the routine's qualified name.
    :param deadline: when the caller's deadline runs out, in this event loop's clock
        (``anyio.current_time()``); ``math.inf`` when the caller had none.
    """

    id: int
    caller_id: int | None
    name: str
    deadline: float


_running: contextvars.ContextVar[RoutineTask | None] = contextvars.ContextVar(
    "anywool_running_call", default=None
)


def current_task() -> RoutineTask:
    """The call the current routine is running for, on its worker.

    :raises RuntimeError: not inside a routine running on a worker.
    """
    task = _running.get()
    if task is None:
        raise RuntimeError("anywool.current_task() is only available inside a routine running "
                           "on a worker")
    return task


def running_task() -> RoutineTask | None:
    """The call the current task runs a routine for, or ``None`` (outside routines)."""
    return _running.get()


def set_running(task: RoutineTask) -> contextvars.Token[RoutineTask | None]:
    """Worker side: mark the current context as running ``task`` (reset with the token)."""
    return _running.set(task)
