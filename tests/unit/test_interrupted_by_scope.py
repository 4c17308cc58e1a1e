"""A routine interrupted because its scope's deadline passed while it held the event loop ends
cancelled, not with the interruption (runtime._server._ended_by_its_scope)."""

from __future__ import annotations

import anyio
import pytest

from anywool.runtime.worker._server import _ended_by_its_scope

pytestmark = pytest.mark.anyio


async def test_a_deadline_that_passed_while_the_loop_was_held_cancels_after_the_interruption(
        ) -> None:
    # Under asyncio the deadline's timer, due but not yet run, fires a pass of the loop after
    # the task's next step: one checkpoint returned, and the call was reported as aborted.
    with anyio.fail_after(5):
        with anyio.CancelScope(deadline=anyio.current_time() + 0.01) as scope:
            while anyio.current_time() <= scope.deadline:
                pass  # a plain function holding the loop until past the deadline
            await _ended_by_its_scope()
            pytest.fail("the scope's cancellation did not arrive")
    assert scope.cancelled_caught


async def test_without_a_cancellation_it_returns_within_its_bound() -> None:
    # Nothing cancels: the interruption is then reported as before, after the bound (1 s).
    with anyio.fail_after(5):
        started = anyio.current_time()
        await _ended_by_its_scope()
    assert anyio.current_time() - started >= 0.9
