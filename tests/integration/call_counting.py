"""Worker side of test_call_budget.py: a profiler hook that counts Python function calls in the
worker's event-loop thread (imported by reference on workers; no pytest here)."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

import anyio

import anywool
from anywool import routine

#: Where the counted code lives: anywool's and AnyIO's. The backend's own scheduling (asyncio's
#: loop, trio's run loop, selectors) is left out: how many turns it takes per call depends on
#: timing (a reply ready at once or not), so counting it would make the budget flaky under load.
COUNTED = (os.path.dirname(anywool.__file__) + os.sep, os.path.dirname(anyio.__file__) + os.sep)


class Counter:
    """``sys.setprofile`` hook: counts ``call`` events (a Python frame entered or resumed) of
    code under :data:`COUNTED`."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(COUNTED):
            self.calls += 1


_counter: Counter | None = None


@routine
async def trivial() -> None:
    """The call whose cost is counted."""


def trivial_plain() -> None:
    """The plain function whose call's cost is counted (``anywool.run_sync``)."""


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
