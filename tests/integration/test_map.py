"""anywool.map with real worker processes: order, batching, laziness, bounds, failures,
cancellation, a worker killed mid-batch, nested maps."""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

import anywool
from anywool import WorkerError
from anywool.runtime._map import MAX_BATCH, MAX_IN_FLIGHT
from anywool.testing import WorkerPoolFactory

from ..helpers import Signal, wait_until
from . import map_work
from .map_work import (
    stop_on,
    fail_on,
    fail_or_hold,
    hold,
    hold_routine,
    map_inside,
    pid_after,
    square,
    square_routine,
    wait_for,
)

pytestmark = pytest.mark.anyio

#: The pool's default cancel_grace (seconds): past it, a call that did not unwind costs the
#: pool its worker.
DEFAULT_GRACE = 1.0


def _release(fifo: Path) -> None:
    """Let the item waiting on ``fifo`` (see ``map_work.wait_for``) go on (blocking)."""
    with open(fifo, "w") as file:
        file.write("go")


@pytest.mark.parametrize("fn", [square, square_routine], ids=["plain", "routine"])
async def test_results_come_in_the_inputs_order_and_many_items_go_in_one_call(
        fn: object, worker_pool: WorkerPoolFactory) -> None:
    count = 20_000
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            async with anywool.map(fn, range(count)) as results:  # type: ignore[arg-type]
                got = [result async for result in results]
            assert got == [x * x for x in range(count)]
            assert results.completed == results.taken == count
            stats = await pool.stats()
    served = sum(s.served for s in stats.values() if s is not None)
    # Sized by the work: after the first calls of one item each, hundreds or thousands a call
    # (fewer for a routine on a loaded machine, where a checkpoint may wait for the CPU).
    assert served < count // 20, served


