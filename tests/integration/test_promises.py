"""README promises about cancellation, teardown and errors that no other test pinned: each
test here kills a mutation of scripts/mutations/behaviour.py that the rest of the suite let
pass."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from anywool import LocalWorker, RoutineCancelled, routine
from anywool.lowlevel import WorkerConnection
from anywool.runtime.client._call import drive_stream

pytestmark = pytest.mark.anyio


@routine
async def first_then_clean_up(marker: str):
    """Yields once; its ``finally`` awaits before it marks (an awaiting cleanup)."""
    try:
        yield "first"
        yield "never"
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.3)  # the cleanup's own work, not synchronisation
        Path(marker).write_text("generator finally ran")


async def test_a_stream_cancelled_between_steps_is_closed_on_its_worker_before_the_answer(
        tmp_path: Path) -> None:
    # README: when the worker closes an async generator routine itself (its caller was
    # cancelled between steps), the generator's finally runs there; the call's answer,
    # RoutineCancelled, comes once it has, not before (nor is it left to the worker's
    # garbage collector).
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with LocalWorker() as worker, WorkerConnection(worker.address) as connection:
            items = drive_stream(lambda: connection.stream(
                first_then_clean_up.__wrapped__, (str(marker),), {}))
            async with aclosing(items):
                assert await items.__anext__() == "first"
                await connection.cancel_all()  # the call is suspended at its yield
                with pytest.raises(RoutineCancelled):
                    await items.__anext__()
                assert marker.read_text() == "generator finally ran"
