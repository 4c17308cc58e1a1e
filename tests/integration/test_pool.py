"""WorkerPool end to end: real worker processes, both backends."""

from __future__ import annotations

import os
import signal
import traceback
from pathlib import Path

import anyio
import psutil
import pytest

from anywool.discovery.local import LocalDiscovery
from anywool.errors import RoutineCancelled
from anywool.runtime._routine import routine
from anywool.runtime.client._connection import WorkerConnection
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._pool import WorkerPool

from ..helpers import Signal
from .routines import hold_until_cancelled

pytestmark = pytest.mark.anyio


@routine
async def scale(x: int) -> int:
    return 2 * x


@routine
async def worker_pid() -> int:
    return os.getpid()


@routine
async def fail(message: str) -> None:
    raise LookupError(message)  # marker: the line a remote traceback must show


@routine
async def numbers(n: int):
    for i in range(n):
        yield i


@routine
async def echo():
    """Yields what it is sent, doubled; answers a thrown KeyError with "caught"."""
    received = None
    while True:
        try:
            received = yield ("ready" if received is None else received * 2)
        except KeyError:
            received = yield "caught"


@routine
async def generate_then_hold(path: str):
    try:
        yield "first"
        await anyio.sleep_forever()
        yield "never"
    finally:
        Path(path).write_text("generator finally ran")


def _assert_gone(pids: list[int]) -> None:
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"worker processes still alive: {alive}"
    children = psutil.Process().children(recursive=True)
    assert [c.pid for c in children if c.pid in pids] == []


async def test_coroutine_routine_returns_its_value_and_workers_are_reaped() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2) as pool:
            pids = [worker.pid for worker in pool.workers]
            assert len(set(pids)) == 2
            assert await scale(21) == 42
            assert {await worker_pid() for _ in range(4)} == set(pids)  # round robin
    _assert_gone(pids)


async def test_twenty_concurrent_calls_all_answer_correctly() -> None:
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await scale(i)

    with anyio.fail_after(30):
        async with WorkerPool(spawn=2):
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
    assert results == {i: 2 * i for i in range(20)}


async def test_exception_arrives_with_type_message_and_remote_traceback() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2):
            with pytest.raises(LookupError) as info:
                await fail("no such thing")
    assert str(info.value) == "no such thing"
    rendered = "".join(traceback.format_exception(info.value))
    assert "in fail" in rendered
    assert "raise LookupError(message)  # marker" in rendered


async def test_async_generator_routine_streams_its_items() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2):
            assert [i async for i in numbers(5)] == [0, 1, 2, 3, 4]
            assert [i async for i in numbers(0)] == []


async def test_async_generator_routine_supports_asend_athrow_aclose() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2):
            agen = echo()
            assert await agen.__anext__() == "ready"
            assert await agen.asend(21) == 42
            assert await agen.athrow(KeyError("x")) == "caught"
            assert await agen.asend(5) == 10
            await agen.aclose()
            with pytest.raises(StopAsyncIteration):
                await agen.__anext__()


async def test_athrow_of_an_uncaught_exception_raises_it_back() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            agen = numbers(3)
            assert await agen.__anext__() == 0
            with pytest.raises(ZeroDivisionError, match="thrown in"):
                await agen.athrow(ZeroDivisionError("thrown in"))


async def test_cancelling_the_caller_runs_the_routines_finally_on_the_worker(tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2), Signal() as signal_:
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(_cancel_when_started, signal_, scope)
                    await hold_until_cancelled(signal_.port, str(marker))
            assert scope.cancelled_caught
            # The cancellation reached us only after the worker confirmed the routine unwound.
            assert marker.read_text() == "finally ran"
            assert await scale(1) == 2  # the connection is still healthy


