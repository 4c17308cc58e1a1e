"""Nested routines: routines calling routines on their workers, through the originating pool."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import anywool
from anywool import WorkerPool, routine
from anywool.lowlevel import WorkerConnection, discovery_stats
from anywool.testing import WorkerPoolFactory

from ..helpers import Signal, wait_until
from .routines import countdown

pytestmark = pytest.mark.anyio


@routine
async def descend(depth: int) -> list[tuple[int, int, int | None]]:
    """``(pid, call id, caller id)`` of every level, from this one down."""
    task = anywool.current_task()
    here = (os.getpid(), task.id, task.caller_id)
    if depth == 1:
        return [here]
    return [here, *await descend(depth - 1)]


@routine
async def pid_of_worker() -> int:
    return os.getpid()


@routine
async def fan_out(count: int) -> tuple[int, list[int]]:
    """This worker's pid, and the pids of the workers ``count`` concurrent nested calls ran on."""
    pids: list[int] = []

    async def one() -> None:
        pids.append(await pid_of_worker())

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return os.getpid(), pids


@routine
async def deep_hold(depth: int, port: int, directory: str) -> None:
    """Calls itself ``depth`` levels down; the deepest tells the test it runs and waits to be
    cancelled. Each level writes ``finally-<depth>`` from its ``finally``."""
    try:
        if depth == 1:
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"started")
            await anyio.sleep_forever()
        await deep_hold(depth - 1, port, directory)
    finally:
        Path(directory, f"finally-{depth}").write_text(str(os.getpid()))


@routine
async def seconds_left() -> float:
    return anyio.current_effective_deadline() - anyio.current_time()


@routine
async def seconds_left_here_and_below() -> tuple[float, float]:
    here = anyio.current_effective_deadline() - anyio.current_time()
    return here, await seconds_left()


@routine
async def streams_below(n: int) -> list[int]:
    return [item async for item in countdown(n)]


@routine
async def attached_subscriptions() -> int:
    """How many discovery iterations this worker's process follows now."""
    return sum(source.consumers for source in discovery_stats())


async def test_a_routine_calls_routines_three_levels_deep(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            levels = await descend(3)
    assert len(levels) == 3
    assert levels[0][2] is None  # the top call was made outside any routine
    for upper, lower in zip(levels, levels[1:]):
        assert lower[2] == upper[1]  # each level knows the call it was made from


async def test_sixteen_nested_calls_spread_over_both_workers(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            here, pids = await fan_out(16)
            workers = {worker.pid for worker in pool.workers}
    assert len(pids) == 16 and set(pids) <= workers
    assert set(pids) == workers  # not all on the worker the fan-out runs on
    assert here in workers


async def test_a_nested_async_generator_streams_its_items(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            assert await streams_below(3) == [3, 2, 1]


async def test_cancelling_the_outermost_call_cancels_the_whole_tree(tmp_path: Path, worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2), Signal() as started:
            async with anyio.create_task_group() as tg:
                tg.start_soon(deep_hold, 3, started.port, str(tmp_path))
                await started.started()
                tg.cancel_scope.cancel()
            # The cancellation was acknowledged level by level: every finally has run.
            assert sorted(p.name for p in tmp_path.iterdir()) == [
                "finally-1", "finally-2", "finally-3"]


async def test_nested_calls_inherit_what_remains_of_the_deadline(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with anyio.move_on_after(5):
                here, below = await seconds_left_here_and_below()
    assert 0 < below <= here <= 5


async def test_a_workers_nested_proxy_is_closed_after_disuse(monkeypatch, worker_pool: WorkerPoolFactory) -> None:
    monkeypatch.setenv("ANYWOOL_PROXY_IDLE_TIMEOUT", "0.5")
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            assert await attached_subscriptions() == 0  # a plain call opens no proxy
            assert len(await descend(2)) == 2
            assert await attached_subscriptions() == 1  # the proxy follows the namespace
            # The proxy's subscription ends once it has gone unused for the idle timeout. (This
            # polls the worker: nothing there could be waited on from here.)
            async def closed() -> bool:
                return await attached_subscriptions() == 0

            await wait_until(closed, "the idle proxy's subscription to end", timeout=20,
                             interval=0.05)
            assert len(await descend(2)) == 2  # and a later nested call opens it again
            assert await attached_subscriptions() == 1


async def test_a_routine_called_without_a_pool_cannot_call_routines_and_says_why() -> None:
    # A bare connection carries no proxy: there is nothing for nested calls to go through.
    with anyio.fail_after(30):
        async with anywool.LocalWorker() as worker, WorkerConnection(
            worker.metadata.address
        ) as connection:
            with pytest.raises(RuntimeError, match="carried no pool"):
                await connection.call(descend.__wrapped__, (2,), {})
            assert await connection.call(pid_of_worker.__wrapped__, (), {}) == worker.pid



@routine
async def mark_levels(depth: int, directory: str) -> None:
    """Each level writes ``started-<depth>`` first and ``finally-<depth>`` from its finally."""
    Path(directory, f"started-{depth}").touch()
    try:
        if depth > 1:
            await mark_levels(depth - 1, directory)
        else:
            await anyio.sleep_forever()
    finally:
        Path(directory, f"finally-{depth}").touch()


async def test_a_call_cancelled_before_it_is_sent_ends_at_once() -> None:
    # Nothing was written, so nothing waits for the worker to confirm a cancellation (here up
    # to the 60 s cancel_timeout).
    with anyio.fail_after(30):
        async with anywool.LocalWorker() as worker, WorkerConnection(
            worker.address, cancel_timeout=60
        ) as connection:
            for scope in (anyio.move_on_after(0), anyio.move_on_after(-1)):
                with scope:
                    await connection.call(pid_of_worker.__wrapped__, (), {})
                assert scope.cancelled_caught
            assert await connection.call(pid_of_worker.__wrapped__, (), {}) == worker.pid


async def test_a_tree_cancelled_at_any_moment_has_run_every_started_finally(tmp_path: Path, worker_pool: WorkerPoolFactory) -> None:
    # Cancelled at a spread of moments: before the first call is sent, while levels start, once
    # all run. Whatever had started has unwound when the cancellation reaches the caller.
    with anyio.fail_after(120):
        async with worker_pool(spawn=2):
            for step in range(12):
                directory = tmp_path / str(step)
                directory.mkdir()
                with anyio.move_on_after(step * 0.01):  # the moments of the cancellation
                    await mark_levels(3, str(directory))
                names = {p.name for p in directory.iterdir()}
                started = {n.split("-")[1] for n in names if n.startswith("started-")}
                unwound = {n.split("-")[1] for n in names if n.startswith("finally-")}
                assert started == unwound, (step, sorted(names))


async def test_proxies_that_pickle_alike_share_one_proxy_on_each_worker(namespace: str) -> None:
    from anywool import LocalDiscovery, WorkerProxy

    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)):
            for _ in range(20):  # a proxy per request, as a server might make them
                async with WorkerProxy(namespace):
                    assert len(await descend(2)) == 2
            async with WorkerProxy(namespace):
                assert await attached_subscriptions() == 1


async def test_a_worker_keeps_few_idle_proxies(namespace: str) -> None:
    from anywool import LocalDiscovery, WorkerProxy
    from anywool.runtime.worker._nested import MAX_IDLE

    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)):
            for index in range(MAX_IDLE + 4):  # as many different origins
                async with WorkerProxy(namespace, f"tag-{index}"):
                    assert len(await descend(2)) == 2
            async with WorkerProxy(namespace):
                assert await attached_subscriptions() == MAX_IDLE


