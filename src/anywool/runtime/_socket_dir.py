"""Where a local worker's Unix socket lives: a directory of its own, locked by the worker.

``<runtime dir>/w-<16 hex>/s``. The worker creates the directory (``0700``), holds
``flock(LOCK_EX)`` on it for its whole life and listens on ``s`` inside. The kernel drops the
lock when the worker dies, however it dies, so a ``w-*`` directory whose lock can be taken is a
dead worker's: the next claim of any namespace sweeps it (``_claim.sweep_leftovers``). The
parent, which chose the directory before starting the worker, removes it after reaping the
worker, also when the worker never got as far as reporting its address.

One end in each process: the parent chooses and removes (:func:`choose`, :func:`remove`; the
worker's lifeline removes too), the worker creates and holds (:class:`Home`). So it sits below
both, not in :mod:`anywool.runtime.worker`: a pool's process imports this module, not the
worker's machinery. (Discovery's sweep knows the ``w-`` prefix and the lock too, by value: it
is a layer below and cannot import this.)

Synchronous and small: no event loop here.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from anywool._runtime_dir import runtime_dir

PREFIX = "w-"
SOCKET = "s"

# sun_path is 108 bytes on Linux (104 on the BSDs), one of which is the terminating NUL.
_SUN_PATH_MAX = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107


def _fits(directory: Path) -> bool:
    return len(os.fsencode(directory / SOCKET)) <= _SUN_PATH_MAX


def choose() -> Path:
    """A fresh directory path for a worker's socket (not created).

    In the runtime directory; when the socket path would not fit ``sun_path`` there, in the
    system temporary directory (where only its parent removes it).

    :raises OSError: no short enough location exists (a path is never truncated).
    """
    name = f"{PREFIX}{os.urandom(8).hex()}"
    directory = runtime_dir() / name
    if _fits(directory):
        return directory
    import tempfile  # here: a worker's start-up imports this module

    directory = Path(tempfile.gettempdir()) / f"aw-{name}"
    if _fits(directory):
        return directory
    raise OSError(
        f"no Unix socket path short enough for a worker: {directory / SOCKET} is longer than "
        f"{_SUN_PATH_MAX} bytes; set ANYWOOL_RUNTIME_DIR or TMPDIR to a shorter directory"
    )


class Home:
    """The worker's side: create its directory, lock it for life, remove it at exit.

    :raises FileExistsError: the directory exists already (never reused, never trusted).
    """

    def __init__(self, directory: Path) -> None:
        os.mkdir(directory, 0o700)
        try:
            self._fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                               | os.O_CLOEXEC)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            remove(directory)
            raise
        self.directory = directory
        self.socket = directory / SOCKET

    def remove(self) -> None:
        """Remove the socket and the directory, then drop the lock. Idempotent."""
        remove(self.directory)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def remove(directory: Path) -> None:
    """Remove a worker's directory and what is in it, if it is still there."""
    import shutil  # here: a worker's start-up imports this module, and rarely removes a tree

    shutil.rmtree(directory, ignore_errors=True)
