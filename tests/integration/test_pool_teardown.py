"""WorkerPool exit: bounded whatever other processes do, cancellable, and nothing leaked.

Reference case 29 and the exit contract: drops are announced within ``announce_timeout``, the
pool's own calls drain within ``shutdown_timeout``, every worker is stopped and reaped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import psutil
import pytest

from anywool import (
    DiscoveryPublisherLike,
    LocalDiscovery,
    LocalWorker,
    RoundRobinLoadBalancer,
    RoutineCancelled,
    WorkerPool,
    routine,
)
from anywool.metadata import WorkerMetadata

from ..helpers import Signal, follow, take, wait_until
from .children import REPO, hold_registry_lock, start, stop
from .routines import hold_until_cancelled, value_after

pytestmark = pytest.mark.anyio

# What exit may take beyond its two budgets: SIGTERM and reaping, on a loaded 2-core machine.
SLACK = 3.0


def _gone(pids: list[int]) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE
               for p in pids)


def _logged_timeout(caplog: pytest.LogCaptureFixture) -> bool:
    return any(r.exc_info and isinstance(r.exc_info[1], TimeoutError) for r in caplog.records)


async def test_exit_with_the_registry_lock_held_elsewhere_is_bounded_and_reaps(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="anywool")
    discovery = LocalDiscovery(namespace, lock_timeout=None)  # publishes would wait forever
    with anyio.fail_after(60):
        pool = WorkerPool(spawn=2, discovery=discovery, announce_timeout=0.5,
                          shutdown_timeout=0.5)
        async with pool:
            pids = [w.pid for w in pool.workers]
            holder = await hold_registry_lock(discovery)
            began = time.monotonic()
        took = time.monotonic() - began
        await stop([holder])
    assert took < 0.5 + 0.5 + SLACK, f"exit took {took:.2f} s"
    assert _logged_timeout(caplog)
    assert "announcing the dropped workers" in caplog.text
    assert _gone(pids)


class HangingDiscovery(LocalDiscovery):
    """A discovery whose drop announcements never complete."""

    @property
    def publisher(self) -> DiscoveryPublisherLike:
        inner = super().publisher

        class Hanging:
            async def __aenter__(self) -> Hanging:
                await inner.__aenter__()
                return self

            async def __aexit__(self, *exc_info: object) -> None:
                await inner.__aexit__(*exc_info)

            async def publish(self, type: str, metadata: WorkerMetadata) -> None:
                if type == "worker-dropped":
                    await anyio.sleep_forever()
                await inner.publish(type, metadata)  # type: ignore[arg-type]

        return Hanging()


async def test_a_hanging_announcement_is_given_up_at_announce_timeout(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="anywool")
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, discovery=HangingDiscovery(namespace),
                              announce_timeout=0.5) as pool:
            pids = [w.pid for w in pool.workers]
            began = time.monotonic()
        took = time.monotonic() - began
    assert took < 0.5 + SLACK, f"exit took {took:.2f} s"
    assert _logged_timeout(caplog)
    assert _gone(pids)


async def test_an_enclosing_deadline_cuts_a_blocked_exit_short_and_workers_are_reaped(
    namespace: str,
) -> None:
    discovery = LocalDiscovery(namespace, lock_timeout=None)
    with anyio.fail_after(60):
        with anyio.CancelScope() as scope:
            async with WorkerPool(spawn=2, discovery=discovery) as pool:  # default budgets: 5 s, 10 s
                pids = [w.pid for w in pool.workers]
                holder = await hold_registry_lock(discovery)
                began = time.monotonic()
                scope.deadline = anyio.current_time() + 0.5
        took = time.monotonic() - began
        await stop([holder])
    assert scope.cancelled_caught
    assert took < 0.5 + SLACK, f"exit took {took:.2f} s"
    assert _gone(pids)


async def test_cancelling_the_task_exiting_a_pool_leaks_no_worker(tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(60):
        async with Signal() as signal_, anyio.create_task_group() as tg:
            exiting = anyio.Event()
            pids: list[int] = []

            async def use_pool() -> None:
                async with WorkerPool(spawn=1, shutdown_timeout=60) as pool:
                    pids.extend(w.pid for w in pool.workers)
                    tg.start_soon(hold_until_cancelled, signal_.port, str(marker))
                    await signal_.started()
                    exiting.set()
                # The exit drains the call above for up to 60 s, unless cancelled.

            tg.start_soon(use_pool)
            await exiting.wait()
            began = time.monotonic()
            tg.cancel_scope.cancel()
        took = time.monotonic() - began
    assert took < SLACK, f"exit took {took:.2f} s after the cancellation"
    assert _gone(pids)
    assert marker.read_text() == "finally ran"


async def test_exit_lets_the_pools_own_calls_finish_within_shutdown_timeout() -> None:
    results: list[object] = []
    with anyio.fail_after(60):
        async with Signal() as signal_, anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(await value_after(0.3, signal_.port))

            async with WorkerPool(spawn=1, shutdown_timeout=30) as pool:
                pids = [w.pid for w in pool.workers]
                tg.start_soon(call)  # outlives the block: still in flight at exit
                await signal_.started()
            assert results == [7]  # the exit waited for it
    assert _gone(pids)


async def test_calls_still_running_at_shutdown_timeout_are_cancelled_on_their_worker(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "finally"
    outcome: list[BaseException] = []
    with anyio.fail_after(60):
        async with Signal() as signal_, anyio.create_task_group() as tg:

            async def call() -> None:
                try:
                    await hold_until_cancelled(signal_.port, str(marker))
                except Exception as exc:
                    outcome.append(exc)

            async with WorkerPool(spawn=1, shutdown_timeout=0.3) as pool:
                pids = [w.pid for w in pool.workers]
                tg.start_soon(call)
                await signal_.started()
                began = time.monotonic()
            took = time.monotonic() - began
    assert [type(e) for e in outcome] == [RoutineCancelled]
    assert marker.read_text() == "finally ran"
    assert took < 0.3 + SLACK, f"exit took {took:.2f} s"
    assert _gone(pids)


async def test_a_call_made_after_exit_began_is_refused() -> None:
    refused: list[BaseException] = []
    results: list[int] = []
    with anyio.fail_after(60):
        async with Signal() as signal_, anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(await value_after(0.3, signal_.port))

            async def late_call() -> None:
                try:
                    await value_after(0, signal_.port)
                except RuntimeError as exc:
                    refused.append(exc)

            async with WorkerPool(spawn=1, shutdown_timeout=30):
                tg.start_soon(call)
                await signal_.started()
                # Runs once this task blocks, which is inside the exit: after it stopped
                # taking calls (its first step), while it drains the call above.
                tg.start_soon(late_call)
    assert results == [7]
    assert len(refused) == 1 and "it is exiting or has exited" in str(refused[0])


POOL = """
import os, sys, anyio
from anywool import LocalDiscovery, WorkerPool
async def main():
    # Both workers connected, so both made their socket directories before the kill.
    async with WorkerPool(spawn=2, lazy=False, quorum=2,
                          discovery=LocalDiscovery(sys.argv[1])) as pool:
        print(*[w.pid for w in pool.workers], flush=True)
        await anyio.sleep_forever()