async def test_nested_calls_reach_a_replaced_worker_whatever_the_lease() -> None:
    import signal

    with anyio.fail_after(60):
        async with WorkerPool(spawn=2, lease=0) as pool:
            first = {worker.pid for worker in pool.workers}
            _, pids = await fan_out(16)
            assert set(pids) == first
            victim = pool.workers[0].pid
            os.kill(victim, signal.SIGKILL)
            await wait_until(lambda: len(pool.workers) == 2
                             and victim not in {worker.pid for worker in pool.workers},
                             "the pool to replace its worker")
            now = {worker.pid for worker in pool.workers}
            for _ in range(4):  # fanning out from each worker, the survivor's included
                here, pids = await fan_out(16)
                assert set(pids) == now, here  # the replacement is one of the pool's own


@routine
async def nest_once_wait_then_fan_out(gate: str) -> list[int]:
    """One nested call, then wait for the test (over the Unix socket ``gate``), then more."""
    await pid_of_worker()
    async with await anyio.connect_unix(gate) as stream:
        await stream.send(b"running")
        await stream.receive()
    pids: list[int] = []

    async def one() -> None:
        pids.append(await pid_of_worker())

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(one)
    return pids


async def test_a_call_running_as_its_pool_exits_can_still_call_routines(
        namespace: str, tmp_path: Path) -> None:
    # The pool withdraws its workers first, then lets its calls finish: their nested calls
    # still reach its workers (here with a quorum_timeout that would otherwise fail them).
    from anywool import LocalDiscovery

    from ..helpers import follow, take

    gate = str(tmp_path / "gate")
    results: list[list[int]] = []
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, \
                await anyio.create_unix_listener(gate) as listener, \
                anyio.create_task_group() as tg:
            events = await follow(tg, discovery.subscriber)
            async with WorkerPool(spawn=2, discovery=discovery, quorum_timeout=2) as pool:
                workers = {worker.pid for worker in pool.workers}
                await take(events, 2)  # both added

                async def caller() -> None:
                    results.append(await nest_once_wait_then_fan_out(gate))

                tg.start_soon(caller)
                held = await listener.accept()
                assert await held.receive() == b"running"

                async def release_once_withdrawn() -> None:
                    assert [kind for kind, _ in await take(events, 2)] == ["worker-dropped"] * 2
                    await held.send(b"go")
                    await held.aclose()

                tg.start_soon(release_once_withdrawn)
            tg.cancel_scope.cancel()
    assert len(results) == 1 and set(results[0]) <= workers and len(results[0]) == 4


@routine
async def raise_below(depth: int) -> None:
    if depth == 1:
        raise KeyError("deep")
    await raise_below(depth - 1)


async def test_an_exception_from_deep_down_a_tree_keeps_its_type(worker_pool: WorkerPoolFactory) -> None:
    # Each level adds its frames to the traceback: past a few hundred, pickling it failed and
    # the exception arrived as a RuntimeError naming it.
    with anyio.fail_after(120):
        async with worker_pool(spawn=2):
            with pytest.raises(KeyError, match="deep") as info:
                await raise_below(45)
    assert any("shortened" in note for note in info.value.__notes__)


@routine
async def proxies_kept() -> int:
    """How many nested-call proxies (entered or not) this worker's process holds."""
    import gc

    from anywool.runtime.worker._nested import _Host

    return sum(isinstance(thing, _Host) for thing in gc.get_objects())


async def test_calls_that_make_no_nested_call_leave_nothing_on_their_worker(
        namespace: str) -> None:
    from anywool import LocalDiscovery, WorkerProxy

    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)):
            for index in range(30):  # as many origins, none calling a routine
                async with WorkerProxy(namespace, f"tag-{index}"):
                    await pid_of_worker()
            assert await proxies_kept() == 0
