"""The budget of a call: Python function calls per steady-state trivial call, counted on the
caller and on the worker with a profiler hook (``sys.setprofile``), not timed.

A change that adds work to every call raises these counts past the budget and fails here: it
then says so, and the budget below moves with a line of why. Counted: every Python frame
entered or resumed in the event loop's thread of each side (the backend's own scheduling
included), over ``CALLS`` sequential awaits of a routine that returns at once, after
``WARM_UP`` calls, on a pool of one worker; reported per call.
"""

from __future__ import annotations

import sys

import anyio
import pytest

from anywool.testing import WorkerPoolFactory

from .call_counting import Counter, start_counting, stop_counting, trivial

pytestmark = pytest.mark.anyio

WARM_UP = 200
CALLS = 2000

#: Python function calls per trivial call, by backend: (the caller's, the worker's). Set from
#: what was measured when the budget was last moved (issue 37, with anywool.map: asyncio 149-160
#: / 198-204, trio 245-250 / 221-223, on Python 3.11, 3.12 and 3.13, idle or with both cores
#: busy), plus about 5 % for the calls whose count varies with timing (a frame read in one
#: receive or two, a turn of the loop more or less).
BUDGET = {
    "asyncio": (168, 214),
    "trio": (262, 234),
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
    with anyio.fail_after(120):
        async with worker_pool(spawn=1, backend=anyio_backend):
            for _ in range(WARM_UP):
                await trivial()
            await start_counting()
            caller = await _count(CALLS) / CALLS
            worker = await stop_counting() / CALLS
    print(f"{anyio_backend}: caller {caller:.1f}, worker {worker:.1f} Python calls per call")
    assert caller <= caller_budget, f"the caller ran {caller:.1f} calls per call"
    assert worker <= worker_budget, f"the worker ran {worker:.1f} calls per call"
