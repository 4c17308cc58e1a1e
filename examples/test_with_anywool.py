"""Testing code that uses anywool, with the pytest plugin that comes with it.

    pytest examples/test_with_anywool.py

Installing anywool installs its pytest plugin (``anywool.testing``); pytest loads it by itself.
What this file uses of it:

- the ``worker_pool`` fixture: ``worker_pool(**kwargs)`` is a ``WorkerPool`` with defaults for
  tests (one worker unless told, entry waits until every worker is connected, short timeouts),
  in a runtime directory of the test's own; the test fails if a worker outlives it;
- the ``anywool_runtime_dir`` fixture: a fresh runtime directory for a test that makes its own
  pools or discoveries, checked empty afterwards;
- ``kill_worker`` and ``owner_process`` from ``anywool.testing``: real faults, real processes;
- both backends: with ``anywool_backends = ["asyncio", "trio"]`` under ``[tool.pytest.ini_options]``
  of your pyproject.toml (``anywool_backends = asyncio trio`` in a pytest.ini), every async test
  runs once under each (this repository's pyproject.toml says so, hence ``[asyncio]`` and
  ``[trio]`` in the test ids); ``-o anywool_backends=trio`` narrows one run. Without the option,
  AnyIO's default is asyncio alone. The marker ``@pytest.mark.anywool_backends("trio")`` picks
  the backends of one test, class or module whatever the option says.

trio needs ``pip install 'anywool[trio]'``. Workers import the routines they run: a routine of a
test module is imported there by its module name, which works because workers start with the
test run's ``sys.path`` and working directory.
"""

from __future__ import annotations

import os

import anyio
import pytest

import anywool
from anywool.testing import kill_worker, owner_process

# Every test here is async and runs under AnyIO's pytest plugin.
pytestmark = pytest.mark.anyio


# -- the code under test (in your project, imported from your package) -----------------------


@anywool.routine
async def scale(x: int) -> int:
    return 2 * x


@anywool.routine
async def whoami() -> int:
    return os.getpid()


@anywool.routine
async def parse_port(text: str) -> int:
    port = int(text)  # ValueError for "http"
    if not 0 < port < 65536:
        raise ValueError(f"port out of range: {port}")
    return port


def word_count(text: str) -> int:
    return len(text.split())


async def count_words(texts: list[str]) -> int:
    """Words in all ``texts``, counted on the workers of whichever pool is active."""
    counts: list[int] = []

    async def one(text: str) -> None:
        counts.append(await anywool.run_sync(word_count, text))

    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    return sum(counts)


# -- the tests ---------------------------------------------------------------------------------


async def test_scale_runs_on_a_worker_of_the_pool(worker_pool) -> None:
    async with worker_pool(spawn=2) as pool:
        assert await scale(21) == 42
        assert await whoami() in {worker.pid for worker in pool.workers}
        assert await whoami() != os.getpid()


async def test_count_words_uses_the_active_pool(worker_pool) -> None:
    async with worker_pool():
        assert await count_words(["one two", "three four five", ""]) == 5


async def test_an_error_in_a_routine_reaches_the_caller(worker_pool) -> None:
    async with worker_pool():
        with pytest.raises(ValueError, match="out of range: 70000"):
            await parse_port("70000")
        assert await parse_port("8080") == 8080  # the worker goes on serving


async def test_a_killed_worker_is_replaced(worker_pool) -> None:
    with anyio.fail_after(20):  # bound every test that waits for something to happen
        async with worker_pool() as pool:
            victim = kill_worker(pool)  # SIGKILL to the pool's first worker
            # The pool withdraws the dead worker and announces a replacement in its namespace.
            replacement = None
            async for event in pool.discovery.subscriber:
                if event.type == "worker-added" and event.metadata.pid != victim:
                    replacement = event.metadata.pid
                    break
            assert await whoami() == replacement


async def test_a_borrower_runs_on_the_owners_workers(anywool_runtime_dir, anyio_backend) -> None:
    # Another interpreter owns "jobs" and publishes one worker there; this test borrows it.
    # The namespace lives in this test's runtime directory, so no other test or program sees it.
    with anyio.fail_after(30):
        async with owner_process("jobs", spawn=1, backend=anyio_backend) as owner:
            borrower = anywool.WorkerPool(discovery=anywool.LocalDiscovery.Subscriber("jobs"),
                                          lazy=False)
            async with borrower:
                # The owner's workers are another interpreter's: they have its sys.path, not
                # this test run's, and cannot import this module (a routine of it would fail
                # with SerializationError there). Call what they can import: os.getpid.
                assert await anywool.run_sync(os.getpid) in owner.worker_pids
                assert borrower.workers == []  # it spawned none


@pytest.mark.anywool_backends("trio")
async def test_this_one_runs_under_trio_only(anyio_backend, worker_pool) -> None:
    assert anyio_backend == "trio"
    async with worker_pool():
        assert await scale(-1) == -2
