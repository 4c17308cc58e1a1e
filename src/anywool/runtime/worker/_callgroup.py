"""Where a worker runs one connection's calls: a task group, and a cancel scope per call.

Under trio these are trio's own nursery and ``trio.CancelScope``: anyio's task group wraps each
task in a handle with a cancel scope of its own, which made spawning a call's task cost about
12 µs against 3 µs for the nursery (and anyio's scope 5 µs against 3.5), per call, on the 2-CPU
machine of ``benchmarks/README.md``. Both have the API the server uses of anyio's (``start_soon``,
``cancel_scope.cancel()``; ``cancel``, ``deadline``, ``cancel_called``, ``cancelled_caught``), and
anyio code runs in them unchanged, since anyio on trio is trio's scopes and nurseries.

Under asyncio the scope is anyio's, and the group is :class:`_AsyncioCallGroup`: plain asyncio
tasks (``create_task``, about 1.5 µs against anyio's 10), each run inside an anyio cancel scope
of the group's, so that cancelling the group reaches them as any anyio cancellation would
(shields included), and exiting the group waits for every one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import sniffio

if TYPE_CHECKING:
    import asyncio


class Scope(Protocol):
    """What the server uses of a cancel scope (anyio's and trio's alike)."""

    deadline: float

    def cancel(self) -> None: ...

    @property
    def cancel_called(self) -> bool: ...

    @property
    def cancelled_caught(self) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: Any) -> bool | None: ...


class CallGroup(Protocol):
    """What the server uses of a task group (anyio's and trio's nursery alike)."""

    @property
    def cancel_scope(self) -> Any: ...

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any,
                   name: object = None) -> Any: ...


def _on_trio() -> bool:
    return sniffio.current_async_library() == "trio"


def open_call_group() -> AbstractAsyncContextManager[CallGroup]:
    """A task group for one connection's calls (trio: a nursery)."""
    if _on_trio():
        import trio

        return trio.open_nursery()  # type: ignore[return-value]
    return _AsyncioCallGroup()


def scope_factory() -> Callable[[], Scope]:
    """What makes a cancel scope for one call on this backend (trio: ``trio.CancelScope``):
    asked once per connection, so that a call does not ask which backend it runs on."""
    if _on_trio():
        import trio

        return trio.CancelScope  # type: ignore[return-value]
    return anyio.CancelScope  # type: ignore[return-value]


class _GroupScope:
    """The group's ``cancel_scope``: cancels every task of the group (those started later
    too)."""

    __slots__ = ("_group",)

    def __init__(self, group: _AsyncioCallGroup) -> None:
        self._group = group

    def cancel(self) -> None:
        group = self._group
        group.cancelled = True
        for scope in list(group.scopes):
            scope.cancel()
        if group.host is not None:
            group.host.cancel()


class _AsyncioCallGroup:
    """A task group of plain asyncio tasks, each inside an anyio cancel scope of its own.

    Entering and exiting follow anyio's task group: exiting waits for every task (shielded
    from the caller's cancellation only by what the tasks do themselves: the caller's
    cancellation cancels them, as anyio's would); cancelling the group cancels its body too;
    an exception a task raises (a server task should raise none: it ends its call) cancels
    the group, and is re-raised at exit in an ``ExceptionGroup``, with the body's own
    exception if it raised one other than that cancellation.
    """

    def __init__(self) -> None:
        self.scopes: set[anyio.CancelScope] = set()
        self.cancelled = False
        self.cancel_scope = _GroupScope(self)
        self._tasks: set[asyncio.Task[None]] = set()
        self._errors: list[BaseException] = []
        self._done: anyio.Event | None = None
        self._active = False
        self.host: anyio.CancelScope | None = None  # around the body, while it runs

    async def __aenter__(self) -> _AsyncioCallGroup:
        import asyncio  # here: a trio worker never imports asyncio

        self._create_task = asyncio.get_running_loop().create_task
        host = anyio.CancelScope()
        host.__enter__()
        self.host = host
        self._active = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool:
        host, self.host = self.host, None
        assert host is not None
        # Exited first, so that the wait below is not inside it; it swallows the body's
        # cancellation when that is the group's own, which is then not the body's failure.
        swallowed = bool(host.__exit__(exc_type, exc, tb))
        if swallowed:
            exc = None
        if exc is not None:
            self.cancel_scope.cancel()
        try:
            try:
                await self._wait_for_tasks()
            except BaseException:
                self.cancel_scope.cancel()  # cancelled: theirs too, then wait on
                with anyio.CancelScope(shield=True):
                    await self._wait_for_tasks()
                raise
        finally:
            self._active = False
        if self._errors:
            errors = self._errors
            if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
                errors = [exc, *errors]
            raise BaseExceptionGroup("unhandled errors in a worker connection's calls",
                                     errors) from None
        return swallowed

    async def _wait_for_tasks(self) -> None:
        while self._tasks:
            self._done = anyio.Event()
            await self._done.wait()

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any,
                   name: object = None) -> None:
        if not self._active:
            raise RuntimeError("this call group is not active")
        task = self._create_task(self._run(func(*args)))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def _run(self, coro: Coroutine[Any, Any, Any]) -> None:
        with anyio.CancelScope() as scope:
            self.scopes.add(scope)
            if self.cancelled:
                scope.cancel()
            try:
                await coro
            except BaseException as exc:
                if not isinstance(exc, anyio.get_cancelled_exc_class()):
                    self._errors.append(exc)
                    self.cancel_scope.cancel()
                raise
            finally:
                self.scopes.discard(scope)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved (it is in _errors if it matters)
        if not self._tasks and self._done is not None:
            self._done.set()


__all__ = ["CallGroup", "Scope", "open_call_group", "scope_factory"]
