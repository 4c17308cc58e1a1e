"""A worker's statistics: what it says of itself when asked (a ``STATS`` frame).

:class:`WorkerStats` is what a caller gets (``await pool.stats()``,
:meth:`WorkerConnection.stats <anywool.lowlevel.WorkerConnection.stats>`, ``anywool top``);
:func:`memory` reads the worker's own resident set size. The counting itself lives where the
calls are (``runtime.worker._server``); the payload's codec in ``runtime.wire._envelope``.

No I/O here besides reading ``/proc/self/statm`` (a file of the kernel's, read without
blocking), no event loop.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

__all__ = ["WorkerStats", "memory"]


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """One worker's statistics, as it reported them (its own clock and counters).

    Counts are since the worker started; times are in seconds, memory in bytes.

    :param pid: the worker's process id.
    :param backend: its event loop, ``"asyncio"`` or ``"trio"``.
    :param python: its Python version (``"3.12.3"``).
    :param version: its anywool version.
    :param max_concurrency: the most calls it runs at once (``None``: no bound).
    :param in_flight: calls running now (accepted, not ended yet).
    :param served: calls that ended (whatever ended them); at least
        ``returned + raised + cancelled``, more when a client left before its call answered.
    :param returned: calls that ended with a value (a coroutine's return, a generator's end).
    :param raised: calls that ended with an exception (other than a cancellation), including
        those that could not be loaded.
    :param cancelled: calls that ended cancelled (by their caller, their deadline, the stop).
    :param busy_seconds: seconds during which at least one call was in flight.
    :param uptime_seconds: seconds since the worker started serving.
    :param rss_bytes: its resident set size in bytes (``None``: unknown).
    :param rss_peak: ``True`` when :attr:`rss_bytes` is the peak since the process started
        (``getrusage``, where ``/proc`` is missing), ``False`` when it is the current size.

    A statistics request is not a call: it is counted in none of these, and answered also when
    the worker runs its ``max_concurrency`` calls or is draining.
    """

    pid: int
    backend: str
    python: str
    version: str
    max_concurrency: int | None
    in_flight: int
    served: int
    returned: int
    raised: int
    cancelled: int
    busy_seconds: float
    uptime_seconds: float
    rss_bytes: int | None
    rss_peak: bool

    @property
    def busy_fraction(self) -> float:
        """``busy_seconds / uptime_seconds`` (0 to 1; 0 before any time passed)."""
        if self.uptime_seconds <= 0:
            return 0.0
        return min(1.0, self.busy_seconds / self.uptime_seconds)


def memory() -> tuple[int | None, bool]:
    """This process's resident set size in bytes and whether it is the peak: the current size
    from ``/proc/self/statm`` (Linux), else the peak from ``getrusage`` (kilobytes on Linux,
    bytes on macOS), else ``(None, False)``."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), False
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None, False
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak if sys.platform == "darwin" else peak * 1024), True