anyio.run(main, backend=sys.argv[2])
"""


async def test_a_sigkilled_pools_workers_exit_by_themselves_and_its_namespace_is_reclaimable(
    namespace: str, anyio_backend: str, runtime_dir: Path
) -> None:
    with anyio.fail_after(60):
        child = await start(POOL, namespace, anyio_backend)
        try:
            pids = [int(p) for p in (await child.readline()).split()]
            child.kill()
            await child.wait()

            def wait_all() -> None:
                psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                  timeout=20)

            await anyio.to_thread.run_sync(wait_all)
            assert _gone(pids)
        finally:
            await stop([child])
        async with LocalDiscovery(namespace) as successor:  # sweeps the dead generation
            assert os.listdir(runtime_dir) == [os.path.basename(str(successor.path))]


@routine
async def numbers(n: int):
    for i in range(n):
        yield i


async def test_a_stream_left_suspended_at_exit_closes_quietly_afterwards() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1) as pool:
            pids = [w.pid for w in pool.workers]
            stream = numbers(100)
            assert await stream.__anext__() == 0
        # The worker and the connection are gone, and with them the remote generator.
        await stream.aclose()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    assert _gone(pids)


async def test_exit_during_a_replacements_announcement_keeps_to_its_budget(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="anywool")
    discovery = LocalDiscovery(namespace, lock_timeout=None)
    with anyio.fail_after(60):
        # An announce budget large against the slack: waiting for the supervisor's own
        # announcement before spending the budget again would take twice as long.
        async with WorkerPool(spawn=2, discovery=discovery, announce_timeout=4.0,
                              shutdown_timeout=0.2) as pool:
            pids = [w.pid for w in pool.workers]
            holder = await hold_registry_lock(discovery)
            os.kill(pids[0], signal.SIGKILL)
            # The supervisor now tries to announce the drop, and waits for the lock.
            await wait_until(lambda: "exited unexpectedly" in caplog.text, "the death noticed")
            began = time.monotonic()
        took = time.monotonic() - began
        await stop([holder])
    assert took < 4.0 + 0.2 + SLACK, f"exit took {took:.2f} s"
    assert _gone(pids)


class HangingExit:
    """A load balancer whose context manager never finishes exiting."""

    async def __aenter__(self) -> RoundRobinLoadBalancer:
        return RoundRobinLoadBalancer()

    async def __aexit__(self, *exc_info: object) -> None:
        await anyio.sleep_forever()


async def test_a_hanging_exit_of_what_the_pool_entered_is_cut_at_announce_timeout() -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, loadbalancer=HangingExit(), announce_timeout=0.5) as pool:
            pids = [w.pid for w in pool.workers]
            began = time.monotonic()
        took = time.monotonic() - began
    assert took < 0.5 + SLACK, f"exit took {took:.2f} s"
    assert _gone(pids)


async def test_announce_timeout_zero_skips_the_announcement_quietly(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="anywool")
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, anyio.create_task_group() as tg:
            events = await follow(tg, discovery.subscriber)
            async with WorkerPool(spawn=1, discovery=discovery, announce_timeout=0) as pool:
                uid = pool.workers[0].metadata.uid
                assert await take(events, 1) == [("worker-added", uid)]
            # Withdrawn all the same, by the publisher's exit (one attempt at the free lock).
            assert await take(events, 1) == [("worker-dropped", uid)]
            tg.cancel_scope.cancel()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_worker_cancelled_while_starting_leaves_no_file(runtime_dir: Path) -> None:
    # Cancelled at every stage of the start: before the process runs, after it bound its
    # socket, after it reported its address.
    with anyio.fail_after(60):
        for step in range(12):
            with anyio.move_on_after(step * 0.04):
                async with LocalWorker():
                    pass
            assert os.listdir(runtime_dir) == []


POOL_GROUP = """
import os, sys, anyio
from anywool import LocalDiscovery, WorkerPool
async def main():
    # Both workers connected, so both made their socket directories before the kill.
    async with WorkerPool(spawn=2, lazy=False, quorum=2,
                          discovery=LocalDiscovery(sys.argv[1])) as pool:
        print(*[w.pid for w in pool.workers], flush=True)
        await anyio.sleep_forever()
