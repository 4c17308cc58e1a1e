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


async def test_workers_and_the_template_import_this_anywool_first(
        anywool_runtime_dir: object) -> None:
    # The directory that holds this anywool goes first on PYTHONPATH of every process a pool
    # starts, its template and each worker, forked or not; the package's own directory never
    # goes on a path (it would make its modules importable as "errors", "worker", ...).
    from anywool import LocalWorker, WorkerPool, routine
    from anywool._location import IMPORT_ROOT, PACKAGE
    from anywool.lowlevel import WorkerConnection

    @routine
    async def where() -> tuple[str, list[str]]:
        import os
        import sys

        return os.environ.get("PYTHONPATH", ""), list(sys.path)

    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS + 1) as pool:  # forked from the template
            template = pool._supervisor.template  # pyright: ignore[reportPrivateUsage]
            process = None if template is None else template._process  # pyright: ignore
            assert process is not None
            with open(f"/proc/{process.pid}/environ", "rb") as file:
                environ = dict(entry.split(b"=", 1) for entry in file.read().split(b"\0")
                               if b"=" in entry)
            paths = [await where() for _ in range(2 * (CPUS + 1))]
        async with LocalWorker() as worker, WorkerConnection(worker.address) as connection:
            paths.append(await connection.call(where.__wrapped__, (), {}))  # not forked
    assert environ[b"PYTHONPATH"].decode().split(os.pathsep)[0] == IMPORT_ROOT
    for pythonpath, sys_path in paths:
        assert pythonpath.split(os.pathsep)[0] == IMPORT_ROOT
        assert PACKAGE not in sys_path
