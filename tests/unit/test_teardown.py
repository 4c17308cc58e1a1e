"""graceful_then_forceful: the forceful part always runs; cancellation is never swallowed."""

from __future__ import annotations

import logging

import anyio
import pytest

from anywool._teardown import graceful_then_forceful

pytestmark = pytest.mark.anyio

log = logging.getLogger("anywool.test")


class Steps:
    def __init__(self) -> None:
        self.done: list[str] = []

    async def graceful(self) -> None:
        self.done.append("graceful")

    async def hang(self) -> None:
        self.done.append("graceful")
        await anyio.sleep_forever()

    async def fail(self) -> None:
        raise LookupError("graceful failed")

    async def forceful(self) -> None:
        await anyio.lowlevel.checkpoint()  # shielded: runs even in a cancelled scope
        self.done.append("forceful")


async def test_both_parts_run_in_order() -> None:
    steps = Steps()
    with anyio.fail_after(5):
        await graceful_then_forceful(steps.graceful, steps.forceful, timeout=1, what="t", log=log)
    assert steps.done == ["graceful", "forceful"]


async def test_a_graceful_part_that_times_out_is_logged_with_its_timeout_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    steps = Steps()
    with anyio.fail_after(5):
        # A bound computed from a deadline has every digit of a float; the log rounds it.
        await graceful_then_forceful(steps.hang, steps.forceful, timeout=0.05 - 1e-9,
                                     what="t", log=log)
    assert steps.done == ["graceful", "forceful"]
    (record,) = caplog.records
    assert record.exc_info is not None and isinstance(record.exc_info[1], TimeoutError)
    assert record.getMessage() == "t: timed out (bound: 0.05 s); finishing forcefully"


async def test_a_failing_graceful_part_is_logged_and_the_forceful_part_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    steps = Steps()
    with anyio.fail_after(5):
        await graceful_then_forceful(steps.fail, steps.forceful, timeout=1, what="t", log=log)
    assert steps.done == ["forceful"]
    assert "graceful failed" in caplog.text


async def test_a_zero_timeout_skips_the_graceful_part() -> None:
    steps = Steps()
    with anyio.fail_after(5):
        await graceful_then_forceful(steps.graceful, steps.forceful, timeout=0, what="t", log=log)
    assert steps.done == ["forceful"]


async def test_the_callers_cancellation_ends_the_graceful_part_and_is_re_raised() -> None:
    steps = Steps()
    with anyio.fail_after(5):
        with anyio.move_on_after(0.05) as scope:
            await graceful_then_forceful(steps.hang, steps.forceful, timeout=None, what="t",
                                         log=log)
            pytest.fail("the cancellation was swallowed")
    assert scope.cancelled_caught
    assert steps.done == ["graceful", "forceful"]


async def test_an_already_cancelled_caller_still_gets_the_forceful_part() -> None:
    steps = Steps()
    with anyio.fail_after(5):
        with anyio.CancelScope() as scope:
            scope.cancel()
            # The graceful part stops at its first checkpoint instead of hanging.
            await graceful_then_forceful(steps.hang, steps.forceful, timeout=None, what="t",
                                         log=log)
    assert scope.cancelled_caught
    assert steps.done == ["graceful", "forceful"]


async def test_a_failing_forceful_part_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps()
    with anyio.fail_after(5):
        await graceful_then_forceful(steps.graceful, steps.fail, timeout=1, what="t", log=log)
    assert "the forceful part failed" in caplog.text
