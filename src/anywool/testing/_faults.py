"""Faults a test can inject into anywool on purpose: a dead worker, a stopped process, a
registry lock that someone holds.

Each helper does one thing to the system as it is, through the same paths anywool uses, and
undoes what can be undone when its block ends. What this module must never do: leave a process
stopped or a lock held after its block, or create a file in the runtime directory.
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.to_thread

from anywool.testing._processes import Identity, can_see_states, identify, signal_process, state
from anywool.testing._settle import settle

if TYPE_CHECKING:
    from anywool.discovery.local._binding import Binding
    from anywool.discovery.local._flock import locked
    from anywool.runtime.pool._pool import WorkerPool


def kill_worker(pool: WorkerPool, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to one of the worker processes ``pool`` spawned and runs now.

    The worker is the first of :attr:`~anywool.WorkerPool.workers`. Returns as soon as the
    signal is sent; what follows is the pool's doing: a worker that dies is withdrawn from
    discovery and replaced, and the calls in flight on it raise
    :class:`~anywool.errors.WorkerError`.

    :param pool: an entered pool that spawns workers.
    :param sig: the signal number (default ``SIGKILL``; the worker treats ``SIGTERM`` as a
        request to stop, cancelling its calls).
    :returns: the pid that was signalled.
    :raises ValueError: the pool runs no spawned worker now (it is not entered, has exited,
        spawns none, or gave up every slot); the message names the pool.
    :raises ProcessLookupError: the worker exited meanwhile, before the pool noticed.
    """
    workers = pool.workers
    if not workers:
        raise ValueError(f"{pool!r} runs no spawned worker to signal (is it entered, and does "
                         "it spawn workers?)")
    pid = workers[0].pid
    os.kill(pid, sig)
    return pid


@contextmanager
def suspended(pid: int, *, timeout: float = 5.0) -> Iterator[None]:
    """Stop the process ``pid`` (SIGSTOP) for the duration of the ``with`` block.

    Meant for a namespace owner or a worker in another process: a stopped process keeps its
    kernel locks and its sockets, so it looks alive but answers nothing. On entry it waits
    (polling, at most ``timeout`` seconds) until the kernel reports the process stopped (where
    ``/proc`` tells; elsewhere it does not wait). On exit, also when the block raises or is
    cancelled, it continues the process (SIGCONT) unless it died meanwhile. Blocks nest: only
    the outermost one stops and continues the process.

    :param pid: a process of the same user.
    :param timeout: seconds (≥ 0) to wait for the process to stop.
    :raises ValueError: ``timeout`` is negative.
    :raises ProcessLookupError: there is no such process (nothing was signalled).
    :raises TimeoutError: the process did not stop within ``timeout`` seconds (it was
        continued before this is raised).

    Blocking: entry polls in the calling thread, for the moment the kernel needs to stop the
    process (normally well under a millisecond).
    """
    from anywool import _validate  # here: the plugin's import loads nothing of anywool

    _validate.duration("timeout", timeout, allow_zero=True)
    process = identify(pid)
    if _suspensions.get(process, 0):
        # Nested: the outermost block stopped it and is the one that continues it.
        _suspensions[process] += 1
        try:
            yield
        finally:
            _suspensions[process] -= 1
        return
    os.kill(pid, signal.SIGSTOP)
    _suspensions[process] = 1
    try:
        if can_see_states() and settle(
                lambda: [process] if state(process) == "running" else [], timeout):
            raise TimeoutError(f"pid {pid} did not stop within {timeout} s of SIGSTOP")
        yield
    finally:
        del _suspensions[process]
        signal_process(process, signal.SIGCONT)


# How many suspended() blocks hold each process stopped (in this process).
_suspensions: dict[Identity, int] = {}


class RegistryLock:
    """A hold on a namespace registry's file lock; see :func:`hold_registry_lock`.

    A context manager, sync (``with``) or async (``async with``), entered once at a time.
    """

    def __init__(self, namespace: str, *, shared: bool, timeout: float | None) -> None:
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, got {namespace!r}")
        from anywool import _validate  # here: the plugin's import loads nothing of anywool

        _validate.seconds("timeout", timeout, allow_zero=True, optional=True)
        self.namespace = namespace
        self.shared = shared
        self._operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        self._timeout = timeout
        self._binding: Binding | None = None
        self._held: locked | None = None

    def _bind(self) -> Binding:
        if self._binding is not None:
            raise RuntimeError(f"the registry lock of {self.namespace!r} is already held "
                               "by this object")
        from anywool.discovery.local._binding import bind

        return bind(self.namespace)

    def _acquire(self, checkpoint: Callable[[], None] | None = None) -> RegistryLock:
        from anywool.discovery.local._flock import locked

        binding = self._bind()
        held = locked(binding.registry_fd, binding.guard, self._operation, self._timeout,
                      self.namespace, checkpoint)
        try:
            held.__enter__()
        except BaseException:
            binding.close()
            raise
        self._binding, self._held = binding, held
        return self

    def __enter__(self) -> RegistryLock:
        return self._acquire()

    async def __aenter__(self) -> RegistryLock:
        # As anywool waits for a registry lock itself: in a worker thread that polls, and that
        # a cancellation of the waiting task stops at its next poll.
        return await anyio.to_thread.run_sync(self._acquire, anyio.from_thread.check_cancelled)

    def release(self) -> None:
        """Release the lock now (idempotent); the block's end does the same."""
        binding, held, self._binding, self._held = self._binding, self._held, None, None
        if binding is not None and held is not None:
            try:
                held.__exit__(None, None, None)
            finally:
                binding.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()


def hold_registry_lock(namespace: str, *, shared: bool = False,
                       timeout: float | None = 5.0) -> RegistryLock:
    """Hold the file lock of ``namespace``'s registry for the duration of a ``with`` block.

    This is the lock every publish, reap and snapshot of the namespace takes: held exclusively
    (the default), every publish waits and raises ``TimeoutError`` after its ``lock_timeout``;
    held shared, reads go on and writes wait. The registry is the live generation's, found
    through anywool's own path code and opened without creating anything. flock belongs to an
    open file description, so the lock excludes anywool's own descriptors in this very process
    as well as other processes.

    ``with hold_registry_lock(ns):`` polls for the lock in the calling thread;
    ``async with hold_registry_lock(ns):`` polls in a worker thread, and the event loop goes
    on meanwhile.

    :param namespace: a namespace with a live owner.
    :param shared: take ``LOCK_SH`` instead of ``LOCK_EX``.
    :param timeout: seconds (≥ 0) to wait for the lock, polled with backoff (``None``:
        forever).
    :raises DiscoveryNamespaceNotFound: no live owner holds the namespace (on entry).
    :raises DiscoveryRegistryCorrupt: its registry does not read as one (on entry).
    :raises TimeoutError: the lock was not acquired within ``timeout`` seconds; the message
        names the namespace (on entry).
    :raises RuntimeError: the returned object is entered while it holds the lock.

    Cancellation (``async with``): the wait for the lock is cancellable and leaves nothing
    held. Exiting the namespace's owner while the lock is held makes the owner's exit wait its
    ``teardown_timeout`` for it.
    """
    return RegistryLock(namespace, shared=shared, timeout=timeout)
