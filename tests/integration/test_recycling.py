"""Recycling workers (issue 24, item 2): a worker past its ``max_calls`` or ``max_memory``
finishes its calls, takes no new ones, and is replaced before it leaves; no call fails. Real
workers, both backends."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from anywool import WorkerPool, routine
from anywool.errors import RoutineCancelled, WorkerError
from anywool.runtime.pool._publishing import Publishing

from ..helpers import wait_until

pytestmark = pytest.mark.anyio

MiB = 1 << 20
_leaked: list[bytes] = []


@routine
async def pid() -> int:
    return os.getpid()


@routine
async def pids(count: int) -> AsyncIterator[int]:
    for _ in range(count):
        await anyio.lowlevel.checkpoint()
        yield os.getpid()


@routine
async def leak_and_hold(mib: int, port: int) -> int:
    """Keeps ``mib`` MiB (touched: resident) for good, tells the test, and returns once the
    test says ``go``."""
    _leaked.append(b"\x01" * (mib * MiB))
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(b"started")
        assert await stream.receive() == b"go"
    return os.getpid()


async def test_workers_past_max_calls_are_replaced_and_no_call_fails() -> None:
    smallest = []
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2, max_calls=5) as pool:

            async def one(results: list[int]) -> None:
                results.append(await pid())
                smallest.append(len(pool.workers))

            results: list[int] = []
            for _ in range(10):
                await one(results)
            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(one, results)
            served = Counter(results)
            assert len(results) == 30  # every call returned
            assert max(served.values()) <= 5, served  # none took more than its bound
            assert len(served) >= 30 // 5
            # Each retired worker was replaced before it left: never fewer than the pool's size.
            assert min(smallest) >= 2
            await wait_until(lambda: len(pool.workers) == 2, "the retired workers to leave")
            assert all(psutil.pid_exists(w.pid) for w in pool.workers)
    retired = [p for p in served if psutil.pid_exists(p)]
    assert retired == [] or all(psutil.Process(p).status() == psutil.STATUS_ZOMBIE
                                for p in retired)


async def test_a_retiring_worker_finishes_the_stream_it_runs() -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, max_calls=1):
            items = [item async for item in pids(3)]
            assert len(set(items)) == 1  # the one call it took, to its end
            assert await pid() != items[0]  # the next went to its replacement


async def test_a_worker_leaking_past_max_memory_is_replaced_while_its_call_runs() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    with anyio.fail_after(60):
        async with listener, WorkerPool(spawn=1, max_memory=150 * MiB) as pool:
            [first] = pool.workers
            async with anyio.create_task_group() as tg:
                returned: list[int] = []

                async def leaking() -> None:
                    returned.append(await leak_and_hold(200, port))

                tg.start_soon(leaking)
                stream = await listener.listeners[0].accept()  # type: ignore[attr-defined]
                async with stream:
                    assert await stream.receive() == b"started"
                    # While the call runs: the replacement starts, the leaking worker stays.
                    await wait_until(lambda: len(pool.workers) == 2, "a replacement")
                    assert first in pool.workers
                    other = await pid()
                    assert other != first.pid  # new calls go to the replacement
                    await stream.send(b"go")
            assert returned == [first.pid]  # the call it ran finished there
            await wait_until(lambda: pool.workers == [w for w in pool.workers
                                                      if w.pid == other],
                             "the leaking worker to leave")
            assert await pid() == other


@contextlib.asynccontextmanager
async def unless_flagged(flag: str) -> AsyncIterator[None]:
    """A lifespan that fails while ``flag`` exists (new workers' set-up broken, say)."""
    if os.path.exists(flag):
        raise RuntimeError("the new configuration is broken")
    yield


async def test_recycle_replaces_every_worker_while_calls_flow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2) as pool:
            before = {worker.pid for worker in pool.workers}
            served: list[int] = []
            ready: list[int] = []
            failures: list[BaseException] = []
            recycled = anyio.Event()
            # How many workers take this pool's calls as each old one is withdrawn: the
            # replacement is connected by then, so its size plus one (sampled there, not
            # between calls, where a short dip could go unseen).
            at_drops: list[int] = []
            announce = Publishing.announce

            async def recording(self: Publishing, worker: Any, kind: str) -> None:
                if kind == "worker-dropped":
                    at_drops.append(len(pool.proxy.workers))
                await announce(self, worker, kind)

            monkeypatch.setattr(Publishing, "announce", recording)

            async def steady() -> None:
                while not recycled.is_set():
                    try:
                        served.append(await pid())
                    except Exception as exc:  # counted: the test says none may fail
                        failures.append(exc)
                    ready.append(len(pool.proxy.workers))

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(steady)
                await pool.recycle()
                recycled.set()
            after = {worker.pid for worker in pool.workers}
            assert failures == []
            assert len(after) == 2 and not after & before  # every worker replaced
            assert min(ready) >= 2  # never fewer than the pool's size taking calls
            assert at_drops == [3, 3]
            assert set(served) == before | after  # calls flowed throughout, to both
            assert {await pid() for _ in range(6)} == after
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in before)


async def test_a_recycle_whose_replacement_cannot_start_keeps_the_workers(
        tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1, worker_lifespan=partial(unless_flagged, str(flag))
                              ) as pool:
            before = sorted(worker.pid for worker in pool.workers)
            flag.touch()
            with pytest.raises(WorkerError, match="the new configuration is broken"):
                await pool.recycle()
            assert sorted(worker.pid for worker in pool.workers) == before
            assert {await pid() for _ in range(3)} == set(before)  # still serving
            flag.unlink()
            await pool.recycle()  # the configuration mended: it goes through
            after = {worker.pid for worker in pool.workers}
            assert len(after) == 1 and not after & set(before)  # no slot was lost


