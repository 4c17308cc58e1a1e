"""Shared subscriptions: one source per process and key, fanned out to every iteration.

A *source* follows one namespace for the whole process: it runs one thread that waits on a hint
with the poll interval as timeout, works out what changed and hands each batch of events to
every *consumer*. What a source follows is its subclass's business: :class:`_LocalSource` binds
a local namespace (key ``(namespace key, poll_interval)``; its hint is inotify on the
registry's notify file), and :mod:`anywool.discovery.lan` adds a source that follows a zeroconf
browser. Everything else (consumers, fan-out, overflow resynchronisation, snapshots for late
joiners, stopping with the last consumer, forks) is here, once, for both.
Each consumer is one ``async for`` over a subscription: it owns a bounded queue and a wake pipe
that its own event loop awaits with :func:`anyio.wait_readable`, so consumers on different event
loops (asyncio and trio, in different threads) share one source, and a slow consumer never
blocks the source or its siblings.

The source thread never touches an event loop; consumers never block on the source's work.
When the last consumer leaves, the source's thread is stopped and joined and its descriptors
closed: nothing per namespace outlives its subscriptions.
"""

from __future__ import annotations

import _thread
import logging
import os
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import NamedTuple
from uuid import UUID

import anyio
import anyio.from_thread
import anyio.to_thread

from anywool import _runtime_dir
from anywool._runtime_dir import runtime_dir
from anywool.discovery import _view
from anywool.discovery._protocols import DiscoveryEvent
from anywool.discovery.local import _binding, _keys, _layout, _watch
from anywool.errors import DiscoveryError, DiscoveryNamespaceNotFound, DiscoveryRegistryCorrupt
from anywool.metadata import WorkerMetadata

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 1.0
# Events a consumer may have queued before it is resynchronised from the current view instead.
CONSUMER_BUFFER = 4096
_JOIN_TIMEOUT = 5.0

class WouldBlock(Exception):
    """An in-loop attach would have to wait or work too long: attach from a thread instead."""


class _Stopped(Exception):
    """The source was told to stop while it waited for the registry lock."""


class _Snapshot(list[DiscoveryEvent]):
    """A new consumer's first batch: every worker of ``view`` as ``worker-added``. Carrying
    the view lets the consumer take it as its own at once (when it reads the batch, not
    before: a batch dropped by an overflow must leave the consumer's view as it was)."""

    def __init__(self, view: dict[UUID, WorkerMetadata],
                 events: list[DiscoveryEvent] | None = None) -> None:
        super().__init__(events if events is not None else
                         [DiscoveryEvent("worker-added", m) for m in view.values()])
        self.view = view


