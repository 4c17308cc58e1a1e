"""The budget of a call: Python function calls per steady-state trivial call, counted on the
caller and on the worker with a profiler hook (``sys.setprofile``), not timed.

A change that adds work to every call raises these counts past the budget and fails here: it
then says so, and the budget below moves with a line of why. Counted: every frame of anywool's
and AnyIO's code entered or resumed in the event loop's thread of each side, over ``CALLS``
sequential awaits of a routine that returns at once, after ``WARM_UP`` calls, on a pool of one
worker; reported per call, the lowest of ``ROUNDS`` rounds. The backend's own scheduling is not
counted (see ``call_counting.COUNTED``): how many turns of its loop a call takes depends on
timing, and so, a little, does anywool's reading of a reply (ready at once, or waited for),
which the lowest of the rounds leaves out.
"""

from __future__ import annotations

import sys

import anyio
import pytest

from anywool.testing import WorkerPoolFactory

from .call_counting import Counter, start_counting, stop_counting, trivial

pytestmark = pytest.mark.anyio

WARM_UP = 200
CALLS = 500
ROUNDS = 4

#: Python function calls of anywool and AnyIO per trivial call, by backend: (the caller's, the
#: worker's). Set from what was measured when the budget was last moved (issue 37, once the
#: caller's CALL frame went without a second look for a cancellation: asyncio 95-100 / 120,
#: trio 92-96 / 92, on Python 3.11, 3.12 and 3.13, idle or with both CPUs busy), plus about
#: 8 %: 12 calls more per call on either side fail.
BUDGET = {
    "asyncio": (108, 130),
    "trio": (104, 100),
}


async def _count(n: int) -> int:
    counter = Counter()
    sys.setprofile(counter)
    try:
        for _ in range(n):
            await trivial()
    finally:
        sys.setprofile(None)
    return counter.calls


async def test_a_trivial_call_stays_within_its_budget_of_python_calls(
        anyio_backend: str, worker_pool: WorkerPoolFactory) -> None:
    caller_budget, worker_budget = BUDGET[anyio_backend]
    callers, workers = [], []
    with anyio.fail_after(120):
        async with worker_pool(spawn=1, backend=anyio_backend):
            for _ in range(WARM_UP):
                await trivial()
            for _ in range(ROUNDS):
                await start_counting()
                callers.append(await _count(CALLS) / CALLS)
                workers.append(await stop_counting() / CALLS)
    caller, worker = min(callers), min(workers)
    print(f"{anyio_backend}: caller {caller:.1f}, worker {worker:.1f} Python calls per call "
          f"(rounds: {callers}, {workers})")
    assert caller <= caller_budget, f"the caller ran {caller:.1f} calls per call"
    assert worker <= worker_budget, f"the worker ran {worker:.1f} calls per call"
