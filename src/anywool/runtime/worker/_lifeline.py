"""The lifeline: a sidecar process that ends a worker when the worker's parent dies.

What it must never do: run anything its worker inherited (atexit handlers, buffered output,
pytest fixtures, an event loop): the sidecar leaves by ``os._exit`` only. It has no event loop
and no threads; it keeps no descriptor but the two pidfds, stdin (to see it hang up), and
stderr: not stdout, whose end-of-file tells the parent that a worker died before reporting its
address, and not the worker's listener or directory lock, which do not exist yet when it forks.

Why a process: the worker's own watchdog (a thread) cannot run while a routine holds the GIL in
C code (``sum(range(10**12))``), and stdin never reaches EOF while another process holds the
pipe's write end (its parent forked). ``PR_SET_PDEATHSIG`` is no substitute: it fires when the
*thread* that spawned the worker exits, and trio spawns from a cached thread that it retires
after 10 s idle. A pidfd on the parent becomes readable when the parent process exits, however
it exits, whatever else holds its pipes.

:func:`start` forks the sidecar from the worker's main thread, before the worker starts any
thread or event loop. The sidecar polls the parent's pidfd, the worker's pidfd and stdin:

* the worker exits first: the sidecar exits;
* the parent dies (or stdin hangs up): the worker, which watches the parent's pidfd too, has
  ``grace`` seconds to stop by itself; then the sidecar SIGKILLs it, removes its socket
  directory (which it could not), and exits.

The worker kills and reaps its sidecar when it exits (:meth:`Lifeline.close`); a worker killed
by SIGKILL leaves its sidecar to see the worker's pidfd become readable and exit, reaped by
init. Linux only (pidfds, 5.3+): where they are missing :func:`start` returns ``None``, and the
worker falls back to its watchdog thread.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
from pathlib import Path
from typing import NoReturn

from anywool.runtime import _socket_dir

# Seconds a worker killed by its sidecar gets to be gone before its directory is removed.
_KILL_TIMEOUT = 5.0


class ParentGone(Exception):
    """The process that started the worker is not its parent any more: it already died."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.pid = pid

    def __str__(self) -> str:
        return f"the worker's parent (pid {self.pid}) is gone"


class Lifeline:
    """The worker's end of its lifeline: the parent's pidfd, and the sidecar to end at exit.

    :param parent: a pidfd on the parent; readable once the parent has exited. Owned: closed
        by :meth:`close`.
    :param sidecar: the pid of the sidecar, an unreaped child of this process.
    """

    def __init__(self, parent: int, sidecar: int) -> None:
        self.parent = parent
        self._sidecar: int | None = sidecar

    def close(self) -> None:
        """SIGKILL the sidecar and reap it, then close the parent's pidfd. Idempotent.

        Signalling by pid is safe: until it is reaped here, the sidecar's pid cannot be reused
        (nothing in anywool reaps children it did not start). Blocks for as long as the kernel
        takes to end a process that was never stopped.
        """
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is None:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sidecar, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):  # reaped by a routine's os.wait()
                os.waitpid(sidecar, 0)
        finally:
            os.close(self.parent)


def start(parent_pid: int, leftover: Path | None, grace: float,
          parent_pidfd: int | None = None) -> Lifeline | None:
    """Check that ``parent_pid`` is this process's parent, and fork the sidecar that watches it.

    Call it from the main thread before any other thread, event loop, listener or lock exists:
    the sidecar inherits the process as it is (and closes what it does not need).

    :param parent_pid: the pid of the process that started the worker (``LocalWorker``).
    :param leftover: what the sidecar removes after killing the worker: its socket directory
        (removed with its content) or its bare socket file; ``None``: nothing.
    :param grace: seconds (≥ 0) the worker has to exit by itself once its parent is gone.
    :param parent_pidfd: a pidfd on the parent, opened by whoever forked this process once it
        had checked that it names the parent (the pool's template: the worker's parent is then
        the template, and the one to watch is the pool); owned from here on.
    :returns: the lifeline, or ``None`` where pidfds or ``fork`` are unavailable (not Linux
        5.3+, or denied by a sandbox): the caller then relies on stdin alone.
    :raises ParentGone: the parent has already died (the worker was re-parented).
    """
    if parent_pidfd is not None:
        try:
            gone = bool(select.select([parent_pidfd], [], [], 0)[0])  # readable: it exited
        except (OSError, ValueError):
            gone = None  # not a descriptor we were given: check by pid, below
        if gone is not None:
            if gone:
                os.close(parent_pidfd)
                raise ParentGone(parent_pid)
            return _fork_sidecar(parent_pidfd, leftover, grace)
    # Opened first, checked second: if our parent is still our parent after the pidfd was
    # opened, the pidfd names it (a pid is only reused after its process is gone).
    parent: int | None
    try:
        parent = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        raise ParentGone(parent_pid) from None
    except (AttributeError, OSError):
        parent = None
    if os.getppid() != parent_pid:
        if parent is not None:
            os.close(parent)
        raise ParentGone(parent_pid)
    if parent is None:
        return None
    return _fork_sidecar(parent, leftover, grace)


def _fork_sidecar(parent: int, leftover: Path | None, grace: float) -> Lifeline | None:
    try:
        worker = os.pidfd_open(os.getpid())
    except OSError:
        os.close(parent)
        return None
    try:
        sidecar = os.fork()
    except OSError:
        os.close(worker)
        os.close(parent)
        return None
    if sidecar == 0:
        _sidecar(parent, worker, leftover, grace)
    os.close(worker)
    return Lifeline(parent, sidecar)


def _sidecar(parent: int, worker: int, leftover: Path | None, grace: float) -> NoReturn:
    """The sidecar's whole life, in the forked child. Never returns, never raises."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C drains the worker: keep watching
        _keep_only(parent, worker)
        if _wait_for_orphaning(parent, worker):
            _end(worker, leftover, grace)
        code = 0
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(2, f"anywool.worker lifeline [{os.getpid()}]: {exc!r}\n".encode())
    finally:
        os._exit(code)


def _keep_only(*pidfds: int) -> None:
    """Close every inherited descriptor but stdin, stderr and ``pidfds``; stdout → /dev/null."""
    if 1 not in pidfds:  # (stdout was closed when the pidfd was opened)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    start = 3
    for fd in sorted(pidfds):
        if fd >= start:
            os.closerange(start, fd)
            start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))


def _wait_for_orphaning(parent: int, worker: int) -> bool:
    """Block until the worker exits (``False``) or its parent is gone (``True``)."""
    poller = select.poll()
    poller.register(parent, select.POLLIN)
    poller.register(worker, select.POLLIN)
    if _is_pipe(0):
        poller.register(0, 0)  # reports POLLHUP, POLLERR only; the worker reads stdin, not us
    while True:
        ready = dict(poller.poll())
        if worker in ready:
            return False
        if parent in ready or 0 in ready:
            return True


def _end(worker: int, leftover: Path | None, grace: float) -> None:
    """Give the worker ``grace`` seconds to exit; then kill it and remove its ``leftover``."""
    if _exited(worker, grace):
        return  # it stopped by itself and cleaned up after itself
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(worker, signal.SIGKILL)  # a pidfd: never another process
    _exited(worker, _KILL_TIMEOUT)
    if leftover is None:
        return
    if leftover.is_dir() and not leftover.is_symlink():
        _socket_dir.remove(leftover)
    else:
        leftover.unlink(missing_ok=True)


def _exited(worker: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(worker, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