class Consumer:
    """One iteration's end of a source: a bounded batch queue and a wake pipe."""

    def __init__(self) -> None:
        self.batches: deque[list[DiscoveryEvent]] = deque()
        self.queued = 0
        self.overflowed = False
        self.view: dict[UUID, WorkerMetadata] = {}
        # Made (under the source lock) when the consumer first waits: until then it looks at
        # its queue before it would wait, so there is nobody to wake.
        self.wake_r = self.wake_w = -1

    def ready_to_wait(self) -> None:
        """Make the wake pipe, if not yet (source lock held)."""
        if self.wake_r < 0:
            self.wake_r, self.wake_w = os.pipe()
            os.set_blocking(self.wake_r, False)
            os.set_blocking(self.wake_w, False)

    # Called with the source lock held, from the source thread or an attaching thread.
    def deliver(self, events: list[DiscoveryEvent]) -> None:
        if not self.overflowed:
            if self.queued + len(events) > CONSUMER_BUFFER:
                self.overflowed = True
                self.batches.clear()
                self.queued = 0
            else:
                self.batches.append(events)
                self.queued += len(events)
        self.wake()

    def wake(self) -> None:
        """Make the consumer's loop look at its queue (and its source's failure)."""
        if self.wake_w < 0:
            return  # not waiting (yet): it looks at its queue before it does
        try:
            os.write(self.wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake is pending) or closed

    def close(self) -> None:
        for fd in (self.wake_r, self.wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.wake_r = self.wake_w = -1


class Source:
    """What one namespace's source shares with every consumer in this process.

    A subclass says what it follows: :meth:`_open_hint` (in the thread, as it starts),
    :meth:`_drain_hint`, :meth:`_refresh` (bring :attr:`view` up to date with
    :meth:`_deliver`) and :meth:`_release` (free what it holds, once, as the thread ends or for
    a source that never started).
    """

    #: The generation of the namespace the view belongs to (``None``: not applicable, or
    #: orphaned); read by attaching threads, so written under ``lock``.
    generation: bytes | None = None

    def __init__(self, key: tuple[str, float], namespace: str, poll_interval: float) -> None:
        self.key = key
        self.namespace = namespace
        self.poll_interval = poll_interval
        self.lock = threading.Lock()
        self.consumers: set[Consumer] = set()
        self.view: dict[UUID, WorkerMetadata] = {}
        self.binds = 1
        self.scans = 0
        # The thread starts when a consumer first waits for a change or a second consumer
        # joins: an iteration that only reads the current workers never costs a thread.
        # ``started`` and ``stopped`` change under ``lock``.
        self.started = False
        self.stopped = False
        # The stop pipe's descriptors are written and closed only under ``lock`` and set to -1
        # when closed: a descriptor number may be reused at once by any file of the process, so
        # nothing may ever be written to one after it was closed.
        self.stop_r = self.stop_w = -1  # made as the thread starts
        # Set (under ``lock``) when the thread ended for any other reason than a stop: every
        # consumer's iteration then raises it instead of waiting for events that never come.
        self.failure: BaseException | None = None
        # Set when the hub no longer lists this source (its last consumer left, or a newer
        # generation's source replaced it).
        self.unlisted = False
        # Set in a forked child: this process has no thread for it (see _forget_in_child).
        self.forgotten = False
        _LIVE_SOURCES.add(self)
        self.thread: threading.Thread | None = None

    # -- what a subclass follows --

    def _open_hint(self) -> int | None:
        """In the thread, as it starts: set up the hint; its descriptor, readable on a change
        (``None``: no hint, poll only)."""
        return None

    def _drain_hint(self) -> None:
        """After the hint's descriptor was readable: consume what made it so."""

    def _refresh(self, probe: bool = False,
                 checkpoint: Callable[[], None] | None = None) -> list[DiscoveryEvent]:
        """Bring the view up to date (see :meth:`_deliver`); ``probe``: woken by the poll
        interval rather than the hint. ``checkpoint`` may raise :class:`_Stopped` while it
        waits."""
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the source holds (idempotent), as its thread ends or in :meth:`close`."""

    def _deliver(self, events: list[DiscoveryEvent],
                 replacement: dict[UUID, WorkerMetadata] | None = None) -> list[DiscoveryEvent]:
        """Take ``events`` into the view (or ``replacement`` as the view, when given) and hand
        them to every consumer."""
        if events:
            with self.lock:
                if replacement is not None:
                    self.view = replacement
                else:
                    _view.apply(self.view, events)
                for consumer in self.consumers:
                    consumer.deliver(events)
        return events

    # -- lifecycle --

    def forget(self) -> None:
        """In a forked child: drop the parent's descriptors and locks (any may have been
        taken at the fork) without touching the parent's; consumers inherited with it raise."""
        self.forgotten = True
        self.lock = threading.Lock()
        self.started = self.stopped = True  # never (re)started here
        self.close()
        for consumer in self.consumers:
            consumer.close()

    def ensure_started(self) -> None:
        """Start the thread that follows changes, once (a no-op once stopped).

        Its first round reads whatever changed since :meth:`prime`, so starting late loses
        nothing. Started under ``lock``, so that :meth:`stop` never sees a thread it cannot
        join; the thread takes ``lock`` only after it is running.
        """
        with self.lock:
            if not self.started and not self.stopped:
                self.stop_r, self.stop_w = os.pipe()
                self.thread = threading.Thread(
                    target=self._run, name=f"anywool-source-{self.key[0]}", daemon=True)
                try:
                    self.thread.start()
                except BaseException:  # e.g. no thread can be started: as if never tried
                    for fd in (self.stop_r, self.stop_w):
                        os.close(fd)
                    self.stop_r = self.stop_w = -1
                    self.thread = None
                    raise
                self.started = True

    def close(self) -> None:
        """Release what the source holds (:meth:`_release`) and the stop pipe: by the thread
        as it ends, or by the attaching thread for a source it built but never started."""
        self._release()
        with self.lock:
            for fd in (self.stop_r, self.stop_w):
                if fd >= 0:
                    os.close(fd)
            self.stop_r = self.stop_w = -1

    def stop(self, *, blocking: bool = True) -> threading.Thread | None:
        """Ask the thread to end (a no-op once it has: its stop pipe is closed); returns it,
        to join, or ``None`` when it never started (the source is then closed here).

        With ``blocking`` false (from a finalizer) a busy lock is not waited for: the thread is
        delivering or closing at that instant, and a thread whose source left the hub and has
        no consumer ends by itself at its next wake-up anyway (see :meth:`_serve`). A source
        that never started is then closed by the next :meth:`_Hub.drain_deferred`.
        """
        if not self.lock.acquire(blocking):
            if self.started:
                return self.thread
            _hub.deferred_closes.append(self)
            _hub.drain_soon()
            return None
        try:
            never_started = not self.started and not self.stopped
            self.stopped = True
            if self.started and self.stop_w >= 0:
                os.write(self.stop_w, b"\0")
        finally:
            self.lock.release()
        if never_started:
            self.close()
        return self.thread if self.started else None

    # -- the thread --

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            log.exception("the discovery source for %r failed", self.namespace)
            self._fail(exc)
        finally:
            self.close()

    def _fail(self, exc: BaseException) -> None:
        """Leave the hub (the next iteration starts a fresh source) and wake every consumer,
        whose iteration raises."""
        with _hub.lock:
            self.unlisted = True
            if _hub.sources.get(self.key) is self:
                del _hub.sources[self.key]
            with self.lock:
                self.failure = exc
                for consumer in self.consumers:
                    consumer.wake()

    def _serve(self) -> None:
        hint_fd = self._open_hint()
        poller = select.poll()
        poller.register(self.stop_r, select.POLLIN)
        if hint_fd is not None:
            poller.register(hint_fd, select.POLLIN)
        last_failure: str | None = None
        first = True  # the first round catches up with what changed since prime, unasked
        # Probed at least every poll interval, also while changes keep waking the loop: a
        # publisher still bound to a registry replaced under it keeps notifying.
        probe_due = time.monotonic() + self.poll_interval
        while True:
            if first:
                first, probe = False, False
            else:
                ready = poller.poll(self.poll_interval * 1000)
                if any(fd == self.stop_r for fd, _ in ready):
                    return
                _hub.drain_deferred()
                if ready:
                    self._drain_hint()
                now = time.monotonic()
                probe = not ready or now >= probe_due
                if probe:
                    probe_due = now + self.poll_interval
            with self.lock:
                if self.unlisted and not self.consumers:
                    return  # a stop request that could not be delivered (see stop)
            try:
                self._refresh(probe=probe, checkpoint=self._check_stop)
            except _Stopped:
                return
            except DiscoveryRegistryCorrupt as exc:
                # Damaged from outside under a live owner, never a torn read (see
                # _layout.verify): nothing can confirm the view any more, and nothing will
                # repair it while the owner lives. Every iteration ends with it, now.
                log.warning("discovery source for %r stops: %s", self.namespace, exc)
                self._fail(exc)
                return
            except Exception as exc:  # a wedged writer, a failing disk...: retry next round
                # Logged once per kind of failure, not on every poll.
                if repr(exc) != last_failure:
                    last_failure = repr(exc)
                    log.warning("discovery source for %r failed to refresh (retrying every "
                                "%s s)", self.namespace, self.poll_interval, exc_info=True)
                else:
                    log.debug("discovery source for %r still failing: %r", self.namespace, exc)
            else:
                last_failure = None

    def _check_stop(self) -> None:
        # Called between attempts to take the registry lock (or any other wait of a refresh):
        # stopping never waits on a writer.
        if select.select([self.stop_r], [], [], 0)[0]:
            raise _Stopped


