"""What a pool's process imports of the worker side: the contract it speaks to its workers
(``anywool.runtime.worker._contract``), and nothing of the machinery that serves calls (the
server, call groups, interrupts, the lifeline, ...), which only a worker process runs. A fresh
interpreter per backend, with real workers."""

from __future__ import annotations

import os

import anyio
import pytest

from anywool.runtime.pool._local_worker import current_backend

from . import children

pytestmark = pytest.mark.anyio

CPUS = os.cpu_count() or 1


async def test_a_pools_process_imports_the_worker_contract_and_nothing_else_of_a_worker() -> None:
    code = f"""
import sys
import anyio
from anywool import WorkerPool, routine

@routine
async def double(x):
    return 2 * x

async def main():
    # More workers than CPUs: the pool starts its template too, which forks them.
    async with WorkerPool(spawn={CPUS + 1}):
        assert await double(21) == 42
    print(*sorted(name for name in sys.modules if name.startswith("anywool.runtime.worker")),
          flush=True)

anyio.run(main, backend={current_backend()!r})
"""
    child = await children.start(code)
    try:
        with anyio.fail_after(60):
            loaded = (await child.readline()).split()
            assert await child.wait() == 0
    finally:
        await children.stop([child])
    assert loaded == ["anywool.runtime.worker", "anywool.runtime.worker._contract"]
