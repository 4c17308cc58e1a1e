"""The task group and cancel scopes a worker runs one connection's calls in (both backends)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from anywool.runtime.worker._callgroup import open_call_group, scope_factory

pytestmark = pytest.mark.anyio


async def test_exiting_waits_for_every_task() -> None:
    done: list[int] = []
    gate = anyio.Event()

    async def work(i: int) -> None:
        await gate.wait()
        for _ in range(i):  # each ends after a different number of turns
            await anyio.lowlevel.checkpoint()
        done.append(i)

    with anyio.fail_after(5):
        async with open_call_group() as group:
            for i in range(5):
                group.start_soon(work, i)
            await anyio.wait_all_tasks_blocked()
            gate.set()  # none of them has ended yet: the exit has all five to wait for
            assert done == []
    assert sorted(done) == [0, 1, 2, 3, 4]


async def test_cancelling_the_group_cancels_its_tasks_and_their_shields_hold() -> None:
    events: list[str] = []

    async def call() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()  # a reply written while cancelled
                events.append("replied")
            raise

    with anyio.fail_after(5):
        async with open_call_group() as group:
            group.start_soon(call)
            group.start_soon(call)
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
            group.start_soon(call)  # started after the cancel: cancelled too
    assert events == ["replied"] * 3


async def test_a_task_that_raises_cancels_the_others_and_the_error_comes_out() -> None:
    cancelled: list[bool] = []

    async def waits() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    async def fails() -> None:
        await anyio.wait_all_tasks_blocked()
        raise LookupError("boom")

    with anyio.fail_after(5), pytest.raises(BaseExceptionGroup) as caught:
        async with open_call_group() as group:
            group.start_soon(waits)
            group.start_soon(fails)
    assert caught.group_contains(LookupError, match="boom")
    assert cancelled == [True]


async def test_a_task_that_raises_cancels_the_body_too() -> None:
    # As a nursery does: the connection stops reading, rather than going on starting calls
    # that the cancelled group cancels at once.
    body: list[str] = []

    async def fails() -> None:
        raise LookupError("boom")

    with anyio.CancelScope(deadline=anyio.current_time() + 5) as bound:
        with pytest.raises(BaseExceptionGroup) as caught:
            async with open_call_group() as group:
                group.start_soon(fails)
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    body.append("cancelled")
                    raise
    assert not bound.cancel_called  # the group cancelled the body, not this bound
    assert body == ["cancelled"]
    assert caught.group_contains(LookupError, match="boom")


async def test_the_bodys_own_error_and_a_tasks_come_out_together() -> None:
    async def fails() -> None:
        raise LookupError("task")

    with anyio.fail_after(5), pytest.raises(BaseExceptionGroup) as caught:
        async with open_call_group() as group:
            group.start_soon(fails)
            raise KeyError("body")  # before the task has run: it still runs, and fails
    assert caught.group_contains(LookupError) and caught.group_contains(KeyError)


async def test_an_outer_cancellation_of_the_body_is_not_taken_for_the_groups() -> None:
    with anyio.fail_after(5):
        with anyio.CancelScope() as outer:
            async with open_call_group() as group:
                group.start_soon(anyio.sleep_forever)
                await anyio.wait_all_tasks_blocked()
                outer.cancel()
                await anyio.sleep_forever()
        assert outer.cancelled_caught


async def test_the_hosts_cancellation_reaches_the_tasks_and_exit_still_waits() -> None:
    ended: list[str] = []

    async def call() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()  # unwinding that awaits, cancelled
            ended.append("unwound")

    with anyio.fail_after(5):
        with anyio.move_on_after(0.05) as scope:
            async with open_call_group() as group:
                group.start_soon(call)
                await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert ended == ["unwound"]


async def test_a_call_scope_cancels_and_keeps_a_deadline() -> None:
    with anyio.fail_after(5):
        scope = scope_factory()()
        scope.deadline = anyio.current_time() + 0.01
        with scope:
            await anyio.sleep_forever()
        assert scope.cancelled_caught
        scope = scope_factory()()
        scope.cancel()
        with scope:
            await anyio.sleep_forever()
        assert scope.cancelled_caught and scope.cancel_called