class _LocalSource(Source):
    """One bound local namespace shared by every consumer in this process."""

    def __init__(self, key: tuple[str, float], namespace: str, poll_interval: float,
                 binding: _binding.Binding) -> None:
        super().__init__(key, namespace, poll_interval)
        self.binding: _binding.Binding | None = binding
        self.generation = binding.generation
        self.watcher: _watch.Watcher | None = None
        self._counter = -1

    def prime(self, checkpoint: Callable[[], None],
              lock_timeout: float | None) -> list[DiscoveryEvent]:
        """Read the registry once, before any thread runs: the first consumer's snapshot (every
        worker as ``worker-added``, the view being empty until now)."""
        return self._refresh(checkpoint=checkpoint, lock_timeout=lock_timeout)

    def _open_hint(self) -> int | None:
        watcher = self.watcher = _watch.Watcher()
        if self.binding is not None:
            watcher.watch(self.binding.path / "notify")
        else:  # orphaned already: a successor appears by a rename into the runtime directory
            watcher.watch(runtime_dir(create=False), directory=True)
        return watcher.fileno()

    def _drain_hint(self) -> None:
        if self.watcher is not None:
            self.watcher.drain()

    def _release(self) -> None:
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.close()
        if self.binding is not None:
            self.binding.close()
            self.binding = None

    def _refresh(self, probe: bool = False, checkpoint: Callable[[], None] | None = None,
                 lock_timeout: float | None = 30.0) -> list[DiscoveryEvent]:
        """Bring the view up to date and hand the difference to every consumer.

        :param checkpoint: called while waiting for the registry lock; may raise to give up.
        :param lock_timeout: seconds the registry lock may be waited for.
        """
        events: list[DiscoveryEvent] = []
        # After a snapshot the new view is the snapshot itself (a dict of our own); after a
        # journal read, the events are applied to the view.
        replacement: dict[UUID, WorkerMetadata] | None = None
        binding = self.binding
        if binding is not None:
            counter, gone = self._counter, True
            try:
                counter, retired = binding.counter()  # DiscoveryRegistryCorrupt: damaged
                # On a probe, also whether the owner lives and its registry is still the one
                # a new borrower would find.
                gone = retired or (probe and not (binding.is_live() and binding.reachable()))
            except DiscoveryNamespaceNotFound:  # damaged, but its owner died: over all the same
                pass
            if gone:
                events = [DiscoveryEvent("worker-dropped", m) for m in self.view.values()]
                replacement = {}
                self._orphan()
            elif counter != self._counter:
                self.scans += 1
                # Nothing read yet (-1): the journal cannot help, read a snapshot at once.
                journal = None if self._counter < 0 else \
                    binding.changes_since(self._counter, lock_timeout, checkpoint)
                if journal is None:  # fell behind the journal: the net difference instead
                    self._counter, replacement = binding.snapshot(lock_timeout, checkpoint)
                    events = _view.diff(self.view, replacement)
                else:
                    self._counter, changes = journal
                    events = _view.replay(self.view, ((c.uid, c.metadata) for c in changes))
        else:
            try:
                binding = _binding.bind(self.namespace)
            except DiscoveryNamespaceNotFound:
                return []
            self.binding = binding
            with self.lock:
                self.generation = binding.generation
            self.binds += 1
            if self.watcher is not None:
                self.watcher.watch(binding.path / "notify")
            self.scans += 1
            self._counter, replacement = binding.snapshot(lock_timeout, checkpoint)
            events = _view.diff(self.view, replacement)
        return self._deliver(events, replacement)

    def _orphan(self) -> None:
        assert self.binding is not None
        self.binding.close()
        self.binding = None
        with self.lock:
            self.generation = None
        self._counter = -1
        # A successor appears by renaming its generation into the runtime directory.
        if self.watcher is not None:  # (a source not yet started sets its watch as it starts)
            self.watcher.watch(runtime_dir(create=False), directory=True)


