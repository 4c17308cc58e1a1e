"""WorkerProxy: dispatch routines to the workers a discovery subscriber reports.

The proxy is an owner. Its task group holds the *sentinel* (the one task iterating the
subscriber) and one task per admitted worker, which connects to that worker and keeps a
:class:`~anywool.lowlevel.WorkerConnection` open until the worker is dropped or the
proxy exits, reconnecting with backoff when the connection is lost while the worker is still
announced; every connection is entered and exited in that one task. Callers only send frames and
wait for their call's.

The subscriber is consumed as given: the proxy iterates it and never enters, exits or resolves
it, so whoever created it owns its lifetime (a :class:`~anywool.WorkerPool` for the
subscribers it resolves). A subscriber whose iteration raises (for example
:class:`~anywool.errors.DiscoveryNamespaceNotFound`) fails the quorum wait and every waiting and
later dispatch with that exception at once.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar, overload
from uuid import UUID

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from anywool import _validate
from anywool._duration import seconds
from anywool._owner import SingleUse, exit_task_group
from anywool._tls import MutualTLS
from anywool.discovery import DiscoveryEvent, DiscoverySubscriberLike, afilter
from anywool.errors import AuthenticationError, NoWorkersAvailable, WorkerError
from anywool.metadata import WorkerMetadata
from anywool.runtime import _output, _telemetry
from anywool.runtime._map import MAX_IN_FLIGHT, MapResults
from anywool.runtime._output import OutputLine
from anywool.runtime._routine import reset_active, set_active
from anywool.runtime.client._call import Call, CallNotDelivered, WorkerBusy, drive_stream
from anywool.runtime.client._connection import WorkerConnection
from anywool.runtime.client._loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool.runtime.client._resolve import is_context_manager
from anywool.runtime.client._room import RoomQueue
from anywool.runtime.wire import _auth
from anywool.runtime.wire import _serializer as serializer
from anywool.runtime.wire._envelope import Origin
from anywool.runtime.wire._frames import FrameError
from anywool.runtime.wire._stats import WorkerStats

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._proxy")

# Reconnection backoff after a lost connection to a worker that is still announced (seconds).
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 2.0
_REJECTED_BACKOFF_MAX = 30.0
# At exit, how long calls still running after the drain get to acknowledge their cancellation.
_CANCEL_AT_EXIT = 1.0
# Once the quorum is met, how long at most the first dispatch also waits for the first
# connections to the other admitted workers, and to the pool's own (seconds): so that the first
# calls spread over the pool, rather than all go to the worker that happened to connect first.
_SETTLE = 0.25

T = TypeVar("T")
R = TypeVar("R")


class SharesATag:
    """A picklable predicate: the worker carries at least one of ``tags``."""

    __slots__ = ("tags",)

    def __init__(self, tags: Iterable[str]) -> None:
        self.tags = frozenset(tags)

    def __call__(self, metadata: WorkerMetadata) -> bool:
        return not self.tags.isdisjoint(metadata.tags)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SharesATag, (self.tags,))

    def __repr__(self) -> str:
        return f"SharesATag({sorted(self.tags)!r})"


class _Admitted:
    """One admitted worker: its latest metadata and the wake-up of its connection task."""

    def __init__(self, metadata: WorkerMetadata) -> None:
        self.metadata = metadata
        self.dropped = False
        self.wakeup = anyio.Event()


class _InFlight:
    """Counts the steps awaiting a worker's answer, so an exit can drain them."""

    def __init__(self) -> None:
        self.count = 0
        self.idle: anyio.Event | None = None

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(self, *exc_info: object) -> None:
        self.count -= 1
        if self.count == 0 and self.idle is not None:
            self.idle.set()

    async def wait_idle(self) -> None:
        while self.count:
            self.idle = anyio.Event()
            await self.idle.wait()


class _NotGiven(enum.Enum):
    """The default of WorkerProxy's two ways to give its discovery (``None`` is a bad value)."""

    NOT_GIVEN = enum.auto()


_NOT_GIVEN = _NotGiven.NOT_GIVEN


def _one_discovery(positional: object, keyword: object) -> object:
    """The discovery given to WorkerProxy, positionally or as ``discovery=``; exactly one."""
    if keyword is _NOT_GIVEN:
        if positional is _NOT_GIVEN:
            raise TypeError(
                "WorkerProxy needs its discovery: a subscriber instance, WorkerProxy(subscriber) "
                "or WorkerProxy(discovery=subscriber), or a pool URI, WorkerProxy(namespace, "
                "*tags)"
            )
        return positional
    if positional is not _NOT_GIVEN:
        raise TypeError(
            "WorkerProxy takes its discovery once, positionally or as discovery=, got both "
            f"{positional!r} and discovery={keyword!r}"
        )
    if isinstance(keyword, str):
        raise TypeError(
            "discovery must be a DiscoverySubscriberLike instance, got the str "
            f"{keyword!r}; a pool URI is given positionally: WorkerProxy({keyword!r})"
        )
    return keyword


