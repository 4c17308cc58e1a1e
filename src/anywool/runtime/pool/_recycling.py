"""Recycling and idleness: when a pool's running worker leaves, and how the pool grows back.

A spawned worker leaves its slot, other than by dying, in four ways, all decided here: it
retires by itself (``max_calls``, ``max_memory``: it says so), :meth:`WorkerPool.recycle
<anywool.WorkerPool.recycle>` replaces it (also on a recycle request a worker passes on), or it
is idle past ``idle_timeout`` while more than ``min_workers`` run (then it is not replaced, and
the pool grows back, one worker at a time, once calls come again). Its worker's notices are
read here while it runs. Starting, announcing and stopping workers is supervision's
(:mod:`~anywool.runtime.pool._supervisor`), on which this part is built: it is the
supervisor's :class:`~anywool.runtime.pool._supervisor.Lifecycle`.

What this module must never do: withdraw a worker that is to be replaced before its
replacement is connected to the pool's proxy, cut the calls of a retiring worker short (they
run to their end, however long; only the pool's exit bounds them), or retire a worker the pool
needs (the last ``min_workers`` stay).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Literal
from uuid import UUID

import anyio

from anywool._duration import seconds
from anywool.errors import WorkerError
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._supervisor import Ended, Supervisor
from anywool.runtime.worker._contract import (
    IDLE_TIMEOUT,
    NOTICE_CALL,
    NOTICE_IDLE,
    NOTICE_RECYCLE,
    REPORT_CALL,
    RETIRING,
)

# The pool's logger: users configure logging by this name.
log = logging.getLogger("anywool.runtime._pool")

# What _until_exit_or_stop says of a worker retired for idleness (not replaced).
_IDLE = "is idle"


class Recycling:
    """Retires one pool's running workers, replaces them, and grows the pool back.

    Job: watch each running worker (its process, its notices, the pool's stop, a recycle of
    it); replace a worker that retires or is recycled (its replacement started, announced and
    connected before it is withdrawn; it then drains and exits); run :meth:`recycle`, one at a
    time, and the recycle requests the workers pass on; retire idle workers down to
    ``min_workers`` and, while fewer than the spawn run, start one more at the next call a
    worker reports.

    Owns: each running worker's "recycle it" event, the events :meth:`recycle` waits on and
    why a replacement could not start, the recycle lock and the pending request, the workers
    asked to report their next call, and whether a start to grow back is under way.

    Invariants: one :meth:`recycle` at a time (requests that come during one are taken after
    it, once); a worker :meth:`recycle` asks for is either replaced or kept with the reason
    given to :meth:`recycle`; an idle worker retires only while more than ``min_workers``
    slots are open and as many others serve; at most one start to grow back at a time, each
    decided by a call taken after the previous start ended; nothing retires or grows once the
    pool's exit began.

    Cancellation: :meth:`recycle` cancelled stops between workers (a replacement under way
    completes); the pool's exit ends the request loop, and a retiring worker's drain, at once
    (its stop is then the exit's, within ``shutdown_timeout``).
    """

    def __init__(self, supervisor: Supervisor, *, idle_timeout: float | None,
                 min_workers: int, on_request: Callable[[], Awaitable[object]]) -> None:
        """:param supervisor: the pool's slots, which this part retires workers from.
        :param idle_timeout: seconds without a call after which a worker is idle (``None``:
            never).
        :param min_workers: the fewest spawned workers idleness leaves running.
        :param on_request: run for each recycle request a worker passes on."""
        self._supervisor = supervisor
        self._idle_timeout = idle_timeout
        self._min_workers = min_workers
        self._on_request = on_request
        # Rolling restarts (recycle()): each running worker's "replace it" event, the events
        # recycle() waits on (set once that worker is gone), and why a replacement could not
        # start (the worker then stays).
        self._recycle_asked: dict[UUID, anyio.Event] = {}
        self._recycled: dict[UUID, anyio.Event] = {}
        self._recycle_failures: dict[UUID, BaseException | str] = {}
        self._one_at_a_time = anyio.Lock()
        # Recycle requests passed on by the workers (see serve_requests).
        self._recycle_wanted = anyio.Event()
        self._requests: anyio.CancelScope | None = None  # around them, once the pool runs
        self._requests_ended = False
        # Idleness: the workers asked to report their next call, and whether a start to grow
        # back is under way.
        self._armed: set[UUID] = set()
        self._growing = False

    async def recycle(self) -> None:
        """Replace every running worker, one at a time (see :meth:`WorkerPool.recycle
        <anywool.WorkerPool.recycle>`).

        :raises ~anywool.errors.WorkerError: a replacement failed to start; the worker it was
            to replace, and those after it, keep running.
        """
        async with self._one_at_a_time:
            for worker in self._supervisor.workers:
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

    # -- the supervisor's Lifecycle --------------------------------------------------------------

    async def configure(self, worker: LocalWorker) -> None:
        """Tell a worker that just started how long it may stay idle (if it may)."""
        if self._idle_timeout is not None:
            await worker.tell(f"{IDLE_TIMEOUT} {self._idle_timeout!r}")

    async def watch(self, worker: LocalWorker) -> int | None | Literal[Ended.RETIRED]:
        """Run with a worker until its process ends by itself (its exit code), the pool stops
        (``None``), or it retired and was stopped (:attr:`Ended.RETIRED`); a worker whose
        replacement could not start for a recycle is watched on."""
        uid = worker.metadata.uid
        while True:
            asked = self._recycle_asked[uid] = anyio.Event()
            code, retiring = await self._until_exit_or_stop(worker, asked)
            if retiring is None:
                return code
            if await self._retire(worker, retiring, recycling=asked.is_set(),
                                  replace=retiring != _IDLE):
                return Ended.RETIRED

    def forget(self, uid: UUID) -> None:
        """The worker ``uid`` is no longer watched: a recycle waiting for it goes on."""
        self._armed.discard(uid)
        self._recycle_asked.pop(uid, None)
        recycled = self._recycled.pop(uid, None)
        if recycled is not None:
            recycled.set()

    async def serve_requests(self) -> None:
        """Run the recycle requests the workers pass on, one at a time: those that come during
        one are taken after it, once. Ends when the pool exits (a recycle under way is
        cancelled between workers)."""
        with anyio.CancelScope() as self._requests:
            if self._requests_ended:
                return
            while True:
                await self._recycle_wanted.wait()
                self._recycle_wanted = anyio.Event()
                await self._on_request()

    def end_requests(self) -> None:
        self._requests_ended = True
        if self._requests is not None:
            self._requests.cancel()

    # -- retiring ------------------------------------------------------------------------------

    async def _retire(self, worker: LocalWorker, reason: str, *, recycling: bool,
                      replace: bool = True) -> bool:
        """Replace ``worker``: start its replacement in a supervisor of its own, wait until
        this pool's proxy is connected to it, then withdraw ``worker`` and let its calls
        finish, however long they take (it then exits by itself); the pool's exit stops it as
        any worker, its calls drained within what is left of ``shutdown_timeout``. Whether it
        was replaced: a worker that retires by itself (it takes no new calls) is withdrawn even
        when no replacement starts (its slot is given up); one that ``recycling`` replaces
        stays when none starts (the reason is kept for :meth:`recycle`). Without ``replace``
        (an idle worker, its slot closed already), it is withdrawn and stopped alone."""
        supervisor = self._supervisor
        replacement: LocalWorker | None = None
        failure: BaseException | str = ""
        if not replace:
            log.info("worker pid %s was idle for %s; retiring it (%d workers left)",
                     worker.pid, seconds(self._idle_timeout), supervisor.slots)
        else:
            log.info("worker pid %s %s; replacing it", worker.pid, reason)
            async with anyio.create_task_group() as notices:
                # It still answers requests meanwhile: a recycle request is passed on.
                notices.start_soon(self._pass_on_recycle_requests, worker)
                replacement, failure = await supervisor.start_replacement(
                    give_up=not recycling)
                if replacement is not None:
                    await supervisor.until_connected(replacement)
                notices.cancel_scope.cancel()
        if replace and replacement is None and recycling and not supervisor.closing:
            uid = worker.metadata.uid
            self._recycle_failures[uid] = failure
            done = self._recycled.pop(uid, None)
            if done is not None:
                done.set()
            return False
        await supervisor.withdraw(worker)
        if not supervisor.stopping:
            async with anyio.create_task_group() as tg:

                async def until_stopping() -> None:
                    await supervisor.until_stopping()
                    tg.cancel_scope.cancel()

                tg.start_soon(until_stopping)
                await worker.drain()
                tg.cancel_scope.cancel()
        await supervisor.stop(worker)
        return True

    async def _pass_on_recycle_requests(self, worker: LocalWorker) -> None:
        """Read ``worker``'s notices (until it ends, or this is cancelled), passing on its
        recycle requests; the others are moot once it is being replaced."""
        while (said := await worker.notice()) is not None:
            if said == NOTICE_RECYCLE and not self._supervisor.closing:
                self._recycle_wanted.set()

    async def _until_exit_or_stop(self, worker: LocalWorker, asked: anyio.Event
                                  ) -> tuple[int | None, str | None]:
        """The worker's exit code if its process ends by itself, or why it is to be replaced
        (it retires, see :meth:`LocalWorker.retiring`, or ``asked`` was set by
        :meth:`recycle`); ``(None, None)`` if the pool stops."""
        supervisor = self._supervisor
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
                    if supervisor.closing:
                        continue
                    if said.startswith(RETIRING):
                        retiring = f"retires: {said[len(RETIRING):]}"
                        tg.cancel_scope.cancel()
                        return
                    if said == NOTICE_RECYCLE:
                        log.info("worker pid %s passed on a recycle request", worker.pid)
                        self._recycle_wanted.set()
                    elif said == NOTICE_IDLE and self._idle_timeout is not None:
                        if (supervisor.slots > self._min_workers
                                and self._running_besides(worker) >= self._min_workers):
                            supervisor.close_slot()  # now: the next idle worker sees one fewer
                            retiring = _IDLE
                            tg.cancel_scope.cancel()
                            self.arm()
                            return
                        log.debug("worker pid %s is idle; kept (min_workers=%d)", worker.pid,
                                  self._min_workers)
                    elif said == NOTICE_CALL:
                        self._armed.discard(worker.metadata.uid)
                        self._grow()

            async def watch_pool() -> None:
                await supervisor.until_stopping()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_process)
            tg.start_soon(watch_pool)
            tg.start_soon(watch_notices)
            tg.start_soon(watch_recycle)
        if supervisor.stopping:
            return None, None
        return code, None if code is not None else retiring

    # -- idleness and growth back (idle_timeout) ------------------------------------------------

    def _running_besides(self, worker: LocalWorker) -> int:
        """How many other spawned workers are up and not withdrawn."""
        return sum(1 for other in self._supervisor.serving() if other is not worker)

    def arm(self) -> None:
        """While the pool runs fewer than its spawn of workers, ask each running worker not
        asked yet to report its next call (it then says ``call`` once: see :meth:`_grow`)."""
        supervisor = self._supervisor
        if (self._idle_timeout is None or supervisor.slots >= supervisor.size
                or supervisor.closing):
            return
        for worker in supervisor.serving():
            uid = worker.metadata.uid
            if uid not in self._armed:
                self._armed.add(uid)
                supervisor.start_soon(worker.tell, REPORT_CALL)

    def _grow(self) -> None:
        """A worker took a call while asked to report one: start one more worker, if the pool
        runs fewer than its spawn and no such start is under way."""
        supervisor = self._supervisor
        if self._growing or supervisor.slots >= supervisor.size or supervisor.closing:
            return
        self._growing = True
        supervisor.start_soon(self._grow_one)

    async def _grow_one(self) -> None:
        supervisor = self._supervisor
        try:
            log.info("a call came with %d of %d workers running; starting one more",
                     supervisor.slots, supervisor.size)
            worker, failure = await supervisor.start_replacement(give_up=False)
            if worker is not None:
                supervisor.reopen_slot()
            elif not supervisor.closing:
                log.warning("a worker to grow back to %d could not start: %s", supervisor.size,
                            failure)
        finally:
            self._growing = False
        self.arm()
