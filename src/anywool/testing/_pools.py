"""The ``worker_pool`` fixture: WorkerPools with test-friendly defaults, checked afterwards.

The factory hands out pools the test enters itself; after the test it checks that each was
entered and exited, and that every worker process any of them spawned is gone. Importing this
module imports no part of anywool (the pool class is imported when a pool is first made).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from anywool.testing._processes import Identity, kill_and_reap, state
from anywool.testing._settle import GRACE, settle

if TYPE_CHECKING:
    from anywool.runtime.pool._pool import WorkerPool
    from anywool.testing._tracked import TrackedWorkerPool

#: What ``worker_pool(**kwargs)`` passes to :class:`~anywool.WorkerPool` unless told otherwise.
DEFAULTS: dict[str, Any] = {"lazy": False, "shutdown_timeout": 5.0, "announce_timeout": 5.0}


class WorkerPoolFactory(Protocol):
    """The type of the ``worker_pool`` fixture: ``worker_pool(**kwargs) -> WorkerPool``."""

    def __call__(self, **kwargs: Any) -> WorkerPool:
        """A new, un-entered :class:`~anywool.WorkerPool` (see the fixture for the defaults)."""
        ...


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    options = {**DEFAULTS, **kwargs}
    if "spawn" not in kwargs and "discovery" not in kwargs:
        options["spawn"] = 1
    # Entry waits for every worker the pool spawns, so that a test starts with all of them.
    if options.get("spawn") is not None and "quorum" not in kwargs:
        options["quorum"] = options["spawn"]
    return options


def _describe(pids: list[Identity]) -> str:
    return ", ".join(str(process.pid) for process in pids)


@pytest.fixture
def worker_pool(anywool_runtime_dir: Path) -> Iterator[WorkerPoolFactory]:
    """A factory of :class:`~anywool.WorkerPool` objects the test enters itself.

    ``worker_pool(**kwargs)`` takes the keyword arguments of ``WorkerPool`` and returns a new,
    un-entered pool (``async with worker_pool(spawn=2) as pool:``). Defaults that differ from
    ``WorkerPool``'s: ``spawn=1`` unless ``spawn`` or ``discovery`` is given; ``lazy=False``
    with ``quorum`` equal to ``spawn``, so that entry returns once every spawned worker is
    connected (a pool that spawns nothing waits for one worker found through its discovery);
    ``shutdown_timeout=5`` and ``announce_timeout=5`` seconds. The pools live in the test's
    own runtime directory (it requests ``anywool_runtime_dir``).

    The factory raises what ``WorkerPool(**kwargs)`` raises (``TypeError``, ``ValueError``).

    After the test it fails the test (an error at teardown) if a pool was made and never
    entered, or entered and never exited, or if a worker process any pool spawned (its first
    workers, and every replacement of a worker that died) is still there 5 seconds after the
    test: those are killed (SIGKILL) and reaped, and the failure names their pids.
    """
    pools: list[TrackedWorkerPool] = []

    def factory(**kwargs: Any) -> WorkerPool:
        from anywool.testing._tracked import TrackedWorkerPool

        pool = TrackedWorkerPool(**_options(kwargs))
        pools.append(pool)
        return pool

    yield factory

    problems = []
    for pool in pools:
        if not pool._entered:
            problems.append(f"{pool!r} was made but never entered (async with)")
        elif pool._stack is not None:  # set by an entry that succeeded, cleared by the exit
            problems.append(f"{pool!r} was entered but never exited")
    spawned = [process for pool in pools for process in pool.spawned]
    left = settle(lambda: [process for process in spawned if state(process) != "gone"])
    if left:
        unkillable = kill_and_reap(left)
        problems.append(f"worker process(es) still there {GRACE:.0f} s after the test "
                        f"(killed and reaped now): pid {_describe(left)}")
        if unkillable:
            problems.append(f"  still there after SIGKILL: pid {_describe(unkillable)}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
