"""anywool.testing's fault helpers and worker_pool, with real processes and real signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import psutil
import pytest

from anywool import (
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    LocalDiscovery,
    WorkerError,
    WorkerPool,
)
from anywool.testing import (
    WorkerPoolFactory,
    hold_registry_lock,
    kill_worker,
    owner_process,
    suspended,
)

from ..helpers import Signal, follow, take, worker
from .routines import hold_until_cancelled, whoami

pytestmark = pytest.mark.anyio


def _stopped(pid: int) -> bool:
    return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


# -- worker_pool ---------------------------------------------------------------------------


async def test_worker_pool_enters_with_every_spawned_worker_connected(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        pool = worker_pool(spawn=2)
        assert isinstance(pool, WorkerPool)
        async with pool:
            assert len(pool.workers) == 2
            assert {m.pid for m in pool.proxy.workers} == {w.pid for w in pool.workers}


# -- kill_worker -----------------------------------------------------------------------------


async def test_kill_worker_makes_the_pool_withdraw_and_replace_the_worker(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool() as pool, anyio.create_task_group() as tg:
            events = await follow(tg, pool.discovery.subscriber)
            (first,) = pool.workers
            assert await take(events, 1) == [("worker-added", first.metadata.uid)]
            assert kill_worker(pool) == first.pid
            assert await take(events, 1) == [("worker-dropped", first.metadata.uid)]
            ((kind, uid),) = await take(events, 1)
            (replacement,) = pool.workers
            assert (kind, uid) == ("worker-added", replacement.metadata.uid)
            assert replacement.pid != first.pid
            assert await whoami() == replacement.pid
            tg.cancel_scope.cancel()


async def test_kill_worker_fails_the_call_in_flight_on_that_worker(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    failures: list[WorkerError] = []
    with anyio.fail_after(60):
        async with worker_pool() as pool, Signal() as started:
            address = pool.workers[0].address

            async def call() -> None:
                with pytest.raises(WorkerError) as info:
                    await hold_until_cancelled(started.port, str(tmp_path / "finally"))
                failures.append(info.value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                assert await started.started() == b"started"
                kill_worker(pool)
    assert [failure.address for failure in failures] == [address]
    assert not (tmp_path / "finally").exists()  # SIGKILL: no finally ran on the worker


async def test_kill_worker_refuses_a_pool_that_runs_no_spawned_worker(
        worker_pool: WorkerPoolFactory, namespace: str) -> None:
    with anyio.fail_after(30):
        async with worker_pool(discovery=LocalDiscovery(namespace), lazy=True) as pool:
            with pytest.raises(ValueError, match="runs no spawned worker") as info:
                kill_worker(pool)
            assert repr(pool) in str(info.value)


# -- suspended -------------------------------------------------------------------------------


async def test_a_suspended_owner_stays_the_owner(namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, backend=anyio_backend) as owner:
            with suspended(owner.pid):
                assert _stopped(owner.pid)
                with pytest.raises(DiscoveryNamespaceInUse) as info:
                    async with LocalDiscovery(namespace):
                        pass
                assert info.value.owner_pid == owner.pid
            assert not _stopped(owner.pid)
        assert owner.returncode == 0  # it went on, and exited politely at the end


async def test_suspended_continues_the_process_when_its_block_raises(
        namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, backend=anyio_backend) as owner:
            with pytest.raises(LookupError):
                with suspended(owner.pid):
                    assert _stopped(owner.pid)
                    raise LookupError
            assert not _stopped(owner.pid)
        assert owner.returncode == 0


def test_suspended_blocks_nest_and_only_the_outermost_continues() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        with suspended(child.pid):
            with suspended(child.pid):
                assert _stopped(child.pid)
            assert _stopped(child.pid)  # still the outer block's
        assert not _stopped(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(30) == 0


def test_suspended_raises_for_a_process_that_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    with pytest.raises(ProcessLookupError):
        with suspended(child.pid):
            pass


# -- hold_registry_lock ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _held(form: str, namespace: str, **options: object):
    lock = hold_registry_lock(namespace, **options)  # type: ignore[arg-type]
    if form == "with":
        with lock:
            yield lock
    else:
        async with lock:
            yield lock


@pytest.mark.parametrize("form", ["with", "async with"])
async def test_a_held_registry_lock_times_publishes_out_until_it_is_released(
        namespace: str, form: str) -> None:
    added = worker()
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, anyio.create_task_group() as tg:
            events = await follow(tg, owner.subscriber)
            async with LocalDiscovery.Publisher(namespace, lock_timeout=0.2) as publisher:
                async with _held(form, namespace):
                    with pytest.raises(TimeoutError):
                        await publisher.publish("worker-added", added)
                await publisher.publish("worker-added", added)
                assert await take(events, 1) == [("worker-added", added.uid)]
            tg.cancel_scope.cancel()


async def test_a_shared_hold_lets_reads_through_and_keeps_writes_out(namespace: str) -> None:
    first, second = worker(), worker()
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", first)
            async with LocalDiscovery.Publisher(namespace, lock_timeout=0.2) as late:
                async with _held("async with", namespace, shared=True), \
                        anyio.create_task_group() as tg:
                    events = await follow(tg, LocalDiscovery.Subscriber(namespace))
                    assert await take(events, 1) == [("worker-added", first.uid)]
                    with pytest.raises(TimeoutError):
                        await late.publish("worker-added", second)
                    tg.cancel_scope.cancel()


async def test_hold_registry_lock_times_out_naming_the_namespace(namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace):
            with hold_registry_lock(namespace):
                # Another open of the registry, in this very process, is another holder.
                with pytest.raises(TimeoutError, match=f"discovery namespace {namespace!r}"):
                    async with hold_registry_lock(namespace, shared=True, timeout=0.1):
                        pass
                with pytest.raises(TimeoutError, match=f"discovery namespace {namespace!r}"):
                    with hold_registry_lock(namespace, timeout=0.1):
                        pass


async def test_hold_registry_lock_needs_a_live_owner_and_creates_nothing(
        namespace: str, runtime_dir: Path) -> None:
    with pytest.raises(DiscoveryNamespaceNotFound):
        with hold_registry_lock(namespace):
            pass
    with pytest.raises(DiscoveryNamespaceNotFound):
        async with hold_registry_lock(namespace):
            pass
    assert list(runtime_dir.iterdir()) == []


# -- owner_process ---------------------------------------------------------------------------


async def test_owner_process_owns_the_namespace_for_its_block(
        namespace: str, anyio_backend: str, runtime_dir: Path) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, backend=anyio_backend) as owner:
            assert owner.namespace == namespace
            assert psutil.Process(owner.pid).ppid() == os.getpid()
            with pytest.raises(DiscoveryNamespaceInUse) as info:
                async with LocalDiscovery(namespace):
                    pass
            assert info.value.owner_pid == owner.pid
        assert owner.returncode == 0
        assert list(runtime_dir.iterdir()) == []  # its exit removed the namespace
        with pytest.raises(DiscoveryNamespaceNotFound):
            async for _ in LocalDiscovery.Subscriber(namespace):
                pass


async def test_owner_process_publishes_the_workers_it_spawns(
        namespace: str, anyio_backend: str, worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, spawn=2, backend=anyio_backend) as owner:
            assert len(owner.worker_pids) == 2
            assert {psutil.Process(pid).ppid() for pid in owner.worker_pids} == {owner.pid}
            seen: list[int] = []
            async for event in LocalDiscovery.Subscriber(namespace):
                assert event.type == "worker-added"
                seen.append(event.metadata.pid)
                if len(seen) == 2:
                    break
            assert sorted(seen) == sorted(owner.worker_pids)
            async with worker_pool(discovery=LocalDiscovery.Subscriber(namespace)) as pool:
                assert pool.workers == []  # it borrows: every worker is the owner's
                assert await whoami() in owner.worker_pids


async def test_a_killed_owner_process_leaves_the_namespace_to_the_next_claim(
        namespace: str, runtime_dir: Path, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, backend=anyio_backend) as owner:
            owner.kill()
            assert await owner.wait() == -signal.SIGKILL
            (left,) = runtime_dir.iterdir()  # a SIGKILLed owner removes nothing
            assert left.name.startswith("ns-")
            async with LocalDiscovery(namespace) as successor:
                assert successor.claimed
            owner.kill()  # a no-op once it has been waited for
        assert list(runtime_dir.iterdir()) == []


async def test_a_terminated_owner_process_exits_politely(
        namespace: str, runtime_dir: Path, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, spawn=1, backend=anyio_backend) as owner:
            owner.terminate()
            assert await owner.wait() == 0
            # It removed the namespace, and stopped and reaped its worker, which removed its
            # socket.
            assert list(runtime_dir.iterdir()) == []
            assert not psutil.pid_exists(owner.worker_pids[0])


async def test_owner_process_is_stopped_and_reaped_when_its_block_is_cancelled(
        namespace: str, runtime_dir: Path, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        with anyio.CancelScope() as scope:
            async with owner_process(namespace, backend=anyio_backend) as owner:
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert owner.returncode == 0  # the shielded teardown still let it exit politely
        assert list(runtime_dir.iterdir()) == []


async def test_owner_process_takes_any_namespace_string(anyio_backend: str) -> None:
    namespace = "a\0b/../\udc80\n" + "x" * 300
    with anyio.fail_after(60):
        async with owner_process(namespace, backend=anyio_backend) as owner:
            with pytest.raises(DiscoveryNamespaceInUse) as info:
                async with LocalDiscovery(namespace):
                    pass
            assert info.value.owner_pid == owner.pid


async def test_owner_process_raises_the_error_that_kept_the_child_from_owning(
        namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace):
            with pytest.raises(DiscoveryNamespaceInUse) as info:
                async with owner_process(namespace, backend=anyio_backend):
                    pass
    assert info.value.namespace == namespace
    assert info.value.owner_pid == os.getpid()


async def test_owner_process_that_dies_before_it_is_ready_raises_with_its_stderr(
        namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        with pytest.raises(RuntimeError, match="before it was ready") as info:
            async with owner_process(namespace, backend=anyio_backend,
                                     env={"ANYWOOL_RUNTIME_DIR": "relative"}):
                pass
    assert "ANYWOOL_RUNTIME_DIR must be an absolute path" in str(info.value)
