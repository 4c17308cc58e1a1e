"""Cancellation that bites: a routine holding its worker's event loop is reached anyway.

A routine that never awaits (a pure-Python loop, ``time.sleep``, a plain function of
``anywool.run_sync``) holds the worker's event loop, so its caller's cancel frame, its deadline
and the worker's stop all wait for it. The worker's interrupter raises into it instead (see
``anywool.runtime.worker._interrupt``): its ``finally`` blocks run, the worker lives on. What cannot be
reached (C code holding the GIL, a routine that swallows the interruption) costs the caller
``cancel_grace`` seconds, and a pool its worker: ended and replaced.

Every routine here tells the test it is running (a connection to a :class:`Signal`) before it
holds the loop, from plain blocking code, so that no checkpoint lies between "started" and
"holding"; its ``finally`` writes a marker file.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import psutil
import pytest

import anywool
from anywool import (
    LocalDiscovery,
    LocalWorker,
    RoutineCancelled,
    WorkerError,
    WorkerProxy,
    routine,
)
from anywool.testing import WorkerPoolFactory, kill_worker

from ..helpers import Signal, wait_until
from .routines import hold_until_cancelled, whoami

pytestmark = pytest.mark.anyio

#: Catastrophic backtracking in ``re``: C code that holds the GIL and checks no signal. Each
#: more "a" doubles the time (24 take about 1.4 s on the project's machine), so 40 run for
#: days: only ending the process ends it.
_BACKTRACK_PATTERN = r"(a+)+$"
_BACKTRACK_SUBJECT = "a" * 40 + "b"
#: The pool's default ``cancel_grace`` (seconds), and a bound that the old behaviour (a
#: cancelled caller waiting ``cancel_timeout``, 5 s, or for ever) would break.
DEFAULT_GRACE = 1.0
OLD_WAIT = 5.0
#: The pool's default ``cancel_timeout`` (seconds): how long a routine that took its
#: cancellation may unwind before its caller stops waiting.
DEFAULT_CANCEL_TIMEOUT = 5.0
#: How late past a bound a caller may resume on a loaded 2-core machine: a grace or timeout
#: grown by more than this fails (an upper bound of OLD_WAIT alone let cancel_grace double).
LATE = 0.5


# -- what runs on the workers ----------------------------------------------------------------


def _tell_started(port: int) -> None:
    """Say ``started <pid>``; blocking, no checkpoint: the routine holds the loop from here on."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(f"started {os.getpid()}".encode())


def _hold(how: str) -> None:
    """Hold the event loop's thread: in Python bytecode, in a system call, or in C code that
    holds the GIL."""
    if how == "spin":
        count = 0
        while True:
            count += 1
    elif how == "sleep":
        time.sleep(30)
    elif how == "backtrack":
        re.fullmatch(_BACKTRACK_PATTERN, _BACKTRACK_SUBJECT)
    elif how == "stubborn":  # swallows every interruption and goes on
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
    raise AssertionError(f"{how} ended by itself")


def hold_plain(how: str, port: int, marker: str) -> None:
    """A plain function for ``run_sync``: holds the loop until interrupted."""
    try:
        _tell_started(port)
        _hold(how)
    finally:
        Path(marker).write_text("finally ran")


@routine
async def hold_loop(how: str, port: int, marker: str) -> None:
    """A coroutine routine that holds the loop until interrupted (never awaits)."""
    hold_plain(how, port, marker)


@routine
async def slow_cleanup(port: int, marker: str, seconds: float) -> None:
    """Waits until cancelled; its ``finally`` awaits ``seconds`` (shielded), then marks."""
    try:
        _tell_started(port)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(seconds)  # the routine's cleanup work, not synchronisation
        Path(marker).write_text("cleaned up")


def _read_all(fifo: str) -> str:
    # Opening blocks until the other side opens; the read returns once it wrote and closed.
    with open(fifo) as released:
        return released.read()


@routine
async def cleanup_until_released(port: int, release: str, marker: str) -> None:
    """Waits until cancelled; its ``finally`` waits (shielded) for a word on the FIFO
    ``release``, then marks: a routine that takes its cancellation at once but unwinds slowly."""
    try:
        _tell_started(port)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_read_all, release)
        Path(marker).write_text("cleaned up")


