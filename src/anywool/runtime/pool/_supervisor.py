"""Supervision: a pool's worker slots, each running one spawned worker at a time.

A slot is a task in the supervisors' task group: it starts a worker, announces it (through
:mod:`~anywool.runtime.pool._publishing`), hands its running life to the pool's lifecycle
rules (recycling and idleness, :mod:`~anywool.runtime.pool._recycling`), replaces it when its
process dies (with a back-off, giving the slot up after failed starts in a row), and stops it
when the pool exits. The warm template the workers are forked from is kept here too, by
:class:`TemplateKeeper`: when to start it and how long it lives follow from when workers start.

What this module must never do: leave a worker unstopped or unreaped at the pool's exit, let a
worker's failure end the pool's task group once the pool runs, or wait for a worker start (a
lifespan's entry may take ``startup_timeout``) when the pool exits.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Literal, Protocol
from uuid import UUID

import anyio
from anyio.abc import TaskGroup, TaskStatus

from anywool._owner import exit_task_group
from anywool._teardown import Budget
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._publishing import Publishing
from anywool.runtime.pool._template import Template, TemplateUnavailable
from anywool.runtime.worker._contract import SUPERVISED

if TYPE_CHECKING:
    from anywool.runtime.client._proxy import WorkerProxy

# The pool's logger: users configure logging by this name.
log = logging.getLogger("anywool.runtime._pool")

# A replacement that dies sooner than this after starting counts as failing at start-up; after
# this many such failures in a row its slot is given up.
_MIN_UPTIME = 2.0
_MAX_START_FAILURES = 3
_RESTART_BACKOFF = 0.1


class Ended(enum.Enum):
    """How a running worker's life ended, when not by its process's exit or the pool's stop."""

    #: A worker left its slot for good: retired and stopped (replaced by a worker of another
    #: slot, or not replaced: idleness closed its slot).
    RETIRED = "retired"


class Lifecycle(Protocol):
    """What happens to a running worker besides its process ending: the pool's recycling and
    idleness rules (:class:`~anywool.runtime.pool._recycling.Recycling`), given to
    :meth:`Supervisor.start` since they are built on the supervisor."""

    async def configure(self, worker: LocalWorker) -> None:
        """Tell a worker that just started what it needs to know of the rules."""

    def arm(self) -> None:
        """A worker joined the running ones: apply the rules that depend on how many run."""

    async def watch(self, worker: LocalWorker) -> int | None | Literal[Ended.RETIRED]:
        """Run with ``worker`` until its process ends by itself (its exit code), the pool
        stops (``None``), or it retired (:attr:`Ended.RETIRED`: it is stopped)."""
        ...

    def forget(self, uid: UUID) -> None:
        """The worker ``uid`` left the running ones."""

    async def serve_requests(self) -> None:
        """Run in the supervisors' task group until :meth:`end_requests`."""

    def end_requests(self) -> None:
        """The pool stops: end :meth:`serve_requests`."""


