"""WorkerProxy: dispatch routines to the workers a discovery subscriber reports.

The proxy is an owner. Its task group holds the *sentinel* (the one task iterating the
subscriber) and one task per admitted worker, which enters that worker's
:class:`~anywool.runtime.connection.WorkerConnection` and keeps it open until the worker is
dropped, its connection fails, or the proxy exits; so every connection is entered and exited in
the same task. Callers only send frames and read their call's memory stream.

The subscriber is consumed as given: the proxy never enters it and never owns what it reads
from. A subscriber whose iteration raises (for example
:class:`~anywool.errors.DiscoveryNamespaceNotFound`) fails every waiting and later dispatch with
that exception at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Iterable
from types import TracebackType
from typing import Any
from uuid import UUID

import anyio
from anyio.abc import TaskGroup

from anywool.discovery.protocols import DiscoveryEvent, DiscoverySubscriberLike
from anywool import _validate
from anywool.errors import NoWorkersAvailable, WorkerError
from anywool.metadata import WorkerMetadata
from anywool.runtime.connection import WorkerConnection, _Call, drive_stream
from anywool.runtime.loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool.runtime.routine import reset_active, set_active

__all__ = ["WorkerProxy"]

log = logging.getLogger(__name__)


class _Admitted:
    def __init__(self, metadata: WorkerMetadata) -> None:
        self.metadata = metadata
        self.stop = anyio.Event()


class WorkerProxy:
    """Dispatch routines to the workers reported by a discovery subscriber.

    ``async with WorkerProxy(subscriber):`` makes this proxy the active one for routines called
    in the block (and in tasks started from it).

    :param discovery: a :class:`~anywool.discovery.protocols.DiscoverySubscriberLike`; iterated
        once, never entered.
    :param loadbalancer: chooses the worker per call (default: a new
        :class:`~anywool.runtime.loadbalancer.RoundRobinLoadBalancer`).
    :param tags: admit only workers whose tags include all of these (``None``: admit all).
    :param quorum_timeout: seconds (≥ 0) a dispatch waits for a first connected worker before
        raising :class:`~anywool.errors.NoWorkersAvailable`.
    :param connect_timeout: seconds (> 0) allowed to connect to one worker.
    :param cancel_timeout: seconds (> 0) a cancelled call waits for its routine to unwind.
    :raises TypeError: ``discovery`` is not a ``DiscoverySubscriberLike``, ``loadbalancer`` not a
        ``LoadBalancerLike``, or ``tags`` a ``str``.
    :raises ValueError: a timeout is out of range.

    Entering raises ``RuntimeError`` on a second entry. Exiting cancels the sentinel and closes
    every connection (calls still in flight fail with :class:`~anywool.errors.WorkerError`); it
    is bounded by the connections' own shielded teardown and never raises.
    """

    def __init__(
        self,
        discovery: DiscoverySubscriberLike,
        *,
        loadbalancer: LoadBalancerLike | None = None,
        tags: Iterable[str] | None = None,
        quorum_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        cancel_timeout: float = 5.0,
    ) -> None:
        if not isinstance(discovery, DiscoverySubscriberLike):
            raise TypeError(
                "discovery must be a DiscoverySubscriberLike (an async iterable of "
                f"DiscoveryEvent), got {discovery!r}"
            )
        if loadbalancer is None:
            loadbalancer = RoundRobinLoadBalancer()
        elif not isinstance(loadbalancer, LoadBalancerLike):
            raise TypeError(f"loadbalancer must be a LoadBalancerLike, got {loadbalancer!r}")
        self._discovery = discovery
        self._balancer = loadbalancer
        self._tags = None if tags is None else _validate.tag_set("tags", tags)
        self._quorum_timeout = _validate.duration("quorum_timeout", quorum_timeout, allow_zero=True)
        self._connect_timeout = _validate.duration("connect_timeout", connect_timeout,
                                                   allow_zero=False)
        self._cancel_timeout = _validate.duration("cancel_timeout", cancel_timeout,
                                                  allow_zero=False)
        self._entered = False
        self._active = False
        self._task_group: TaskGroup | None = None
        self._token: Any = None
        self._admitted: dict[UUID, _Admitted] = {}
        self._ready: dict[UUID, tuple[WorkerMetadata, WorkerConnection]] = {}
        self._connecting = 0
        self._discovery_ended = False
        self._failure: BaseException | None = None
        self._changed = anyio.Event()

    @property
    def workers(self) -> list[WorkerMetadata]:
        """The admitted workers that currently have an open connection."""
        return [metadata for metadata, _ in self._ready.values()]

    async def __aenter__(self) -> WorkerProxy:
        if self._entered:
            raise RuntimeError("a WorkerProxy is single-use; create a new one")
        self._entered = True
        task_group = self._task_group = anyio.create_task_group()
        await task_group.__aenter__()
        task_group.start_soon(self._sentinel, name="anywool-proxy-sentinel")
        self._active = True
        self._token = set_active(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        try:
            reset_active(self._token)
        except ValueError:
            log.warning("WorkerProxy exited in another context than it was entered in")
        task_group = self._task_group
        if task_group is not None:
            task_group.cancel_scope.cancel()
            try:
                await task_group.__aexit__(None, None, None)
            finally:
                self._task_group = None

    # -- discovery -----------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _sentinel(self) -> None:
        try:
            async for event in self._discovery:
                self._handle(event)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            log.warning("discovery subscriber %r failed: %r", self._discovery, exc, exc_info=True)
            self._failure = exc
        self._discovery_ended = True
        self._notify()

    def _admits(self, metadata: WorkerMetadata) -> bool:
        return self._tags is None or self._tags <= metadata.tags

    def _handle(self, event: DiscoveryEvent) -> None:
        if not self._active:
            return  # exiting: the sentinel is being cancelled, admit nothing new
        metadata = event.metadata
        current = self._admitted.get(metadata.uid)
        if event.type == "worker-dropped" or not self._admits(metadata):
            if current is not None:
                current.stop.set()
                del self._admitted[metadata.uid]
            return
        if current is not None:
            if current.metadata.address == metadata.address:
                current.metadata = metadata
                return
            current.stop.set()  # moved: reconnect at the new address
        admitted = _Admitted(metadata)
        self._admitted[metadata.uid] = admitted
        assert self._task_group is not None
        self._connecting += 1
        self._task_group.start_soon(self._connect, admitted, name=f"anywool-connection-{metadata.address}")

    async def _connect(self, admitted: _Admitted) -> None:
        uid = admitted.metadata.uid
        connection = WorkerConnection(
            admitted.metadata.address,
            connect_timeout=self._connect_timeout,
            cancel_timeout=self._cancel_timeout,
            on_lost=admitted.stop.set,
        )
        connecting = True
        try:
            async with connection:
                connecting = False
                self._connecting -= 1
                self._ready[uid] = (admitted.metadata, connection)
                self._notify()
                await admitted.stop.wait()
        except WorkerError as exc:
            log.warning("could not use worker %s: %s", admitted.metadata.address, exc)
        except Exception:
            log.exception("connection to worker %s failed", admitted.metadata.address)
        finally:
            if connecting:
                self._connecting -= 1
            entry = self._ready.get(uid)
            if entry is not None and entry[1] is connection:
                del self._ready[uid]
            if self._admitted.get(uid) is admitted:
                del self._admitted[uid]
            self._notify()

    # -- dispatch ------------------------------------------------------------------------------

    async def _workers(self) -> list[tuple[WorkerMetadata, WorkerConnection]]:
        if not self._active:
            raise RuntimeError("this WorkerProxy is not active (enter it with `async with`)")
        with anyio.move_on_after(self._quorum_timeout):
            while not self._ready and self._failure is None:
                if self._discovery_ended and not self._connecting:
                    break
                await self._changed.wait()
        if self._failure is not None:
            raise self._failure
        if not self._ready:
            if self._discovery_ended and not self._connecting:
                raise NoWorkersAvailable("the discovery subscription ended with no usable worker")
            raise NoWorkersAvailable(
                f"no admitted worker connected within {self._quorum_timeout} seconds"
            )
        return list(self._ready.values())

    async def dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the coroutine routine ``fn(*args, **kwargs)`` on a worker and return its result.

        :raises RuntimeError: the proxy is not active.
        :raises NoWorkersAvailable: no worker connected within ``quorum_timeout`` seconds, or
            none accepted the call.
        :raises Exception: the discovery subscriber's failure, if its iteration raised; the
            routine's own exception; :class:`~anywool.errors.WorkerError` when the connection
            was lost mid-call; :class:`~anywool.errors.RoutineCancelled`.

        Cancellation: cancels the routine on the worker, waits (bounded) for it to unwind.
        """
        workers = await self._workers()
        return await self._balancer.dispatch(workers, lambda c: c.call(fn, args, kwargs))

    def stream(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncGenerator[Any, Any]:
        """Start the async generator routine ``fn(*args, **kwargs)`` on a worker, lazily.

        Returns an async generator; the first step waits for a worker and dispatches, raising
        as :meth:`dispatch` does.
        """

        async def open_call() -> _Call:
            workers = await self._workers()
            return await self._balancer.dispatch(workers, lambda c: c.stream(fn, args, kwargs))

        return drive_stream(open_call)