async def test_recycle_needs_an_entered_pool() -> None:
    with pytest.raises(RuntimeError, match="not entered"):
        await WorkerPool(spawn=1).recycle()


@routine
async def hold_until_go(port: int) -> int:
    """Tells the test it started, and returns once the test says ``go``."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(b"started")
        assert await stream.receive() == b"go"
    return os.getpid()


@contextlib.asynccontextmanager
async def first_start_only(path: str) -> AsyncIterator[None]:
    """Enters at once in the first worker started; in every later one, notes that it is
    entering in ``path`` and never finishes (a replacement whose start takes for ever)."""
    with open(path, "a") as file:
        file.write(f"entering {os.getpid()}\n")
    if len(Path(path).read_text().splitlines()) > 1:
        await anyio.sleep_forever()
    yield


async def test_a_retiring_worker_finishes_a_call_that_outlasts_shutdown_timeout() -> None:
    # shutdown_timeout bounds the drain of the pool's exit, not how long a retiring worker's
    # calls may take: the retiring worker must not be stopped with it while the pool runs.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    with anyio.fail_after(60):
        async with listener, WorkerPool(spawn=1, max_calls=1, shutdown_timeout=0) as pool:
            [first] = pool.workers
            returned: list[int] = []
            async with anyio.create_task_group() as tg:

                async def holding() -> None:
                    returned.append(await hold_until_go(port))

                tg.start_soon(holding)
                stream = await listener.listeners[0].accept()  # type: ignore[attr-defined]
                async with stream:
                    assert await stream.receive() == b"started"
                    # Replaced and withdrawn (until then it was announced): its call still runs.
                    await wait_until(lambda: [m.uid for m in pool.proxy.workers] not in (
                        [], [first.metadata.uid]), "the retiring worker to be withdrawn")
                    assert await pid() != first.pid  # the replacement serves meanwhile
                    await stream.send(b"go")
            assert returned == [first.pid]
            await first.wait()  # it left by itself, once its call ended


async def test_the_pools_exit_does_not_wait_for_a_replacement_that_is_starting(
        tmp_path: Path) -> None:
    path = tmp_path / "starts"
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, max_calls=1, startup_timeout=120, shutdown_timeout=1,
                              worker_lifespan=partial(first_start_only, str(path))):
            await pid()  # its worker retires; its replacement's start never ends
            await wait_until(lambda: len(path.read_text().splitlines()) == 2,
                             "the replacement's lifespan to be entered")
        # The exit cancelled the start (its process is killed and reaped: see conftest).


async def test_the_pools_own_call_on_a_retiring_worker_is_cancelled_at_exit() -> None:
    # A withdrawn worker is no longer among the proxy's choice of workers; the proxy's exit
    # still asks it to cancel the calls of its own that it runs (not dropping the connection
    # under them).
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    with anyio.fail_after(60):
        async with listener, anyio.create_task_group() as tg:
            outcome: list[BaseException] = []

            async def holding() -> None:
                try:
                    await hold_until_go(port)
                except Exception as exc:
                    outcome.append(exc)

            async with contextlib.AsyncExitStack() as streams:
                async with WorkerPool(spawn=1, max_calls=1, shutdown_timeout=0.5) as pool:
                    [first] = pool.workers
                    tg.start_soon(holding)
                    stream = await streams.enter_async_context(
                        await listener.listeners[0].accept())  # type: ignore[attr-defined]
                    assert await stream.receive() == b"started"
                    await wait_until(lambda: [m.uid for m in pool.proxy.workers] not in (
                        [], [first.metadata.uid]), "the retiring worker to be withdrawn")
                # The call never ended by itself (its stream is open still).
            assert [type(exc) for exc in outcome] == [RoutineCancelled], outcome


@contextlib.asynccontextmanager
async def ballast(mib: int) -> AsyncIterator[None]:
    """Holds ``mib`` MiB (touched: resident) for the worker's life, from its start."""
    held = b"\x01" * (mib * MiB)
    # A few turns of the event loop with the memory held: a memory watch started before the
    # address (the defect this guards against) looks at once when it first runs, and would
    # retire the worker here, where its parent waits for the address. No time is waited.
    for _ in range(10):
        await anyio.lowlevel.checkpoint()
    yield
    del held


async def test_a_worker_past_max_memory_once_started_fails_its_start() -> None:
    # It could never take a call: retiring at once, its replacements too, for ever, callers
    # waiting; or, its memory passing the bound while it started, it said "retiring" where
    # its parent waited for its address.
    with anyio.fail_after(60):
        with pytest.raises(WorkerError, match=r"once started, its memory \(.* MiB\) passed "
                                              r"its max_memory \(64.0 MiB\)"):
            async with WorkerPool(spawn=1, max_memory=64 * MiB,
                                  worker_lifespan=partial(ballast, 128)):
                pass  # pragma: no cover


@pytest.mark.parametrize("options, error, message", [
    ({"max_calls": 0}, ValueError, "max_calls must be between 1 and"),
    ({"max_calls": True}, TypeError, "max_calls must be an int"),
    ({"max_calls": 2.5}, TypeError, "max_calls must be an int"),
    ({"max_memory": MiB - 1}, ValueError, "max_memory must be between 1048576 and"),
    ({"max_memory": "1G"}, TypeError, "max_memory must be an int"),
])
def test_bad_recycling_bounds_are_refused_at_construction(options: dict[str, object],
                                                          error: type[Exception],
                                                          message: str) -> None:
    with pytest.raises(error, match=message):
        WorkerPool(spawn=1, **options)  # type: ignore[arg-type]
