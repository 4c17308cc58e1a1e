"""Worker side of test_call_budget.py: a profiler hook that counts Python function calls in the
worker's event-loop thread (imported by reference on workers; no pytest here)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from anywool import routine


class Counter:
    """``sys.setprofile`` hook: counts ``call`` events (a Python frame entered or resumed)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1


_counter: Counter | None = None


@routine
async def trivial() -> None:
    """The call whose cost is counted."""


@routine
async def start_counting() -> None:
    global _counter
    _counter = Counter()
    sys.setprofile(_counter)


@routine
async def stop_counting() -> int:
    sys.setprofile(None)
    assert _counter is not None
    return _counter.calls
