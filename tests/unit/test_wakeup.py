"""One waiter's wake-up, native to each backend (runtime._wakeup)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from anywool.runtime.client import _wakeup

pytestmark = pytest.mark.anyio


async def test_a_set_wakes_its_waiter() -> None:
    wakeup = _wakeup.factory()()
    woken: list[bool] = []

    async def wait() -> None:
        await wakeup.wait()
        woken.append(True)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.lowlevel.checkpoint()
            assert not wakeup.is_set()
            wakeup.set()
            wakeup.set()  # a second set does nothing
    assert woken == [True]
    assert wakeup.is_set()


async def test_a_set_after_its_waiter_was_cancelled_still_counts_as_given() -> None:
    # The waiter's cancellation is delivered, then the wake-up is given before the waiter
    # runs again: it must see that it was owed one, to pass it on (see runtime.client._room).
    wakeup = _wakeup.factory()()
    seen: list[bool] = []

    async def wait(scope: anyio.CancelScope) -> None:
        with scope:
            try:
                await wakeup.wait()
            finally:
                seen.append(wakeup.is_set())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()
            tg.start_soon(wait, scope)
            await anyio.lowlevel.checkpoint()
            scope.cancel()
            wakeup.set()
    assert seen == [True]
    assert scope.cancelled_caught
