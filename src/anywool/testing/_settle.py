"""Bounded waiting for something to go away: the grace every after-the-test check gives.

Synchronous, no event loop: these run in fixture teardown, after the test's event loop is gone.
What this module must never do: poll once nothing is left (a clean test pays one probe).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

#: Seconds a process or a file gets to finish going away after the test.
GRACE = 5.0


def settle(probe: Callable[[], list[_T]], grace: float = GRACE) -> list[_T]:
    """Call ``probe`` until it returns an empty list or ``grace`` seconds have passed.

    Polls with intervals growing from 1 ms to 50 ms, and only while something is left.

    :returns: what the last probe found (empty when everything went away in time).
    """
    deadline = time.monotonic() + grace
    interval = 0.001
    while True:
        found = probe()
        remaining = deadline - time.monotonic()
        if not found or remaining <= 0:
            return found
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, 0.05)
