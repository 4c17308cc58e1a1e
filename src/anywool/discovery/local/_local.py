"""LocalDiscovery: one owner per namespace on this host, and the borrowers that use it.

Roles:

- **owner**: ``async with LocalDiscovery(ns)`` claims the namespace (creating its registry),
  reaps the workers of publishers that died, and on exit removes every file of it.
- **publisher** (borrower): ``async with LocalDiscovery.Publisher(ns) as p`` binds the owner's
  registry and announces workers with ``await p.publish(...)``.
- **subscriber** (borrower): ``async for event in LocalDiscovery.Subscriber(ns)`` yields the
  current workers as ``worker-added``, then every change.

Borrowers never create anything: with no live owner they raise
:class:`~anywool.errors.DiscoveryNamespaceNotFound`. The file-system work lives in the sibling
modules (see the package's docstring); it runs in the event loop on a memory file system when
nothing on the way can wait, in a worker thread otherwise. The shared subscription machinery
lives in :mod:`anywool.discovery._hub`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskGroup

from anywool import _runtime_dir, _validate
from anywool._duration import seconds
from anywool._owner import SingleUse, exit_task_group
from anywool._teardown import graceful_then_forceful
from anywool.discovery import _hub
from anywool.discovery._filter import afilter
from anywool.discovery._protocols import (
    Discovery,
    DiscoveryEvent,
    DiscoveryEventType,
    DiscoverySubscriberLike,
    PredicateFunction,
    check_event,
)
from anywool.discovery.local import _binding, _claim, _layout
from anywool.errors import DiscoveryError, DiscoveryNamespaceNotFound
from anywool.metadata import WorkerMetadata

log = logging.getLogger(__name__)


class LocalDiscovery(Discovery, SingleUse):
    """Own a discovery namespace on this host for the lifetime of an ``async with`` block.

    Entering claims the namespace atomically across processes: exactly one of any number of
    racing claimants is admitted. The claim rests on a kernel ``flock`` the owner holds on the
    namespace directory, so an owner that died (even by SIGKILL) is detected at once and, with
    ``reclaim=True``, its namespace is swept and claimed. A live owner, however slow or stopped,
    is never displaced. Exiting removes every file of the namespace; a process forked from the
    owner removes nothing.

    While entered, the owner's task group runs a reaper that removes the workers of publishers
    whose process died or that released their lease without withdrawing them, every
    ``reap_interval`` seconds.

    ``publisher``, ``subscriber`` and :meth:`subscribe` return borrowers whether or not this
    instance is entered; they bind whichever owner is live when they are used.

    :param namespace: any string (it is hashed, never used as a path); ``None`` picks a fresh
        random namespace.
    :param filter: a predicate on :class:`~anywool.WorkerMetadata` applied to ``subscriber``.
    :param capacity: number of worker slots in the registry, 1 to 65 536.
    :param block_size: bytes available to one worker's encoded metadata, 1 to 512 KiB; the
        whole registry (slots, a journal of 256 changes, blocks) is at most 256 MiB.
    :param lock_timeout: seconds a registry lock may be waited for (``None``: forever).
    :param reclaim: sweep a dead owner's namespace on entry instead of refusing it.
    :param poll_interval: seconds (0.01 to a week) between subscribers' checks that back up the
        change hint (``None``: 1 s).
    :param reap_interval: seconds (0.01 to a week) between dead-publisher reaps.
    :param teardown_timeout: seconds (≥ 0) the exit may wait for the registry lock to retire
        the namespace politely (``0``: not at all); also the ``teardown_timeout`` of
        :attr:`publisher`. See :meth:`__aexit__`.
    :raises TypeError: an argument has the wrong type.
    :raises ValueError: an argument is out of range (the message names it and its value).
    """

    def __init__(
        self,
        namespace: str | None = None,
        *,
        filter: PredicateFunction | None = None,
        capacity: int = 128,
        block_size: int = 1024,
        lock_timeout: float | None = 30.0,
        reclaim: bool = True,
        poll_interval: float | None = None,
        reap_interval: float = 1.0,
        teardown_timeout: float = 5.0,
    ) -> None:
        self._namespace = (
            f"anywool-{uuid.uuid4().hex}" if namespace is None else _validate.namespace(namespace)
        )
        if filter is not None and not callable(filter):
            raise TypeError(f"filter must be callable or None, got {filter!r}")
        self._filter = filter
        self._capacity = _validate.count("capacity", capacity, upper=_layout.MAX_CAPACITY)
        self._block_size = _validate.count("block_size", block_size, upper=_layout.MAX_BLOCK_SIZE)
        size = _layout.registry_size(self._capacity, self._block_size)
        if size > _layout.MAX_REGISTRY_BYTES:
            raise ValueError(
                f"a registry of capacity={capacity} and block_size={block_size} takes {size} "
                f"bytes (slots, journal and blocks); at most {_layout.MAX_REGISTRY_BYTES} are "
                "allowed"
            )
        self._lock_timeout = _validate.seconds("lock_timeout", lock_timeout, allow_zero=True, optional=True)
        if not isinstance(reclaim, bool):
            raise TypeError(f"reclaim must be a bool, got {reclaim!r}")
        self._reclaim = reclaim
        self._poll_interval = _validate.seconds("poll_interval", poll_interval, allow_zero=False, optional=True,
                                                floor=_validate.MIN_INTERVAL)
        self._reap_interval = _validate.duration("reap_interval", reap_interval, allow_zero=False,
                                                 floor=_validate.MIN_INTERVAL)
        self._teardown_timeout = _validate.duration("teardown_timeout", teardown_timeout,
                                                    allow_zero=True)
        self._claim: _claim.Claim | None = None
        self._in_loop = False
        self._task_group: TaskGroup | None = None
        # Ends the reaper at exit: waking it costs less than cancelling it (a claim and
        # release is mostly this task's start and end); a reap in progress is cancelled.
        self._stop_reaping: anyio.Event | None = None
        self._reaping = False

    @property
    def namespace(self) -> str:
        """The namespace this instance owns (or would own once entered)."""
        return self._namespace

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def claimed(self) -> bool:
        """Whether this instance currently owns its namespace (entered and not yet exited)."""
        return self._claim is not None

    @property
    def path(self) -> str | None:
        """The namespace directory while entered, else ``None``."""
        return None if self._claim is None else str(self._claim.path)

    @property
    def publisher(self) -> LocalDiscovery.Publisher:
        """A new publisher borrowing this namespace (enter it to use it), with this instance's
        ``lock_timeout`` and ``teardown_timeout``."""
        return LocalDiscovery.Publisher(self._namespace, lock_timeout=self._lock_timeout,
                                        teardown_timeout=self._teardown_timeout)

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        """A subscription to this namespace, filtered by this instance's ``filter``."""
        return self.subscribe(self._filter)

    def subscribe(self, filter: PredicateFunction | None = None) -> DiscoverySubscriberLike:
        """A subscription to this namespace, optionally filtered by ``filter``."""
        subscription = LocalDiscovery.Subscriber(self._namespace, poll_interval=self._poll_interval)
        return subscription if filter is None else afilter(filter, subscription)

    async def __aenter__(self) -> LocalDiscovery:
        """Claim the namespace and start the reaper.

        :raises DiscoveryNamespaceInUse: a live owner holds it (or a dead one and
            ``reclaim=False``).
        :raises RuntimeError: this instance was entered before.
        :raises OSError: the registry could not be created; nothing is left behind.
        """
        self._enter_once()
        await anyio.lowlevel.checkpoint_if_cancelled()
        # Decided once: the exit must not depend on the environment changing meanwhile.
        self._in_loop = _runtime_dir.in_memory() and \
            _layout.registry_size(self._capacity, self._block_size) <= _layout.IN_LOOP_BYTES
        claim = None
        if self._in_loop and not _claim.sweep_due():
            # Every call returns at once: no thread hop. Once in SWEEP_INTERVAL, the claim
            # takes the thread path, which also sweeps what dead processes left behind.
            claim = _claim.try_claim(self._namespace, capacity=self._capacity,
                                       block_size=self._block_size)
        if claim is None:  # taken (by a live or a dead owner), or on a disk: may wait
            claim = await anyio.to_thread.run_sync(
                lambda: _claim.claim(self._namespace, capacity=self._capacity,
                                       block_size=self._block_size, reclaim=self._reclaim))
        self._claim = claim
        try:
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            self._stop_reaping = anyio.Event()
            self._task_group.start_soon(self._reap_forever, claim, self._stop_reaping,
                                        name="anywool-local-reaper")
        except BaseException:
            self._task_group = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(claim.release)
            self._claim = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Stop the reaper, retire the namespace and remove every file of it.

        Two phases (see :func:`anywool._teardown.graceful_then_forceful`):

        - graceful: retire the generation under the registry lock, so that no publisher is
          cut off mid-write. The lock wait is cancellable and lasts at most
          ``teardown_timeout`` seconds (or ``lock_timeout``, if smaller); a timeout is logged.
        - forceful (shielded, never waits on another process): retire the generation without
          the lock if the graceful phase did not, remove every file of it and close its
          descriptors, which releases the owner's lock. A writer that still holds the registry
          lock then writes to an unlinked file; borrowers see the retired flag or a dead owner.

        Never raises an ``Exception`` (failures are logged). Cancellation: an enclosing cancel
        scope or deadline cuts the graceful phase short; the forceful one still runs, then the
        cancellation propagates. A process forked from the owner removes nothing.
        """
        claim, task_group = self._claim, self._task_group
        self._claim = self._task_group = None
        try:
            if task_group is not None:
                assert self._stop_reaping is not None
                self._stop_reaping.set()
                if self._reaping:  # in a reap's thread, maybe waiting for the registry lock
                    task_group.cancel_scope.cancel()
            await exit_task_group(task_group, cancel=False)
        finally:
            if claim is not None and not self._released_in_loop(claim):
                # Not done in the loop at once (a writer holds the registry lock, or the
                # runtime directory is on a disk): one thread hop, bounded and cancellable.

                async def remove_now() -> None:
                    if not claim.released:  # no thread hop when the graceful part did it all
                        await anyio.to_thread.run_sync(claim.release, 0)

                await graceful_then_forceful(
                    # Retire under the lock, then remove. Interrupted while waiting for the
                    # lock, it retires without it and removes all the same.
                    lambda: anyio.to_thread.run_sync(self._release, claim),
                    remove_now,
                    timeout=self._teardown_timeout,
                    what=f"retiring discovery namespace {self._namespace!r}",
                    log=log,
                )
        return None

    def _released_in_loop(self, claim: _claim.Claim) -> bool:
        """Release at once, in the loop, when that cannot wait on anything."""
        if not self._in_loop:
            return False
        try:
            return claim.try_release()
        except Exception:  # released as far as it went; the thread path finishes the rest
            log.warning("releasing discovery namespace %r failed", self._namespace,
                        exc_info=True)
            return claim.released

    def _release(self, claim: _claim.Claim) -> None:
        claim.release(self._lock_timeout, anyio.from_thread.check_cancelled)

    async def _reap_forever(self, claim: _claim.Claim, stop: anyio.Event) -> None:
        last_failure: str | None = None
        while True:
            with anyio.move_on_after(self._reap_interval):
                await stop.wait()
            if stop.is_set():
                return
            self._reaping = True
            try:
                await anyio.to_thread.run_sync(self._reap, claim)
            except Exception as exc:  # logged once per kind of failure, not every round
                if repr(exc) != last_failure:
                    last_failure = repr(exc)
                    log.warning("reaping dead publishers of %r failed (retrying every %s)",
                                self._namespace, seconds(self._reap_interval), exc_info=True)
            else:
                last_failure = None
            finally:
                self._reaping = False

    @staticmethod
    def _reap(claim: _claim.Claim) -> None:
        claim.reap(checkpoint=anyio.from_thread.check_cancelled)  # stops with the task group

    def __repr__(self) -> str:
        return f"LocalDiscovery({self._namespace!r})"

    # -- borrowers ----------------------------------------------------------------------------

    class Publisher(SingleUse):
        """Borrow a namespace to announce workers in it.

        Entering binds the live owner's registry and takes a lease (a locked file that tells the
        owner this publisher is alive). Exiting withdraws every worker this publisher announced
        and did not drop, then releases the lease (see :meth:`__aexit__`). If the owner exits
        meanwhile, the publisher is *orphaned*: its next publish rebinds to a successor owner
        if one exists.

        :param namespace: the namespace to borrow.
        :param lock_timeout: seconds a registry lock may be waited for (``None``: forever).
        :param teardown_timeout: seconds (≥ 0) the exit may wait for the registry lock to
            withdraw this publisher's workers (the smaller of it and ``lock_timeout`` applies;
            ``0``: only one non-blocking attempt).
        :raises TypeError: an argument has the wrong type or is not accepted (a borrower
            cannot declare ``capacity`` or ``block_size``; the owner stamped them).
        :raises ValueError: ``lock_timeout`` or ``teardown_timeout`` is negative.
        """

        bind_host = "127.0.0.1"

        def __init__(self, namespace: str, *, lock_timeout: float | None = 30.0,
                     teardown_timeout: float = 5.0) -> None:
            self.namespace = _validate.namespace(namespace)
            self.lock_timeout = _validate.seconds("lock_timeout", lock_timeout, allow_zero=True, optional=True)
            self.teardown_timeout = _validate.duration("teardown_timeout", teardown_timeout,
                                                       allow_zero=True)
            self._held: _Held | None = None
            self._in_loop = False
            # Concurrent publishes share one binding; held only across bookkeeping and file
            # calls that never wait on another process.
            self._binding_lock = threading.Lock()
            self._withdrawn = False

        async def __aenter__(self) -> LocalDiscovery.Publisher:
            """Bind the namespace.

            :raises DiscoveryNamespaceNotFound: no live owner holds it (nothing is created).
            :raises RuntimeError: this publisher was entered before.
            """
            self._enter_once()
            await anyio.lowlevel.checkpoint_if_cancelled()
            # Decided once: the exit must not depend on the environment changing meanwhile.
            self._in_loop = _runtime_dir.in_memory()
            if self._in_loop:
                self._bind_first()  # files in memory only: nothing here can wait
                await anyio.lowlevel.cancel_shielded_checkpoint()  # let other tasks run
            else:
                await anyio.to_thread.run_sync(self._bind_first)
            return self

        async def __aexit__(self, *exc_info: object) -> None:
            """Withdraw this publisher's workers, then release its lease.

            Two phases (see :func:`anywool._teardown.graceful_then_forceful`):

            - graceful: withdraw the workers this publisher announced and did not drop, under
              the registry lock. The lock wait is cancellable and lasts at most
              ``teardown_timeout`` seconds (or ``lock_timeout``, if smaller); a timeout is
              logged with its ``TimeoutError``.
            - forceful (shielded, never waits on another process): if the workers were not
              withdrawn, one non-blocking attempt to withdraw them; then release the lease and
              close the binding.

            Leaving workers behind is safe: the owner's reaper drops the slots of a released
            lease within its ``reap_interval``, and subscribers then see ``worker-dropped``.

            Never raises an ``Exception`` (failures are logged). Cancellation: an enclosing
            cancel scope or deadline cuts the graceful phase short; the forceful one still
            runs, then the cancellation propagates.
            """
            self._released = True  # no publish from here on
            if self._in_loop and self._leave_now():
                # All done in the loop; an enclosing cancellation still propagates from here.
                await anyio.lowlevel.checkpoint()
                return
            await graceful_then_forceful(
                lambda: anyio.to_thread.run_sync(self._withdraw),
                lambda: anyio.to_thread.run_sync(self._release),
                timeout=self.teardown_timeout,
                what=f"withdrawing the workers of a publisher of {self.namespace!r}",
                log=log,
            )

        async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
            """Announce a worker lifecycle change to every subscriber of the namespace.

            :param type: ``"worker-added"`` registers (or refreshes in place),
                ``"worker-updated"`` rewrites an existing registration, ``"worker-dropped"``
                removes it (no-op when unknown).
            :param metadata: the worker; its msgpack encoding must fit the owner's
                ``block_size``.
            :raises DiscoveryNamespaceNotFound: no live owner holds the namespace (after trying
                to rebind to a successor).
            :raises DiscoveryCapacityExhausted: every slot holds another worker.
            :raises DiscoveryBlockExhausted: the metadata does not fit one block.
            :raises DiscoveryWorkerNotFound: an update names an unregistered worker.
            :raises DiscoveryRegistryCorrupt: the live owner's registry is damaged (nothing is
                written into it).
            :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` s.
            :raises RuntimeError: the publisher is not entered.

            Cancellation: safe at any point; a cancelled publish either committed fully or not
            at all and never leaves the registry lock held (the lock is polled, never waited on
            in the kernel, and the thread checks for cancellation between attempts). On a
            memory file system with the lock free, the publish is done in the event loop
            without a thread hop: a cancellation point then, not a schedule point.
            """
            check_event(type, metadata)
            if not self._entered or self._released:
                raise RuntimeError("publish needs an entered publisher (inside its async with)")
            await anyio.lowlevel.checkpoint_if_cancelled()
            if self._in_loop and self._publish_now(type, metadata):
                # Done: a schedule point (other tasks run), which a cancellation cannot undo.
                await anyio.lowlevel.cancel_shielded_checkpoint()
                return
            await anyio.to_thread.run_sync(self._publish, type, metadata)

        _released = False

        def _bind(self) -> _Held:
            binding = _binding.bind(self.namespace)
            try:
                lease = binding.open_lease()
            except BaseException:
                binding.close()
                raise
            return _Held(binding, lease)

        def _bind_first(self) -> None:
            self._held = self._bind()

        def _acquire(self, *, rebind: bool) -> _Held | None:
            """The current binding, counted as in use until :meth:`_done`. With ``rebind``, a
            binding whose owner is gone is replaced by one to a successor (or
            :class:`~anywool.errors.DiscoveryNamespaceNotFound`). Never waits on another
            process."""
            with self._binding_lock:
                held = self._held
                if rebind and (held is None or not held.binding.is_live()):
                    self._drop(held)
                    try:
                        held = self._held = self._bind()
                    except DiscoveryNamespaceNotFound:
                        raise DiscoveryNamespaceNotFound(self.namespace) from None
                if held is not None:
                    held.users += 1
                return held

        def _done(self, held: _Held) -> None:
            with self._binding_lock:
                held.users -= 1
                if held.dropped and not held.users:
                    held.close()

        def _drop(self, held: _Held | None) -> None:
            """Stop handing out ``held``; it closes once its last user is done (lock held)."""
            if held is None:
                return
            if self._held is held:
                self._held = None
            held.dropped = True
            if not held.users:
                held.close()

        def _publish(self, type: str, metadata: WorkerMetadata) -> None:
            held = self._acquire(rebind=True)
            assert held is not None
            try:
                held.binding.publish(type, metadata, held.lease.id, lock_timeout=self.lock_timeout,
                                     checkpoint=anyio.from_thread.check_cancelled)
            finally:
                self._done(held)

        def _publish_now(self, type: str, metadata: WorkerMetadata) -> bool:
            """Publish in the event loop if the registry lock is free right now (on a memory
            file system nothing else on the way can wait); ``False``: nothing was written, the
            lock is taken (the thread path waits for it)."""
            held = self._acquire(rebind=True)
            assert held is not None
            try:
                if held.binding.table.size > _layout.IN_LOOP_BYTES:
                    return False  # too large to scan in the loop
                held.binding.publish(type, metadata, held.lease.id, lock_timeout=0)
            except TimeoutError:
                return False
            finally:
                self._done(held)
            return True

        def _leave_now(self) -> bool:
            """The whole exit in the event loop, if the registry lock is free right now;
            ``False``: nothing was withdrawn (the two-phase exit takes over)."""
            held = self._acquire(rebind=False)
            if held is not None:
                try:
                    if held.binding.table.size > _layout.IN_LOOP_BYTES:
                        return False  # too large to scan in the loop
                    if held.binding.is_live():
                        held.binding.withdraw(held.lease.id, lock_timeout=0)
                except Exception:  # the lock is taken (or worse): the graceful part handles it
                    return False
                finally:
                    self._done(held)
            self._withdrawn = True
            self._release()
            return True

        def _withdraw(self) -> None:
            """The graceful part of the exit: withdraw under the lock, cancellably."""
            held = self._acquire(rebind=False)
            if held is not None:
                try:
                    if held.binding.is_live():
                        held.binding.withdraw(held.lease.id, lock_timeout=self.lock_timeout,
                                              checkpoint=anyio.from_thread.check_cancelled)
                finally:
                    self._done(held)
            self._withdrawn = True

        def _release(self) -> None:
            """The forceful part of the exit; idempotent, never waits on another process."""
            held = self._acquire(rebind=False)
            if held is None:
                return
            try:
                if not self._withdrawn and held.binding.is_live():
                    try:
                        held.binding.withdraw(held.lease.id, lock_timeout=0)
                    except (TimeoutError, DiscoveryError) as exc:  # the graceful part said why
                        log.debug("workers of a publisher of %r left to the owner's reaper: %r",
                                  self.namespace, exc)
                self._withdrawn = True
            finally:
                with self._binding_lock:
                    self._drop(held)
                self._done(held)

        def __repr__(self) -> str:
            return f"LocalDiscovery.Publisher({self.namespace!r})"

    class Subscriber:
        """Borrow a namespace to follow its workers: an async iterable of events.

        Every ``async for`` binds the live owner (all iterations in one process over the same
        ``(namespace, poll_interval)`` share one source), yields ``worker-added`` for each
        current worker, then every change. If the owner exits, the iteration yields
        ``worker-dropped`` for every worker it knew, then follows a successor owner when one
        claims the namespace.

        :param namespace: the namespace to borrow.
        :param poll_interval: seconds (0.01 to a week) between checks that back up the change
            hint (``None``: 1 s).
        :raises TypeError: an argument has the wrong type or is not accepted.
        :raises ValueError: ``poll_interval`` is not positive.

        Iterating raises :class:`~anywool.errors.DiscoveryNamespaceNotFound` when no live
        owner holds the namespace as the iteration starts (nothing is created), and
        ``TimeoutError`` if a publisher kept the registry locked for 30 s while the iteration
        started (cancelling the iteration ends that wait at once). It raises
        :class:`~anywool.errors.DiscoveryRegistryCorrupt` when the registry of the live owner is
        damaged (overwritten, truncated, of another format, replaced by another file, or no
        longer openable): at once as it starts, and later, after the events it already
        yielded, within about ``poll_interval`` seconds of the damage (every iteration of the
        namespace in this process, each with its own copy). A registry removed from under its
        owner reads as the owner gone: ``worker-dropped`` for every worker. Closing or cancelling an
        iteration affects no other; the source stops with the last one. An iteration left with
        a plain ``break`` is released as soon as nothing refers to it (no garbage collection
        pass needed); ``aclose()`` also waits for the source's thread to end.
        """

        if TYPE_CHECKING:
            # For type checkers only: construction is typed as the protocol the caller relies
            # on, while the parameters below are still checked.
            def __new__(
                cls, namespace: str, *, poll_interval: float | None = None
            ) -> DiscoverySubscriberLike: ...

        def __init__(self, namespace: str, *, poll_interval: float | None = None) -> None:
            self.namespace = _validate.namespace(namespace)
            self.poll_interval = _validate.seconds("poll_interval", poll_interval, allow_zero=False, optional=True,
                                                floor=_validate.MIN_INTERVAL)

        def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            interval = _hub.DEFAULT_POLL_INTERVAL if self.poll_interval is None \
                else self.poll_interval
            return _hub.iterate(self.namespace, interval)

        def __reduce__(self) -> tuple[Any, ...]:
            return (_make_subscriber, (self.namespace, self.poll_interval))

        def _owned(self) -> bool | None:
            """Whether a live owner holds the namespace now (``None``: it cannot say). Blocking
            file I/O: for a diagnosis, run in a worker thread."""
            try:
                binding = _binding.bind(self.namespace)
            except DiscoveryNamespaceNotFound:
                return False
            except Exception:
                return None
            binding.close()
            return True

        def __eq__(self, other: object) -> bool:
            if not isinstance(other, LocalDiscovery.Subscriber):
                return NotImplemented
            return (self.namespace, self.poll_interval) == (other.namespace, other.poll_interval)

        def __hash__(self) -> int:
            return hash((self.namespace, self.poll_interval))

        def __repr__(self) -> str:
            return (f"LocalDiscovery.Subscriber({self.namespace!r}, "
                    f"poll_interval={self.poll_interval!r})")


class _Held:
    """A publisher's binding and lease, and how many threads are using them.

    A binding is replaced when its owner goes (a successor appears) and released when the
    publisher exits, possibly while other threads still publish through it: it is closed only
    once it was dropped *and* its last user is done, so no write ever goes through a closed
    descriptor, whose number another file may already have taken.
    """

    def __init__(self, binding: _binding.Binding, lease: _binding.Lease) -> None:
        self.binding = binding
        self.lease = lease
        self.users = 0
        self.dropped = False

    def close(self) -> None:
        try:
            self.lease.release()
        finally:
            self.binding.close()


def _make_subscriber(namespace: str, poll_interval: float | None) -> DiscoverySubscriberLike:
    return LocalDiscovery.Subscriber(namespace, poll_interval=poll_interval)
