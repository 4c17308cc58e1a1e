"""Admission: a worker runs at most ``max_concurrency`` calls; the others go elsewhere or wait."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from anywool import LocalWorker, WorkerPool, routine
from anywool.lowlevel import CallNotDelivered, WorkerBusy, WorkerConnection

pytestmark = pytest.mark.anyio

# Per worker process: how many `gated` calls run now, and the most that ever ran at once.
_running = 0
_peak = 0


@routine
async def gated(gate: str) -> int:
    """Says it runs (over the Unix socket ``gate``), then waits for the test to let it go."""
    global _running, _peak
    _running += 1
    _peak = max(_peak, _running)
    try:
        async with await anyio.connect_unix(gate) as stream:
            await stream.send(b"running")
            await stream.receive()
    finally:
        _running -= 1
    return os.getpid()


@routine
async def peak() -> tuple[int, int]:
    return os.getpid(), _peak


@routine
async def touch(path: str) -> None:
    Path(path).touch()


async def test_a_worker_at_its_bound_refuses_a_call_before_running_it(tmp_path: Path) -> None:
    gate = str(tmp_path / "gate")
    marker = tmp_path / "ran"
    room = anyio.Event()
    with anyio.fail_after(30):
        async with LocalWorker(max_concurrency=1) as worker, \
                await anyio.create_unix_listener(gate) as listener, \
                WorkerConnection(worker.address, on_room=room.set) as connection, \
                anyio.create_task_group() as tg:
            tg.start_soon(connection.call, gated.__wrapped__, (gate,), {})
            async with await listener.accept() as held:
                assert await held.receive() == b"running"
                with pytest.raises(WorkerBusy) as info:
                    await connection.call(touch.__wrapped__, (str(marker),), {})
                assert isinstance(info.value, CallNotDelivered)  # safe to send elsewhere
                assert connection.busy
                await held.send(b"go")
            await room.wait()  # the worker says when it has room again, unasked
            assert not connection.busy and not marker.exists()  # the refused call never ran
            await connection.call(touch.__wrapped__, (str(marker),), {})
            assert marker.exists()


async def test_calls_beyond_every_workers_bound_wait_for_room(tmp_path: Path) -> None:
    gate = str(tmp_path / "gate")
    pids: list[int] = []
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2, max_concurrency=1) as pool, \
                await anyio.create_unix_listener(gate) as listener:

            async def call() -> None:
                pids.append(await gated(gate))

            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(call)
                first = await listener.accept()
                second = await listener.accept()
                held = [first, second]  # both workers are full; three calls wait
                for _ in range(3):
                    assert await held[0].receive() == b"running"
                    await held[0].send(b"go")
                    await held.pop(0).aclose()
                    held.append(await listener.accept())  # room: a waiting call runs
                for stream in held:
                    assert await stream.receive() == b"running"
                    await stream.send(b"go")
                    await stream.aclose()
            workers = {worker.pid for worker in pool.workers}
            peaks: dict[int, int] = {}
            while set(peaks) != workers:
                pid, most = await peak()
                peaks[pid] = most
    assert len(pids) == 5 and set(pids) == workers  # every call ran, on both workers
    assert peaks == {pid: 1 for pid in workers}  # and no worker ever ran two at once


@pytest.mark.parametrize("value, error", [(0, ValueError), (True, TypeError), ("2", TypeError)])
async def test_max_concurrency_is_validated_naming_it(value: object, error: type) -> None:
    with pytest.raises(error, match="max_concurrency"):
        WorkerPool(spawn=1, max_concurrency=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="max_concurrency"):
        LocalWorker(max_concurrency=value)  # type: ignore[arg-type]


class CountingBalancer:
    """Round robin, counting every attempt to hand a call to a worker."""

    def __init__(self) -> None:
        from anywool import RoundRobinLoadBalancer

        self._inner = RoundRobinLoadBalancer()
        self.attempts = 0

    async def dispatch(self, workers, send):
        async def counted(connection):
            self.attempts += 1
            return await send(connection)

        return await self._inner.dispatch(workers, counted)


@routine
async def pause(x: int) -> int:
    await anyio.sleep(0.001)  # the routine's work: long enough for calls to pile up
    return x


@routine
async def brief(x: int) -> int:
    await anyio.sleep(0)
    return x


@pytest.mark.parametrize("bound", [1, 3])
async def test_each_place_freed_wakes_one_waiting_call(bound: int) -> None:
    # 400 calls for a few places: each call that ends lets one waiting call try (which, once
    # accepted, lets the next one try), rather than every waiting call trying again and all but
    # one being refused again, which made the attempts per call grow with the calls waiting.
    calls = 400
    balancer = CountingBalancer()
    results: list[int] = []
    with anyio.fail_after(120):
        async with WorkerPool(spawn=1, max_concurrency=bound, loadbalancer=balancer):
            async def call(x: int) -> None:
                results.append(await brief(x))

            async with anyio.create_task_group() as tg:
                for x in range(calls):
                    tg.start_soon(call, x)
    assert sorted(results) == list(range(calls))
    # The worker's HELLO told the pool its bound: no call is ever sent to be refused, so each
    # is handed over once.
    assert balancer.attempts == calls, balancer.attempts


async def test_calls_through_several_proxies_all_get_their_turn(namespace: str) -> None:
    # Each proxy has its own connection to each worker. A worker that owed one ROOM per refusal
    # sent some to a connection whose refused calls had run elsewhere meanwhile: nobody woke,
    # and the other proxy's calls waited for ever on an idle worker.
    from anywool import LocalDiscovery, WorkerProxy

    done: list[int] = []
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2, max_concurrency=1,
                              discovery=LocalDiscovery(namespace)) as pool, \
                WorkerProxy(namespace) as other:
            proxies = [pool.proxy, other]

            async def call(x: int) -> None:
                done.append(await proxies[x % 2].dispatch(pause.__wrapped__, (x,), {}))

            async with anyio.create_task_group() as tg:
                for x in range(300):
                    tg.start_soon(call, x)
    assert sorted(done) == list(range(300))
