"""A WorkerPool whose entry or exit is cancelled leaves nothing behind when the cancellation
returns: every worker process it started is reaped (none alive, none a zombie) and nothing of
its namespace or its workers' sockets is left in the runtime directory.

The cancellation is sent at many moments, so that one of them lands in each stage (resolving
the discovery, spawning, waiting for an address, publishing, the quorum wait; the drop
announcements, the drain, the workers' stop): after a sweep of delays from 0 to a little past
what the stage takes here, after a sweep of scheduling steps, and the moment the k-th process
appears (while its pipes are being set up, where a delay rarely lands). The check runs at
once, with no grace: the promise is that the workers are reaped before the cancellation
propagates.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import psutil
import pytest

from anywool import LocalWorker, WorkerPool

pytestmark = pytest.mark.anyio

# Delays as fractions of what the stage took when measured: 0 up to 1.2 times it.
_FRACTIONS = [i * 0.3 for i in range(5)]
# Scheduling steps before the cancellation.
_STEPS = [1, 2, 8, 32]


def _left_behind(runtime_dir: Path) -> list[str]:
    """The test's descendant processes (alive or zombie) and the runtime directory's entries."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            found.append(f"pid {process.pid} ({process.status()})")
        except psutil.NoSuchProcess:
            pass  # exited and reaped since it was listed
    return found + [f"file {name}" for name in os.listdir(runtime_dir)]


async def _cancel_after_steps(scope: anyio.CancelScope, steps: int) -> None:
    for _ in range(steps):
        await anyio.lowlevel.checkpoint()
    scope.cancel()


async def _cancel_when_processes(scope: anyio.CancelScope, count: int) -> None:
    # Polled at every scheduling step, not on a timer: the aim is the first steps after the
    # process appears, when it is being set up.
    while len(psutil.Process().children(recursive=True)) < count:
        await anyio.lowlevel.checkpoint()
    scope.cancel()


async def test_a_worker_cancelled_as_its_process_appears_is_reaped_before_the_cancellation_returns(
    runtime_dir: Path,
) -> None:
    # What a pool's cancelled entry rests on: a LocalWorker whose entry is cancelled while its
    # process is being set up records that process, and reaps it.
    moments: list[str] = []
    with anyio.fail_after(60):
        for attempt in range(12):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_when_processes, scope, 1)
                    async with LocalWorker():
                        await anyio.sleep_forever()
            moments.append(f"attempt {attempt}: {_left_behind(runtime_dir)}")
    leaks = [moment for moment in moments if not moment.endswith("[]")]
    assert not leaks, "\n".join(leaks)


async def test_a_cancelled_entry_reaps_every_worker_before_the_cancellation_returns(
    runtime_dir: Path,
) -> None:
    with anyio.fail_after(100):
        began = anyio.current_time()
        async with WorkerPool(spawn=2, lazy=False):
            took = anyio.current_time() - began
        moments: list[str] = []
        for fraction in _FRACTIONS:
            with anyio.move_on_after(took * fraction):
                async with WorkerPool(spawn=2, lazy=False):
                    await anyio.sleep_forever()
            moments.append(f"after {fraction:.2f} of the entry: {_left_behind(runtime_dir)}")
        for steps in _STEPS:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_after_steps, scope, steps)
                    async with WorkerPool(spawn=2, lazy=False):
                        await anyio.sleep_forever()
            moments.append(f"after {steps} steps: {_left_behind(runtime_dir)}")
        for count in (1, 2):  # a worker or its lifeline sidecar, then another
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_when_processes, scope, count)
                    async with WorkerPool(spawn=2, lazy=False):
                        await anyio.sleep_forever()
            moments.append(f"as process {count} appears: {_left_behind(runtime_dir)}")
    leaks = [moment for moment in moments if not moment.endswith("[]")]
    assert not leaks, "\n".join(leaks)


async def test_a_cancelled_exit_reaps_every_worker_before_the_cancellation_returns(
    runtime_dir: Path,
) -> None:
    with anyio.fail_after(100):
        async with WorkerPool(spawn=2, lazy=False):
            began = anyio.current_time()
        took = anyio.current_time() - began
        moments: list[str] = []
        cancels = [(f"after {f:.2f} of the exit", took * f, None) for f in _FRACTIONS]
        cancels += [(f"after {n} steps of the exit", None, n) for n in _STEPS]
        for what, delay, steps in cancels:
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    async with WorkerPool(spawn=2, lazy=False):
                        # Started last in the block: it runs once the exit has begun.
                        if delay is not None:
                            tg.start_soon(_cancel_after_delay, scope, delay)
                        else:
                            tg.start_soon(_cancel_after_steps, scope, steps)
            moments.append(f"{what}: {_left_behind(runtime_dir)}")
    leaks = [moment for moment in moments if not moment.endswith("[]")]
    assert not leaks, "\n".join(leaks)


async def _cancel_after_delay(scope: anyio.CancelScope, delay: float) -> None:
    await anyio.sleep(delay)
    scope.cancel()
