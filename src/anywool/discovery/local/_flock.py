"""Descriptors and the flock locks on them: polling with backoff, probes, liveness, fork.

Liveness always comes from a kernel ``flock`` held by the live process; the kernel releases it
when the last descriptor of the open file description closes, so a SIGKILLed holder frees it at
once. Nothing here ever blocks in ``flock`` itself: waits poll ``LOCK_NB`` so that the waiting
thread can always be told to stop.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

# A probe that finds a lock held retries for this long before calling its holder alive: another
# prober may hold it for an instant, a live owner holds it continuously.
_PROBE_WINDOW = 0.002


def try_lock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def probe_free(fd: int, operation: int = fcntl.LOCK_EX) -> bool:
    """Whether the lock on ``fd`` is free (its holder is dead); the lock is left *taken* if so.

    Retries for ``_PROBE_WINDOW`` seconds so that a concurrent prober's momentary hold is not
    mistaken for a live holder.
    """
    deadline = time.monotonic() + _PROBE_WINDOW
    while True:
        if try_lock(fd, operation):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0002)


def lock_with_backoff(
    fd: int,
    operation: int,
    *,
    timeout: float | None,
    describe: Callable[[], str],
    checkpoint: Callable[[], None] | None = None,
    started: float | None = None,
) -> None:
    """Take ``flock(operation)`` by polling ``LOCK_NB`` with a 1 ms → 20 ms backoff.

    Never blocks in ``flock`` itself, so the calling thread can always be told to stop:
    ``checkpoint`` is called between attempts and may raise (cancellation).

    :param started: ``time.monotonic()`` when the caller began waiting (default: now); the
        timeout counts from there.
    :raises TimeoutError: not acquired within ``timeout`` seconds (``None``: wait forever).
    """
    if try_lock(fd, operation):
        return
    begun = time.monotonic() if started is None else started
    deadline = None if timeout is None else begun + timeout
    delay = 0.001
    while True:
        if checkpoint is not None:
            checkpoint()
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{describe()}: lock not acquired within {timeout} s")
            time.sleep(min(delay, remaining))
        else:
            time.sleep(delay)
        if try_lock(fd, operation):
            return
        delay = min(delay * 2, 0.02)


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_file(path: Path | str, flags: int = os.O_RDWR, *, dir_fd: int | None = None) -> int:
    """Open (``O_NOFOLLOW``, ``O_CLOEXEC``) ``path``, relative to ``dir_fd`` when given."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)


def close_quietly(fd: int | None) -> None:
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class locked:
    """Hold the registry lock: first ``guard`` (the threads sharing this descriptor), then flock.

    flock excludes open file descriptions, not threads: two threads publishing through one
    descriptor would both "hold" it. The guard serialises them, polled like the flock so that
    the wait stays cancellable and bounded by the same timeout.
    """

    def __init__(self, fd: int, guard: threading.Lock, operation: int, timeout: float | None,
                 namespace: str, checkpoint: Callable[[], None] | None = None) -> None:
        self._fd = fd
        self._operation = operation
        self._timeout = timeout
        self._namespace = namespace
        self._checkpoint = checkpoint
        self._guard = guard

    def _describe(self) -> str:
        return f"discovery namespace {self._namespace!r}"

    def __enter__(self) -> None:
        start = time.monotonic()
        while not self._guard.acquire(timeout=0.02 if self._timeout != 0 else 0):
            if self._checkpoint is not None:
                self._checkpoint()
            if self._timeout is not None and time.monotonic() - start >= self._timeout:
                raise TimeoutError(
                    f"{self._describe()}: lock not acquired within {self._timeout} s")
        try:
            lock_with_backoff(self._fd, self._operation, timeout=self._timeout,
                              describe=self._describe, checkpoint=self._checkpoint,
                              started=start)
        except BaseException:
            self._guard.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            unlock(self._fd)
        finally:
            self._guard.release()


def owner_alive(dir_fd: int) -> bool:
    """Whether a live process holds ``dir_fd``'s lock: the owner of a generation (its owner
    file or directory), or whoever locks a socket, claimant's or remover's directory (one try:
    ``LOCK_SH`` conflicts only with the holder's ``LOCK_EX``, and is let go at once)."""
    if try_lock(dir_fd, fcntl.LOCK_SH):
        unlock(dir_fd)
        return False
    return True


# Descriptors that carry a lock proving a process alive (an owner's directory, a publisher's
# lease). flock belongs to the open file description, which fork shares: a child that kept them
# would keep a dead parent "alive". The child closes its copies (closing never unlocks the
# parent's) and its inherited handles become inert.


class Forgettable(Protocol):
    def forget(self) -> None:
        """Drop the descriptors inherited from the parent, without touching its locks."""


LOCK_HOLDERS: weakref.WeakSet[Forgettable] = weakref.WeakSet()


def _forget_inherited_locks() -> None:
    for holder in list(LOCK_HOLDERS):
        holder.forget()


os.register_at_fork(after_in_child=_forget_inherited_locks)
