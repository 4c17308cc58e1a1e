"""WorkerPool: spawn workers, announce them through discovery, dispatch routines to them.

The pool is an owner composed of smaller owners, entered in this order and exited in reverse on
one :class:`~contextlib.AsyncExitStack` (so exactly what was entered is exited, once):

1. the discovery service when the pool owns it (a fresh :class:`LocalDiscovery` by default);
2. a task group hosting one task per spawned :class:`LocalWorker` (each worker is entered and
   exited in its own hosting task, so the workers start and stop concurrently);
3. the discovery publisher, which announces the spawned workers;
4. the :class:`WorkerProxy` over the discovery subscriber, which makes the pool the active
   dispatcher for ``@routine`` calls in the block.

Exit: the proxy closes its connections; ``worker-dropped`` is announced for each spawned worker
(bounded; a failure or hang is logged, never fatal); the publisher is exited; every worker is
stopped within ``shutdown_timeout`` and reaped; the discovery service is exited.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from anywool import _validate
from anywool.discovery.protocols import DiscoveryLike, DiscoveryPublisherLike, DiscoverySubscriberLike
from anywool.runtime.loadbalancer import LoadBalancerLike
from anywool.runtime.local_worker import LocalWorker, current_backend
from anywool.runtime.proxy import WorkerProxy
from anywool.runtime.resolve import resolve

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)


def _is_bare_subscriber(obj: object) -> bool:
    return isinstance(obj, DiscoverySubscriberLike) and not isinstance(obj, DiscoveryLike)


def _taken_as_is(obj: object) -> bool:
    # A bare subscriber is consumed, never entered; a discovery its caller already entered
    # (e.g. ``async with LocalDiscovery(ns) as d: WorkerPool(discovery=d)``) stays the caller's.
    return _is_bare_subscriber(obj) or getattr(obj, "claimed", False) is True


class WorkerPool:
    """Workers for the routines called inside an ``async with`` block.

    ============  =====================================  =========================================
    ``spawn``     ``discovery``                          the pool
    ============  =====================================  =========================================
    ``None``      ``None``                               owns a fresh ``LocalDiscovery``, spawns
                                                         ``os.cpu_count()`` workers
    N             ``None``                               owns a fresh ``LocalDiscovery``, spawns N
    ``None``      a DiscoveryLike (e.g. ``LocalDiscovery(ns)``)  enters (owns) it, spawns nothing,
                                                         uses the workers found there
    N             a DiscoveryLike                        owns it, spawns N, publishes them, also
                                                         uses other workers found there
    ``None``      a bare subscriber (e.g.                borrows: consumes the subscriber, spawns
                  ``LocalDiscovery.Subscriber(ns)``)     nothing
    ============  =====================================  =========================================

    ``discovery`` may be given in any Factory form (see :mod:`anywool.runtime.resolve`); a bare
    subscriber is always taken as it is, never entered, and so is a discovery that is already
    entered (``claimed`` is true, e.g. the ``d`` of ``async with LocalDiscovery(ns) as d``): its
    owner stays whoever entered it, and the pool only publishes into it and reads from it. The resolved object is classified once:
    ``DiscoveryLike`` first, then ``DiscoverySubscriberLike``.

    :param spawn: number of local workers to start (``int`` ≥ 1), or ``None`` (see the table).
    :param discovery: where workers are announced and found (see the table).
    :param tags: tags of the spawned workers; the proxy admits only workers carrying all of them.
    :param backend: ``"asyncio"`` or ``"trio"`` for the spawned workers (``None``: the backend
        running the pool).
    :param loadbalancer: chooses the worker per call (default: round robin).
    :param quorum_timeout: seconds (≥ 0) a dispatch waits for a first connected worker.
    :param startup_timeout: seconds (> 0) each spawned worker gets to report its address.
    :param shutdown_timeout: seconds (≥ 0) each spawned worker gets to drain its calls when the
        pool exits, before SIGTERM and SIGKILL.
    :param announce_timeout: seconds (≥ 0) allowed for announcing dropped workers at exit.
    :raises TypeError: an argument has the wrong type (checked at construction).
    :raises ValueError: an argument is out of range (checked at construction).

    Entering raises ``TypeError``/``ValueError`` for a bad ``spawn`` (naming it),
    ``TypeError`` when ``discovery`` resolves to neither protocol, ``ValueError`` when ``spawn``
    is combined with a bare subscriber (it cannot publish), ``RuntimeError`` on a second entry,
    :class:`~anywool.errors.WorkerError` when a worker fails to start, and whatever entering the
    discovery raises (e.g. :class:`~anywool.errors.DiscoveryNamespaceInUse`); what was entered
    before the failure is exited first. Exiting is bounded, never raises over the exception the
    block is unwinding, and leaves no worker process or socket file behind.
    """

    def __init__(
        self,
        *,
        spawn: int | None = None,
        discovery: Any = None,
        tags: Iterable[str] = (),
        backend: str | None = None,
        loadbalancer: LoadBalancerLike | None = None,
        quorum_timeout: float = 10.0,
        startup_timeout: float = 30.0,
        shutdown_timeout: float = 10.0,
        announce_timeout: float = 5.0,
    ) -> None:
        self._spawn = spawn
        self._discovery = discovery
        self._tags = _validate.tag_set("tags", tags)
        self._backend = _validate.backend(backend)
        self._loadbalancer = loadbalancer
        self._quorum_timeout = _validate.duration("quorum_timeout", quorum_timeout, allow_zero=True)
        self._startup_timeout = _validate.duration("startup_timeout", startup_timeout, allow_zero=False)
        self._shutdown_timeout = _validate.duration("shutdown_timeout", shutdown_timeout, allow_zero=True)
        self._announce_timeout = _validate.duration("announce_timeout", announce_timeout, allow_zero=True)
        self._entered = False
        self._stack: AsyncExitStack | None = None
        self._workers: list[LocalWorker] = []
        self._proxy: WorkerProxy | None = None
        self._resolved: Any = None

    @property
    def workers(self) -> list[LocalWorker]:
        """The workers this pool spawned (empty when it spawns none)."""
        return list(self._workers)

    @property
    def discovery(self) -> Any:
        """The discovery the pool resolved on entry (a DiscoveryLike or a bare subscriber).

        :raises RuntimeError: the pool is not entered.
        """
        if self._proxy is None:
            raise RuntimeError("the WorkerPool is not entered")
        return self._resolved

    @property
    def proxy(self) -> WorkerProxy:
        """The pool's proxy.

        :raises RuntimeError: the pool is not entered.
        """
        if self._proxy is None:
            raise RuntimeError("the WorkerPool is not entered")
        return self._proxy

    def _spawn_count(self, owns_default_discovery: bool) -> int:
        spawn = self._spawn
        if spawn is None:
            return (os.cpu_count() or 1) if owns_default_discovery else 0
        if isinstance(spawn, bool) or not isinstance(spawn, int):
            raise TypeError(f"spawn must be an int >= 1 or None, got {spawn!r}")
        if spawn < 1:
            raise ValueError(f"spawn must be >= 1 (or None), got {spawn!r}")
        return spawn

    async def __aenter__(self) -> WorkerPool:
        if self._entered:
            raise RuntimeError("a WorkerPool is single-use; create a new one")
        self._entered = True
        count = self._spawn_count(self._discovery is None)
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._enter(stack, count)
        except BaseException as exc:
            # Not wrapped in a shield: the stack holds task groups entered before it would be.
            # Every step on it shields and bounds its own teardown.
            try:
                await stack.__aexit__(type(exc), exc, exc.__traceback__)
            except Exception:
                log.exception("unwinding a WorkerPool that failed to start failed too")
            raise
        self._stack = stack
        return self

    async def _enter(self, stack: AsyncExitStack, count: int) -> None:
        factory = self._discovery
        if factory is None:
            from anywool.discovery.local import LocalDiscovery

            factory = LocalDiscovery()
        discovery = self._resolved = await resolve(factory, stack, is_value=_taken_as_is)
        owned: DiscoveryLike | None = None
        if isinstance(discovery, DiscoveryLike):
            owned = discovery
            subscriber = discovery.subscriber
        elif isinstance(discovery, DiscoverySubscriberLike):
            if count:
                raise ValueError(
                    "spawn needs a DiscoveryLike to publish the workers it starts; "
                    f"{discovery!r} is only a subscriber"
                )
            subscriber = discovery
        else:
            raise TypeError(
                "discovery must resolve to a DiscoveryLike or a DiscoverySubscriberLike, "
                f"got {discovery!r}"
            )
        if owned is not None and count:
            await self._start_workers(stack, count)
            publisher = await resolve(owned.publisher, stack)
            if not isinstance(publisher, DiscoveryPublisherLike):
                raise TypeError(f"discovery.publisher is not a DiscoveryPublisherLike: {publisher!r}")
            stack.push_async_callback(self._announce_dropped, publisher)
            for worker in self._workers:
                await publisher.publish("worker-added", worker.metadata)
        self._proxy = WorkerProxy(
            subscriber,
            loadbalancer=self._loadbalancer,
            tags=self._tags or None,
            quorum_timeout=self._quorum_timeout,
        )
        await stack.enter_async_context(self._proxy)

    async def _start_workers(self, stack: AsyncExitStack, count: int) -> None:
        hosts = anyio.create_task_group()
        await hosts.__aenter__()
        stopping = anyio.Event()

        async def close_hosts() -> None:
            stopping.set()
            await hosts.__aexit__(None, None, None)

        stack.push_async_callback(close_hosts)
        backend = self._backend or current_backend()
        failures: list[BaseException] = []

        async def start_one(starters: TaskGroup) -> None:
            try:
                worker = await hosts.start(self._host_worker, backend, stopping)
            except Exception as exc:
                failures.append(exc)
                starters.cancel_scope.cancel()
            else:
                self._workers.append(worker)

        async with anyio.create_task_group() as starters:
            for _ in range(count):
                starters.start_soon(start_one, starters)
        if failures:
            raise failures[0]

    async def _host_worker(
        self, backend: str, stopping: anyio.Event, *, task_status: TaskStatus[LocalWorker]
    ) -> None:
        worker = LocalWorker(
            backend=backend,
            tags=self._tags,
            startup_timeout=self._startup_timeout,
            shutdown_timeout=self._shutdown_timeout,
        )
        async with worker:
            task_status.started(worker)
            await stopping.wait()

    async def _announce_dropped(self, publisher: DiscoveryPublisherLike) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._announce_timeout) as scope:
            for worker in self._workers:
                try:
                    await publisher.publish("worker-dropped", worker.metadata)
                except Exception:
                    log.warning(
                        "announcing worker-dropped for %s failed", worker.metadata, exc_info=True
                    )
        if scope.cancelled_caught:
            log.warning(
                "announcing dropped workers timed out after %s seconds", self._announce_timeout
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        self._proxy = None
        if stack is None:
            return
        try:
            await stack.__aexit__(exc_type, exc, tb)
        except Exception:
            if exc_type is None:
                raise
            log.exception("WorkerPool teardown failed while the block was raising")