async def test_unordered_results_do_not_wait_for_an_item_that_has_not_ended(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            got = []
            async with anywool.map(functools.partial(wait_for, str(fifo)), range(50),
                                   ordered=False, batch_size=1) as results:
                async for result in results:
                    got.append(result)
                    if len(got) == 49:  # all but item 0, which waits for us
                        assert 0 not in got
                        await anyio.to_thread.run_sync(_release, fifo)
            assert sorted(got) == list(range(50))


async def test_an_item_that_has_not_ended_holds_back_at_most_max_in_flight_batches(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            async with anywool.map(functools.partial(wait_for, str(fifo)), range(1000),
                                   batch_size=10, max_in_flight=4) as results:
                # Batches 1-3 come back; batch 0 waits; nothing more is read meanwhile.
                await wait_until(lambda: results.completed == 30, "three batches back")
                assert results.taken == 40
                await anyio.to_thread.run_sync(_release, fifo)
                got = [result async for result in results]
            assert got == list(range(1000))


async def test_the_input_is_read_lazily(worker_pool: WorkerPoolFactory) -> None:
    read = itertools.count()

    def endless() -> Iterator[int]:
        for x in range(1_000_000):
            next(read)
            yield x
        raise AssertionError("the map read a million items")

    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            got = []
            async with anywool.map(square, endless()) as results:
                async for result in results:
                    got.append(result)
                    if len(got) == 100_000:
                        break
            assert got == [x * x for x in range(100_000)]
            taken = next(read)
            assert results.taken == taken
            assert taken <= 100_000 + MAX_IN_FLIGHT * MAX_BATCH  # the batches held, at most


async def test_an_async_iterable_is_read_as_well(worker_pool: WorkerPoolFactory) -> None:
    async def numbers() -> AsyncIterator[int]:
        for x in range(5000):
            if x % 1000 == 0:
                await anyio.lowlevel.checkpoint()
            yield x

    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            async with pool.map(square_routine, numbers(), ordered=False) as results:
                got = sorted([result async for result in results])
            assert got == [x * x for x in range(5000)]


async def test_long_items_spread_over_the_workers_by_work(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            pids = {w.pid for w in pool.workers}
            async with pool.proxy.map(pid_after, [0.3] * 6, max_in_flight=2) as results:
                ran_on = [pid async for pid in results]
    # One item per call once the first took 0.3 s: each worker takes items as it is free
    # (in one batch, the four after the first two would all go to one worker).
    assert set(ran_on) == pids
    assert all(ran_on.count(pid) >= 2 for pid in pids), ran_on


async def test_the_first_exception_is_raised_with_its_type_and_names_its_item(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            got = []
            with pytest.raises(ValueError, match="item 4321 is bad") as caught:
                async with anywool.map(functools.partial(fail_on, 4321),
                                       range(10_000)) as results:
                    async for result in results:
                        got.append(result)
            assert "(raised for item 4321 of the input of anywool.map)" in caught.value.__notes__
            assert got == list(range(len(got)))
            assert len(got) < 4321
            # The pool goes on.
            async with anywool.map(square, range(10)) as results:
                assert [result async for result in results] == [x * x for x in range(10)]


async def test_an_exception_of_the_input_ends_the_map_with_its_type(
        worker_pool: WorkerPoolFactory) -> None:
    def broken() -> Iterator[int]:
        yield from range(10)
        raise LookupError("the input broke")

    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.raises(LookupError, match="the input broke"):
                async with anywool.map(square, broken()) as results:
                    async for _ in results:
                        pass


async def test_the_first_exception_cancels_the_batches_still_running(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            async with anywool.map(functools.partial(fail_or_hold, 0), range(2),
                                   batch_size=1) as results:
                with pytest.raises(ValueError, match="item 0 is bad"):
                    async for _ in results:
                        pass

                async def nothing_runs() -> bool:
                    stats = (await pool.stats()).values()
                    return all(s is not None and s.in_flight == 0 for s in stats)

                # Still in the block: item 1 was cancelled on its worker, not left to run.
                await wait_until(nothing_runs, "item 1 to be cancelled")


@pytest.mark.parametrize("fn", [hold, hold_routine], ids=["plain", "routine"])
async def test_cancelling_the_block_interrupts_a_batch_mid_way_on_its_worker(
        fn: object, worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(60):
        async with worker_pool(spawn=1) as pool, Signal() as started:
            (worker,) = pool.workers
            with anyio.CancelScope() as scope:
                async with anywool.map(functools.partial(fn, started.port, str(marker)),  # type: ignore[arg-type]
                                       [5, 6, 0, 7], batch_size=4) as results:
                    assert await started.started() == f"started {worker.pid}".encode()
                    began = anyio.current_time()
                    scope.cancel()
                    async for _ in results:
                        pass
            waited = anyio.current_time() - began
            assert scope.cancelled_caught
            assert marker.read_text() == "finally ran"
            assert waited < DEFAULT_GRACE
            assert [w.pid for w in pool.workers] == [worker.pid]  # interrupted, not ended
            async with anywool.map(square, range(3)) as results:
                assert [result async for result in results] == [0, 1, 4]


async def test_a_batch_of_a_c_function_is_interrupted_too(
        worker_pool: WorkerPoolFactory) -> None:
    # time.sleep is C code: the loop's own frame is the innermost Python one, where the
    # worker's interrupter must be allowed to raise.
    with anyio.fail_after(60):
        async with worker_pool(spawn=1) as pool:
            (worker,) = pool.workers
            began = anyio.current_time()
            with anyio.move_on_after(1.0) as scope:
                async with anywool.map(time.sleep, [0.0, 30.0], batch_size=2) as results:
                    async for _ in results:
                        pass
            waited = anyio.current_time() - began - 1.0
            assert scope.cancelled_caught
            stats = await pool.stats()
            assert waited < DEFAULT_GRACE
            assert [w.pid for w in pool.workers] == [worker.pid]
            assert [(s.pid, s.cancelled) for s in stats.values() if s is not None] == [(worker.pid, 1)]


async def test_a_worker_killed_mid_batch_fails_the_map_with_worker_error(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool, Signal() as started:
            # Item 0 holds its worker; the others, sent to it behind item 0 and not started
            # there, go to the other worker: only item 0's batch is lost.
            with pytest.raises(WorkerError):
                async with anywool.map(functools.partial(hold, started.port, str(marker)),
                                       range(20), batch_size=1) as results:
                    killed = int((await started.started()).split()[1])
                    os.kill(killed, signal.SIGKILL)
                    async for _ in results:
                        pass
            assert not marker.exists()  # killed, not interrupted

            async def replaced() -> bool:  # and its replacement connected
                stats = [s for s in (await pool.stats()).values() if s is not None]
                return len(stats) == 2 and killed not in {s.pid for s in stats}

            await wait_until(replaced, "the worker to be replaced")
            async with anywool.map(square, range(3)) as results:
                assert [result async for result in results] == [0, 1, 4]


async def test_leaving_the_block_early_cancels_the_rest(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            pids = sorted(w.pid for w in pool.workers)
            async with anywool.map(pid_after, [0.0] + [30.0] * 4, batch_size=1) as results:
                async for _ in results:
                    began = anyio.current_time()
                    break
            left_after = anyio.current_time() - began
            # Interrupted on their workers (time.sleep returns early), not waited for nor
            # ended: the workers are the same and took the cancellations.
            assert left_after < DEFAULT_GRACE
            assert sorted(w.pid for w in pool.workers) == pids

            async def cancelled() -> int:
                stats = (await pool.stats()).values()
                if any(s is None or s.in_flight for s in stats):
                    return -1
                return sum(s.cancelled for s in stats if s is not None)

            async def both_cancelled() -> bool:
                return await cancelled() >= 2  # and those sent ahead, when they were

            await wait_until(both_cancelled, "the two running items cancelled")


async def test_a_routine_maps_on_the_pool_it_was_called_from(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            assert await map_inside(3000) == [x * x for x in range(3000)]


async def test_progress_counts_every_item(worker_pool: WorkerPoolFactory) -> None:
    seen: list[int] = []
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            async with anywool.map(square, range(5000), progress=seen.append) as results:
                async for _ in results:
                    pass
    assert sum(seen) == 5000
    assert len(seen) > 1


async def test_entering_without_a_pool_and_twice_is_refused(
        worker_pool: WorkerPoolFactory) -> None:
    mapped = anywool.map(square, range(3))
    with pytest.raises(RuntimeError, match="no WorkerPool or WorkerProxy is active"):
        async with mapped:
            pass
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            async with anywool.map(square, range(3)) as results:
                with pytest.raises(RuntimeError, match="entered once"):
                    await results.__aenter__()
                assert [r async for r in results] == [0, 1, 4]
            with pytest.raises(RuntimeError, match="inside its async with block"):
                await results.__anext__()


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"fn": 3}, TypeError, "map needs a callable for fn, got 3"),
    ({"fn": map_work.map_inside.__wrapped__}, None, None),
    ({"items": 5}, TypeError, "map needs an iterable or async iterable for items, got 5"),
    ({"ordered": 1}, TypeError, "ordered must be a bool, got 1"),
    ({"batch_size": 0}, ValueError, "batch_size must be between 1 and 8192, got 0"),
    ({"batch_size": 8193}, ValueError, "batch_size must be between 1 and 8192, got 8193"),
    ({"batch_size": 8192}, None, None),
    ({"batch_size": 2.0}, TypeError, "batch_size must be an int, got 2.0"),
    ({"max_in_flight": 0}, ValueError, "max_in_flight must be between 1 and 65536, got 0"),
    ({"max_in_flight": 65537}, ValueError, "max_in_flight must be between 1 and 65536"),
    ({"max_in_flight": 65536}, None, None),
    ({"progress": "bar"}, TypeError, "progress must be a plain callable or None"),
    ({"progress": anyio.sleep}, TypeError, "progress must be a plain callable or None"),
])
def test_bad_arguments_are_refused_at_construction(kwargs: dict, error: type | None,
                                                   match: str | None) -> None:
    arguments = {"fn": square, "items": range(3), **kwargs}
    fn, items = arguments.pop("fn"), arguments.pop("items")
    if error is None:
        anywool.map(fn, items, **arguments)
        return
    with pytest.raises(error, match=match):
        anywool.map(fn, items, **arguments)


def test_an_async_generator_function_is_refused() -> None:
    @anywool.routine
    async def numbers(x: int):
        yield x

    with pytest.raises(TypeError, match="is an async generator function"):
        anywool.map(numbers, range(3))


async def test_an_item_raising_stop_async_iteration_does_not_end_the_map_quietly(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            with pytest.raises(RuntimeError, match="StopAsyncIteration was raised") as caught:
                async with anywool.map(functools.partial(stop_on, 5), range(100),
                                       batch_size=1) as results:
                    async for _ in results:
                        pass
    assert isinstance(caught.value.__cause__, StopAsyncIteration)


async def test_several_tasks_share_the_results(worker_pool: WorkerPoolFactory) -> None:
    got: list[list[int]] = [[], []]
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            async with anywool.map(square, range(2000), batch_size=7) as results:

                async def consume(mine: list[int]) -> None:
                    async for result in results:
                        mine.append(result)
                        await anyio.lowlevel.checkpoint()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume, got[0])
                    tg.start_soon(consume, got[1])
    assert sorted(got[0] + got[1]) == sorted(x * x for x in range(2000))
    assert got[0] and got[1]


async def test_large_items_are_batched_within_a_frame(worker_pool: WorkerPoolFactory) -> None:
    # 30 000 items of 10 kB: 8 192 to a batch would make a call of 80 MB, past the 64 MiB of a
    # frame; batches are also sized by the pickled size of the items and results.
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            async with anywool.map(len, (b"x" * 10_000 for _ in range(30_000))) as results:
                assert [n async for n in results] == [10_000] * 30_000


@pytest.mark.parametrize("max_in_flight", [2, MAX_IN_FLIGHT])
async def test_items_that_become_slower_still_spread_over_the_workers(
        max_in_flight: int, worker_pool: WorkerPoolFactory) -> None:
    # 20 000 instant items size the batches at thousands; the 30 of 50 ms after them arrive in
    # one such batch, which gives back what it has not started after its budget (80 ms): the
    # rest goes again, in pieces sized anew, to both workers. The pieces belong to a batch read
    # already: they go even while every batch allowed is read and waits to be consumed.
    with anyio.fail_after(60):
        async with worker_pool(spawn=2) as pool:
            pids = {w.pid for w in pool.workers}
            async with anywool.map(pid_after, [0.0] * 20_000 + [0.05] * 30,
                                   max_in_flight=max_in_flight) as results:
                ran_on = [pid async for pid in results]
    assert len(ran_on) == 20_030
    assert set(ran_on[-30:]) == pids


async def test_what_a_batch_reports_names_the_function_mapped(
        worker_pool: WorkerPoolFactory) -> None:
    import threading

    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.raises(anywool.SerializationError, match=r"map\(square\)"):
                async with anywool.map(square, [1, threading.Lock()], batch_size=2) as results:
                    async for _ in results:
                        pass


async def test_a_system_exit_of_progress_ends_the_map_as_itself(
        worker_pool: WorkerPoolFactory) -> None:
    def stop(done: int) -> None:
        raise SystemExit(4)

    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.raises(SystemExit):
                async with anywool.map(square, range(10), progress=stop) as results:
                    async for _ in results:
                        pass


async def test_results_left_in_a_batch_are_not_yielded_after_the_block(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            async with anywool.map(square, range(100), batch_size=100) as results:
                async for _ in results:
                    break
            with pytest.raises(RuntimeError, match="inside its async with block"):
                await results.__anext__()