anyio.run(main, backend=sys.argv[2])
"""


async def test_a_killed_process_groups_socket_directories_are_swept_by_the_next_claim(
    namespace: str, runtime_dir: Path, anyio_backend: str
) -> None:
    with anyio.fail_after(60):
        child = await start(POOL_GROUP, namespace, anyio_backend, new_group=True)
        try:
            pids = [int(p) for p in (await child.readline()).split()]
            # The pool and its workers at once (workers run in sessions of their own, out of
            # the pool's process group): nobody cleans up. The workers are stopped first, else
            # one may see its pool gone (its lifeline) and remove its directory before its kill.
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            child.kill(group=True)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await child.wait()
            await anyio.to_thread.run_sync(lambda: psutil.wait_procs(
                [psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=20))
        finally:
            await stop([child])
        left = sorted(name[:2] for name in os.listdir(runtime_dir))
        assert left == ["ns", "w-", "w-"]
        # Spared while young (a worker locks its directory just after creating it).
        for entry in runtime_dir.iterdir():
            os.utime(entry, (time.time() - 60, time.time() - 60))
        async with LocalDiscovery(f"{namespace}-other") as other:
            assert os.listdir(runtime_dir) == [os.path.basename(str(other.path))]


ORPHANING_POOL = """
import os, sys, time, anyio
from anywool import WorkerPool, routine

@routine
async def block(path: str) -> None:
    with open(path, "w") as marker:
        marker.write(str(os.getpid()))
    BLOCK

async def main():
    async with WorkerPool(spawn=1):
        await block(sys.argv[2])
anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("block", [
    # blocks the worker's event loop: it cannot see its parent go
    pytest.param("time.sleep(60)", id="blocked-loop"),
    # C code that never lets go of the GIL: no thread of the worker runs either
    pytest.param("sum(range(10**13))", id="held-gil"),
])
async def test_a_worker_whose_routine_will_not_yield_still_exits_when_its_pool_is_killed(
    block: str, anyio_backend: str, runtime_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "blocking"
    worker: psutil.Process | None = None
    with anyio.fail_after(60):
        child = await start(ORPHANING_POOL.replace("BLOCK", block), anyio_backend, str(marker))
        try:
            await wait_until(lambda: marker.exists() and marker.read_text() != "",
                             "the routine to block its worker", timeout=30)
            worker = psutil.Process(int(marker.read_text()))
            rest = worker.children(recursive=True)  # its lifeline: it must not outlive it
            child.kill()
            await child.wait()
            # Its lifeline kills it 5 s after the pool died.
            gone, _ = await anyio.to_thread.run_sync(
                lambda: psutil.wait_procs([worker, *rest], timeout=20))
            assert sorted(p.pid for p in gone) == sorted(p.pid for p in [worker, *rest])
        finally:
            if worker is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.kill()  # no descendant of ours any more: the conftest cannot
            await stop([child])
        # Its socket directory was removed; what is left is the killed pool's namespace.
        assert [name[:3] for name in os.listdir(runtime_dir)] == ["ns-"]
        async with LocalDiscovery("sweeper"):  # sweeps the dead generation
            pass


FORKING_POOL = """
import os, sys, anyio
from anywool import WorkerPool
from tests.integration.routines import hold_until_cancelled

async def main():
    async with WorkerPool(spawn=1) as pool:
        holder = os.fork()
        if holder == 0:
            # Holds a copy of every descriptor, the write end of the worker's stdin among them,
            # until the test closes our stdin.
            try:
                os.read(0, 1)
            finally:
                os._exit(0)
        print(holder, pool.workers[0].pid, flush=True)
        await hold_until_cancelled(int(sys.argv[2]), sys.argv[3])
anyio.run(main, backend=sys.argv[1])
"""


async def test_a_worker_stops_gracefully_when_its_pool_dies_while_its_stdin_is_held_elsewhere(
    anyio_backend: str, runtime_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "finally"
    holder: psutil.Process | None = None
    with anyio.fail_after(60):
        async with Signal() as signal_:
            child = await start(FORKING_POOL, anyio_backend, str(signal_.port), str(marker))
            try:
                holder_pid, worker_pid = map(int, (await child.readline()).split())
                holder = psutil.Process(holder_pid)
                worker = psutil.Process(worker_pid)
                await signal_.started()
                child.kill()
                await child.wait()
                began = time.monotonic()
                # Its stdin never hangs up; it sees its parent's exit on a pidfd instead.
                gone, _ = await anyio.to_thread.run_sync(
                    lambda: psutil.wait_procs([worker], timeout=20))
                took = time.monotonic() - began
                assert [p.pid for p in gone] == [worker_pid]
            finally:
                if holder is not None:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        holder.kill()  # re-parented away from us: the conftest cannot
                await stop([child])
        # Cancelled and unwound, before its lifeline would have killed it (5 s).
        assert marker.read_text() == "finally ran"
        assert took < 5.0, f"the worker took {took:.2f} s to stop"
        assert [name[:3] for name in os.listdir(runtime_dir)] == ["ns-"]
        async with LocalDiscovery("sweeper"):  # sweeps the dead generation
            pass


async def test_a_pools_workers_leave_no_process_behind_at_exit() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2) as pool:
            pids = [w.pid for w in pool.workers]
            rest = [p.pid for pid in pids for p in psutil.Process(pid).children(recursive=True)]
            assert len(rest) == len(pids)  # their lifelines: what could outlive them
    assert _gone(pids + rest)  # at once: a worker reaps its lifeline before it exits


async def test_the_lifeline_of_a_sigkilled_worker_exits_by_itself() -> None:
    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            [lifeline] = psutil.Process(worker.pid).children()
            os.kill(worker.pid, signal.SIGKILL)
            await worker.wait()
            # Re-parented to init, which reaps it.
            gone, _ = await anyio.to_thread.run_sync(
                lambda: psutil.wait_procs([lifeline], timeout=10))
            assert [p.pid for p in gone] == [lifeline.pid]


async def test_a_worker_whose_parent_is_already_gone_exits_at_once(runtime_dir: Path) -> None:
    home = runtime_dir / "w-0123456789abcdef"
    env = dict(os.environ)
    env["ANYWOOL_WORKER_PARENT_PID"] = str(os.getppid())  # not the worker's parent: we are
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "anywool.worker", "--home", str(home)],
            input=b"", env=env, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (70, b"", b"")
    assert not home.exists()
