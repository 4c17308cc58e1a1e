"""How a pool spreads calls started all at once: by how soon its workers start them, not by
count (a worker whose event loop a call holds is given next to nothing meanwhile), while
routines that await still overlap many per worker."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

import anywool
from anywool import routine
from anywool.testing import WorkerPoolFactory

from ..helpers import wait_until

pytestmark = pytest.mark.anyio


@routine
async def hold_until(started: str, release: str) -> int:
    """Hold the worker's event loop (no await) from writing ``started`` until ``release``
    exists."""
    Path(started).touch()
    while not os.path.exists(release):
        time.sleep(0.001)
    return os.getpid()


def hold_until_sync(started: str, release: str) -> int:
    Path(started).touch()
    while not os.path.exists(release):
        time.sleep(0.001)
    return os.getpid()


@routine
async def pid_of() -> int:
    return os.getpid()


@routine
async def spin(seconds: float) -> int:
    """Hold the loop for ``seconds`` of CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return os.getpid()


@routine
async def meet(port: int) -> int:
    """Connect to the test, and return once it answers: every call stays open meanwhile."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.receive()
    return os.getpid()


@pytest.mark.parametrize("form", ["routine", "run_sync"])
async def test_a_worker_held_by_a_call_is_committed_next_to_nothing_meanwhile(
        form: str, tmp_path: Path, worker_pool: WorkerPoolFactory) -> None:
    # Dealt by count, half of the 20 quick calls would wait on the held worker, and the other
    # would never answer 18 of them while the first holds.
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    done: Counter[int] = Counter()
    holder: list[int] = []
    with anyio.fail_after(60):
        async with worker_pool(spawn=2), anyio.create_task_group() as tg:

            async def hold() -> None:
                if form == "routine":
                    holder.append(await hold_until(started, release))
                else:
                    holder.append(await anywool.run_sync(hold_until_sync, started, release))

            tg.start_soon(hold)
            await wait_until(lambda: os.path.exists(started), "the holder to start")

            async def quick() -> None:
                done[await pid_of()] += 1

            for _ in range(20):
                tg.start_soon(quick)
            # All but the few committed to the held worker answer while it holds.
            await wait_until(lambda: sum(done.values()) >= 18, "18 quick calls elsewhere")
            assert not holder
            Path(release).touch()
    held = holder[0]
    assert sum(done.values()) == 20
    assert done[held] <= 2, done


async def test_calls_that_alternate_long_and_short_are_not_dealt_by_turn(
        worker_pool: WorkerPoolFactory) -> None:
    # Long, short, long, short...: dealt in turn over 2 workers, every long call lands on the
    # same worker.
    long_on: Counter[int] = Counter()
    with anyio.fail_after(60):
        async with worker_pool(spawn=2), anyio.create_task_group() as tg:

            async def long() -> None:
                long_on[await spin(0.02)] += 1

            for _ in range(20):
                tg.start_soon(long)
                tg.start_soon(pid_of)
    assert len(long_on) == 2 and min(long_on.values()) >= 5, long_on


async def test_routines_that_await_overlap_many_per_worker(
        worker_pool: WorkerPoolFactory) -> None:
    # 100 calls are open at once on 2 workers: the listener has all 100 connections before it
    # answers any of them.
    calls = 100
    pids: Counter[int] = Counter()
    with anyio.fail_after(60):
        async with worker_pool(spawn=2), \
                await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    pids[await meet(port)] += 1

                for _ in range(calls):
                    tg.start_soon(call)
                streams = []
                for _ in range(calls):
                    streams.append(await listener.listeners[0].accept())  # type: ignore[attr-defined]
                for stream in streams:
                    await stream.send(b"go")
                    await stream.aclose()
    assert sum(pids.values()) == calls and len(pids) == 2, pids


@routine
async def nap_then_double(x: int, seconds: float) -> int:
    await anyio.sleep(seconds)
    return 2 * x


async def test_calls_cancelled_while_they_wait_for_room_leave_no_wake_up_owed(
        worker_pool: WorkerPoolFactory) -> None:
    # With max_concurrency=1 most calls of a burst wait at the caller for a worker with room;
    # cancelled there, at random moments (some just as room came to them), they must pass on
    # what they were given: afterwards a burst runs to the end, and nothing is owed.
    import random

    rnd = random.Random(20)
    with anyio.fail_after(90):
        async with worker_pool(spawn=2, max_concurrency=1) as pool:
            for _ in range(3):
                with anyio.move_on_after(rnd.uniform(0.1, 0.3)):
                    async with anyio.create_task_group() as tg:

                        async def one(i: int) -> None:
                            with anyio.move_on_after(rnd.uniform(0, 0.03)):
                                await nap_then_double(i, rnd.uniform(0, 0.002))

                        for i in range(400):
                            tg.start_soon(one, i)
            results: dict[int, int] = {}
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:

                    async def keep(i: int) -> None:
                        results[i] = await nap_then_double(i, 0)

                    for i in range(200):
                        tg.start_soon(keep, i)
            proxy = pool.proxy
            assert proxy is not None
            queue = proxy._room_queue
            owed = (queue.promised, len(queue.back), len(queue.front), queue.queued)
    assert results == {i: 2 * i for i in range(200)}
    assert owed == (0, 0, 0, 0)
