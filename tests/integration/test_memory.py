"""Entering and exiting pools over and over keeps no memory: whatever anywool allocates for one
cycle is freed (or lands in a bounded cache that is already full) when the cycle ends.

Measured with tracemalloc rather than RSS: it counts the blocks still allocated, and by whom,
so neither the allocator's fragmentation nor other tests' garbage can mask or fake a leak.
The cycle is the cheapest that kept memory (issue 21): a ``LocalDiscovery`` over a fresh
namespace, as every ``WorkerPool(spawn=N)`` makes one, entered and exited; a whole pool cycle
costs ten times as much and kept nothing more once this was fixed.
"""

from __future__ import annotations

import gc
import pathlib
import sys
import tracemalloc
from pathlib import Path

import anyio
import pytest

import anywool
from anywool import LocalDiscovery

pytestmark = pytest.mark.anyio

_WARM_UP = 50  # past every bounded cache's size (the namespace keys keep 32)
_CYCLES = 200
# What a cycle may keep on average: a leftover of a few bytes per cycle is allocator and
# interpreter noise (a free list growing, a dict resizing); a leak of the kind this pins (the
# namespace key cache keeping every fresh namespace) keeps some 300 bytes a cycle.
_BYTES_PER_CYCLE = 32


async def _cycle() -> None:
    async with LocalDiscovery():
        pass


def _kept_by_anywool(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> tuple[int, str]:
    """Bytes allocated with anywool's code on the stack that are alive in ``after`` and were
    not in ``before``, net; and the largest such sites, for the failure message."""
    only_anywool = [tracemalloc.Filter(True, str(Path(anywool.__file__).parent / "*"),
                                       all_frames=True)]
    if sys.version_info[:2] == (3, 12):
        # Python 3.12's pathlib interns every part of a path it parses, and interned strings
        # are immortal in 3.12 (PEP 683; mortal again in 3.13): a fresh namespace's directory
        # name, about 130 bytes a cycle, is kept by the interpreter, not by anywool.
        only_anywool.append(tracemalloc.Filter(False, pathlib.__file__, all_frames=True))
    stats = after.filter_traces(only_anywool).compare_to(
        before.filter_traces(only_anywool), "traceback")
    growth = sum(stat.size_diff for stat in stats)
    top = "\n".join(f"+{stat.size_diff} B in {stat.count_diff} blocks:\n    "
                    + "\n    ".join(stat.traceback.format(limit=4))
                    for stat in stats[:3] if stat.size_diff > 0)
    return growth, top


async def test_discovery_cycles_keep_no_memory() -> None:
    with anyio.fail_after(60):
        # Traced from the start, so that what a full cache evicts during the measured cycles
        # (allocated in the warm-up) counts as freed.
        tracemalloc.start(8)
        try:
            for _ in range(_WARM_UP):
                await _cycle()
            gc.collect()
            snapshots = [tracemalloc.take_snapshot()]
            # Two windows: a leak keeps memory in both; a table of the interpreter's growing
            # once (the interned strings' dict resizing, some megabytes in one block, when
            # anywool happens to be on the stack at that moment) shows in one only.
            for _ in range(2):
                for _ in range(_CYCLES):
                    await _cycle()
                gc.collect()
                snapshots.append(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
    windows = [_kept_by_anywool(snapshots[i], snapshots[i + 1]) for i in range(2)]
    growth, top = min(windows)
    assert growth < _BYTES_PER_CYCLE * _CYCLES, (
        f"{_CYCLES} discovery cycles kept {growth} bytes ({growth / _CYCLES:.0f} per cycle), "
        f"in each of two windows; the largest in the smaller:\n{top}")
