"""The calls waiting for room (runtime.client._room): who is woken, in what order, what a
cancellation passes on; without workers (connections are stand-ins with busy and broken)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup

from anywool.runtime.client._room import RoomQueue

pytestmark = pytest.mark.anyio


def _workers(*busy: bool) -> list[Any]:
    return [(None, SimpleNamespace(busy=b, broken=False)) for b in busy]


async def _queue_up(tg: TaskGroup, queue: RoomQueue, woken: list[str], *names: str,
                    front: bool = False) -> None:
    """Start one waiter per name, in that order, each queued before the next starts."""
    for name in names:

        async def wait(name: str = name) -> None:
            await queue.wait(front)
            woken.append(name)

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()


async def test_each_announcement_wakes_the_longest_waiting_call() -> None:
    queue, woken = RoomQueue(), []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await _queue_up(tg, queue, woken, "a", "b", "c")
            for _ in range(3):
                queue.announce()
                await anyio.wait_all_tasks_blocked()
    assert woken == ["a", "b", "c"]
    assert (queue.queued, queue.promised, queue.announced) == (0, 0, 3)


async def test_calls_woken_before_are_served_first() -> None:
    queue, woken = RoomQueue(), []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await _queue_up(tg, queue, woken, "new")
            await _queue_up(tg, queue, woken, "woken before", front=True)
            assert queue.queued == 2
            queue.announce()
            await anyio.wait_all_tasks_blocked()
            assert woken == ["woken before"]
            queue.announce()
    assert woken == ["woken before", "new"]


async def test_a_change_of_workers_wakes_every_waiter() -> None:
    queue, woken = RoomQueue(), []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await _queue_up(tg, queue, woken, "a", "b")
            queue.workers_changed(_workers(False))
    assert sorted(woken) == ["a", "b"]
    assert (queue.queued, queue.promised, queue.generation) == (0, 0, 1)


async def test_a_room_nobody_waits_for_is_kept_as_a_spare_at_most_once_per_worker() -> None:
    queue = RoomQueue()
    queue.workers_changed(_workers(True, True))
    for _ in range(5):
        queue.announce()
    assert queue.spare == 2


async def test_a_sent_call_wakes_the_next_waiter_only_while_a_worker_has_room() -> None:
    queue, woken = RoomQueue(), []
    workers = _workers(True)
    queue.workers_changed(workers)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await _queue_up(tg, queue, woken, "a")
            queue.sent()  # every worker busy: nobody is woken
            await anyio.wait_all_tasks_blocked()
            assert woken == []
            workers[0][1].busy = False
            queue.sent()
    assert woken == ["a"]


async def test_a_waiter_cancelled_after_its_wake_up_passes_it_to_the_next() -> None:
    queue, woken = RoomQueue(), []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def leaving() -> None:
                with scope:
                    await queue.wait(False)
                    woken.append("leaving")

            tg.start_soon(leaving)
            await anyio.wait_all_tasks_blocked()
            await _queue_up(tg, queue, woken, "next")
            scope.cancel()
            queue.announce()  # given to the first, which is cancelled before it runs
    assert woken == ["next"]
    assert (queue.queued, queue.promised, len(queue.front), len(queue.back)) == (0, 0, 0, 0)


async def test_a_waiter_cancelled_before_its_wake_up_leaves_its_place() -> None:
    queue = RoomQueue()
    with anyio.fail_after(5):
        with anyio.move_on_after(0.01):
            await queue.wait(False)
    assert (queue.queued, queue.promised, len(queue.back)) == (0, 0, 0)
    queue.announce()  # nobody left to wake: a spare, if there is a worker to keep it for
    assert queue.spare == 0