class _Hub:
    """The process-wide table of live sources."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sources: dict[tuple[str, float], Source] = {}
        # Detaches a finalizer could not do without waiting for a lock (see detach). A deque:
        # appended to without the lock, drained with popleft, so that nothing is ever lost.
        self.deferred: deque[tuple[Source, Consumer]] = deque()
        # Sources that never started, left by a finalizer that found their lock busy.
        self.deferred_closes: deque[Source] = deque()

    def attach(self, namespace: str, poll_interval: float, consumer: Consumer,
               checkpoint: Callable[[], None], *, in_loop: bool = False) -> Source:
        """Join (or start) the local namespace's source and queue the current view as
        ``worker-added`` (see :meth:`join`).

        Runs in a worker thread, or (``in_loop``) in an event loop's own thread. The hub lock
        is only ever held for bookkeeping, never across file-system work or a wait for the
        registry lock, so the event loops that detach consumers never block on it.

        :param checkpoint: called while waiting for the registry lock; raises to give up
            (cancellation of the iteration that is starting).
        :param in_loop: never wait: give up with :class:`WouldBlock` (nothing attached) when
            the registry lock is taken, or when the registry is too large to scan at once.
        :raises DiscoveryNamespaceNotFound: no live owner holds the namespace right now.
        :raises TimeoutError: the registry stayed locked by a writer for 30 s.
        """
        self.drain_deferred()
        key = (_keys.namespace_key(namespace), poll_interval)
        # A new iteration needs a live owner now, even if a sibling's source still follows one
        # that just died (it would only notice at its next check).
        probe: _binding.Binding | None = _binding.bind(namespace)
        generation = probe.generation
        lock_timeout: float | None = 30.0
        if in_loop:
            lock_timeout = 0
            if probe.table.size > _layout.IN_LOOP_BYTES:
                probe.close()
                raise WouldBlock

        def build() -> tuple[Source, list[DiscoveryEvent]]:
            nonlocal probe
            assert probe is not None
            fresh = _LocalSource(key, namespace, poll_interval, probe)
            probe = None
            try:
                return fresh, fresh.prime(checkpoint, lock_timeout)
            except BaseException as exc:
                fresh.close()
                if in_loop and isinstance(exc, TimeoutError):
                    raise WouldBlock from None
                raise

        try:
            return self.join(key, consumer, build,
                             current=lambda source: source.generation == generation)
        finally:
            if probe is not None:
                probe.close()

    def join(self, key: tuple[str, float], consumer: Consumer,
             build: Callable[[], tuple[Source, list[DiscoveryEvent]]],
             current: Callable[[Source], bool] | None = None) -> Source:
        """Join the source listed under ``key`` (or install a new one) and queue its current
        view for ``consumer`` as ``worker-added``: the machinery every kind of source shares.

        :param build: makes a source that nobody else knows yet, and its first read (the first
            consumer's snapshot); called outside the hub lock, at most once. If another thread
            installed a source under ``key`` meanwhile, the built one is closed and that one is
            joined.
        :param current: whether a listed source still follows what a new iteration must see
            (``False``: it is unlisted, keeps serving its consumers, and a new one is built).
        :raises Exception: whatever ``build`` raised (nothing is attached then).
        """
        fresh: Source | None = None
        primed: list[DiscoveryEvent] = []
        try:
            while True:
                with self.lock:
                    source = self.sources.get(key)
                    if source is not None and current is not None and not current(source):
                        # It still follows an earlier generation (or none): a new iteration
                        # sees only the current one, so it gets a source of its own, and the
                        # stale one serves its consumers until it catches up or they leave.
                        del self.sources[key]
                        source.unlisted = True
                        source = None
                    if source is None and fresh is not None:
                        source, fresh = fresh, None
                        self.sources[key] = source
                        # Its view is what build read until the thread starts: the primed
                        # events are this consumer's snapshot as they are.
                        with source.lock:
                            source.consumers.add(consumer)
                            if primed:
                                consumer.deliver(_Snapshot(dict(source.view), primed))
                        return source  # its thread starts when a consumer first waits
                    if source is not None:
                        with source.lock:
                            source.consumers.add(consumer)
                            if source.view:
                                consumer.deliver(_Snapshot(dict(source.view)))
                        break
                # No source: build one outside the hub lock, then install it unless another
                # thread installed its own meanwhile (then join that one and drop ours).
                fresh, primed = build()
        finally:
            if fresh is not None:
                fresh.close()
        # Joined a source: the snapshot was its view, which follows changes only while its
        # thread runs. Start it (if not yet): its first round brings every consumer, this one
        # included, up to date with whatever changed since that view was read.
        try:
            source.ensure_started()
        except BaseException:
            self.detach(source, consumer)  # no phantom consumer left behind
            raise
        return source

    def drain_deferred(self) -> None:
        """Do the detaches finalizers had to leave (see :meth:`detach`): at every attach, and
        at every wake-up of every source thread (so within a poll interval at the latest).

        Also by a one-off thread when the source of a deferred detach never started its own.
        Must be called with neither the hub lock nor any source lock held."""
        while True:
            try:
                source, consumer = self.deferred.popleft()
            except IndexError:
                break
            self.detach(source, consumer)  # its thread is not joined: told, it ends promptly
        while True:
            try:
                self.deferred_closes.popleft().stop()
            except IndexError:
                return

    def _defer(self, source: Source, consumer: Consumer) -> None:
        self.deferred.append((source, consumer))
        if not source.started:
            self.drain_soon()  # no thread of its own will wake up to do it

    def drain_soon(self) -> None:
        """Have a one-off thread wait for the locks and :meth:`drain_deferred`. Started with
        _thread: a finalizer asks for it, and may run while threading's own locks are held by
        the thread it interrupted."""
        _thread.start_new_thread(self.drain_deferred, ())

    def detach(self, source: Source, consumer: Consumer, *,
               blocking: bool = True) -> threading.Thread | None:
        """Leave the source; returns its thread (to join) when this was the last consumer.

        With ``blocking`` false (from a finalizer, which may run in any thread at any point, with
        any lock held), a lock that is busy defers the detach to the next attach or detach
        instead of waiting for it, so a finalizer can never deadlock; the consumer's files are
        closed once it is detached.
        """
        if not self.lock.acquire(blocking):
            self._defer(source, consumer)
            return None
        try:
            if not source.lock.acquire(blocking):
                self._defer(source, consumer)
                return None
            try:
                source.consumers.discard(consumer)
                last = not source.consumers
            finally:
                source.lock.release()
            if last:
                source.unlisted = True
                if self.sources.get(source.key) is source:
                    del self.sources[source.key]
        finally:
            self.lock.release()
        consumer.close()
        # Also a source the hub replaced (see attach), or one that failed (stopping a source
        # whose thread ended is a no-op).
        return source.stop(blocking=blocking) if last else None


_hub = _Hub()
_LIVE_SOURCES: weakref.WeakSet[Source] = weakref.WeakSet()


def _forget_in_child() -> None:
    """A forked child inherits the parent's sources but not their threads, and perhaps locks
    that were held at the fork: it starts with an empty hub, and iterations it inherited raise
    instead of waiting for events that never come."""
    global _hub
    _hub = _Hub()
    for source in list(_LIVE_SOURCES):
        source.forget()


os.register_at_fork(after_in_child=_forget_in_child)


class SourceStats(NamedTuple):
    """One shared source of this process (see :func:`anywool.lowlevel.discovery_stats`)."""

    #: The namespace's key: a hash, never the namespace's name.
    key: str
    #: Seconds between the source's counter checks.
    poll_interval: float
    #: Generations it has bound: 1, plus one per successor owner it followed.
    binds: int
    #: Times it read the registry (journal or snapshot) because something changed.
    scans: int
    #: Iterations attached to it now.
    consumers: int


def source_stats() -> list[SourceStats]:
    """Every live shared source of this process, for :mod:`anywool.lowlevel`."""
    return [SourceStats(key, interval, *numbers) for (key, interval), numbers in stats().items()]


def stats() -> dict[tuple[str, float], tuple[int, int, int]]:
    """Test hook: ``(binds, scans, consumers)`` of every live source, by key."""
    with _hub.lock:
        return {k: (s.binds, s.scans, len(s.consumers)) for k, s in _hub.sources.items()}


def iterate(namespace: str, poll_interval: float) -> AsyncIterator[DiscoveryEvent]:
    """An iteration of the local namespace: its current workers as ``worker-added``, then every
    change (see :class:`_Iteration`).

    :raises DiscoveryNamespaceNotFound: (from the first step) no live owner holds the namespace
        when iteration starts.
    :raises DiscoveryRegistryCorrupt: the live owner's registry is damaged: from the first
        step, or from a later one once the source has seen it (every iteration of the source).
    """
    return _Iteration(_LocalOpener(namespace, poll_interval))


class Opener:
    """How an iteration attaches a consumer to its source (see :func:`iterate_with`)."""

    async def prepare(self) -> None:
        """First, in the iteration's own event loop: whatever attaching needs read there
        (cancellable like any await)."""

    def attach_in_loop(self, consumer: Consumer) -> Source | None:
        """Attach in the event loop's own thread if nothing on the way can wait; ``None``:
        nothing attached, use :meth:`attach` in a worker thread."""
        return None

    def attach(self, consumer: Consumer, checkpoint: Callable[[], None]) -> Source:
        """Attach in a worker thread (usually through :meth:`_Hub.join`); ``checkpoint`` raises
        when the starting iteration is cancelled."""
        raise NotImplementedError


class _LocalOpener(Opener):
    __slots__ = ("namespace", "poll_interval")

    def __init__(self, namespace: str, poll_interval: float) -> None:
        self.namespace = namespace
        self.poll_interval = poll_interval

    def attach_in_loop(self, consumer: Consumer) -> Source | None:
        if not _runtime_dir.in_memory():
            return None
        try:  # no thread hop when nothing on the way can wait
            return _hub.attach(self.namespace, self.poll_interval, consumer, _no_checkpoint,
                               in_loop=True)
        except WouldBlock:
            return None

    def attach(self, consumer: Consumer, checkpoint: Callable[[], None]) -> Source:
        return _hub.attach(self.namespace, self.poll_interval, consumer, checkpoint)


def iterate_with(opener: Opener) -> AsyncIterator[DiscoveryEvent]:
    """An iteration of whatever source ``opener`` attaches to: the source's current view as
    ``worker-added``, then every change (see :class:`_Iteration`). The first step raises what
    attaching raised."""
    return _Iteration(opener)


def hub() -> _Hub:
    """This process's hub (a forked child gets a fresh one)."""
    return _hub


class _Attachment:
    """What one iteration holds of the hub: its source and consumer, detached once."""

    __slots__ = ("consumer", "detached", "source")

    def __init__(self) -> None:
        self.source: Source | None = None
        self.consumer: Consumer | None = None
        self.detached = False

    def detach(self, *, blocking: bool) -> threading.Thread | None:
        if self.detached or self.source is None or self.consumer is None:
            return None
        self.detached = True
        return _hub.detach(self.source, self.consumer, blocking=blocking)


async def _follow(opener: Opener,
                  attachment: _Attachment) -> AsyncGenerator[list[DiscoveryEvent], None]:
    """The batches of one iteration. It never refers to its :class:`_Iteration` (no cycle: the
    iteration is freed, and detached, as soon as the caller drops it)."""
    consumer = Consumer()
    try:
        await opener.prepare()
        source = opener.attach_in_loop(consumer)
        if source is None:
            source = await anyio.to_thread.run_sync(
                opener.attach, consumer, anyio.from_thread.check_cancelled)
    except BaseException:
        consumer.close()
        raise
    attachment.source, attachment.consumer = source, consumer
    try:
        while True:
            yield await _receive(source, consumer)
    finally:
        thread = attachment.detach(blocking=True)
        if thread is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join, _JOIN_TIMEOUT)


