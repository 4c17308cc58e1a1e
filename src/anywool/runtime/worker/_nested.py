"""Nested routines: the proxies a worker keeps so that its routines can call routines.

Every call carries its *origin*: a key and the pickle of the proxy of the pool its call tree
started from (:class:`~anywool.runtime.wire._envelope.Origin`). A routine that calls a routine on a
worker dispatches through a proxy rebuilt from that pickle: one per origin on each worker,
entered on first use by a task of the worker's own (a proxy is an owner, entered and exited in
one task), and exited after ``idle_timeout`` seconds without a call, when more than
:data:`MAX_IDLE` are idle (the least recently used first), or when the worker stops. The key is
a digest of the pickle, so proxies that pickle alike (``WorkerProxy("jobs")`` made per request,
say) share one. The rebuilt proxy keeps the origin, so the calls it makes carry it further down
the tree.

What this module must never do: exit a proxy while a call uses it, or let a proxy's failure end
the worker's task group.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from anywool import _validate
from anywool.runtime._routine import RoutineDispatcher
from anywool.runtime.wire import _serializer as serializer
from anywool.runtime.wire._envelope import Origin
from anywool.runtime.worker._contract import PROXY_IDLE_TIMEOUT_ENV

if TYPE_CHECKING:  # imported at the first nested call: most workers never make one
    from anywool.runtime.client._proxy import WorkerProxy

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._nested")

DEFAULT_IDLE_TIMEOUT = 60.0
#: The most proxies a worker keeps while no call uses them: beyond, the least recently used
#: is exited at once (each holds a subscription and a connection to every worker).
MAX_IDLE = 8


def idle_timeout_from_environment() -> float:
    """``$ANYWOOL_PROXY_IDLE_TIMEOUT`` as seconds (> 0), else :data:`DEFAULT_IDLE_TIMEOUT`.

    :raises ValueError: the variable is set to something else.
    """
    text = os.environ.get(PROXY_IDLE_TIMEOUT_ENV)
    if text is None:
        return DEFAULT_IDLE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{PROXY_IDLE_TIMEOUT_ENV} must be a number of seconds, "
                         f"got {text!r}") from None
    return _validate.duration(PROXY_IDLE_TIMEOUT_ENV, value, allow_zero=False)


class NestedProxies:
    """The worker's proxies for nested calls, one per origin, hosted in ``task_group``.

    :param task_group: where the proxies' tasks run; cancelling it exits every proxy.
    :param idle_timeout: seconds (> 0) a proxy stays entered without a call.
    :param where: the worker, in words, for error messages.
    """

    def __init__(self, task_group: TaskGroup, idle_timeout: float, where: str) -> None:
        self._task_group = task_group
        self._idle_timeout = idle_timeout
        self._where = where
        self._hosts: dict[bytes, _Host] = {}
        self._running: set[anyio.CancelScope] = set()  # of the proxies' tasks
        self._closed = False
        self._changed = anyio.Event()

    async def close(self) -> None:
        """Exit every proxy (each exit is bounded) and start no more; idempotent."""
        self._closed = True
        for scope in list(self._running):
            scope.cancel()
        while self._running:
            self._changed = anyio.Event()
            await self._changed.wait()

    def _trim(self) -> None:
        idle = [host for host in self._hosts.values()
                if host.proxy is not None and not host._uses]
        if len(idle) > MAX_IDLE:
            idle.sort(key=lambda host: host._last_used)
            for host in idle[:len(idle) - MAX_IDLE]:
                host._expire()

    def dispatcher(self, origin: Origin | None, routine: str) -> RoutineDispatcher:
        """What the routine ``routine``, called with ``origin``, dispatches its calls through.

        Cheap, and keeps nothing: a proxy's entry is made at the first nested call only."""
        if origin is None:
            return _NoOrigin(routine)
        return _Dispatcher(self, origin)

    def _host(self, origin: Origin) -> _Host:
        host = self._hosts.get(origin[0])
        if host is None:
            host = self._hosts[origin[0]] = _Host(self, origin)
        return host


