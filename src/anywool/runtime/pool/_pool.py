"""WorkerPool: spawn workers, announce them through discovery, dispatch routines to them.

The pool is an owner composed of smaller owners, entered in this order on one
:class:`~contextlib.AsyncExitStack` (so exactly what was entered is exited, once, in reverse):

1. the load balancer and the discovery, each resolved from its Factory form (what a form needs
   entering is entered here, by the pool, and by nobody else);
2. a task group hosting one *supervisor* task per spawned worker: it enters the
   :class:`LocalWorker`, replaces it if its process dies, and stops it when the pool exits;
3. the discovery publisher, which announces the spawned workers;
4. the :class:`WorkerProxy` over the discovery subscriber, which makes the pool the active
   dispatcher for ``@routine`` calls in the block.

Exit has two budgets. ``announce_timeout`` covers everything that waits on the namespace (the
drop announcements, the publisher's exit, the discovery's exit); ``shutdown_timeout`` covers the
calls (the pool's own in-flight calls, then the workers' drain). Each waiting step runs in the
caller's cancel scopes and gives up at its budget's end (logged with its ``TimeoutError``); what
must happen whatever (terminating and reaping every worker, removing files) is shielded. See
:mod:`anywool._teardown`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any
from uuid import UUID, uuid4

import anyio
from anyio.abc import TaskStatus

from anywool import _validate
from anywool._duration import seconds
from anywool._owner import SingleUse, exit_task_group
from anywool._teardown import Budget, ExitWithin
from anywool.discovery import DiscoveryLike, DiscoveryPublisherLike, DiscoverySubscriberLike
from anywool.errors import WorkerError
from anywool.runtime.client import _ctrl_c
from anywool.runtime.worker import _lifespan
from anywool.runtime import _output
from anywool.runtime.client._loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool._tls import MutualTLS
from anywool.runtime.pool._local_worker import (
    LocalWorker,
    check_recycling,
    current_backend,
    tcp_endpoint,
)
from anywool.runtime.worker._server import (
    IDLE_TIMEOUT,
    NOTICE_CALL,
    NOTICE_IDLE,
    NOTICE_RECYCLE,
    REPORT_CALL,
    SUPERVISED,
)
from anywool.runtime.worker._main import MAX_CONCURRENCY, RETIRING
from anywool.runtime._output import OutputLine
from anywool.runtime.client._proxy import WorkerProxy
from anywool.runtime.wire._stats import WorkerStats
from anywool.runtime.pool._template import Template, TemplateUnavailable
from anywool.runtime.client._resolve import expected_names, is_factory, resolved

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._pool")

#: The most workers one pool may spawn.
MAX_SPAWN = 1024
# A replacement that dies sooner than this after starting counts as failing at start-up; after
# this many such failures in a row its slot is given up.
_MIN_UPTIME = 2.0
_MAX_START_FAILURES = 3
# What _until_exit_or_stop says of a worker retired for idleness (not replaced).
_IDLE = "is idle"
_RESTART_BACKOFF = 0.1

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
        self._workers: list[LocalWorker] = []
        self._supervisors: anyio.abc.TaskGroup | None = None
        self._template: Template | None = None  # the warm template workers are forked from
        self._template_wanted = False
        self._keeper: anyio.abc.TaskGroup | None = None  # runs the template
        self._workers_stopped = anyio.Event()
        # Rolling restarts (recycle()): each running worker's "replace it" event, the events
        # recycle() waits on (set once that worker is gone), and why a replacement could not
        # start (the worker then stays).
        self._recycle_asked: dict[UUID, anyio.Event] = {}
        self._recycled: dict[UUID, anyio.Event] = {}
        self._recycle_failures: dict[UUID, BaseException | str] = {}
        self._recycling = anyio.Lock()
        # Recycle requests passed on by the workers (see _serve_recycle_requests).
        self._recycle_wanted = anyio.Event()
        self._requests: anyio.CancelScope | None = None  # around them, once the pool runs
        self._requests_ended = False
        # Idleness (idle_timeout): how many workers the pool runs when none is idle (its
        # spawn), whether a start to grow back is under way, the workers asked to report
        # their next call, and where the spawned workers' supervisors start.
        self._target = 0
        self._growing = False
        self._armed: set[UUID] = set()
        self._spawned_with: tuple[str, frozenset[str]] | None = None
        self._own: set[UUID] = set()
        self._proxy: WorkerProxy | None = None
        self._resolved: Any = None
        self._publisher: DiscoveryPublisherLike | None = None
        self._worker_namespace: str | None = None  # what spawned workers' spans name
        self._published = False
        self._publishing = anyio.Lock()
        self._exiting = False
        self._announcing: set[anyio.CancelScope] = set()
        self._stopping = anyio.Event()
        # Worker slots that have not been given up (nor closed by idleness: see idle_timeout).
        self._slots = 0
        self._ended: set[UUID] = set()  # workers this pool killed itself (see _end_stuck)
        self._starting: set[anyio.CancelScope] = set()  # around each worker start under way
        self._given_up: str | None = None  # why every slot was, once they all were
        self._announce_budget = Budget(self._announce_timeout)
        self._shutdown_budget = Budget(self._shutdown_timeout)

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
        return list(self._workers)

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
        async with self._recycling:
            for worker in list(self._workers):
                uid = worker.metadata.uid
                asked = self._recycle_asked.get(uid)
                if asked is None:  # gone meanwhile
                    continue
                done = self._recycled[uid] = anyio.Event()
                asked.set()
                await done.wait()
                failure = self._recycle_failures.pop(uid, None)
                if failure is not None:
                    raise WorkerError(f"pid {worker.pid}", f"recycling stopped: its "
                                      f"replacement failed to start: {failure}")

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
            await self._start_workers(stack, count, tags)
            publisher = self._publisher = await stack.enter_async_context(ExitWithin(
                resolved(owned.publisher, expect=DiscoveryPublisherLike,
                         name="discovery.publisher"), self._announce_budget))
            async with self._publishing:
                for worker in list(self._workers):
                    await publisher.publish("worker-added", worker.metadata)
                self._published = True
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
        self._proxy.set_own_workers(self._own)
        self._proxy.serve_pool(spawns=bool(count and owned is not None),
                               end_worker=self._end_stuck)
        if self._given_up is not None:
            self._proxy.slots_given_up(self._given_up)
        await stack.enter_async_context(self._proxy)
        stack.push_async_callback(self._begin_exit)

    async def _start_workers(self, stack: AsyncExitStack, count: int, tags: frozenset[str]) -> None:
        backend = self._backend or current_backend()
        # The warm template (see _template): its task group is entered before the supervisors,
        # so exited after them (the template outlives the workers it forked).
        # Entered and exited as the supervisors are (exit_task_group): given the exception of
        # the pool's block, a task group would re-raise it in a group (trio: a Ctrl-C's
        # KeyboardInterrupt ended a script as an exception group, exit code 1).
        keeper = self._keeper = anyio.create_task_group()
        await keeper.__aenter__()
        # Cancelled: a warm-up under way is not waited for.
        stack.push_async_callback(exit_task_group, keeper)
        stack.callback(self._workers_stopped.set)
        # More workers than CPUs: forking them all from one warm interpreter beats starting as
        # many interpreters side by side. Otherwise those start faster side by side than after
        # a template, which is then started when the pool first starts a worker again (a
        # replacement, a recycle): a pool that never does pays nothing for it.
        if count > (os.cpu_count() or 1):
            self._template_wanted = True
            await keeper.start(self._keep_template, backend)
        supervisors = self._supervisors = anyio.create_task_group()
        await supervisors.__aenter__()

        async def stop_supervisors() -> None:
            self._stopping.set()
            self._end_recycle_requests()
            self._stop_starting()  # a replacement starting (its lifespan, say) is not waited for
            await exit_task_group(supervisors, cancel=False)  # they stop their workers

        stack.push_async_callback(stop_supervisors)
        failures: list[BaseException] = []

        async def start_one(starters: anyio.abc.TaskGroup) -> None:
            try:
                await supervisors.start(self._supervise, backend, tags)
            except Exception as exc:
                failures.append(exc)
                starters.cancel_scope.cancel()

        self._slots = self._target = count
        self._spawned_with = (backend, tags)
        supervisors.start_soon(self._serve_recycle_requests)
        async with anyio.create_task_group() as starters:
            for _ in range(count):
                starters.start_soon(start_one, starters)
        if failures:
            raise failures[0]

    def _want_template(self, backend: str) -> None:
        """Start the warm template, once (the worker starting now does not wait for it)."""
        if not self._template_wanted and self._keeper is not None:
            self._template_wanted = True
            self._keeper.start_soon(self._keep_template, backend)

    async def _keep_template(self, backend: str, *,
                             task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the pool's warm template until its workers have stopped (started once it is
        warm, or known unavailable: workers then start as processes of their own)."""
        try:
            async with Template(backend, self._startup_timeout) as template:
                self._template = template
                task_status.started()
                try:
                    # Shielded: the pool's cancellation (a deadline, a Ctrl-C) does not end it
                    # while the workers it forked are being stopped (it says how they end).
                    with anyio.CancelScope(shield=True):
                        await self._workers_stopped.wait()
                finally:
                    self._template = None
        except TemplateUnavailable as exc:
            log.info("no warm template (%s): workers start as processes of their own", exc)
            task_status.started()

    # -- supervision ---------------------------------------------------------------------------

    async def _supervise(
        self, backend: str, tags: frozenset[str], *, replacing: bool = False,
        task_status: TaskStatus[LocalWorker]
    ) -> None:
        """Run one worker slot: start a worker, replace it when its process dies, stop it when
        the pool exits, hand the slot to a new supervisor when it retires. The first start's
        failure is the caller's (``task_status``); ``replacing``: the new worker is announced
        before the caller hears of it (it replaces a retiring one)."""
        started = False
        start_failures = 0
        while not (self._stopping.is_set() or self._exiting):
            credentials = self._credentials
            worker = LocalWorker(backend=backend, tags=tags, startup_timeout=self._startup_timeout,
                                 shutdown_timeout=self._shutdown_timeout,
                                 max_concurrency=self._max_concurrency, host=self._host,
                                 secret=None if credentials is None else credentials.secret,
                                 tls=None if credentials is None else credentials.tls,
                                 namespace=self._worker_namespace,
                                 output_level=self._spawned_output_level(),
                                 lifespan=self._lifespan, max_calls=self._max_calls,
                                 max_memory=self._max_memory,
                                 extra={POOL_EXTRA: self._pool_id})
            if started or replacing:
                self._want_template(backend)
            worker.fork_from(self._template)
            born = anyio.current_time()  # again once it is up
            try:
                # The pool's exit (or a Ctrl-C) cancels a start under way: a worker's start
                # may take up to startup_timeout (its lifespan's entry), which no exit waits for.
                with anyio.CancelScope() as starting:
                    self._starting.add(starting)
                    try:
                        async with worker:
                            self._starting.discard(starting)
                            # Before it is announced: a recycle request is passed on from then.
                            await worker.tell(SUPERVISED)
                            if self._idle_timeout is not None:
                                await worker.tell(f"{IDLE_TIMEOUT} {self._idle_timeout!r}")
                            born = anyio.current_time()
                            self._own.add(worker.metadata.uid)
                            self._own_changed()
                            self._workers.append(worker)
                            self._adopted(worker)
                            uid = worker.metadata.uid
                            self._arm()
                            try:
                                if started or replacing:
                                    await self._announce(worker, "worker-added")
                                if not started:
                                    started = True
                                    task_status.started(worker)
                                while True:
                                    asked = self._recycle_asked[uid] = anyio.Event()
                                    code, retiring = await self._until_exit_or_stop(worker, asked)
                                    if retiring is None:
                                        break
                                    if await self._retire(worker, retiring, backend, tags,
                                                          recycling=asked.is_set(),
                                                          replace=retiring != _IDLE):
                                        return
                            finally:
                                self._workers.remove(worker)
                                self._armed.discard(uid)
                                self._recycle_asked.pop(uid, None)
                                recycled = self._recycled.pop(uid, None)
                                if recycled is not None:
                                    recycled.set()
                            if code is None:  # the pool is exiting
                                await worker.stop(self._shutdown_budget.left)
                                return
                            if worker.metadata.uid in self._ended:
                                self._ended.discard(worker.metadata.uid)
                                log.info("worker pid %s ended (code %s); replacing it",
                                         worker.pid, code)
                            else:
                                log.warning("worker pid %s exited unexpectedly (code %s); "
                                            "replacing it", worker.pid, code)
                            await self._announce(worker, "worker-dropped")
                            self._own.discard(worker.metadata.uid)
                            self._own_changed()
                    finally:
                        self._starting.discard(starting)
                if starting.cancelled_caught:
                    return  # the pool exits: nothing was started
            except Exception as exc:  # a supervisor never ends the pool's task group
                if not started:
                    raise
                reason: BaseException | str = exc
            else:
                uptime = anyio.current_time() - born
                if uptime >= _MIN_UPTIME:
                    start_failures = 0
                    continue
                reason = f"it exited {uptime:.2f} s after starting"
            start_failures += 1
            if start_failures >= _MAX_START_FAILURES:
                self._give_up_slot(start_failures, reason)
                return
            with anyio.move_on_after(_RESTART_BACKOFF * 2 ** (start_failures - 1)):
                await self._stopping.wait()

    def _stop_starting(self) -> None:
        """Cancel the worker starts under way (a cancelled start kills and reaps its process)."""
        for scope in list(self._starting):
            scope.cancel()

    def _hurry(self) -> None:
        """A Ctrl-C during the exit: spend no more time waiting; end the workers now (their
        calls in flight fail), and let the exit's forceful steps reap them."""
        log.warning("exiting %r in a hurry (Ctrl-C): ending its workers now", self)
        self._announce_budget.exhaust()
        self._shutdown_budget.exhaust()
        self._stop_starting()
        for worker in self._workers:
            self._ended.add(worker.metadata.uid)
            worker.kill()

    def _end_stuck(self, uid: UUID) -> None:
        """End a spawned worker that did not take a cancellation in time (its supervisor then
        replaces it, as it does any worker that dies)."""
        for worker in self._workers:
            if worker.metadata.uid == uid:
                log.warning("ending worker pid %s (SIGKILL): a routine holds its event loop "
                            "past a cancellation; it is replaced", worker.pid)
                self._ended.add(uid)
                worker.kill()
                return

    def _own_changed(self) -> None:
        if self._proxy is not None:
            self._proxy.set_own_workers(self._own)

    async def _retire(self, worker: LocalWorker, reason: str, backend: str,
                      tags: frozenset[str], *, recycling: bool, replace: bool = True) -> bool:
        """Replace ``worker``: start its replacement in a supervisor of its own, wait until
        this pool's proxy is connected to it, then withdraw ``worker`` and let its calls
        finish, however long they take (it then exits by itself); the pool's exit stops it as
        any worker, its calls drained within what is left of ``shutdown_timeout``. Whether it
        was replaced: a worker that retires by itself (it takes no new calls) is withdrawn even
        when no replacement starts (its slot is given up); one that ``recycling`` replaces
        stays when none starts (the reason is kept for :meth:`recycle`). Without ``replace``
        (an idle worker, its slot closed already), it is withdrawn and stopped alone."""
        replacement: LocalWorker | None = None
        failure: BaseException | str = ""
        if not replace:
            log.info("worker pid %s was idle for %s; retiring it (%d workers left)",
                     worker.pid, seconds(self._idle_timeout), self._slots)
        else:
            log.info("worker pid %s %s; replacing it", worker.pid, reason)
            async with anyio.create_task_group() as notices:
                # It still answers requests meanwhile: a recycle request is passed on.
                notices.start_soon(self._pass_on_recycle_requests, worker)
                replacement, failure = await self._start_replacement(backend, tags,
                                                                     give_up=not recycling)
                if replacement is not None:
                    await self._until_proxy_has(replacement)
                notices.cancel_scope.cancel()
        if (replace and replacement is None and recycling
                and not (self._stopping.is_set() or self._exiting)):
            uid = worker.metadata.uid
            self._recycle_failures[uid] = failure
            done = self._recycled.pop(uid, None)
            if done is not None:
                done.set()
            return False
        await self._announce(worker, "worker-dropped")
        self._own.discard(worker.metadata.uid)
        self._own_changed()
        if not self._stopping.is_set():
            async with anyio.create_task_group() as tg:

                async def until_stopping() -> None:
                    await self._stopping.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(until_stopping)
                await worker.drain()
                tg.cancel_scope.cancel()
        await worker.stop(self._shutdown_budget.left)
        return True

    async def _pass_on_recycle_requests(self, worker: LocalWorker) -> None:
        """Read ``worker``'s notices (until it ends, or this is cancelled), passing on its
        recycle requests; the others are moot once it is being replaced."""
        while (said := await worker.notice()) is not None:
            if said == NOTICE_RECYCLE and not (self._stopping.is_set() or self._exiting):
                self._recycle_wanted.set()

    async def _until_proxy_has(self, worker: LocalWorker) -> None:
        """Wait (within ``startup_timeout``) until this pool's proxy is connected to
        ``worker``, so that its calls have somewhere to go before the worker it replaces stops
        taking them."""
        if self._proxy is not None:
            await self._proxy.until_connected(worker.metadata.uid, self._startup_timeout)

    async def _start_replacement(self, backend: str, tags: frozenset[str], *, give_up: bool
                                 ) -> tuple[LocalWorker | None, BaseException | str]:
        """Start a supervisor whose worker replaces another, once it is up and announced:
        the new worker, or ``None`` and why not. Retried with the slot's back-off; after
        :data:`_MAX_START_FAILURES` failed starts in a row the slot is given up if
        ``give_up``."""
        supervisors = self._supervisors
        assert supervisors is not None  # a worker retires only once the supervisors run
        reason: BaseException | str = "the pool is exiting"
        for failures in range(1, _MAX_START_FAILURES + 1):
            if self._stopping.is_set() or self._exiting:
                return None, "the pool is exiting"
            try:
                worker: LocalWorker = await supervisors.start(
                    functools.partial(self._supervise, backend, tags, replacing=True))
                return worker, ""
            except Exception as exc:
                if self._stopping.is_set():
                    return None, "the pool is exiting"  # its start was cancelled by the exit
                reason = exc
                log.warning("a replacement worker failed to start (%d of %d): %s", failures,
                            _MAX_START_FAILURES, exc)
            with anyio.move_on_after(_RESTART_BACKOFF * 2 ** (failures - 1)):
                await self._stopping.wait()
        if give_up:
            self._give_up_slot(_MAX_START_FAILURES, reason)
        return None, reason

    def _give_up_slot(self, failures: int, reason: BaseException | str) -> None:
        log.error("giving up a worker slot of %r after %d failed starts in a row; last: %s",
                  self, failures, reason)
        self._slots -= 1
        if not self._slots:
            self._given_up = (f"every worker slot of this pool was given up after {failures} "
                              f"failed starts in a row (the last: {reason})")
            if self._proxy is not None:
                self._proxy.slots_given_up(self._given_up)

    async def _until_exit_or_stop(self, worker: LocalWorker, asked: anyio.Event
                                  ) -> tuple[int | None, str | None]:
        """The worker's exit code if its process ends by itself, or why it is to be replaced
        (it retires, see :meth:`LocalWorker.retiring`, or ``asked`` was set by
        :meth:`recycle`); ``(None, None)`` if the pool stops."""
        code: int | None = None
        retiring: str | None = None
        async with anyio.create_task_group() as tg:

            async def watch_recycle() -> None:
                nonlocal retiring
                await asked.wait()
                retiring = "is recycled (pool.recycle())"
                tg.cancel_scope.cancel()

            async def watch_process() -> None:
                nonlocal code
                code = await worker.wait()
                tg.cancel_scope.cancel()

            async def watch_notices() -> None:
                nonlocal retiring
                while (said := await worker.notice()) is not None:
                    if self._stopping.is_set() or self._exiting:
                        continue
                    if said.startswith(RETIRING):
                        retiring = f"retires: {said[len(RETIRING):]}"
                        tg.cancel_scope.cancel()
                        return
                    if said == NOTICE_RECYCLE:
                        log.info("worker pid %s passed on a recycle request", worker.pid)
                        self._recycle_wanted.set()
                    elif said == NOTICE_IDLE and self._idle_timeout is not None:
                        if (self._slots > self._min_workers
                                and self._running_besides(worker) >= self._min_workers):
                            self._slots -= 1  # now: the next idle worker sees one fewer
                            retiring = _IDLE
                            tg.cancel_scope.cancel()
                            self._arm()
                            return
                        log.debug("worker pid %s is idle; kept (min_workers=%d)", worker.pid,
                                  self._min_workers)
                    elif said == NOTICE_CALL:
                        self._armed.discard(worker.metadata.uid)
                        self._grow()

            async def watch_pool() -> None:
                await self._stopping.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_process)
            tg.start_soon(watch_pool)
            tg.start_soon(watch_notices)
            tg.start_soon(watch_recycle)
        if self._stopping.is_set():
            return None, None
        return code, None if code is not None else retiring

    # -- idleness and growth back (idle_timeout) ------------------------------------------------

    def _running_besides(self, worker: LocalWorker) -> int:
        """How many other spawned workers are up and not withdrawn (a slot whose worker is
        being restarted after a crash has none)."""
        return sum(1 for other in self._workers
                   if other is not worker and other.metadata.uid in self._own)

    def _arm(self) -> None:
        """While the pool runs fewer than its spawn of workers, ask each running worker not
        asked yet to report its next call (it then says ``call`` once: see :meth:`_grow`)."""
        supervisors = self._supervisors
        if (self._idle_timeout is None or supervisors is None or self._slots >= self._target
                or self._stopping.is_set() or self._exiting):
            return
        for worker in self._workers:
            uid = worker.metadata.uid
            if uid not in self._armed and uid in self._own:
                self._armed.add(uid)
                supervisors.start_soon(worker.tell, REPORT_CALL)

    def _grow(self) -> None:
        """A worker took a call while asked to report one: start one more worker, if the pool
        runs fewer than its spawn and no such start is under way."""
        supervisors = self._supervisors
        if (self._growing or supervisors is None or self._spawned_with is None
                or self._slots >= self._target or self._stopping.is_set() or self._exiting):
            return
        self._growing = True
        supervisors.start_soon(self._grow_one, *self._spawned_with)

    async def _grow_one(self, backend: str, tags: frozenset[str]) -> None:
        try:
            log.info("a call came with %d of %d workers running; starting one more",
                     self._slots, self._target)
            worker, failure = await self._start_replacement(backend, tags, give_up=False)
            if worker is not None:
                self._slots += 1
            elif not (self._stopping.is_set() or self._exiting):
                log.warning("a worker to grow back to %d could not start: %s", self._target,
                            failure)
        finally:
            self._growing = False
        self._arm()

    # -- recycle requests ----------------------------------------------------------------------

    async def _serve_recycle_requests(self) -> None:
        """Run :meth:`recycle` for the requests the workers pass on, one at a time: those that
        come during one are taken after it, once. Ends when the pool exits (a recycle under
        way is cancelled between workers)."""
        with anyio.CancelScope() as self._requests:
            if self._requests_ended:
                return
            while True:
                await self._recycle_wanted.wait()
                self._recycle_wanted = anyio.Event()
                await self._recycle_requested()

    def _end_recycle_requests(self) -> None:
        self._requests_ended = True
        if self._requests is not None:
            self._requests.cancel()

    async def _announce(self, worker: LocalWorker, kind: str) -> None:
        """Publish one worker's change, once the initial announcement has been made."""
        async with self._publishing:
            if not self._published or self._publisher is None or self._exiting:
                return
            # The exit abandons an announcement under way (it announces every drop itself).
            with anyio.CancelScope() as scope:
                self._announcing.add(scope)
                try:
                    with anyio.fail_after(self._announce_timeout):
                        await self._publisher.publish(kind, worker.metadata)  # type: ignore[arg-type]
                except Exception:
                    log.warning("announcing %s for %s failed", kind, worker.metadata,
                                exc_info=True)
                finally:
                    self._announcing.discard(scope)

    # -- exit ----------------------------------------------------------------------------------

    async def _begin_exit(self) -> None:
        """First steps of exit: stop taking calls, announce the drops, drain own calls."""
        proxy = self._proxy
        assert proxy is not None
        proxy.deactivate()
        self._exiting = True
        self._end_recycle_requests()
        for scope in self._announcing:
            scope.cancel()
        if self._publisher is not None and self._announce_timeout > 0:
            try:
                with self._announce_budget.scope(fail=True):
                    async with self._publishing:
                        publisher, self._published = self._publisher, False
                        for worker in list(self._workers):
                            await publisher.publish("worker-dropped", worker.metadata)
            except TimeoutError:
                log.warning("announcing the dropped workers of %r gave up after %s; "
                            "stopping them anyway", self, seconds(self._announce_timeout), exc_info=True)
            except Exception:
                log.warning("announcing the dropped workers of %r failed; stopping them anyway",
                            self, exc_info=True)
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