def _no_checkpoint() -> None:
    pass


class _Iteration:
    """One ``async for`` over a shared subscription.

    The events come from an inner async generator, so that an event loop that ends finalizes
    it (and detaches the consumer) as it does any async generator; but the object handed out is
    a plain async iterator, so that dropping it (a plain ``break``) detaches at once, from
    ``__del__``, without waiting for the loop to finalize the generator or for a garbage
    collection pass. ``aclose()`` detaches and also joins the source's thread when it was the
    last consumer.
    """

    def __init__(self, opener: Opener) -> None:
        self._attachment = _Attachment()
        self._pending: deque[DiscoveryEvent] = deque()
        self._batches = _follow(opener, self._attachment)

    def __aiter__(self) -> _Iteration:
        return self

    async def __anext__(self) -> DiscoveryEvent:
        while not self._pending:
            self._pending.extend(await self._batches.__anext__())
        return self._pending.popleft()

    async def aclose(self) -> None:
        """End the iteration: detach, and join the source's thread if it was the last."""
        await self._batches.aclose()

    def __del__(self) -> None:
        try:
            self._attachment.detach(blocking=False)
            # Close the generator now: with nothing left to detach its ``finally`` does not
            # await, so one step ends it, and the loop has no generator left to finalize.
            closing = self._batches.aclose()
            try:
                closing.send(None)
            except StopIteration:
                pass
            else:
                closing.close()
        except Exception:  # e.g. at interpreter shutdown; never raise from a finalizer
            pass


