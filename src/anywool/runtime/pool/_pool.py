"""WorkerPool: spawn workers, announce them through discovery, dispatch routines to them.

The pool is an owner composed of smaller owners, entered in this order on one
:class:`~contextlib.AsyncExitStack` (so exactly what was entered is exited, once, in reverse):

1. the load balancer and the discovery, each resolved from its Factory form (what a form needs
   entering is entered here, by the pool, and by nobody else);
2. the supervision of the spawned workers (:mod:`~anywool.runtime.pool._supervisor`): a task
   group hosting one *supervisor* task per worker slot, which enters the :class:`LocalWorker`,
   replaces it if its process dies, and stops it when the pool exits, and the warm template
   they fork from; while a worker runs, recycling and idleness
   (:mod:`~anywool.runtime.pool._recycling`) decide whether it retires;
3. the publishing (:mod:`~anywool.runtime.pool._publishing`): the discovery publisher, which
   announces the spawned workers and withdraws them;
4. the :class:`WorkerProxy` over the discovery subscriber, which makes the pool the active
   dispatcher for ``@routine`` calls in the block.

This module checks the options, makes those parts and orchestrates them; each part says what it
owns.

Exit has two budgets. ``announce_timeout`` covers everything that waits on the namespace (the
drop announcements, the publisher's exit, the discovery's exit); ``shutdown_timeout`` covers the
calls (the pool's own in-flight calls, then the workers' drain). Each waiting step runs in the
caller's cancel scopes and gives up at its budget's end (logged with its ``TimeoutError``); what
must happen whatever (terminating and reaping every worker, removing files) is shielded. See
:mod:`anywool._teardown`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any, TypeVar, overload
from uuid import UUID, uuid4

import anyio

from anywool import _validate
from anywool._owner import SingleUse
from anywool._teardown import Budget, ExitWithin
from anywool._tls import MutualTLS
from anywool.discovery import DiscoveryLike, DiscoverySubscriberLike
from anywool.errors import WorkerError
from anywool.runtime import _lifespan, _output
from anywool.runtime._map import MAX_IN_FLIGHT, MapResults
from anywool.runtime._output import OutputLine
from anywool.runtime.client import _ctrl_c
from anywool.runtime.client._loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool.runtime.client._proxy import WorkerProxy
from anywool.runtime.client._resolve import expected_names, is_factory, resolved
from anywool.runtime.pool._local_worker import (
    LocalWorker,
    check_recycling,
    current_backend,
    tcp_endpoint,
)
from anywool.runtime.pool._publishing import Publishing
from anywool.runtime.pool._recycling import Recycling
from anywool.runtime.pool._supervisor import Supervisor
from anywool.runtime.wire._stats import WorkerStats
from anywool.runtime.worker._contract import MAX_CONCURRENCY

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._pool")

#: The most workers one pool may spawn.
MAX_SPAWN = 1024

#: The key, in a spawned worker's metadata ``extra``, of its pool's id: a random hex string
#: per pool, the same for every worker it spawns (replacements included), so that a reader of
#: the namespace (``anywool recycle``) knows which workers one pool runs.
POOL_EXTRA = "anywool.pool"
#: The shortest ``idle_timeout`` (seconds): a worker says it is idle every that many seconds.
MIN_IDLE_TIMEOUT = 0.1

_SPAWNING_ACCEPTS = (DiscoveryLike,)
_DURABLE_ACCEPTS = (DiscoveryLike, DiscoverySubscriberLike)


def _is_entered(obj: object) -> bool:
    # A discovery its caller already entered (``async with LocalDiscovery(ns) as d:
    # WorkerPool(discovery=d)``) stays the caller's: the pool uses it and never exits it.
    return getattr(type(obj), "claimed", None) is not None and getattr(obj, "claimed", False) is True


# ids of the discoveries that pools entered themselves, while those pools run: another pool
# given one of them must not take it for its caller's (its owner pool will exit it).
_ENTERED_BY_POOLS: set[int] = set()


def _is_loadbalancer(obj: object) -> bool:
    return not isinstance(obj, type) and isinstance(obj, LoadBalancerLike)


T = TypeVar("T")
R = TypeVar("R")

class WorkerPool(SingleUse):
    """Workers for the routines called inside an ``async with`` block.

    ============  =============================================  ====================================
    ``spawn``     ``discovery``                                  the pool
    ============  =============================================  ====================================
    ``None``      ``None``                                       owns a fresh ``LocalDiscovery``,
                                                                 spawns ``os.cpu_count()`` workers
    N             ``None``                                       owns a fresh ``LocalDiscovery``,
                                                                 spawns N
    ``None``      a ``DiscoveryLike`` (e.g. ``LocalDiscovery(ns)``)  owns it (claims ``ns``), spawns
                                                                 nothing, uses the workers that
                                                                 others publish there
    ``None``      a bare subscriber (e.g.                        borrows: iterates the subscriber,
                  ``LocalDiscovery.Subscriber(ns)``)             owns and creates nothing
    N             a ``DiscoveryLike``                            owns it, spawns N, publishes them,
                                                                 also uses other workers found there
    ============  =============================================  ====================================

    ``discovery`` and ``loadbalancer`` may be given in any Factory form (an instance, a callable
    or class returning one, an awaitable, a sync or async context manager; see
    :func:`anywool.resolved`). The pool resolves them on entry, enters what needs entering
    (exactly once) and exits it on exit (exactly once); the proxy only iterates the subscriber.
    A ``LocalDiscovery`` its caller already entered stays the caller's. A durable pool
    (``spawn=None`` with a ``discovery``) classifies what it resolved once: a ``DiscoveryLike``
    first (it uses its ``subscriber``), else a ``DiscoverySubscriberLike``.

    Spawned workers carry ``tags`` and the pool's namespace as tags. A spawned worker whose
    process dies is withdrawn from discovery at once and replaced (logged); one that keeps
    failing at start-up is given up after 3 tries (logged as an error naming the cause).

    :param spawn: number of local workers to start (``int``, 1 to :data:`MAX_SPAWN`), or
        ``None`` (see the table).
    :param discovery: where workers are announced and found (see the table).
    :param tags: tags of the spawned workers; the proxy admits only workers carrying all of them.
    :param backend: ``"asyncio"`` or ``"trio"`` for the spawned workers (``None``: the backend
        running the pool); ``"trio"`` needs the ``anywool[trio]`` extra.
    :param loadbalancer: chooses the worker per call, in any Factory form of a
        ``LoadBalancerLike`` (default: round robin).
    :param lazy: ``False``: entering waits until ``quorum`` workers are connected; ``True``: the
        first dispatch waits for them.
    :param quorum: connected workers (``int`` ≥ 1) required before dispatching; at most ``spawn``
        when the pool only has its own workers.
    :param quorum_timeout: seconds (≥ 0) the quorum wait, and any dispatch finding no connected
        worker, waits.
    :param lease: admit at most this many discovered workers (``int`` ≥ 0) beyond the pool's own
        (``None``: no limit).
    :param startup_timeout: seconds (> 0) each spawned worker gets to report its address.
    :param shutdown_timeout: seconds (≥ 0) the pool's own in-flight calls, then the workers' other
        in-flight calls, get to finish when the pool exits, before they are cancelled.
    :param announce_timeout: seconds (≥ 0) allowed, at exit, for everything that waits on the
        discovery namespace: announcing dropped workers, the publisher's and the discovery's own
        exits.
    :param cancel_grace: seconds (> 0) a cancelled call waits for its worker to take the
        cancellation (default 1). A routine that holds its worker's event loop (a CPU-bound
        loop, a blocking call, a plain function of :func:`~anywool.run_sync`) is interrupted
        there, and its ``finally`` blocks run; one that cannot be (C code holding the GIL, or
        it catches the interruption and goes on) leaves its worker stuck: after
        ``cancel_grace`` the caller resumes and a spawned worker is ended (SIGKILL) and
        replaced, and its other calls in flight raise :class:`~anywool.errors.WorkerError`.
    :param max_concurrency: the most calls each spawned worker runs at once (``int`` ≥ 1;
        ``None``: no bound). A worker at its bound refuses a call before running it; the call
        goes to another worker, or waits until one has room.
    :param host: spawned workers listen on TCP at this address (a port each, chosen by the
        system) instead of a Unix socket: ``"127.0.0.1"`` for this host only, ``"0.0.0.0"`` for
        every interface (a routable address of this host is announced). TCP requires
        ``secret`` or ``tls``.
    :param secret: the shared secret for TCP workers, ``bytes`` or ``str`` of at least 16 bytes
        (``None``: ``$ANYWOOL_SECRET``, if set): spawned workers require it of every peer, and
        the proxy authenticates with it to every TCP worker it finds (a mutual HMAC
        challenge-response; the secret never crosses the wire). A ``LanDiscovery`` (or its
        subscriber) given no secret of its own signs and verifies records with it too.
    :param tls: mutual TLS (:class:`~anywool.MutualTLS`) for TCP workers, instead of or
        besides the secret.
    :param forward_output: whether what routines log and print comes back to this process
        (default ``True``): their ``logging`` records are handled by its loggers (with the
        worker and the call as ``anywool_*`` attributes), their lines go to ``on_output``; see
        "Worker output at the caller" in the README. ``False``: it stays on the workers'
        stderr.
    :param on_output: called with each :class:`~anywool.OutputLine` (a line a routine wrote to
        its ``sys.stdout`` or ``sys.stderr``), synchronously from the connection's reader: it
        must not block; an exception it raises is logged once. ``None``: the line is written to
        this process's ``sys.stderr`` as ``[routine uid8 pid N] text``.
    :param worker_lifespan: an async context manager factory, called with no arguments in
        each spawned worker (or ``"module:name"`` naming one), entered before the worker takes
        calls and exited after its last one, in its main task; routines reach what it yields
        as ``anywool.current_worker().state``. Sent pickled (by reference when importable, by
        value otherwise). Its entry counts in ``startup_timeout``; one that raises fails that
        worker's start (the first workers': entering the pool raises
        :class:`~anywool.errors.WorkerError` with the cause; a replacement's: its slot's
        back-off, given up after 3 failed starts in a row); one that raises on exit is logged
        by the worker.
    :param max_calls: each spawned worker retires after taking this many calls (``int`` ≥ 1;
        ``None``: never): it refuses new calls (callers go to other workers), finishes those
        it runs (however long they take), and the pool starts its replacement, announces it,
        then withdraws the retiring worker, which exits once they have ended (the pool's exit
        drains them within ``shutdown_timeout``, as any worker's). A replacement that
        fails to start is retried with the slot's back-off, the slot given up after 3 tries.
    :param max_memory: each spawned worker retires, likewise, once its resident set passes
        this many bytes (``int`` ≥ 1 MiB; ``None``: never; looked at ten times a second, also
        while calls run). A worker past it once started (its lifespan entered) fails its
        start.
    :param idle_timeout: seconds (≥ 0.1; ``None``: never) after which a spawned worker that
        ran no call (from this pool or any other caller: the worker counts them) is retired
        and not replaced, while the pool runs more than ``min_workers`` spawned workers: it
        is withdrawn, takes no new call (callers go to the others), finishes those it runs
        and exits. While the pool runs fewer than ``spawn`` workers, the next call one of
        them takes (from any caller) starts one more, announced like the first ones: one
        start at a time, until ``spawn`` again.
    :param min_workers: the fewest spawned workers idleness leaves running (``int``, 1 to
        ``spawn``; default 1); only with ``idle_timeout``.
    :raises TypeError: an argument has the wrong type, e.g. a ``discovery`` or ``loadbalancer``
        that is neither a protocol instance nor a Factory form, or a bare subscriber given to a
        spawning pool (checked at construction where the value says so, else at entry).
    :raises ValueError: an argument is out of range (the message names it and its value), or
        ``host`` is given without credentials or to a pool that spawns nothing, or
        ``on_output`` is given with ``forward_output=False``, or ``idle_timeout`` to a pool
        that spawns nothing, or ``min_workers`` without ``idle_timeout`` or above ``spawn``.
    :raises ImportError: ``backend="trio"`` where trio is not installed (the message names
        ``pip install 'anywool[trio]'``).

    Every spawned worker carries the pool's id in its metadata (``extra["anywool.pool"]``),
    and passes on to the pool a recycle request a client sends it (``anywool recycle NS``,
    authenticated as a call is): the pool then runs :meth:`recycle` (logging a failure), one
    at a time; a request that comes during a recycle is taken after it.

    A TCP worker that rejects the pool's credentials (or has none to check) is not used; when
    no other worker is, dispatching raises its :class:`~anywool.errors.AuthenticationError`.

    Entering raises ``TypeError`` naming the accepted protocols when ``discovery`` or
    ``loadbalancer`` resolves to something else, ``RuntimeError`` on a second entry,
    :class:`~anywool.errors.WorkerError` when a worker fails to start, ``TimeoutError`` when
    ``lazy=False`` and the quorum is not met in ``quorum_timeout``, and whatever entering the
    discovery raises (e.g. :class:`~anywool.errors.DiscoveryNamespaceInUse`, or
    :class:`~anywool.errors.DiscoveryNamespaceNotFound` for a non-lazy borrower with no owner to
    borrow from); what was entered before the failure is exited first. A cancelled entry
    (at any stage, a worker's spawning included) stops and reaps every worker process it
    started, and removes their sockets and its namespace, before the cancellation propagates.

    Exiting: new calls raise ``RuntimeError``; ``worker-dropped`` is announced for the spawned
    workers (within ``announce_timeout``); the pool's own calls in flight may finish within
    ``shutdown_timeout``, after which they are cancelled on their workers and raise
    :class:`~anywool.errors.RoutineCancelled`; the workers drain other callers' calls for what is
    left of ``shutdown_timeout`` and are stopped (SIGTERM, then SIGKILL) and reaped. The whole
    exit takes at most ``announce_timeout + shutdown_timeout`` plus a few seconds for workers
    that ignore SIGTERM, whatever other processes do (a registry lock held elsewhere included).
    If the exit is cancelled, the waiting parts end at once and the workers are still stopped and
    reaped before the cancellation propagates. It never raises over the exception the block is
    unwinding.
    """

    def __init__(
        self,
        *,
        spawn: int | None = None,
        discovery: Any = None,
        tags: Iterable[str] = (),
        backend: str | None = None,
        loadbalancer: Any = None,
        lazy: bool = True,
        quorum: int = 1,
        quorum_timeout: float = 10.0,
        lease: int | None = None,
        startup_timeout: float = 30.0,
        shutdown_timeout: float = 10.0,
        announce_timeout: float = 5.0,
        max_concurrency: int | None = None,
        cancel_grace: float = 1.0,
        host: str | None = None,
        secret: bytes | str | None = None,
        tls: MutualTLS | None = None,
        forward_output: bool = True,
        on_output: Callable[[OutputLine], object] | None = None,
        worker_lifespan: Callable[[], AbstractAsyncContextManager[Any]] | str | None = None,
        max_calls: int | None = None,
        max_memory: int | None = None,
        idle_timeout: float | None = None,
        min_workers: int | None = None,
    ) -> None:
        self._max_calls, self._max_memory = check_recycling(max_calls, max_memory)
        _output.check_options(forward_output, on_output)  # here: errors at construction
        self._lifespan = _lifespan.check(worker_lifespan)
        if self._lifespan is not None:
            _lifespan.encode(self._lifespan)  # one that cannot be sent fails here
            if spawn is None and discovery is not None:
                raise ValueError("worker_lifespan is for the workers a pool spawns, but this "
                                 "pool spawns none (pass spawn=N)")
        self._forward_output = forward_output
        self._on_output = on_output
        self._spawn = None if spawn is None else _validate.count("spawn", spawn, upper=MAX_SPAWN)
        if host is not None and spawn is None and discovery is not None:
            raise ValueError(f"host={host!r} is where spawned workers listen, but this pool "
                             "spawns none (pass spawn=N)")
        _, self._credentials = tcp_endpoint(host, secret, tls)  # checked once, here
        self._host = host
        if discovery is not None and not is_factory(discovery):
            accepts = _SPAWNING_ACCEPTS if self._spawn is not None else _DURABLE_ACCEPTS
            if not isinstance(discovery, accepts):
                raise TypeError(
                    f"discovery must be a {expected_names(accepts)}"
                    + (" (a spawning pool publishes its workers)" if self._spawn is not None
                       else "")
                    + f", or a Factory form of one; got {discovery!r}"
                )
        self._discovery = discovery
        if loadbalancer is not None and not (_is_loadbalancer(loadbalancer)
                                             or is_factory(loadbalancer)):
            raise TypeError(
                "loadbalancer must be a LoadBalancerLike, or a Factory form of one (a class, a "
                f"callable, an awaitable or a context manager); got {loadbalancer!r}"
            )
        self._loadbalancer = loadbalancer
        self._tags = _validate.tag_set("tags", tags)
        self._backend = _validate.backend(backend)
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy must be a bool, got {lazy!r}")
        self._lazy = lazy
        self._quorum = _validate.count("quorum", quorum, upper=1 << 20)
        if discovery is None:
            own = self._spawn if self._spawn is not None else (os.cpu_count() or 1)
            if self._quorum > own:
                raise ValueError(
                    f"quorum must be at most the {own} workers the pool spawns when it uses no "
                    f"other discovery, got quorum={quorum!r}"
                )
        self._lease = None if lease is None else _validate.count("lease", lease, lower=0,
                                                                   upper=1 << 20)
        self._quorum_timeout = _validate.duration("quorum_timeout", quorum_timeout, allow_zero=True)
        self._startup_timeout = _validate.duration("startup_timeout", startup_timeout, allow_zero=False)
        self._shutdown_timeout = _validate.duration("shutdown_timeout", shutdown_timeout, allow_zero=True)
        self._announce_timeout = _validate.duration("announce_timeout", announce_timeout, allow_zero=True)
        self._cancel_grace = _validate.duration("cancel_grace", cancel_grace, allow_zero=False)
        self._max_concurrency = None if max_concurrency is None else _validate.count(
            "max_concurrency", max_concurrency, upper=MAX_CONCURRENCY)
        self._idle_timeout, self._min_workers = self._check_idleness(
            idle_timeout, min_workers, discovery)
        self._pool_id = uuid4().hex
        self._stack: AsyncExitStack | None = None
        self._proxy: WorkerProxy | None = None
        self._resolved: Any = None
        self._worker_namespace: str | None = None  # what spawned workers' spans name
        self._announce_budget = Budget(self._announce_timeout)
        self._shutdown_budget = Budget(self._shutdown_timeout)
        # The parts: each says what it owns (see the module's docstring).
        self._publishing = Publishing(self, self._announce_timeout, self._announce_budget)
        self._supervisor = Supervisor(
            self, new_worker=self._new_worker, publishing=self._publishing,
            startup_timeout=self._startup_timeout, shutdown_budget=self._shutdown_budget,
            on_adopted=self._adopted)
        self._recycling = Recycling(self._supervisor, idle_timeout=self._idle_timeout,
                                    min_workers=self._min_workers,
                                    on_request=self._recycle_requested)

    def _check_idleness(self, idle_timeout: object, min_workers: object, discovery: object
                        ) -> tuple[float | None, int]:
        """``idle_timeout`` and ``min_workers`` checked (see the class)."""
        timeout = _validate.seconds("idle_timeout", idle_timeout, allow_zero=False,
                                    optional=True, floor=MIN_IDLE_TIMEOUT)
        if timeout is None:
            if min_workers is not None:
                raise ValueError(f"min_workers={min_workers!r} is the floor of idle_timeout's "
                                 "retirements, but idle_timeout is None (pass both)")
            return None, 1
        if self._spawn is None and discovery is not None:
            raise ValueError(f"idle_timeout={idle_timeout!r} retires the workers a pool spawns, "
                             "but this pool spawns none (pass spawn=N)")
        spawned = self._spawn if self._spawn is not None else (os.cpu_count() or 1)
        if min_workers is None:
            return timeout, 1
        if isinstance(min_workers, bool) or not isinstance(min_workers, int):
            raise TypeError(f"min_workers must be an int, got {min_workers!r}")
        if not 1 <= min_workers <= spawned:
            raise ValueError(f"min_workers must be between 1 and spawn ({spawned}), got "
                             f"{min_workers!r}")
        return timeout, min_workers

    @property
    def workers(self) -> list[LocalWorker]:
        """The workers this pool spawned and that are running now (empty when it spawns none)."""
        return self._supervisor.workers

    # -- what subclasses may change (the `anywool worker` command's pool, anywool.testing's) ----

    #: The root level of the workers this pool spawns (``None``: what this process's logging
    #: lets through when each starts). A pool whose workers serve other processes' calls (the
    #: ``anywool worker`` command's) sets ``logging.NOTSET``: every record, their callers'
    #: levels decide.
    _output_level: int | None = None

    def _adopted(self, worker: LocalWorker) -> None:
        """Called with each worker the pool starts, its first ones and every replacement, once
        its process is up (for subclasses that keep a record, as ``anywool.testing``'s does)."""

    async def _recycle_requested(self) -> None:
        """Run for each recycle request a worker passes on (``anywool recycle NS``), one at a
        time: :meth:`recycle`, a failure logged (a subclass may say what it does, as the
        ``anywool worker`` command does)."""
        try:
            await self.recycle()
        except (WorkerError, RuntimeError) as exc:  # RuntimeError: the pool is not entered yet
            log.error("a requested recycle of %r failed: %s", self, exc)

    def _spawned_output_level(self) -> int | None:
        if not self._forward_output:
            return None
        return _output.lowest_level() if self._output_level is None else self._output_level

    def _new_worker(self, backend: str, tags: frozenset[str]) -> LocalWorker:
        """A worker to spawn, as this pool's options make it (each start, a replacement's
        too, makes one afresh: it starts with the configuration as it is then)."""
        credentials = self._credentials
        return LocalWorker(backend=backend, tags=tags, startup_timeout=self._startup_timeout,
                           shutdown_timeout=self._shutdown_timeout,
                           max_concurrency=self._max_concurrency, host=self._host,
                           secret=None if credentials is None else credentials.secret,
                           tls=None if credentials is None else credentials.tls,
                           namespace=self._worker_namespace,
                           output_level=self._spawned_output_level(),
                           lifespan=self._lifespan, max_calls=self._max_calls,
                           max_memory=self._max_memory,
                           extra={POOL_EXTRA: self._pool_id})

    @property
    def discovery(self) -> Any:
        """What ``discovery`` resolved to on entry (a DiscoveryLike or a bare subscriber).

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

    @overload
    def map(self, fn: Callable[[T], Awaitable[R]], items: Iterable[T] | AsyncIterable[T], /, *,
            ordered: bool = ..., batch_size: int | None = ..., max_in_flight: int = ...,
            progress: Callable[[int], object] | None = ...) -> MapResults[R]: ...

    @overload
    def map(self, fn: Callable[[T], R], items: Iterable[T] | AsyncIterable[T], /, *,
            ordered: bool = ..., batch_size: int | None = ..., max_in_flight: int = ...,
            progress: Callable[[int], object] | None = ...) -> MapResults[R]: ...

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any] | AsyncIterable[Any], /, *,
            ordered: bool = True, batch_size: int | None = None,
            max_in_flight: int = MAX_IN_FLIGHT,
            progress: Callable[[int], object] | None = None) -> MapResults[Any]:
        """:func:`anywool.map` through this pool's proxy rather than the active one (same
        parameters, errors and cancellation); entering it raises :class:`RuntimeError` when the
        pool is not entered."""
        return MapResults(lambda: self.proxy, fn, items, ordered=ordered,
                          batch_size=batch_size, max_in_flight=max_in_flight,
                          progress=progress)

    async def stats(self, timeout: float = 5.0) -> dict[UUID, WorkerStats | None]:
        """Ask every worker the pool's proxy admitted for its statistics: see
        :meth:`WorkerProxy.stats <anywool.WorkerProxy.stats>` (same arguments, result and
        errors).

        :raises RuntimeError: the pool is not entered.
        """
        return await self.proxy.stats(timeout)

    async def recycle(self) -> None:
        """Replace every worker this pool spawned, one at a time: each replacement is started,
        announced and connected to this pool's proxy before the worker it replaces is
        withdrawn and stopped (its calls drained within ``shutdown_timeout``, new ones going
        to the others). So no call is lost or fails, and this pool never has fewer than its
        size of workers taking calls. New code in the modules routines come from, new
        environment: the replacements start with what is there now.

        One recycle at a time (a second waits for the first). Cancelled, it stops between
        workers; a replacement under way completes. Workers that die or retire meanwhile are
        replaced as ever.

        :raises RuntimeError: the pool is not entered.
        :raises ~anywool.errors.WorkerError: a replacement failed to start
            (:data:`_MAX_START_FAILURES` tries, with the slot's back-off): the worker it was to
            replace, and those after it, keep running; its cause is attached.
        """
        if self._proxy is None:
            raise RuntimeError("the WorkerPool is not entered")
        await self._recycling.recycle()

    # -- entry ---------------------------------------------------------------------------------

    async def __aenter__(self) -> WorkerPool:
        self._enter_once()
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._enter(stack)
        except BaseException as exc:
            # Not wrapped in a shield: the stack holds task groups entered before it would be.
            # Every step on it bounds its own teardown and shields what must happen.
            try:
                await stack.__aexit__(type(exc), exc, exc.__traceback__)
            except Exception:
                log.exception("unwinding a WorkerPool that failed to start failed too")
            raise
        self._stack = stack
        return self

    async def _enter(self, stack: AsyncExitStack) -> None:
        if self._loadbalancer is None:
            balancer: LoadBalancerLike = RoundRobinLoadBalancer()
        else:
            balancer = await stack.enter_async_context(ExitWithin(resolved(
                self._loadbalancer, expect=LoadBalancerLike, is_value=_is_loadbalancer,
                name="loadbalancer"), self._announce_budget))
        factory = self._discovery
        count = self._spawn
        if factory is None:
            from anywool.discovery import LocalDiscovery

            factory = LocalDiscovery()
            count = self._spawn or os.cpu_count() or 1
        accepts = _SPAWNING_ACCEPTS if count else _DURABLE_ACCEPTS
        taken_as_is: list[object] = []

        def is_value(obj: object) -> bool:
            if _is_entered(obj):
                taken_as_is.append(obj)
                return True
            return False

        discovery = self._resolved = await stack.enter_async_context(ExitWithin(
            resolved(factory, expect=accepts, is_value=is_value, name="discovery"),
            self._announce_budget))
        if self._credentials is not None and self._credentials.secret is not None:
            from anywool.discovery.lan._lan import share_secret

            share_secret(discovery, self._credentials.secret)
        if any(obj is discovery for obj in taken_as_is):
            if id(discovery) in _ENTERED_BY_POOLS:
                raise RuntimeError(
                    f"{discovery!r} belongs to another WorkerPool, which entered it and will "
                    "exit it; give each pool its own, or enter it yourself (async with) and "
                    "give it to both"
                )
        elif _is_entered(discovery):
            _ENTERED_BY_POOLS.add(id(discovery))
            stack.callback(_ENTERED_BY_POOLS.discard, id(discovery))
        if isinstance(discovery, DiscoveryLike):
            owned: DiscoveryLike | None = discovery
            subscriber = discovery.subscriber
        else:
            owned, subscriber = None, discovery
        if owned is not None and count:
            namespace = getattr(owned, "namespace", None)
            tags = self._tags | ({namespace} if isinstance(namespace, str) else set())
            self._worker_namespace = namespace if isinstance(namespace, str) else None
            await self._supervisor.start(stack, count, self._backend or current_backend(), tags,
                                         self._recycling)
            await self._publishing.open(stack, owned, lambda: self._supervisor.workers)
        self._proxy = WorkerProxy(
            subscriber,
            loadbalancer=balancer,
            tags=self._tags or None,
            lazy=self._lazy,
            quorum=self._quorum,
            quorum_timeout=self._quorum_timeout,
            lease=self._lease,
            cancel_grace=self._cancel_grace,
            secret=None if self._credentials is None else self._credentials.secret,
            tls=None if self._credentials is None else self._credentials.tls,
            forward_output=self._forward_output,
            on_output=self._on_output,
        )
        self._supervisor.link(self._proxy, spawns=bool(count and owned is not None))
        await stack.enter_async_context(self._proxy)
        stack.push_async_callback(self._begin_exit)

    def _hurry(self) -> None:
        """A Ctrl-C during the exit: spend no more time waiting; end the workers now (their
        calls in flight fail), and let the exit's forceful steps reap them."""
        log.warning("exiting %r in a hurry (Ctrl-C): ending its workers now", self)
        self._announce_budget.exhaust()
        self._shutdown_budget.exhaust()
        self._supervisor.hurry()

    # -- exit ----------------------------------------------------------------------------------

    async def _begin_exit(self) -> None:
        """First steps of exit: stop taking calls, announce the drops, drain own calls."""
        proxy = self._proxy
        assert proxy is not None
        proxy.deactivate()
        self._supervisor.begin_exit()
        self._recycling.end_requests()
        await self._publishing.withdraw_all(lambda: self._supervisor.workers)
        with self._shutdown_budget.scope():
            await proxy.drain()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            with _ctrl_c.hurried(self._hurry):
                await stack.__aexit__(exc_type, exc, tb)
        except Exception:
            # A failure of the pool's own machinery is raised, also over a cancellation (which
            # it may have caused by cancelling its task groups); over the block's own
            # exception it is only logged.
            if exc is None or isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            log.exception("WorkerPool teardown failed while the block was raising")
        finally:
            self._proxy = None

    def __repr__(self) -> str:
        where = getattr(self._resolved, "namespace", None) if self._resolved is not None else None
        return f"WorkerPool(spawn={self._spawn!r}, namespace={where!r})"
