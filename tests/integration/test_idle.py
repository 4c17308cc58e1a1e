"""Idle workers (issue 24): ``WorkerPool(idle_timeout=..., min_workers=...)`` retires a spawned
worker that ran no call for ``idle_timeout`` seconds, not replaced, down to ``min_workers`` and
no further; calls coming again grow the pool back to ``spawn``. Real workers, both backends."""

from __future__ import annotations

import logging
import os
import re
import signal
from typing import Any

import anyio
import pytest

from anywool import WorkerPool, routine
from anywool.discovery.local import LocalDiscovery

from ..helpers import wait_until

pytestmark = pytest.mark.anyio

_POOL_LOG = "anywool.runtime._pool"


@routine
async def pid() -> int:
    return os.getpid()


def kept(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The pool's records of an idle worker it kept (at min_workers)."""
    return [record.getMessage() for record in caplog.records
            if record.name == _POOL_LOG and "is idle; kept" in record.getMessage()]


async def test_idle_workers_retire_down_to_min_workers_and_calls_grow_the_pool_back(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=_POOL_LOG)
    with anyio.fail_after(90):
        async with WorkerPool(spawn=3, idle_timeout=1.0, min_workers=1) as pool:
            first = {w.pid for w in pool.workers}
            assert len(first) == 3
            await wait_until(lambda: len(pool.workers) == 1, "two idle workers to retire", 30)
            [last] = pool.workers
            assert last.pid in first
            # The one left says it is idle again and again; the pool keeps it each time.
            await wait_until(lambda: len(kept(caplog)) >= 2, "the last worker to be kept", 30)
            assert [w.pid for w in pool.workers] == [last.pid]
            # Calls again: each succeeds, and the pool grows back to its spawn, one at a time.
            seen: set[int] = set()
            while len(pool.workers) < 3:
                seen.add(await pid())
            assert len(pool.workers) == 3 and last.pid in {w.pid for w in pool.workers}
            grown = {w.pid for w in pool.workers} - {last.pid}
            assert not grown & first  # new processes, not the retired ones
            # The new workers take calls (they are announced, connected and used).
            await wait_until(lambda: len(pool.proxy.workers) == 3, "the proxy to see 3")
            while not grown <= seen:
                seen.add(await pid())
    assert seen <= {last.pid} | grown


async def test_min_workers_equal_to_spawn_retires_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=_POOL_LOG)
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2, idle_timeout=0.5, min_workers=2) as pool:
            pids = {w.pid for w in pool.workers}

            def both_kept() -> bool:
                said = {int(m) for m in re.findall(r"worker pid (\d+) is idle",
                                                    "\n".join(kept(caplog)))}
                return said == pids

            await wait_until(both_kept, "each worker to be idle and kept", 30)
            assert {w.pid for w in pool.workers} == pids
            assert await pid() in pids


async def test_idle_retirement_counts_other_callers_calls(
        namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    # A worker busy with another pool's calls is not idle, whatever its own pool sees.
    caplog.set_level(logging.DEBUG, logger=_POOL_LOG)
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=2, discovery=discovery, idle_timeout=1.0) as pool:
            await wait_until(lambda: len(pool.workers) == 1, "one idle worker to retire", 30)
            [busy] = pool.workers
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)):
                # Calls from elsewhere for three idle_timeouts: the worker never says it is
                # idle, so the pool (left at min_workers anyway) logs no keeping of it, and
                # grows back (these calls count as well).
                # Counted once the calls have begun: the worker, idle since its spawn like the
                # one that retired, may say so (and be kept) before the first call reaches it.
                assert await pid() in {w.pid for w in pool.workers}
                kept_before = len(kept(caplog))
                started = anyio.current_time()
                while anyio.current_time() - started < 3.0 or len(pool.workers) < 2:
                    assert await pid() in {w.pid for w in pool.workers}
                assert len(pool.workers) == 2 and busy in pool.workers
                assert len(kept(caplog)) == kept_before


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"idle_timeout": 0}, ValueError, "idle_timeout must be > 0"),
    ({"idle_timeout": 0.05}, ValueError, "idle_timeout must be at least 0.1 seconds"),
    ({"idle_timeout": float("nan")}, ValueError, "idle_timeout must be > 0"),
    ({"idle_timeout": "5"}, TypeError, "idle_timeout must be a number of seconds or None, "
                                       "got '5'"),
    ({"idle_timeout": True}, TypeError, "idle_timeout must be a number"),
    ({"idle_timeout": 5, "min_workers": 0}, ValueError,
     "min_workers must be between 1 and spawn (3), got 0"),
    ({"idle_timeout": 5, "min_workers": 4}, ValueError,
     "min_workers must be between 1 and spawn (3), got 4"),
    ({"idle_timeout": 5, "min_workers": 1.0}, TypeError, "min_workers must be an int, got 1.0"),
    ({"idle_timeout": 5, "min_workers": True}, TypeError, "min_workers must be an int"),
    ({"min_workers": 2}, ValueError, "min_workers=2 is the floor of idle_timeout's"),
])
def test_bad_idleness_is_refused_at_construction(kwargs: dict[str, Any], error: type,
                                                 message: str) -> None:
    with pytest.raises(error) as info:
        WorkerPool(spawn=3, **kwargs)
    assert message in str(info.value)


def test_idle_timeout_needs_a_pool_that_spawns(namespace: str) -> None:
    with pytest.raises(ValueError, match=r"idle_timeout=5 retires the workers a pool spawns, "
                                         r"but this pool spawns none"):
        WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), idle_timeout=5)


async def test_a_host_retires_idle_workers_and_grows_back(namespace: str,
                                                          anyio_backend: str) -> None:
    from .children import stop
    from .test_worker_command import host

    with anyio.fail_after(90):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--workers", "2", "--backend", anyio_backend,
                                  "--idle-timeout", "1", "--min-workers", "1")
        try:
            assert len(lines) == 2
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace),
                                  quorum=2, lazy=False) as borrower:
                await wait_until(lambda: len(borrower.proxy.workers) == 1,
                                 "the host to withdraw an idle worker", 30)
                # Calls from this other process: the host grows back to its --workers.
                while len(borrower.proxy.workers) < 2:
                    assert await pid()
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])


def test_the_host_refuses_bad_idleness_options() -> None:
    import subprocess
    import sys

    from .children import REPO

    result = subprocess.run(
        [sys.executable, "-m", "anywool.cli", "worker", "--discovery", "local", "-n", "x",
         "--workers", "2", "--idle-timeout", "1", "--min-workers", "3"],
        capture_output=True, cwd=REPO, timeout=60, check=False)
    assert result.returncode == 2
    assert "--min-workers must be between 1 and --workers (2), got 3" in result.stderr.decode()
