"""The warm template's process: ``python -m anywool.runtime._template BACKEND``.

It imports what a worker on ``BACKEND`` runs, says it is warm, then forks one child per request
of its pool and reaps them, saying to the pool which it forked (with a pidfd of each) and how
each ended (frames: :mod:`anywool.runtime.pool._template_frames`). Each child becomes the worker
(:func:`anywool.runtime.worker._main.main`) with the request's arguments, environment and
working directory, in a session of its own, with the descriptor of a pidfd on the pool in
``PARENT_PIDFD_ENV`` (:mod:`anywool.runtime.worker._contract`): the pool is the worker's
grandparent, so the worker watches the pool through that pidfd, which the template opened while
the pool was still its parent. At end-of-file on its socket (the pool died, or closed it) the
template exits. The pool's end of all this is :mod:`anywool.runtime.pool._template`.

What this module must never do: start a thread or an event loop, in the template or before a
fork (forking is safe here because there is none), or import anything of the pool's end.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from anywool.runtime.pool._template_frames import Frames, ancillary_space, encode, rights
from anywool.runtime.worker._contract import PARENT_PIDFD_ENV

# What a worker imports before it serves (the rest is imported by what its routines run).
# (shutil: argparse's help formatter imports it, for the terminal's size.)
_PRELOAD = ("anywool.runtime.worker._main", "anywool.runtime.worker._server",
            "anywool.runtime.worker._callgroup", "anyio.to_thread", "anyio.streams.memory",
            "anyio.abc", "shutil")
_PRELOAD_BACKEND = {
    "asyncio": ("asyncio", "anyio._backends._asyncio", "anywool.runtime.worker._asyncio_loop"),
    "trio": ("trio", "anyio._backends._trio"),
}


def _send(control: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = encode({**message, "fds": len(fds)} if fds else message)
    sent = control.sendmsg([data], rights(fds))
    if sent < len(data):
        control.sendall(data[sent:])


def _serve(backend: str) -> list[str] | None:
    """The template's life; returns ``None`` at end-of-file from the pool. In a forked child it
    returns the worker's arguments instead, having made the child what a worker expects to be
    (the template's descriptors closed on the way out)."""
    failure = None
    try:
        for name in (*_PRELOAD, *_PRELOAD_BACKEND[backend]):
            importlib.import_module(name)
    except BaseException as exc:  # said to the pool, which then starts workers by themselves
        failure = f"cannot import what a worker runs: {exc!r}"
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # Opened first, checked second: if the pool is still our parent once the pidfd is open, the
    # pidfd names it. Workers inherit it (it is how they know the pool, see _lifeline).
    pool_pid = os.getppid()
    try:
        pool = os.pidfd_open(pool_pid)
    except OSError as exc:
        failure = failure or f"no pidfd on the pool: {exc!r}"
        pool = -1
    if pool >= 0 and os.getppid() != pool_pid:
        return None  # the pool is gone already
    if failure is not None:
        _send(control, {"failed": failure})
        return None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to write the wake-up byte
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when its template ends
    frames = Frames()
    live: set[int] = set()
    _send(control, {"ready": os.getpid()})
    try:
        while True:
            readable, _, _ = select.select([control, wake_r], [], [])
            if wake_r in readable:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                _reap(control, live)
            if control in readable:
                data, ancillary, _, _ = control.recvmsg(1 << 16, ancillary_space())
                frames.feed(data, ancillary)
                if not data:
                    return None
                while (frame := frames.next()) is not None:
                    request, fds = frame
                    try:
                        pid = os.fork()
                    except OSError as exc:
                        _send(control, {"failed": f"fork: {exc}"})
                    else:
                        if pid == 0:
                            return _child(request, fds, (control, wake_r, wake_w), pool)
                        live.add(pid)
                        pidfd = os.pidfd_open(pid)  # unreaped till _reap: it names the child
                        _send(control, {"forked": pid}, [pidfd])
                        os.close(pidfd)
                    finally:
                        for fd in fds:
                            os.close(fd)
    except (BrokenPipeError, ConnectionResetError):
        return None  # the pool is gone
    finally:
        frames.close()


def _reap(control: socket.socket, live: set[int]) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            live.clear()
            return
        if pid == 0:
            return
        live.discard(pid)
        _send(control, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(request: dict[str, Any], fds: list[int], close: tuple[Any, ...], pool: int
           ) -> list[str]:
    """In the forked child: become what ``python -m anywool.worker`` starts as; the worker's
    arguments. ``fds`` are left to the caller to close, once duplicated onto stdin, stdout and
    stderr.
    Anything failing here ends the child, code 70."""
    try:
        os.setsid()  # as LocalWorker's start_new_session: a terminal's Ctrl-C is the pool's
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        stdin, stdout, stderr = fds
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        control, wake_r, wake_w = close
        control.close()
        os.close(wake_r)
        os.close(wake_w)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.environ[PARENT_PIDFD_ENV] = str(pool)
        os.chdir(request["cwd"])
        return [str(arg) for arg in request["argv"]]
    except BaseException as exc:
        os.write(2, f"anywool template child [{os.getpid()}]: {exc!r}\n".encode())
        os._exit(70)


def main() -> None:
    """Entry point of ``python -m anywool.runtime._template BACKEND``."""
    backend = sys.argv[1] if len(sys.argv) == 2 else ""
    if backend not in _PRELOAD_BACKEND:
        sys.exit(f"usage: python -m anywool.runtime._template {{asyncio|trio}}, got {sys.argv[1:]}")
    argv = _serve(backend)
    if argv is not None:  # a forked child
        sys.argv = ["anywool.worker", *argv]
        from anywool.runtime.worker._main import main as worker_main

        worker_main(argv)