class WorkerProxy(SingleUse):
    """Dispatch routines to the workers reported by a discovery subscriber.

    ``async with WorkerProxy(subscriber):`` makes this proxy the active one for routines called
    in the block (and in tasks started from it).

    Two ways to say where the workers are, exactly one of them:

    - ``WorkerProxy(subscriber)`` or ``WorkerProxy(discovery=subscriber)``: any
      :class:`~anywool.DiscoverySubscriberLike` *instance*, iterated and never entered (enter a
      context-manager subscriber where its lifetime is owned, e.g. by giving it to a
      :class:`~anywool.WorkerPool`);
    - ``WorkerProxy("jobs", "gpu", ...)`` (*pool URI*, positional only): borrows
      ``LocalDiscovery.Subscriber("jobs")`` and admits exactly the workers whose tags share at
      least one of ``{"jobs", "gpu", ...}`` (a pool tags its workers with its namespace). It
      claims nothing: with no live owner of ``"jobs"`` it fails with
      :class:`~anywool.errors.DiscoveryNamespaceNotFound`.

    :param subscriber_or_namespace: (positional only) a subscriber instance, or a namespace
        (``str``) for the pool-URI form.
    :param uri_tags: more tags for the pool-URI form (``str``).
    :param discovery: (keyword only) a subscriber instance; the same as giving it positionally.
    :param loadbalancer: chooses the worker per call (default: a new
        :class:`~anywool.RoundRobinLoadBalancer`).
    :param tags: further, admit only workers whose tags include all of these (``None``: no
        such condition).
    :param lazy: ``False``: entering waits until ``quorum`` admitted workers are connected;
        ``True``: the first dispatch waits for them instead.
    :param quorum: connected workers (``int`` ≥ 1) needed before the first dispatch.
    :param quorum_timeout: seconds (≥ 0) the quorum wait, and later any dispatch finding no
        connected worker, waits.
    :param lease: admit at most this many workers (``int`` ≥ 0; ``None``: no limit); a worker
        over the lease waits its turn and is admitted when an admitted one leaves.
    :param connect_timeout: seconds (> 0) allowed to connect to one worker.
    :param cancel_timeout: seconds (> 0) a cancelled call waits for its routine to unwind,
        once its worker took the cancellation.
    :param cancel_grace: seconds (> 0) a cancelled call waits for its worker to take the
        cancellation. A worker whose event loop a routine holds so that it cannot be
        interrupted (C code holding the GIL, a routine that catches the interruption and goes
        on) is then counted as stuck: the call is given up (its caller resumes), and a pool ends
        and replaces the worker if it spawned it.
    :param secret: the shared secret to authenticate with to TCP workers, ``bytes`` or ``str``
        of at least 16 bytes (``None``: this process's own: ``$ANYWOOL_SECRET``, or on a worker
        the one its pool handed it).
    :param tls: mutual TLS (:class:`~anywool.MutualTLS`) for TCP workers (``None``: on a
        worker, its own).
    :param forward_output: whether what routines log and print is sent back here (see
        "Worker output at the caller" in the README): their ``logging`` records are handled
        by this process's loggers, their lines go to ``on_output``. ``False``: it stays on the
        workers' stderr. A routine's own calls to routines forward as its call does.
    :param on_output: called with each :class:`~anywool.OutputLine` a routine writes
        (synchronously, from the connection's reader: it must not block; an exception it
        raises is logged once, and the line is lost); ``None``: the line is written to this
        process's ``sys.stderr`` as ``[routine uid8 pid N] text``.
    :raises TypeError: the discovery is a class, a callable, or neither a subscriber nor a
        ``str`` (``discovery=`` takes no ``str``: a pool URI is positional); it is given both
        positionally and as ``discovery=``, or neither way; ``uri_tags`` are given with a
        subscriber or are not ``str``; ``loadbalancer`` is not a ``LoadBalancerLike`` instance;
        ``tags`` is a ``str``; a count is not an ``int``; ``forward_output`` is not a
        ``bool``, or ``on_output`` neither callable nor ``None``, or a coroutine function.
    :raises ValueError: a timeout or count is out of range, ``secret`` is too short, or
        ``on_output`` is given with ``forward_output=False``.

    A TCP worker is used only once both sides have authenticated (see
    :mod:`anywool.runtime.wire._auth`); one that fails is retried with backoff while it is
    announced. When every admitted worker failed authentication and none is connected, a
    dispatch raises the latest :class:`~anywool.errors.AuthenticationError` at once.

    Entering raises ``RuntimeError`` on a second entry; with ``lazy=False`` it raises the
    subscriber's error (e.g. :class:`~anywool.errors.DiscoveryNamespaceNotFound`) as soon as the
    iteration fails, and ``TimeoutError`` when the quorum is not met within ``quorum_timeout``.
    Exiting stops the proxy taking calls, cancels the calls still in flight (they raise
    :class:`~anywool.errors.RoutineCancelled`, or :class:`~anywool.errors.WorkerError` if the
    worker does not answer), stops the sentinel and closes every connection; it is bounded and
    never raises an ``Exception``.

    A proxy pickles as its constructor call (so a routine can carry it to a worker), unless its
    subscriber is a context manager: that raises ``TypeError`` naming ``discovery``, since a
    context manager's lifetime cannot travel. Its credentials never travel: the proxy rebuilt
    on a worker authenticates with that worker's own.
    """

    @overload
    def __init__(
        self,
        subscriber_or_namespace: DiscoverySubscriberLike | str,
        /,
        *uri_tags: str,
        loadbalancer: LoadBalancerLike | None = ...,
        tags: Iterable[str] | None = ...,
        lazy: bool = ...,
        quorum: int = ...,
        quorum_timeout: float = ...,
        lease: int | None = ...,
        connect_timeout: float = ...,
        cancel_timeout: float = ...,
        cancel_grace: float = ...,
        secret: bytes | str | None = ...,
        tls: MutualTLS | None = ...,
        forward_output: bool = ...,
        on_output: Callable[[OutputLine], object] | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self,
        /,
        *,
        discovery: DiscoverySubscriberLike,
        loadbalancer: LoadBalancerLike | None = ...,
        tags: Iterable[str] | None = ...,
        lazy: bool = ...,
        quorum: int = ...,
        quorum_timeout: float = ...,
        lease: int | None = ...,
        connect_timeout: float = ...,
        cancel_timeout: float = ...,
        cancel_grace: float = ...,
        secret: bytes | str | None = ...,
        tls: MutualTLS | None = ...,
        forward_output: bool = ...,
        on_output: Callable[[OutputLine], object] | None = ...,
    ) -> None: ...

    def __init__(
        self,
        subscriber_or_namespace: DiscoverySubscriberLike | str | _NotGiven = _NOT_GIVEN,
        /,
        *uri_tags: str,
        discovery: DiscoverySubscriberLike | _NotGiven = _NOT_GIVEN,
        loadbalancer: LoadBalancerLike | None = None,
        tags: Iterable[str] | None = None,
        lazy: bool = True,
        quorum: int = 1,
        quorum_timeout: float = 10.0,
        lease: int | None = None,
        connect_timeout: float = 10.0,
        cancel_timeout: float = 5.0,
        cancel_grace: float = 1.0,
        secret: bytes | str | None = None,
        tls: MutualTLS | None = None,
        forward_output: bool = True,
        on_output: Callable[[OutputLine], object] | None = None,
    ) -> None:
        where = _one_discovery(subscriber_or_namespace, discovery)
        self._uri: str | None = None
        self._uri_tags = _validate.tag_set("uri_tags", uri_tags)
        if isinstance(where, str):
            from anywool.discovery import LocalDiscovery

            self._uri = where
            source = LocalDiscovery.Subscriber(where)
            subscriber: DiscoverySubscriberLike = afilter(
                SharesATag({where, *self._uri_tags}), source)
        else:
            if uri_tags:
                raise TypeError(
                    "extra positional tags belong to the pool-URI form WorkerProxy(namespace, "
                    f"*tags); with a subscriber, pass tags=..., got {uri_tags!r}"
                )
            subscriber = source = _check_subscriber(where)
        # What a NoWorkersAvailable says: the namespace, and why (see _why_none).
        self._source: object = source
        self._namespace = getattr(source, "namespace", None)
        if not isinstance(self._namespace, str):
            self._namespace = None
        if loadbalancer is None:
            loadbalancer = RoundRobinLoadBalancer()
        elif isinstance(loadbalancer, type) or not isinstance(loadbalancer, LoadBalancerLike):
            raise TypeError(
                f"loadbalancer must be a LoadBalancerLike instance, got {loadbalancer!r}"
            )
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy must be a bool, got {lazy!r}")
        self._discovery = subscriber
        self._balancer = loadbalancer
        self._picks = type(loadbalancer) is RoundRobinLoadBalancer
        self._tags = None if tags is None else _validate.tag_set("tags", tags)
        self._lazy = lazy
        self._quorum = _validate.count("quorum", quorum, upper=1 << 20)
        self._quorum_timeout = _validate.duration("quorum_timeout", quorum_timeout, allow_zero=True)
        self._lease = None if lease is None else _validate.count("lease", lease, lower=0,
                                                                   upper=1 << 20)
        self._connect_timeout = _validate.duration("connect_timeout", connect_timeout,
                                                   allow_zero=False)
        self._cancel_timeout = _validate.duration("cancel_timeout", cancel_timeout,
                                                  allow_zero=False)
        self._cancel_grace = _validate.duration("cancel_grace", cancel_grace, allow_zero=False)
        self._output = _output.check_options(forward_output, on_output)
        # Set by a pool: ends one of its own workers, stuck (see cancel_grace).
        self._end_worker: Callable[[UUID], object] | None = None
        self._credentials = _auth.Credentials.resolve(secret, tls)
        self._active = False
        self._task_group: TaskGroup | None = None
        self._token: Any = None
        # Workers a pool spawned itself: admitted whatever the lease (the pool keeps this set).
        self._own: set[UUID] = set()
        self._admitted: dict[UUID, _Admitted] = {}
        self._ever_admitted = False
        # Workers published but not admitted, for want of a tag of ``tags``.
        self._excluded: dict[UUID, frozenset[str]] = {}
        # Set by a pool: whether it spawns workers (None: not a pool's), and why it has none left
        # (its slots were given up).
        self._spawns: bool | None = None
        self._given_up: str | None = None
        self._owned_at: tuple[float, bool | None] | None = None  # when the owner was asked
        self._waiting: dict[UUID, WorkerMetadata] = {}  # over the lease, in arrival order
        self._ready: dict[UUID, tuple[WorkerMetadata, WorkerConnection]] = {}
        # Connections to workers withdrawn while calls of ours ran on them, kept until those
        # end: the exit cancels them there too (see _close).
        self._withdrawn: set[WorkerConnection] = set()
        self._ready_list: list[tuple[WorkerMetadata, WorkerConnection]] = []
        self._connecting = 0  # admitted workers whose first connection attempt is under way
        # Admitted workers whose latest connection failed authentication, and with what.
        self._rejected: dict[UUID, AuthenticationError] = {}
        self._quorum_met = False
        self._discovery_ended = False
        self._failure: BaseException | None = None
        self._changed = anyio.Event()
        self._in_flight = _InFlight()
        # Calls that no worker can take now, waiting for room (see _deliver).
        self._room_queue = RoomQueue()
        # What calls carry so that their routines can call routines (see runtime.worker._nested):
        # this proxy's pickle and a digest of it, its key, made once (again when the pool's own
        # workers change). Proxies that pickle alike share one proxy on each worker.
        self._origin_key = b""
        self._origin_blob: bytes | None = None
        self._origin_unpicklable = False
        self._nested = False

    @property
    def discovery(self) -> DiscoverySubscriberLike:
        """The subscriber this proxy iterates."""
        return self._discovery

    @property
    def workers(self) -> list[WorkerMetadata]:
        """The admitted workers that currently have an open connection."""
        return [metadata for metadata, _ in self._ready.values()]

    # -- lifetime ------------------------------------------------------------------------------

    async def __aenter__(self) -> WorkerProxy:
        self._enter_once()
        task_group = self._task_group = anyio.create_task_group()
        await task_group.__aenter__()
        task_group.start_soon(self._sentinel, name="anywool-proxy-sentinel")
        self._active = True
        if not self._lazy:
            try:
                await self._wait_for_quorum(at_entry=True)
            except BaseException:
                self._active = False
                await self._close()
                raise
        self._token = set_active(self)
        _telemetry.watch(self)  # its workers counted until it deactivates
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.deactivate()
        await self._close()

    def deactivate(self) -> None:
        """Stop taking calls (a later dispatch raises ``RuntimeError``) and stop following
        discovery; calls in flight go on. Exiting does this first; a pool calls it earlier, so
        that its own drop announcements do not cut its calls short. Idempotent."""
        if not self._active:
            return
        self._active = False
        _telemetry.watch(self, False)
        if self._token is not None:
            try:
                reset_active(self._token)
            except ValueError:
                log.warning("WorkerProxy exited in another context than it was entered in")
            self._token = None
        self._notify()

    async def drain(self) -> None:
        """Wait until no call of this proxy awaits a worker (bound it with a cancel scope)."""
        await self._in_flight.wait_idle()

    async def _close(self) -> None:
        if self._in_flight.count:
            # Ask each worker to cancel what is still running, so those calls end typed
            # (RoutineCancelled) rather than by the connection closing under them.
            with anyio.CancelScope(shield=True), anyio.move_on_after(
                min(self._cancel_timeout, _CANCEL_AT_EXIT)
            ):
                for connection in [c for _, c in self._ready.values()] + list(self._withdrawn):
                    await connection.cancel_all()
                await self._in_flight.wait_idle()
        task_group, self._task_group = self._task_group, None
        await exit_task_group(task_group)

    # -- discovery -----------------------------------------------------------------------------

    def _notify(self) -> None:
        self._ready_list = list(self._ready.values())
        self._changed.set()
        self._changed = anyio.Event()
        self._room_queue.workers_changed(self._ready_list)

    async def _sentinel(self) -> None:
        try:
            async for event in self._discovery:
                if _telemetry.state is not None:
                    _telemetry.state.discovery_event(self._namespace, event.type)
                self._handle(event)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            log.warning("discovery subscriber %r failed: %r", self._discovery, exc)
            self._failure = exc
        self._discovery_ended = True
        self._notify()

    def _admits(self, metadata: WorkerMetadata) -> bool:
        return self._tags is None or self._tags <= metadata.tags

    def _over_lease(self, uid: UUID) -> bool:
        if self._lease is None or uid in self._own:
            return False
        borrowed = sum(1 for other in self._admitted if other not in self._own)
        return borrowed >= self._lease

    def _handle(self, event: DiscoveryEvent) -> None:
        if not self._active:
            return  # exiting: admit nothing new, drop nothing that calls may still use
        metadata = event.metadata
        uid = metadata.uid
        if event.type != "worker-dropped" and not self._admits(metadata):
            self._excluded[uid] = metadata.tags
        else:
            self._excluded.pop(uid, None)
        if event.type == "worker-dropped" or not self._admits(metadata):
            self._waiting.pop(uid, None)
            current = self._admitted.pop(uid, None)
            if current is not None:
                current.dropped = True
                current.wakeup.set()
                self._admit_waiting()
            return
        current = self._admitted.get(uid)
        if current is not None:
            moved = current.metadata.address != metadata.address
            current.metadata = metadata
            if moved:
                current.wakeup.set()  # its task reconnects at the new address
            return
        if self._over_lease(uid):
            self._waiting[uid] = metadata
            return
        self._admit(metadata)

    def _admit(self, metadata: WorkerMetadata) -> None:
        self._ever_admitted = True
        admitted = _Admitted(metadata)
        self._admitted[metadata.uid] = admitted
        self._connecting += 1
        assert self._task_group is not None
        self._task_group.start_soon(self._serve, admitted,
                                    name=f"anywool-connection-{metadata.address}")

    def _admit_waiting(self) -> None:
        if not self._active:
            return  # exiting: nothing new is connected
        while self._waiting and not self._over_lease(next(iter(self._waiting))):
            uid = next(iter(self._waiting))
            self._admit(self._waiting.pop(uid))

    def _unresponsive(self, uid: UUID) -> None:
        """A worker did not take a cancellation within ``cancel_grace``: a pool ends its own
        (and replaces it); any other is taken out of the choice of workers at once, its
        connection closed (its calls in flight fail with a :class:`WorkerError`), and
        reconnected with the usual back-off while it is announced: it is chosen again once
        it answers (its greeting on a new connection), never given up for good."""
        if uid in self._own and self._end_worker is not None:
            self._end_worker(uid)
            return
        admitted = self._admitted.get(uid)
        entry = self._ready.get(uid)
        if admitted is None or entry is None:
            return  # out of the choice already (lost, dropped, reconnecting)
        log.warning("worker %s did not take a cancellation within %s: left out of the "
                    "choice of workers until it answers again", admitted.metadata.address,
                    seconds(self._cancel_grace))
        self._unready(uid, entry[1])
        admitted.wakeup.set()  # its connection closes; reconnected, with back-off

    def _unready(self, uid: UUID, connection: WorkerConnection) -> None:
        """Take ``connection`` out of the choice of workers (if it is still ``uid``'s)."""
        entry = self._ready.get(uid)
        if entry is not None and entry[1] is connection:
            del self._ready[uid]
            self._notify()

    async def _serve(self, admitted: _Admitted) -> None:
        """Keep one connection to ``admitted`` open while it is announced, reconnecting with
        backoff when the connection is lost."""
        uid = admitted.metadata.uid
        first = True
        failures = 0
        try:
            while not admitted.dropped:
                rejected = False
                wakeup = admitted.wakeup = anyio.Event()
                address = admitted.metadata.address

                def lost(wakeup: anyio.Event = wakeup) -> None:
                    # Before its calls learn of it: a call that fails with the connection finds
                    # the worker out of the proxy's choice already.
                    self._unready(uid, connection)
                    wakeup.set()

                connection = WorkerConnection(
                    address,
                    connect_timeout=self._connect_timeout,
                    cancel_timeout=self._cancel_timeout,
                    cancel_grace=self._cancel_grace,
                    on_lost=lost,
                    on_unresponsive=lambda uid=uid: self._unresponsive(uid),
                    on_room=self._room_queue.announce,
                    on_free=self._room_queue.announce,
                    on_accepted=self._room_queue.accepted,
                    on_sent=self._room_queue.sent,
                    origin=self._origin,
                    credentials=self._credentials,
                    output=self._output,
                    identity=(str(uid), admitted.metadata.pid),
                    attributes=self._worker_attributes(admitted.metadata),
                )
                try:
                    async with connection:
                        if first:
                            first = False
                            self._connecting -= 1
                        failures = 0
                        self._rejected.pop(uid, None)
                        self._ready[uid] = (admitted.metadata, connection)
                        self._notify()
                        await wakeup.wait()
                        if admitted.dropped and self._nested and uid in self._own:
                            # The pool the call tree came from is exiting, and lets its calls
                            # finish: their nested calls may still use its workers, until they
                            # stop.
                            await connection.wait_lost()
                        elif admitted.dropped:
                            # Withdrawn: no new call goes to it, but the calls on it may finish
                            # (a stopping worker drains them): closing now would fail them.
                            self._unready(uid, connection)
                            self._withdrawn.add(connection)
                            try:
                                await connection.wait_idle()
                            finally:
                                self._withdrawn.discard(connection)
                except AuthenticationError as exc:
                    self._rejected[uid] = exc
                    rejected = True
                    (log.warning if failures == 0 else log.debug)(
                        "could not use worker %s: authentication failed: %s", address,
                        exc.reason)
                except WorkerError as exc:
                    (log.warning if failures == 0 else log.debug)(
                        "could not use worker %s: %s", address, exc.reason)
                except Exception:
                    # Never let one worker's failure end the proxy's task group (which would
                    # cancel the block it encloses): treat it as a failed connection.
                    (log.exception if failures == 0 else log.debug)(
                        "unexpected failure with worker %s", address)
                finally:
                    self._unready(uid, connection)
                    if first:
                        first = False
                        self._connecting -= 1
                    self._notify()
                if admitted.dropped or address != admitted.metadata.address:
                    continue  # dropped: the loop ends; moved: reconnect at once
                failures += 1
                # A worker that refused our credentials will refuse them again: try it seldom.
                delay = min(_BACKOFF_FIRST * 2 ** (failures - 1),
                            _REJECTED_BACKOFF_MAX if rejected else _BACKOFF_MAX)
                if failures == 1:
                    log.info("lost worker %s; reconnecting while it is announced", address)
                admitted.wakeup = anyio.Event()
                with anyio.move_on_after(delay):
                    await admitted.wakeup.wait()
        finally:
            self._rejected.pop(uid, None)
            if self._admitted.get(uid) is admitted:
                del self._admitted[uid]
                self._admit_waiting()

    # -- dispatch ------------------------------------------------------------------------------

    async def _wait_for_quorum(self, *, at_entry: bool = False) -> None:
        """Wait until the quorum (or, once met, one worker) is connected.

        Raised outside the timeout's scope, so a subscriber's error carries no TimeoutError in
        its context.
        """
        need = 1 if self._quorum_met else self._quorum
        with anyio.move_on_after(self._quorum_timeout):
            while len(self._ready) < need and self._failure is None and self._active:
                if self._discovery_ended and not self._connecting:
                    break
                if self._all_rejected():
                    break
                await self._changed.wait()
        if self._failure is not None:
            raise _fresh(self._failure)
        if not self._active:
            raise self._inactive()
        connected = len(self._ready)
        if connected >= need:
            if not self._quorum_met:
                # Also for the pool's own workers not yet admitted: the subscriber may still
                # be delivering its snapshot, one event at a time.
                with anyio.move_on_after(_SETTLE):
                    while (self._connecting or not self._own <= self._ready.keys()) \
                            and self._active and self._failure is None:
                        await self._changed.wait()
            self._quorum_met = True
            return
        if not connected and not self._rejected:
            claimed = self._unverified()
            if claimed is not None:
                # Workers are there, but their adverts are signed with another secret than
                # ours: that, not their absence, is what to say.
                raise AuthenticationError(
                    claimed, "its discovery record does not verify with our secret (the "
                    "workers there hold another secret, or the record is forged)")
        if self._all_rejected() or (not connected and self._rejected):
            # The workers there are refuse our credentials (or we have none): say so, rather
            # than that there are none.
            latest = next(reversed(self._rejected.values()))
            raise AuthenticationError(*latest.args)  # a fresh one: raised by every dispatch
        refused = ""
        if self._rejected:
            latest = next(reversed(self._rejected.values()))
            refused = (f"; {len(self._rejected)} refused to authenticate us, the latest "
                       f"{latest.address}: {latest.reason}")
        if at_entry:
            raise TimeoutError(
                f"{connected} of the quorum of {need} workers connected within "
                f"{self._quorum_timeout} seconds{refused}"
            )
        if self._discovery_ended and not self._connecting:
            raise NoWorkersAvailable("the discovery subscription ended with no usable worker",
                                     self._namespace)
        if need > 1:
            raise NoWorkersAvailable(
                f"{connected} of the quorum of {need} workers connected within "
                f"{self._quorum_timeout} seconds{refused}", self._namespace)
        raise NoWorkersAvailable(await self._why_none(), self._namespace)

    async def _why_none(self) -> str:
        """Why no worker is connected, in words (after waiting ``quorum_timeout``)."""
        waited = f"(waited {self._quorum_timeout:g} s)"
        if self._given_up is not None:
            return f"{self._given_up} {waited}"
        owned = None
        ask = getattr(self._source, "_owned", None)
        if callable(ask):
            # Asked once however many calls fail at once, and again a while later.
            now = anyio.current_time()
            if self._owned_at is None or now - self._owned_at[0] > 1.0:
                answer = await anyio.to_thread.run_sync(ask)
                self._owned_at = (now, answer if isinstance(answer, bool) else None)
            owned = self._owned_at[1]
        # Asked first: its subscription may not have dropped the workers of a dead owner yet.
        if owned is False:
            gone = "its workers went with it" if self._ever_admitted else "none were published"
            return f"the namespace has no live owner any more: it exited or died, and {gone} " \
                   f"{waited}"
        if self._admitted:
            return (f"{len(self._admitted)} admitted worker(s) did not connect "
                    f"{waited}{_reasons(self._rejected)}")
        if self._excluded:
            return (f"{len(self._excluded)} worker(s) are published there, but none carries "
                    f"every tag of {sorted(self._tags or ())} {waited}")
        if self._ever_admitted:
            return f"every worker published there was withdrawn {waited}"
        if self._spawns:
            return f"this pool's workers are not running {waited}"
        if self._nested:
            return f"the workers of the pool this call came from are gone {waited}"
        if self._spawns is None:
            return f"no worker is published there {waited}"
        return f"this pool spawns no workers, and none are published there {waited}"

    def _unverified(self) -> str | None:
        """The address claimed by a record our subscriber could not verify, when it can say
        (a ``LanDiscovery.Subscriber`` can), else ``None``."""
        ask = getattr(self._discovery, "_unverified", None)
        if not callable(ask):
            return None
        try:
            claimed = ask()
        except Exception:  # a diagnosis, never a failure of its own
            log.debug("asking %r for unverified records failed", self._discovery, exc_info=True)
            return None
        return claimed if isinstance(claimed, str) else None

    def _all_rejected(self) -> bool:
        """Whether every admitted worker failed authentication and none is still connecting:
        waiting longer would only wait for the same answer."""
        return (not self._connecting and not self._ready and bool(self._admitted)
                and self._admitted.keys() <= self._rejected.keys())

    def _inactive(self) -> RuntimeError:
        if self._entered:
            return RuntimeError("this WorkerProxy is not active: it is exiting or has exited, "
                                "and takes no new calls")
        return RuntimeError("this WorkerProxy is not active (enter it with `async with`)")

    async def _workers(self) -> list[tuple[WorkerMetadata, WorkerConnection]]:
        if not self._active:
            raise self._inactive()
        if self._failure is not None or not self._quorum_met or not self._ready_list:
            await self._wait_for_quorum()
        return self._ready_list

    async def _deliver(self, send: Callable[[WorkerConnection], Awaitable[T]]) -> T:
        """Hand a call to the balancer; when every worker refused it as busy, wait (without
        polling: a worker with room again, or a change of workers, wakes it) and try again."""
        refused = False

        async def attempt(connection: WorkerConnection) -> T:
            nonlocal refused
            try:
                return await send(connection)
            except WorkerBusy:
                refused = True
                raise

        # Calls that found no worker with room wait their turn, first come first served: a new
        # call joins them rather than overtake them; one that was woken and found the room
        # gone again waits at the front (see runtime.client._room for who wakes whom).
        queue = self._room_queue
        front = False
        if queue.queued:
            await queue.wait(front, kick=True)
            front = True
        while True:
            generation = queue.generation  # before trying: new workers, and it tries again
            try:
                workers = await self._workers()
                refused = False
                announced = queue.announced
                try:
                    return await self._balancer.dispatch(workers, attempt)
                except NoWorkersAvailable:
                    # A worker skipped as busy may have had room since (answers arrive while
                    # others are tried): then the call takes, or waits for, that room.
                    if not (refused or queue.announced != announced
                            or any(connection.busy for _, connection in workers)):
                        raise
            except BaseException:
                # Woken, and leaving without sending a call: calls that queued behind this
                # one while it was woken (see RoomQueue.promised) must not wait for a wake-up
                # it owed.
                if front and not queue.promised:
                    queue.sent()
                raise
            if queue.generation != generation:
                continue
            # A room announced while nobody waited goes to one call refused since.
            if queue.spare:
                queue.spare -= 1
                continue
            await queue.wait(front)
            front = True

    async def dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                       *, plain: bool = False) -> Any:
        """Run the coroutine routine ``fn(*args, **kwargs)`` (with ``plain``, the plain function:
        see :func:`anywool.run_sync`) on a worker and return its result.

        :raises RuntimeError: the proxy is not active.
        :raises NoWorkersAvailable: the quorum (or, once met, one worker) was not connected
            within ``quorum_timeout`` seconds, or no worker accepted the call.
        :raises Exception: the discovery subscriber's failure, if its iteration raised; the
            routine's own exception; :class:`~anywool.errors.WorkerError` when the connection
            was lost mid-call; :class:`~anywool.errors.RoutineCancelled`.

        A call that every worker refuses because it runs its ``max_concurrency`` calls waits
        until one has room, for as long as it takes (bound it with a deadline).

        Cancellation: cancels the routine on the worker, waits (bounded) for it to unwind.
        """
        telemetry = _telemetry.current()
        if telemetry is not None:
            with telemetry.client(getattr(fn, "__qualname__", repr(fn)),
                                  "function" if plain else "coroutine",
                                  self._namespace).attached(finish=True):
                return await self._dispatch(fn, args, kwargs, plain)
        return await self._dispatch(fn, args, kwargs, plain)

    async def _dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any], plain: bool) -> Any:
        with self._in_flight:
            # The built-in balancer's choice, made here, saves every call the layers of the
            # general path; a call nobody has room for, or that is refused, takes that path.
            if self._picks and self._quorum_met and self._active and self._failure is None \
                    and not self._room_queue.queued:
                connection = self._balancer.pick(self._ready_list)  # type: ignore[attr-defined]
                if connection is not None:
                    try:
                        return await connection.call(fn, args, kwargs, plain=plain)
                    except CallNotDelivered:
                        pass
            return await self._deliver(lambda c: c.call(fn, args, kwargs, plain=plain))

    def stream(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncGenerator[Any, Any]:
        """Start the async generator routine ``fn(*args, **kwargs)`` on a worker, lazily.

        Returns an async generator; the first step waits for a worker and dispatches, raising
        as :meth:`dispatch` does.
        """

        async def open_call() -> Call:
            telemetry = _telemetry.current()
            if telemetry is None:
                return await self._deliver(lambda c: c.stream(fn, args, kwargs))
            # Its span ends with the stream (see drive_stream), or here if it never opens.
            with telemetry.client(getattr(fn, "__qualname__", repr(fn)), "generator",
                                  self._namespace).attached():
                return await self._deliver(lambda c: c.stream(fn, args, kwargs))

        return drive_stream(open_call, self._in_flight)

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
        """:func:`anywool.map` through this proxy rather than the active one (same parameters,
        errors and cancellation); entering it raises :class:`RuntimeError` when this proxy is
        not active."""
        return MapResults(lambda: self, fn, items, ordered=ordered, batch_size=batch_size,
                          max_in_flight=max_in_flight, progress=progress)

    # -- telemetry ---------------------------------------------------------------------------

    def _worker_attributes(self, metadata: WorkerMetadata) -> dict[str, str]:
        """What the spans and metrics of calls to ``metadata``'s worker say about it."""
        attributes = {"anywool.worker.uid": str(metadata.uid)}
        if self._namespace is not None:
            attributes["anywool.namespace"] = self._namespace
        return attributes

    def _telemetry_counts(self) -> tuple[str | None, dict[str, int]]:
        """This proxy's namespace and its workers by state (the workers gauge; read from
        whatever thread collects metrics: only sizes are read)."""
        connected = len(self._ready)
        return self._namespace, {
            "connected": connected,
            "connecting": max(0, len(self._admitted) - connected),
            "waiting": len(self._waiting),
            "excluded": len(self._excluded),
        }
    # -- stats: what the admitted workers say of themselves ----------------------------------

    async def stats(self, timeout: float = 5.0) -> dict[UUID, WorkerStats | None]:
        """Ask every worker this proxy admitted for its statistics, all at once.

        :param timeout: seconds (> 0) each worker gets to answer.
        :returns: by worker uid, what it reported, or ``None`` for a worker that did not answer
            within ``timeout`` (its event loop held, suspended), whose connection is not open
            (connecting, reconnecting) or was lost meanwhile, or whose answer was malformed.
            Empty when no worker is admitted. Before the proxy's first call (a lazy proxy, or
            pool, connects then), it first waits up to ``timeout`` seconds for its quorum, as a
            call would: at most about twice ``timeout`` in all.
        :raises RuntimeError: the proxy is not entered, or has exited.

        A statistics request is not a call: it is not counted by the worker, and is answered
        also when the worker runs its ``max_concurrency`` calls or is draining.

        Cancellation: cancels the requests (late answers are dropped).
        """
        timeout = _validate.duration("timeout", timeout, allow_zero=False)
        if self._task_group is None:
            raise self._inactive()
        if not self._quorum_met and self._active:
            with anyio.move_on_after(timeout):
                try:
                    await self._wait_for_quorum()
                except Exception:  # what a call would raise: here, fewer workers are shown
                    pass
        found: dict[UUID, WorkerStats | None] = dict.fromkeys(self._admitted)

        async def ask(uid: UUID, connection: WorkerConnection) -> None:
            try:
                found[uid] = await connection.stats(timeout)
            except (TimeoutError, WorkerError, FrameError) as exc:
                log.debug("no stats from worker %s: %r", connection.address, exc)

        async with anyio.create_task_group() as tg:
            for uid, (_, connection) in list(self._ready.items()):
                found.setdefault(uid, None)
                tg.start_soon(ask, uid, connection)
        return found

    # -- origin --------------------------------------------------------------------------------

    def _origin(self) -> Origin | None:
        """This proxy's key and pickle, which its calls carry (``None``: it cannot be pickled,
        so routines called through it cannot call routines; logged once, at debug level)."""
        if self._origin_blob is None and not self._origin_unpicklable:
            try:
                self._origin_blob = serializer.dumps(self)
                self._origin_key = hashlib.blake2b(self._origin_blob, digest_size=16).digest()
            except serializer.VALUE_FAILURES as exc:
                self._origin_unpicklable = True
                log.debug("routines called through %r cannot call routines: the proxy cannot be "
                          "pickled (%s: %s)", self, type(exc).__name__, exc)
        return None if self._origin_blob is None else (self._origin_key, self._origin_blob)

    # -- for the package: the pool that runs this proxy, a worker's nested proxies -----------
    # What a WorkerPool (anywool.runtime.pool) and a worker's nested proxies
    # (anywool.runtime.worker._nested) tell a proxy, instead of writing its state. Underscored
    # because WorkerProxy is public: these are the package's, not the user's API.

    def _serve_pool(self, *, spawns: bool, end_worker: Callable[[UUID], object]) -> None:
        """Make this the proxy of a pool, before it is entered.

        :param spawns: whether the pool spawns workers (what a :class:`NoWorkersAvailable`
            says when none is found).
        :param end_worker: called with the uid of one of the pool's own workers that did not
            take a cancellation within ``cancel_grace``: the pool ends and replaces it (any
            other worker is only left out of the choice until it answers again).
        """
        self._spawns = spawns
        self._end_worker = end_worker

    def _set_own_workers(self, uids: Iterable[UUID]) -> None:
        """The workers a pool spawned itself, admitted whatever the lease (the pool calls this
        whenever they change)."""
        self._own = set(uids)
        self._origin_blob = None
        self._origin_unpicklable = False

    def _slots_given_up(self, reason: str) -> None:
        """The pool gave up every worker slot (``reason``, in words): a call that finds no
        worker says so."""
        self._given_up = reason

    async def _until_connected(self, uid: UUID, timeout: float) -> None:
        """Wait until the worker ``uid`` is among this proxy's choice of workers (connected),
        at most ``timeout`` seconds, or until the proxy stops taking calls.

        Cancellation: only the wait is cancelled.
        """
        with anyio.move_on_after(timeout):
            while uid not in self._ready and self._active:
                await self._changed.wait()

    def _adopt_origin(self, origin: Origin) -> None:
        """Carry ``origin`` (this proxy was rebuilt from it on a worker) in every call, and serve
        nested calls: the origin pool's own workers stay in use after their withdrawal (their
        pool is exiting and lets its calls finish) until their connections end."""
        self._origin_key, self._origin_blob = origin
        self._nested = True

    # -- pickling ------------------------------------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        if self._uri is None and is_context_manager(self._discovery):
            raise TypeError(
                f"a WorkerProxy whose discovery is a context manager ({self._discovery!r}) "
                "cannot be pickled: its lifetime belongs to whoever entered it; give the proxy a "
                "plain subscriber (e.g. LocalDiscovery.Subscriber) or a pool URI instead"
            )
        options = {
            "loadbalancer": self._balancer,
            "tags": self._tags,
            "lazy": self._lazy,
            "quorum": self._quorum,
            "quorum_timeout": self._quorum_timeout,
            "lease": self._lease,
            "connect_timeout": self._connect_timeout,
            "cancel_timeout": self._cancel_timeout,
            "cancel_grace": self._cancel_grace,
        }
        where = self._discovery if self._uri is None else self._uri
        return (_rebuild, (where, tuple(sorted(self._uri_tags)), options, frozenset(self._own)))

    def __repr__(self) -> str:
        if self._uri is not None:
            return f"WorkerProxy({', '.join(map(repr, [self._uri, *sorted(self._uri_tags)]))})"
        return f"WorkerProxy({self._discovery!r})"


def _fresh(error: BaseException) -> BaseException:
    """A copy of ``error`` for one more call to raise: each call fails with its own exception
    (one raised by many tasks at once would chain all their tracebacks, and appear many times
    over in a task group's ExceptionGroup)."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        return error
    copy.__cause__ = error.__cause__
    copy.__suppress_context__ = True
    return copy


def _reasons(rejected: dict[UUID, AuthenticationError]) -> str:
    if not rejected:
        return ""
    latest = next(reversed(rejected.values()))
    return f"; the latest, {latest.address}, refused to authenticate us: {latest.reason}"


def _check_subscriber(discovery: object) -> DiscoverySubscriberLike:
    if isinstance(discovery, type):
        raise TypeError(
            f"discovery must be a DiscoverySubscriberLike instance, got the class {discovery!r}; "
            "a WorkerProxy consumes a subscriber as given (a WorkerPool accepts factories)"
        )
    if callable(discovery):
        raise TypeError(
            f"discovery must be a DiscoverySubscriberLike instance, got the callable "
            f"{discovery!r}; a WorkerProxy consumes a subscriber as given (a WorkerPool accepts "
            "factories)"
        )
    if not isinstance(discovery, DiscoverySubscriberLike):
        raise TypeError(
            "discovery must be a DiscoverySubscriberLike (an async iterable of DiscoveryEvent) "
            f"or a namespace str, got {discovery!r}"
        )
    return discovery


def _rebuild(where: Any, uri_tags: tuple[str, ...], options: dict[str, Any],
             own: frozenset[UUID] = frozenset()) -> WorkerProxy:
    proxy = WorkerProxy(where, *uri_tags, **options)
    proxy._own = set(own)
    return proxy