class TemplateKeeper:
    """Keeps a pool's warm template (:mod:`~anywool.runtime.pool._template`) while its workers
    run, so that they start as forks of one warm interpreter.

    Owns: the task group the template runs in (entered on the pool's exit stack before the
    supervisors, so exited after them: the template outlives the workers it forked), the
    template while it is warm, and whether it was asked for.

    Invariants: the template is started at most once; a worker starting while it warms up does
    not wait for it; it runs until every worker was stopped, whatever cancels the pool.

    Cancellation: a warm-up under way is cancelled by the pool's exit, not waited for; once
    warm, the template ends only after the workers (shielded), then is killed and reaped.
    """

    def __init__(self, startup_timeout: float) -> None:
        self._startup_timeout = startup_timeout
        self._template: Template | None = None
        self._wanted = False
        self._task_group: TaskGroup | None = None
        self._workers_stopped = anyio.Event()

    @property
    def template(self) -> Template | None:
        """The warm template, while it runs (``None``: not asked for, warming up, unavailable
        or ended)."""
        return self._template

    async def open(self, stack: AsyncExitStack) -> None:
        """Enter the keeper's task group on ``stack``. A template started later runs until
        ``stack`` has run what was pushed on it after this (the supervisors' exit, which stops
        the workers), then is killed and reaped."""
        # Entered and exited as the supervisors are (exit_task_group): given the exception of
        # the pool's block, a task group would re-raise it in a group (trio: a Ctrl-C's
        # KeyboardInterrupt ended a script as an exception group, exit code 1).
        task_group = self._task_group = anyio.create_task_group()
        await task_group.__aenter__()
        # Cancelled: a warm-up under way is not waited for.
        stack.push_async_callback(exit_task_group, task_group)
        stack.callback(self._workers_stopped.set)

    async def warm(self, backend: str) -> None:
        """Start the template and wait until it is warm (or known unavailable)."""
        assert self._task_group is not None
        self._wanted = True
        await self._task_group.start(self._keep, backend)

    def want(self, backend: str) -> None:
        """Start the warm template, once (the worker starting now does not wait for it)."""
        if not self._wanted and self._task_group is not None:
            self._wanted = True
            self._task_group.start_soon(self._keep, backend)

    async def _keep(self, backend: str, *,
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


class Supervisor:
    """Runs the worker slots of one pool: a supervisor task per slot, in one task group.

    Job: start the pool's first workers (together; the first failure fails the pool's entry),
    replace a worker whose process dies (logged; a start that fails, or a worker that dies
    within :data:`_MIN_UPTIME` seconds, is retried with an exponential back-off, and the slot
    is given up after :data:`_MAX_START_FAILURES` in a row), start workers for others (a
    retiring worker's replacement, one more to grow back), end a worker its proxy found stuck,
    and stop every worker when the pool exits.

    Owns: the supervisors' task group, the running workers (in start order), which of them are
    the pool's own (up and announced, not withdrawn: what the pool's proxy admits whatever its
    lease), the starts under way, the open slots and the spawn they count down from, why every
    slot was given up, and the :class:`TemplateKeeper`.

    Invariants: a worker is in :attr:`workers` from its start (its ``supervised`` line sent)
    until its supervisor stops watching it; the proxy learns of every change of the own workers
    at once; no worker starts once the pool's exit began; every worker started is stopped and
    reaped before :meth:`start`'s exit callbacks return.

    Cancellation: the pool's exit first cancels the starts under way (a cancelled start kills
    and reaps its process), then waits, uncancelled, for each slot to stop its worker within
    what is left of ``shutdown_timeout``; a Ctrl-C during the exit (:meth:`hurry`) kills them.
    """

    def __init__(self, owner: object, *, new_worker: Callable[[str, frozenset[str]], LocalWorker],
                 publishing: Publishing, startup_timeout: float, shutdown_budget: Budget,
                 on_adopted: Callable[[LocalWorker], object]) -> None:
        """:param owner: the pool, named (by its ``repr``) in what is logged.
        :param new_worker: makes each worker to start (with the pool's options), given the
            backend and the tags.
        :param publishing: where workers are announced and withdrawn.
        :param startup_timeout: seconds the template gets to warm up, and a replacement to
            connect to the pool's proxy.
        :param shutdown_budget: what the workers' stops spend at the pool's exit.
        :param on_adopted: called with each worker once it is up, before it is announced."""
        self._owner = owner
        self._new_worker = new_worker
        self._publishing = publishing
        self._startup_timeout = startup_timeout
        self._shutdown_budget = shutdown_budget
        self._on_adopted = on_adopted
        self._templates = TemplateKeeper(startup_timeout)
        self._lifecycle: Lifecycle | None = None
        self._proxy: WorkerProxy | None = None
        self._task_group: TaskGroup | None = None
        self._spawned_with: tuple[str, frozenset[str]] | None = None
        self._workers: list[LocalWorker] = []
        self._own: set[UUID] = set()
        self._stopping = anyio.Event()
        self._exiting = False
        # Worker slots that have not been given up (nor closed by idleness).
        self._slots = 0
        #: The pool's spawn: the slots it runs when none was closed or given up (set by start).
        self.size = 0
        self._ended: set[UUID] = set()  # workers this pool killed itself (see end_stuck)
        self._starting: set[anyio.CancelScope] = set()  # around each worker start under way
        self._given_up: str | None = None  # why every slot was, once they all were

    # -- what the other parts read -------------------------------------------------------------

    @property
    def workers(self) -> list[LocalWorker]:
        """The spawned workers running now, in start order (a copy)."""
        return list(self._workers)

    @property
    def template(self) -> Template | None:
        """The warm template, while it runs (see :class:`TemplateKeeper`)."""
        return self._templates.template

    @property
    def closing(self) -> bool:
        """Whether the pool's exit began or its workers are being stopped: no worker starts,
        retires or is announced any more."""
        return self._stopping.is_set() or self._exiting

    @property
    def stopping(self) -> bool:
        """Whether the workers are being stopped (the last part of the pool's exit)."""
        return self._stopping.is_set()

    async def until_stopping(self) -> None:
        """Wait until the workers are being stopped."""
        await self._stopping.wait()

    def serving(self) -> list[LocalWorker]:
        """The spawned workers up and not withdrawn (a slot whose worker is being restarted
        after a crash has none)."""
        return [worker for worker in self._workers if worker.metadata.uid in self._own]

    @property
    def slots(self) -> int:
        """Worker slots neither given up nor closed by idleness (at most :attr:`size`)."""
        return self._slots

    # -- entry and exit ------------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack, count: int, backend: str,
                    tags: frozenset[str], lifecycle: Lifecycle) -> None:
        """Open ``count`` slots and start their workers together, on ``stack``: its exit stops
        them all (then the template). ``lifecycle`` watches each running worker.

        :raises Exception: the first failure of a first worker's start (the others are stopped
            by ``stack``'s exit).
        """
        self._lifecycle = lifecycle
        await self._templates.open(stack)
        # More workers than CPUs: forking them all from one warm interpreter beats starting as
        # many interpreters side by side. Otherwise those start faster side by side than after
        # a template, which is then started when the pool first starts a worker again (a
        # replacement, a recycle): a pool that never does pays nothing for it.
        if count > (os.cpu_count() or 1):
            await self._templates.warm(backend)
        supervisors = self._task_group = anyio.create_task_group()
        await supervisors.__aenter__()

        async def stop_supervisors() -> None:
            self._stopping.set()
            lifecycle.end_requests()
            self._stop_starting()  # a replacement starting (its lifespan, say) is not waited for
            await exit_task_group(supervisors, cancel=False)  # they stop their workers

        stack.push_async_callback(stop_supervisors)
        failures: list[BaseException] = []

        async def start_one(starters: TaskGroup) -> None:
            try:
                await supervisors.start(self._supervise, backend, tags)
            except Exception as exc:
                failures.append(exc)
                starters.cancel_scope.cancel()

        self._slots = self.size = count
        self._spawned_with = (backend, tags)
        supervisors.start_soon(lifecycle.serve_requests)
        async with anyio.create_task_group() as starters:
            for _ in range(count):
                starters.start_soon(start_one, starters)
        if failures:
            raise failures[0]

    def link(self, proxy: WorkerProxy, *, spawns: bool) -> None:
        """Link the pool's ``proxy`` (not entered yet): it learns the own workers, now and at
        each change, how to end one that is stuck (:meth:`end_stuck`), and why none is left
        once every slot was given up. ``spawns``: whether the pool spawns workers at all."""
        self._proxy = proxy
        proxy._set_own_workers(self._own)
        proxy._serve_pool(spawns=spawns, end_worker=self.end_stuck)
        if self._given_up is not None:
            proxy._slots_given_up(self._given_up)

    def begin_exit(self) -> None:
        """The pool's exit began: no worker starts, retires or is announced any more."""
        self._exiting = True

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None:
        """Run ``func(*args)`` in the supervisors' task group (it belongs to the slots: it
        ends, cancelled if need be, before the workers are stopped)."""
        assert self._task_group is not None  # a worker runs only once the supervisors do
        self._task_group.start_soon(func, *args)

    def hurry(self) -> None:
        """Stop waiting on the workers: cancel the starts under way and kill every worker (its
        calls in flight fail); the exit still reaps them."""
        self._stop_starting()
        for worker in self._workers:
            self._ended.add(worker.metadata.uid)
            worker.kill()

    def _stop_starting(self) -> None:
        """Cancel the worker starts under way (a cancelled start kills and reaps its process)."""
        for scope in list(self._starting):
            scope.cancel()

    # -- one slot ------------------------------------------------------------------------------

    async def _supervise(
        self, backend: str, tags: frozenset[str], *, replacing: bool = False,
        task_status: TaskStatus[LocalWorker]
    ) -> None:
        """Run one worker slot: start a worker, replace it when its process dies, stop it when
        the pool exits, hand the slot to a new supervisor when it retires. The first start's
        failure is the caller's (``task_status``); ``replacing``: the new worker is announced
        before the caller hears of it (it replaces a retiring one)."""
        lifecycle = self._lifecycle
        assert lifecycle is not None  # given by start(), which runs the first supervisors
        started = False
        start_failures = 0
        while not self.closing:
            worker = self._new_worker(backend, tags)
            if started or replacing:
                self._templates.want(backend)
            worker._fork_from(self._templates.template)
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
                            await lifecycle.configure(worker)
                            born = anyio.current_time()
                            self._own.add(worker.metadata.uid)
                            self._own_changed()
                            self._workers.append(worker)
                            self._on_adopted(worker)
                            uid = worker.metadata.uid
                            lifecycle.arm()
                            try:
                                if started or replacing:
                                    await self._publishing.announce(worker, "worker-added")
                                if not started:
                                    started = True
                                    task_status.started(worker)
                                code = await lifecycle.watch(worker)
                            finally:
                                self._workers.remove(worker)
                                lifecycle.forget(uid)
                            if code is Ended.RETIRED:
                                return
                            if code is None:  # the pool is exiting
                                await self.stop(worker)
                                return
                            if worker.metadata.uid in self._ended:
                                self._ended.discard(worker.metadata.uid)
                                log.info("worker pid %s ended (code %s); replacing it",
                                         worker.pid, code)
                            else:
                                log.warning("worker pid %s exited unexpectedly (code %s); "
                                            "replacing it", worker.pid, code)
                            await self.withdraw(worker)
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

    # -- what the other parts do with the workers ------------------------------------------------

    async def start_replacement(self, *, give_up: bool
                                ) -> tuple[LocalWorker | None, BaseException | str]:
        """Start a supervisor whose worker replaces another, once it is up and announced:
        the new worker, or ``None`` and why not. Retried with the slot's back-off; after
        :data:`_MAX_START_FAILURES` failed starts in a row the slot is given up if
        ``give_up``."""
        supervisors = self._task_group
        assert supervisors is not None and self._spawned_with is not None  # the slots run
        backend, tags = self._spawned_with
        reason: BaseException | str = "the pool is exiting"
        for failures in range(1, _MAX_START_FAILURES + 1):
            if self.closing:
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

    def close_slot(self) -> None:
        """One slot fewer, at once (an idle worker retires, not replaced)."""
        self._slots -= 1

    def reopen_slot(self) -> None:
        """One slot more (a worker grown back is up)."""
        self._slots += 1

    async def until_connected(self, worker: LocalWorker) -> None:
        """Wait (within ``startup_timeout``) until the pool's proxy is connected to
        ``worker``, so that its calls have somewhere to go before the worker it replaces stops
        taking them."""
        if self._proxy is not None:
            await self._proxy._until_connected(worker.metadata.uid, self._startup_timeout)

    async def withdraw(self, worker: LocalWorker) -> None:
        """Announce ``worker-dropped`` for ``worker`` and no longer count it among the own."""
        await self._publishing.announce(worker, "worker-dropped")
        self._disown(worker)

    async def stop(self, worker: LocalWorker) -> None:
        """Stop ``worker``, its calls drained within what is left of ``shutdown_timeout``."""
        await worker.stop(self._shutdown_budget.left)

    def end_stuck(self, uid: UUID) -> None:
        """End a spawned worker that did not take a cancellation in time (its supervisor then
        replaces it, as it does any worker that dies)."""
        for worker in self._workers:
            if worker.metadata.uid == uid:
                log.warning("ending worker pid %s (SIGKILL): a routine holds its event loop "
                            "past a cancellation; it is replaced", worker.pid)
                self._ended.add(uid)
                worker.kill()
                return

    def _disown(self, worker: LocalWorker) -> None:
        self._own.discard(worker.metadata.uid)
        self._own_changed()

    def _own_changed(self) -> None:
        if self._proxy is not None:
            self._proxy._set_own_workers(self._own)

    def _give_up_slot(self, failures: int, reason: BaseException | str) -> None:
        log.error("giving up a worker slot of %r after %d failed starts in a row; last: %s",
                  self._owner, failures, reason)
        self._slots -= 1
        if not self._slots:
            self._given_up = (f"every worker slot of this pool was given up after {failures} "
                              f"failed starts in a row (the last: {reason})")
            if self._proxy is not None:
                self._proxy._slots_given_up(self._given_up)