@routine
async def shielded_spin(port: int, shield_done: str, marker: str, seconds: float) -> None:
    """Spins ``seconds`` in a shielded scope (writes ``shield_done`` with the time it spun),
    then awaits until cancelled."""
    try:
        with anyio.CancelScope(shield=True):
            _tell_started(port)
            began = time.monotonic()
            while time.monotonic() - began < seconds:
                pass
            Path(shield_done).write_text(f"{time.monotonic() - began}")
        await anyio.sleep_forever()
    finally:
        Path(marker).write_text("finally ran")


@routine
async def hold_until_released(port: int, release: str) -> None:
    """Holds the loop (pure Python, polling a file) until ``release`` exists."""
    _tell_started(port)
    while not os.path.exists(release):
        pass


@routine
async def mark_when_run(marker: str, *_loaded: object) -> None:
    Path(marker).write_text("ran")


@routine
async def warm() -> int:
    """A first call that makes the worker import this module (so that later calls start at
    once); returns the worker's pid."""
    return os.getpid()


def _load_slowly(port: int, seconds: float) -> None:
    _tell_started(port)
    time.sleep(seconds)


class SlowToLoad:
    """An argument whose unpickling on the worker tells the test, then holds the worker's
    event loop ``seconds`` long, as importing a heavy module on a routine's first call does."""

    def __init__(self, port: int, seconds: float) -> None:
        self.port = port
        self.seconds = seconds

    def __reduce__(self) -> tuple[object, ...]:
        return (_load_slowly, (self.port, self.seconds))


# -- the test side ---------------------------------------------------------------------------


async def _started(started: Signal) -> int:
    """Wait until a routine says it started; the pid of its worker."""
    word, pid = (await started.started()).split()
    assert word == b"started"
    return int(pid)


async def _cancel_when_started(started: Signal, scope: anyio.CancelScope,
                               at: list[float], workers: list[psutil.Process] | None = None,
                               busy_for: float = 0.0) -> None:
    pid = await _started(started)
    process = psutil.Process(pid)  # while it surely runs: its pid is not reused
    if workers is not None:
        workers.append(process)
    if busy_for:
        # In C code for sure, not still in the Python that said "started": a worker loaded
        # enough to take over HELD_AFTER (0.1 s) to get there would rightly interrupt that.
        base = _cpu_seconds(process)
        await wait_until(lambda: _cpu_seconds(process) >= base + busy_for, "the held call")
    at.append(anyio.current_time())
    scope.cancel()


async def _call(kind: str, how: str, port: int, marker: Path) -> None:
    if kind == "routine":
        await hold_loop(how, port, str(marker))
    else:
        await anywool.run_sync(hold_plain, how, port, str(marker))


async def _cancelled_call(kind: str, how: str, started: Signal,
                          marker: Path) -> tuple[float, psutil.Process]:
    """Call, cancel the call once it runs; the seconds from the cancellation until the
    cancelled await returned, and the worker process that ran it. Asserts that the await was
    cancelled, not ended otherwise."""
    cancelled_at: list[float] = []
    workers: list[psutil.Process] = []
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            # A call stuck in C (or swallowing interruptions) is cancelled once it has spun
            # there a while: the case under test is a call that cannot be interrupted.
            busy_for = 0.2 if how in ("backtrack", "stubborn") else 0.0
            tg.start_soon(_cancel_when_started, started, scope, cancelled_at, workers, busy_for)
            await _call(kind, how, started.port, marker)
        resumed = anyio.current_time()
    assert scope.cancelled_caught
    return resumed - cancelled_at[0], workers[0]