async def test_cancelling_a_streaming_caller_runs_the_generators_finally(tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            agen = generate_then_hold(str(marker))
            assert await agen.__anext__() == "first"
            with anyio.move_on_after(0.2) as scope:
                await agen.__anext__()
            assert scope.cancelled_caught
            assert marker.read_text() == "generator finally ran"


async def _cancel_when_started(signal_: Signal, scope: anyio.CancelScope) -> None:
    await signal_.started()
    scope.cancel()


async def test_routine_cancelled_by_its_worker_raises_routine_cancelled(tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with LocalWorker() as worker, WorkerConnection(worker.address) as connection:
            async with Signal() as signal_, anyio.create_task_group() as tg:
                tg.start_soon(_sigterm_when_started, signal_, worker.pid)
                with pytest.raises(RoutineCancelled) as info:
                    await connection.call(hold_until_cancelled, (signal_.port, str(marker)), {})
    assert info.value.routine == "hold_until_cancelled"
    assert info.value.address == worker.address
    assert marker.read_text() == "finally ran"
    _assert_gone([worker.pid])


async def _sigterm_when_started(signal_: Signal, pid: int) -> None:
    await signal_.started()
    os.kill(pid, signal.SIGTERM)


async def test_default_pool_spawns_one_worker_per_cpu() -> None:
    with anyio.fail_after(30):
        async with WorkerPool() as pool:
            assert len(pool.workers) == (os.cpu_count() or 1)
            assert await scale(4) == 8


async def test_pool_borrowing_a_namespace_dispatches_to_the_owners_worker(namespace: str) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)) as owner:
            owner_pid = owner.workers[0].pid
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)) as borrower:
                assert borrower.workers == []
                assert await worker_pid() == owner_pid
    _assert_gone([owner_pid])


async def test_a_pool_with_tags_never_dispatches_to_a_found_worker_lacking_them(
        namespace: str) -> None:
    from uuid import UUID

    from ..helpers import wait_until

    with anyio.fail_after(60):
        async with LocalWorker(tags={namespace}) as lacking, \
                LocalWorker(tags={"gpu", "x"}) as found, \
                WorkerPool(spawn=1, discovery=LocalDiscovery(namespace), tags={"gpu"}) as pool, \
                LocalDiscovery.Publisher(namespace) as publisher:
            (own,) = pool.workers
            assert own.metadata.tags == {"gpu", namespace}  # the pool's tags and its namespace
            await publisher.publish("worker-added", lacking.metadata)  # in the namespace, no "gpu"
            await publisher.publish("worker-added", found.metadata)  # found, and carries "gpu"

            def connected() -> set[UUID]:
                return {w.uid for w in pool.proxy.workers}

            # Published after the lacking one: once it is connected, the lacking one was seen.
            await wait_until(lambda: found.metadata.uid in connected(), "the found worker")
            assert {await worker_pid() for _ in range(9)} == {own.pid, found.pid}
            assert lacking.metadata.uid not in connected()


@pytest.mark.parametrize(
    ("spawn", "error", "match"),
    [(0, ValueError, "spawn must be between 1 and 1024, got 0"),
     (1025, ValueError, "spawn must be between 1 and 1024, got 1025"),
     (True, TypeError, "spawn must be an int"), ("2", TypeError, "spawn")],
)
async def test_invalid_spawn_is_rejected_naming_the_parameter(spawn: object, error: type, match: str) -> None:
    with anyio.fail_after(10), pytest.raises(error, match=match):
        async with WorkerPool(spawn=spawn):  # type: ignore[arg-type]
            pass


async def test_discovery_of_the_wrong_kind_is_rejected_naming_both_protocols() -> None:
    with anyio.fail_after(10), pytest.raises(TypeError, match="DiscoveryLike or DiscoverySubscriberLike"):
        async with WorkerPool(discovery=42):
            pass


async def test_pool_is_single_use() -> None:
    pool = WorkerPool(spawn=1)
    with anyio.fail_after(30):
        async with pool:
            pass
        with pytest.raises(RuntimeError, match="single-use"):
            async with pool:
                pass


async def test_exception_in_the_block_propagates_unchanged_and_workers_are_reaped() -> None:
    with anyio.fail_after(30):
        with pytest.raises(KeyError, match="body"):
            async with WorkerPool(spawn=1) as pool:
                pids = [w.pid for w in pool.workers]
                raise KeyError("body")
    _assert_gone(pids)


async def test_worker_process_exits_and_removes_its_socket_at_stdin_eof(runtime_dir: Path) -> None:
    import sys

    with anyio.fail_after(30):
        process = await anyio.open_process(
            [sys.executable, "-m", "anywool.worker", "--backend", "trio"], stdin=-1, stdout=-1
        )
        async with process:
            assert process.stdout is not None and process.stdin is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive()
            address = line.decode().strip()
            socket_path = Path(address.removeprefix("unix:"))
            home = socket_path.parent
            assert home.parent == runtime_dir and home.name.startswith("w-")
            assert socket_path.stat().st_mode & 0o777 == 0o600
            assert home.stat().st_mode & 0o777 == 0o700
            await process.stdin.aclose()  # what a SIGKILLed parent's pipe looks like to the worker
            assert await process.wait() == 0
    assert not home.exists()