class _Dispatcher:
    """A call's way to its origin's proxy (``_Host``), found or made at each nested call."""

    __slots__ = ("_owner", "_origin")

    def __init__(self, owner: NestedProxies, origin: Origin) -> None:
        self._owner = owner
        self._origin = origin

    async def dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any], *, plain: bool = False) -> Any:
        return await self._owner._host(self._origin).dispatch(fn, args, kwargs, plain=plain)

    def stream(self, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> AsyncGenerator[Any, Any]:
        return self._owner._host(self._origin).stream(fn, args, kwargs)


class _Host:
    """One origin's proxy: started on first use, exited after ``idle_timeout`` without one."""

    def __init__(self, owner: NestedProxies, origin: Origin) -> None:
        self._owner = owner
        self._origin = origin
        self.proxy: WorkerProxy | None = None
        self._starting: anyio.Event | None = None
        self._uses = 0
        self._last_used = 0.0
        self._expired = False
        self._changed = anyio.Event()

    def _expire(self) -> None:
        """Exit the proxy now (it is idle, and too many are)."""
        self._expired = True
        self._changed.set()

    async def _acquire(self, name: str) -> WorkerProxy:
        while self.proxy is None:
            if self._owner._closed:
                raise RuntimeError(f"cannot call {name}: the worker {self._owner._where} is "
                                   "stopping")
            if self._starting is not None:
                await self._starting.wait()  # then try again: the start may have failed
                continue
            self._starting = anyio.Event()
            try:
                await self._owner._task_group.start(self._host, name)
            except BaseException:
                if self.proxy is None and not self._uses:
                    self._retire()  # nothing to keep for an origin that did not start
                raise
            finally:
                self._starting.set()
                self._starting = None
        self._uses += 1
        self._changed.set()
        return self.proxy

    def _release(self) -> None:
        self._uses -= 1
        self._changed.set()
        if not self._uses:
            self._last_used = anyio.current_time()
            self._owner._trim()

    async def _host(self, name: str, *, task_status: TaskStatus[None]) -> None:
        """The task that owns the proxy: enters it, exits it once it has been idle."""
        from anywool.runtime.client._proxy import WorkerProxy

        owner = self._owner
        proxy = serializer.loads_value(serializer.Pickled([self._origin[1]]), name, "the proxy of the pool it was "
                                       "called from", f" on worker {owner._where}")
        if not isinstance(proxy, WorkerProxy):
            raise TypeError(f"a call's origin must be the pickle of a WorkerProxy, got {proxy!r}")
        proxy._adopt_origin(self._origin)
        owner._hosts.setdefault(self._origin[0], self)
        scope = anyio.CancelScope()
        owner._running.add(scope)
        started = False
        try:
            with scope:
                async with proxy:
                    self.proxy = proxy
                    started = True
                    task_status.started()
                    try:
                        await self._until_idle()
                    finally:
                        self._retire()  # at once: no new call may pick the exiting proxy
        except Exception:
            if not started:
                raise  # entering failed: the caller's start() raises it
            log.exception("the proxy for nested calls %r failed", proxy)
        finally:
            self._retire()
            owner._running.discard(scope)
            owner._changed.set()

    def _retire(self) -> None:
        self.proxy = None
        if self._owner._hosts.get(self._origin[0]) is self:
            del self._owner._hosts[self._origin[0]]

    async def _until_idle(self) -> None:
        timeout = self._owner._idle_timeout
        self._expired = False
        while True:
            changed = self._changed = anyio.Event()
            if self._expired and not self._uses:
                return
            if self._uses:
                await changed.wait()
                continue
            with anyio.move_on_after(timeout):
                await changed.wait()
            if not changed.is_set() and not self._uses:
                return

    # -- RoutineDispatcher ---------------------------------------------------------------------

    async def dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any], *, plain: bool = False) -> Any:
        proxy = await self._acquire(_name(fn))
        try:
            return await proxy.dispatch(fn, args, kwargs, plain=plain)
        finally:
            self._release()

    def stream(self, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> AsyncGenerator[Any, Any]:
        return self._stream(fn, args, kwargs)

    async def _stream(self, fn: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> AsyncGenerator[Any, Any]:
        # Holds a use for the stream's whole life (it keeps a call open between steps), and
        # forwards every step: asend, athrow and aclose reach the remote generator.
        proxy = await self._acquire(_name(fn))
        try:
            async with aclosing(proxy.stream(fn, args, kwargs)) as remote:
                sent: Any = None
                thrown: BaseException | None = None
                while True:
                    try:
                        if thrown is None:
                            item = await remote.asend(sent)
                        else:
                            item, thrown = await remote.athrow(thrown), None
                    except StopAsyncIteration:
                        return
                    try:
                        sent = yield item
                    except GeneratorExit:
                        raise
                    except BaseException as exc:
                        thrown, sent = exc, None
        finally:
            self._release()


class _NoOrigin:
    """The dispatcher of a call that carried no origin: nested calls fail, saying why."""

    def __init__(self, routine: str) -> None:
        self._routine = routine

    def _error(self, fn: Callable[..., Any]) -> RuntimeError:
        return RuntimeError(
            f"cannot call {_name(fn)} from {self._routine}: the call running {self._routine} "
            "carried no pool to dispatch through (it was made on a bare WorkerConnection, or "
            "its pool's proxy cannot be pickled, as one whose subscriber is a context manager "
            "cannot)")

    async def dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any], *, plain: bool = False) -> Any:
        raise self._error(fn)

    def stream(self, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> AsyncGenerator[Any, Any]:
        raise self._error(fn)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))