def _ended(process: psutil.Process) -> bool:
    """The process is gone, or exited and waits to be reaped."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


# -- interruptible: the routine unwinds, the worker lives on ----------------------------------


@pytest.mark.parametrize("how", ["spin", "sleep"])
@pytest.mark.parametrize("kind", ["routine", "run_sync"])
async def test_a_cancelled_call_holding_the_loop_unwinds_before_its_caller_resumes(
        kind: str, how: str, worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            waited, ran_on = await _cancelled_call(kind, how, started, marker)
            # Its finally ran before the cancellation reached us, which took less than the
            # pool's cancel_grace (past it, the pool would have ended the worker).
            assert marker.read_text() == "finally ran"
            assert ran_on.pid == worker.pid
            assert waited < DEFAULT_GRACE
            # The same worker took it and answers the next call: nothing was ended.
            assert await whoami() == worker.pid
            assert [w.pid for w in pool.workers] == [worker.pid]


async def test_a_task_group_cancelled_around_a_loop_holding_call_waits_for_its_finally(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_loop, "spin", started.port, str(marker))
                assert await _started(started) == worker.pid
                tg.cancel_scope.cancel()
            assert marker.read_text() == "finally ran"
            assert await whoami() == worker.pid
            assert [w.pid for w in pool.workers] == [worker.pid]


@pytest.mark.parametrize("kind", ["routine", "run_sync"])
async def test_the_callers_deadline_interrupts_a_call_holding_the_loop(
        kind: str, worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            assert await warm() == worker.pid  # the deadline is for the routine alone
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.5):
                    await _call(kind, "spin", started.port, marker)
            assert marker.read_text() == "finally ran"
            assert await whoami() == worker.pid
            assert [w.pid for w in pool.workers] == [worker.pid]


async def test_a_routine_whose_finally_awaits_past_cancel_grace_is_waited_for_not_ended(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    # The worker takes the cancellation at once (its loop is free); the cleanup then takes
    # longer than cancel_grace, which bounds only the taking.
    marker = tmp_path / "cleaned"
    with anyio.fail_after(30):
        async with worker_pool(cancel_grace=0.5) as pool, Signal() as started:
            (worker,) = pool.workers
            cancelled_at: list[float] = []
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_started, started, scope, cancelled_at)
                    await slow_cleanup(started.port, str(marker), 2.0)
                assert marker.read_text() == "cleaned up"
            assert scope.cancelled_caught
            assert await whoami() == worker.pid
            assert [w.pid for w in pool.workers] == [worker.pid]


async def test_a_routine_unwinding_slowly_holds_its_caller_for_the_default_cancel_timeout_of_5_s(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    # README: a worker that took the cancellation but unwinds slowly "is waited for, up to
    # cancel_timeout (5 s), and never ended".
    release, marker = tmp_path / "release", tmp_path / "cleaned"
    os.mkfifo(release)
    with anyio.fail_after(30):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            cancelled_at: list[float] = []
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_started, started, scope, cancelled_at)
                    await cleanup_until_released(started.port, str(release), str(marker))
                waited = anyio.current_time() - cancelled_at[0]
            assert scope.cancelled_caught
            assert DEFAULT_CANCEL_TIMEOUT <= waited <= DEFAULT_CANCEL_TIMEOUT + LATE, \
                f"the caller resumed {waited:.2f} s after cancelling"
            assert not marker.exists()  # still unwinding when its caller stopped waiting
            await anyio.to_thread.run_sync(release.write_text, "go")
            await wait_until(marker.exists, "the routine to finish its cleanup")
            # Never ended: the same worker answers.
            assert await whoami() == worker.pid
            assert [w.pid for w in pool.workers] == [worker.pid]


async def test_shielded_loop_holding_code_runs_to_its_end_before_the_cancellation_bites(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    shield_done, marker = tmp_path / "shield-done", tmp_path / "finally"
    with anyio.fail_after(30):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            cancelled_at: list[float] = []
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_started, started, scope, cancelled_at)
                    await shielded_spin(started.port, str(shield_done), str(marker), 0.5)
                # The shielded loop was not interrupted: it spun its whole 0.5 s; then the
                # cancellation took effect at the routine's next await.
                assert float(shield_done.read_text()) >= 0.5
                assert marker.read_text() == "finally ran"
            assert scope.cancelled_caught
            assert await whoami() == worker.pid
            assert [w.pid for w in pool.workers] == [worker.pid]


async def test_a_call_waiting_to_start_behind_a_held_loop_is_withdrawn_at_once(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    release, marker = tmp_path / "release", tmp_path / "ran"
    with anyio.fail_after(30):
        # One worker: the second call goes to the worker whose loop the first one holds, and
        # waits there to start.
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            # The pool's connection to it, for its count of open calls (WorkerConnection's
            # outstanding): where the second call waits is the point of the test.
            (connection,) = [c for _, c in pool.proxy._ready.values()]
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_until_released, started.port, str(release))
                assert await _started(started) == worker.pid
                cancelled_at: list[float] = []
                with anyio.CancelScope() as scope:

                    async def cancel_once_sent() -> None:
                        # Sent: both calls are open on the connection, the second not started.
                        await wait_until(lambda: connection.outstanding == 2,
                                         "the second call to be sent to the held worker")
                        cancelled_at.append(anyio.current_time())
                        scope.cancel()

                    tg.start_soon(cancel_once_sent)
                    await mark_when_run(str(marker))
                resumed_within = anyio.current_time() - cancelled_at[0]
                # Withdrawn without waiting for the holder, and well within cancel_grace
                # (waiting for the worker to take it would have taken that long at least).
                assert scope.cancelled_caught
                assert not release.exists()
                assert resumed_within < DEFAULT_GRACE
                release.touch()
            # The holder is done; two calls in a row: a withdrawn call that was going to run
            # would have run before the second of them was even sent.
            assert await whoami() == worker.pid
            assert await whoami() == worker.pid
            assert not marker.exists()
            assert [w.pid for w in pool.workers] == [worker.pid]


async def test_a_call_cancelled_while_its_worker_still_loads_it_never_runs(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with anyio.fail_after(30):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            cancelled_at: list[float] = []
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_started, started, scope, cancelled_at)
                    await mark_when_run(str(marker), SlowToLoad(started.port, 1.0))
            assert scope.cancelled_caught
            # Once the worker answers again it has finished loading that call: it ran it then
            # (in the same step), or skipped it.
            assert await whoami() == worker.pid
            assert not marker.exists(), "the cancelled call ran after its caller resumed"


@pytest.mark.anywool_backends("asyncio")  # where the order below is deterministic
async def test_a_call_cancelled_before_its_acknowledgement_is_read_still_waits_for_its_finally(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    finally_ran_first: list[bool] = []
    with anyio.fail_after(30), socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        port = listener.getsockname()[1]
        async with worker_pool() as pool:
            (worker,) = pool.workers
            assert await warm() == worker.pid
            (connection,) = [c for _, c in pool.proxy._ready.values()]
            scope = anyio.CancelScope()

            async def call() -> None:
                with scope:
                    await hold_loop("spin", port, str(marker))
                finally_ran_first.append(marker.exists())

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.lowlevel.checkpoint()  # once: the call task sends the call
                assert connection.outstanding == 1, "the call was not sent in one step"
                # Blocking, on purpose: our event loop stands still while the worker
                # acknowledges the call (before running it) and the routine says it started,
                # so the ACK waits unread in our socket when the cancellation comes.
                accepted, _ = listener.accept()
                with accepted:
                    assert accepted.recv(64).startswith(b"started")
                scope.cancel()
            assert finally_ran_first == [True], "the caller resumed before the routine's finally"


# -- not interruptible: the caller resumes after cancel_grace, the pool ends the worker -------


async def _stuck_worker_is_replaced(pool: anywool.WorkerPool, stuck: psutil.Process,
                                    size: int) -> None:
    """The stuck worker is ended; the pool runs ``size`` workers again, which answer."""
    pid = stuck.pid
    others = {w.pid for w in pool.workers} - {pid}
    await wait_until(lambda: _ended(stuck), f"the stuck worker pid {pid} to be ended")
    await wait_until(lambda: len(pool.workers) == size and pid not in {w.pid for w in pool.workers},
                     "the pool to replace the stuck worker")
    running = {w.pid for w in pool.workers}
    assert others < running  # the others were left alone
    answered: set[int] = set()

    async def every_worker_answered() -> bool:  # round robin, once the proxy has them all
        answered.add(await whoami())
        assert answered <= running
        return answered == running

    await wait_until(every_worker_answered, "every worker to answer", interval=0)


@pytest.mark.parametrize("kind", ["routine", "run_sync"])
async def test_a_call_stuck_in_c_code_resumes_its_caller_after_cancel_grace_and_loses_its_worker(
        kind: str, worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool, Signal() as started:
            waited, stuck = await _cancelled_call(kind, "backtrack", started,
                                                  tmp_path / "finally")
            # At the default grace of 1 s: not before, and far sooner than the old 5 s wait.
            assert DEFAULT_GRACE <= waited <= DEFAULT_GRACE + LATE
            await _stuck_worker_is_replaced(pool, stuck, 2)


async def test_a_shorter_cancel_grace_ends_a_stuck_worker_sooner(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with worker_pool(cancel_grace=0.3) as pool, Signal() as started:
            waited, stuck = await _cancelled_call("routine", "backtrack", started,
                                                  tmp_path / "finally")
            assert 0.3 <= waited < DEFAULT_GRACE
            await _stuck_worker_is_replaced(pool, stuck, 1)


async def test_a_routine_that_swallows_the_interruption_loses_its_worker_after_cancel_grace(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with worker_pool() as pool, Signal() as started:
            waited, stuck = await _cancelled_call("routine", "stubborn", started,
                                                  tmp_path / "finally")
            assert DEFAULT_GRACE <= waited <= DEFAULT_GRACE + LATE
            await _stuck_worker_is_replaced(pool, stuck, 1)


async def test_the_other_calls_on_an_ended_stuck_worker_raise_worker_error(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    failures: list[WorkerError] = []
    with anyio.fail_after(60):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers

            async def bystander() -> None:
                with pytest.raises(WorkerError) as info:
                    await hold_until_cancelled(started.port, str(tmp_path / "bystander"))
                failures.append(info.value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(bystander)
                assert await started.started() == b"started"  # awaiting, on the same worker
                _, stuck = await _cancelled_call("routine", "backtrack", started,
                                                 tmp_path / "finally")
                assert stuck.pid == worker.pid
            assert [failure.address for failure in failures] == [worker.address]
            await _stuck_worker_is_replaced(pool, stuck, 1)


async def test_a_bare_proxy_gives_up_a_stuck_call_after_cancel_grace_but_ends_no_worker(
        namespace: str, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, LocalWorker() as worker, \
                discovery.publisher as publisher, Signal() as started:
            await publisher.publish("worker-added", worker.metadata)
            async with WorkerProxy(discovery.subscriber):
                waited, stuck = await _cancelled_call("run_sync", "backtrack", started,
                                                      tmp_path / "finally")
                assert stuck.pid == worker.pid
                assert DEFAULT_GRACE <= waited <= DEFAULT_GRACE + LATE
                # Still there, still backtracking: it burns CPU time after we gave up on it.
                spent = _cpu_seconds(stuck)
                await wait_until(lambda: _cpu_seconds(stuck) > spent + 0.2,
                                 "the stuck worker to go on running")
                assert not _ended(stuck)
                worker.kill()  # ours to end (the proxy's is only to stop waiting)


async def test_sigterm_interrupts_a_routine_holding_the_loop_and_the_worker_exits_promptly(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(60):
        async with worker_pool() as pool, Signal() as started:
            (worker,) = pool.workers
            process = psutil.Process(worker.pid)
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    with pytest.raises(RoutineCancelled):
                        await hold_loop("spin", started.port, str(marker))

                tg.start_soon(call)
                assert await _started(started) == worker.pid
                assert kill_worker(pool, signal.SIGTERM) == worker.pid
                sent = anyio.current_time()
                # Well before a stopping LocalWorker escalates from SIGTERM to SIGKILL (3 s).
                await wait_until(lambda: _ended(process), "the worker to exit", timeout=3.0)
                exited_within = anyio.current_time() - sent
            assert marker.read_text() == "finally ran"
            assert exited_within < 3.0
