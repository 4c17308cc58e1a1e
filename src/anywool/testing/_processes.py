"""Processes by pid, as the fixtures see them: who a pid is, whether it is gone, and reaping.

Synchronous, standard library only (psutil is not a dependency of anywool). On Linux a process
is told apart from a later one that reused its pid by its start time in ``/proc``; elsewhere
only by the pid. What this module must never do: signal a pid that no longer names the process
it was given for.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

from anywool.testing._settle import GRACE, settle


@dataclass(frozen=True)
class Identity:
    """A process as it was when it was recorded: its pid and, where ``/proc`` tells, its start
    time (clock ticks after boot)."""

    pid: int
    started: int | None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) from ``/proc/<pid>/stat``; ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last.
    fields = text[text.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def can_see_states() -> bool:
    """Whether :func:`state` can tell ``"zombie"`` and ``"stopped"`` (where ``/proc`` is)."""
    return os.path.isdir(f"/proc/{os.getpid()}")


def identify(pid: int) -> Identity:
    """The identity of the live process ``pid``, to tell it from a successor later."""
    stat = _stat(pid)
    return Identity(pid, None if stat is None else stat[1])


def state(process: Identity) -> str:
    """``"gone"`` (exited and reaped, or its pid names another process now), ``"zombie"``
    (exited, not yet reaped), ``"stopped"`` (SIGSTOP and the like) or ``"running"`` (anything
    else; without ``/proc``, everything that is not gone)."""
    if can_see_states():
        stat = _stat(process.pid)
        if stat is None or (process.started is not None and stat[1] != process.started):
            return "gone"
        letter = stat[0]
        return {"Z": "zombie", "X": "gone", "T": "stopped", "t": "stopped"}.get(letter, "running")
    try:
        os.kill(process.pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "gone"  # another user's process: ours exited and the pid was reused
    return "running"


def signal_process(process: Identity, sig: int) -> bool:
    """Send ``sig`` to ``process`` if it is still that process; whether it was sent."""
    if state(process) == "gone":
        return False
    try:
        os.kill(process.pid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_and_reap(processes: list[Identity], timeout: float = GRACE) -> list[Identity]:
    """SIGKILL each process that is still running, then reap those that are our children.

    Waits at most ``timeout`` seconds in all, polling ``waitpid(WNOHANG)`` with growing
    intervals; a process that is not our child (or that its own parent reaps) counts as reaped
    once it is gone.

    :returns: the processes still there after ``timeout`` (normally none).
    """
    for process in processes:
        signal_process(process, signal.SIGKILL)

    def left() -> list[Identity]:
        for process in processes:
            if state(process) != "gone":
                with contextlib.suppress(ChildProcessError):  # not our child: its parent reaps
                    os.waitpid(process.pid, os.WNOHANG)
        return [process for process in processes if state(process) != "gone"]

    return settle(left, timeout)