async def _receive(source: Source, consumer: Consumer) -> list[DiscoveryEvent]:
    while True:
        if source.forgotten:
            raise RuntimeError(
                f"this iteration of discovery namespace {source.namespace!r} was started before "
                "the process forked; start a new one in this process")
        with source.lock:
            if consumer.overflowed:
                consumer.overflowed = False
                consumer.batches.clear()
                consumer.queued = 0
                events = _view.diff(consumer.view, source.view)
            elif consumer.batches:
                events = consumer.batches.popleft()
                consumer.queued -= len(events)
            elif source.failure is not None:  # once what it delivered before has been read
                failure = source.failure
                if isinstance(failure, DiscoveryError):
                    # The documented error itself; a copy for each iteration, since one
                    # exception object raised in several tasks would gather their tracebacks.
                    raise type(failure)(*failure.args) from None
                raise RuntimeError(
                    f"the discovery source of namespace {source.namespace!r} failed: "
                    f"{failure!r}") from failure
            else:
                events = None
                consumer.ready_to_wait()
        if events:
            if isinstance(events, _Snapshot) and not consumer.view:
                consumer.view = events.view  # a copy of the source's view: ours now
            else:
                _view.apply(consumer.view, events)
            return events
        source.ensure_started()  # nothing queued: changes are what this consumer waits for
        await anyio.wait_readable(consumer.wake_r)
        try:
            os.read(consumer.wake_r, 4096)
        except BlockingIOError:
            pass
