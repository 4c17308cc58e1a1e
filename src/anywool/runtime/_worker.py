"""The worker process: ``python -m anywool.worker --backend asyncio|trio [--home DIR | --address ADDR]``.

It runs its own event loop on the requested backend, listens on a Unix socket in a directory of
its own inside the runtime directory (``0600`` socket in ``0700`` directories: only the same user
can dispatch; the directory is locked for the worker's life, see
:mod:`anywool.runtime._socket_dir`), and prints
its address as one line on stdout. TCP is refused until peer authentication exists: a frame is
pickled code, so an unauthenticated TCP listener would run anyone's code. Everything it
prints afterwards (including routines' ``print``) goes to stderr, so the pipe its parent reads
can never fill up and block it.

Calls run concurrently, served by :class:`~anywool.runtime._server.Server`; a connection that
closes cancels its calls. The worker stops:

* on a stop request, a line ``stop <grace>`` on stdin: ``grace`` seconds to drain in-flight calls
  (new ones are refused with ``NACK``), ``0`` to cancel them now, negative to drain for as long
  as they take;
* at EOF on stdin (its parent closed the pipe or died, even by SIGKILL), or when its parent
  exits (seen on a pidfd, also while another process holds the pipe's write end): cancels now.
  If it has not exited 5 s after that (a routine that shields itself, or blocks the event loop,
  even in C code holding the GIL), its lifeline, a sidecar process forked at start-up
  (:mod:`anywool.runtime._lifeline`), SIGKILLs it and removes its socket directory. Without
  pidfds, or run by hand (no ``$ANYWOOL_WORKER_PARENT_PID``), a watchdog thread does the same
  5 s after stdin hangs up, when the GIL lets it run;
* on SIGTERM: cancels now; on SIGINT: drains forever.

The socket file is removed at exit.

The parent's pipe is moved off descriptor 0 at start-up, and routines get ``/dev/null`` as their
stdin: reading or closing it never touches the stop requests.

The parent passes its ``sys.path`` in ``$ANYWOOL_WORKER_SYS_PATH`` (JSON list) and its working
directory as ours, so that routines defined in its modules import here by reference, and its
pid in ``$ANYWOOL_WORKER_PARENT_PID``: a worker whose parent is already gone exits at once (70).
"""


from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteStream, SocketListener, TaskGroup

from anywool._address import Address
from anywool._errno import exhausted
from anywool.runtime import _lifeline, _socket_dir
from anywool.runtime._nested import NestedProxies, idle_timeout_from_environment
from anywool.runtime._server import LINGER, REPLY_TIMEOUT, Server

log = logging.getLogger("anywool.worker")

SYS_PATH_ENV = "ANYWOOL_WORKER_SYS_PATH"
PARENT_PID_ENV = "ANYWOOL_WORKER_PARENT_PID"

# Once its parent is gone (stdin hung up), the seconds a worker has to stop by itself before it
# exits regardless: a routine that shields itself or blocks the event loop cannot keep it alive.
_ORPHAN_GRACE = 5.0
# Seconds between tries to accept a connection while the process is out of descriptors.
_ACCEPT_BACKOFF = 0.1
#: The largest ``--max-concurrency``.
MAX_CONCURRENCY = 1 << 20
_ORPHANED_EXIT_CODE = 70


async def _open_listener(
    address: Address | None, home: Path | None
) -> tuple[SocketListener, Address, _socket_dir.Home | None, Path | None]:
    """(listener, announced address, the socket's locked home if any, a bare socket path)."""
    if address is None:
        owned = _socket_dir.Home(home or _socket_dir.choose())
        try:
            listener = await anyio.create_unix_listener(owned.socket, mode=0o600)
        except BaseException:
            owned.remove()
            raise
        return listener, Address.unix(owned.socket), owned, None
    if address.path is not None:
        path = Path(address.path)
        listener = await anyio.create_unix_listener(path, mode=0o600)
        return listener, address, None, path
    raise SystemExit(
        f"anywool.worker: refusing to listen on {str(address)!r}: TCP listeners need peer "
        "authentication (mutual TLS or an HMAC challenge), which is not implemented yet; "
        "use a unix: address"
    )


def _exit_when_orphaned(control: int, cleanup: Callable[[], None]) -> None:
    """Thread body: once stdin hangs up (the parent closed it or died), give the event loop
    :data:`_ORPHAN_GRACE` seconds to stop the worker, then remove its socket and exit anyway.

    It never reads stdin (the event loop does): it polls for the hang-up only."""
    poller = select.poll()
    poller.register(control, 0)  # POLLHUP and POLLERR are always reported
    while not any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
                  for _, event in poller.poll()):
        pass
    time.sleep(_ORPHAN_GRACE)
    try:
        cleanup()
    finally:
        os._exit(_ORPHANED_EXIT_CODE)


async def _accept(listener: SocketListener,
                  handler: Callable[[ByteStream], Coroutine[Any, Any, None]],
                  handlers: TaskGroup) -> None:
    # Handlers run in ``handlers``. Closing the listener stops accepting, nothing else: under
    # asyncio, anyio's close deregisters the pending accept before waking it, whereas cancelling
    # it can make the loop report InvalidStateError if a client connects in that iteration.
    # Out of descriptors or memory, the worker waits for some to be freed (the pending client
    # stays in the backlog) and goes on serving what it has.
    warned = False
    while True:
        try:
            stream = await listener.accept()
        except anyio.ClosedResourceError:
            return
        except anyio.BrokenResourceError as exc:
            if not exhausted(exc.__cause__):
                raise
            if not warned:
                log.warning("cannot accept a connection (%s); trying again every %s s",
                            exc.__cause__, _ACCEPT_BACKOFF)
                warned = True
            await anyio.sleep(_ACCEPT_BACKOFF)
            continue
        warned = False
        handlers.start_soon(handler, stream)


async def serve(address: Address | None = None, home: Path | None = None, *,
                max_concurrency: int | None = None,
                lifeline: _lifeline.Lifeline | None = None, control: int = 0) -> None:
    """Listen, announce the address on stdout, serve until stopped, clean up.

    :param max_concurrency: the most calls run at once (``None``: no bound); a call beyond it
        is refused before it runs.
    :param lifeline: the sidecar watching our parent, whose pidfd we watch too; ``None``: a
        watchdog thread watches stdin instead (unless it is a terminal).
    :param control: the descriptor of the parent's pipe (stop requests, EOF), see
        :func:`_take_stdin`.
    """
    idle_timeout = idle_timeout_from_environment()
    listener, announced, owned, path = await _open_listener(address, home)

    def remove_socket() -> None:
        if owned is not None:
            owned.remove()
        if path is not None:
            path.unlink(missing_ok=True)

    if lifeline is None and not os.isatty(control):
        threading.Thread(target=_exit_when_orphaned, args=(control, remove_socket), daemon=True,
                         name="anywool-orphan-watchdog").start()
    try:
        async with anyio.create_task_group() as main_tg:
            worker = Server(str(announced), NestedProxies(main_tg, idle_timeout, str(announced)),
                             max_concurrency, control)
            main_tg.start_soon(worker.watch_stdin)
            if lifeline is not None:
                main_tg.start_soon(worker.watch_parent, lifeline.parent)
            main_tg.start_soon(worker.watch_signals)
            async with anyio.create_task_group() as serving:
                serving.start_soon(_accept, listener, worker.handle, serving)
                sys.stdout.write(f"{announced}\n")
                sys.stdout.flush()
                os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # later output → stderr
                await worker.stop.requested.wait()
                worker.stop.draining = True
                await worker.stop.drain()
                with anyio.CancelScope(shield=True):
                    await listener.aclose()  # stop accepting
                await worker.cancel_calls(REPLY_TIMEOUT)
                # Before the connections: a proxy connected to this worker hangs up itself.
                with anyio.move_on_after(LINGER):
                    await worker.nested.close()
                # Half-close, so that clients end their streams themselves: a receive that is
                # cancelled rather than ended can make asyncio report InvalidStateError.
                await worker.close_connections(LINGER)
                serving.cancel_scope.cancel()
            main_tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await listener.aclose()
        remove_socket()


def _apply_parent_environment() -> None:
    paths = os.environ.pop(SYS_PATH_ENV, None)
    if paths:
        parent = [p for p in json.loads(paths) if isinstance(p, str)]
        sys.path[:] = parent + [p for p in sys.path if p not in parent]


def _start_lifeline(address: Address | None, home: Path | None) -> _lifeline.Lifeline | None:
    """Fork the sidecar that ends us if our parent dies, when the parent gave its pid (see
    :mod:`anywool.runtime._lifeline`); exit at once, code 70, if that parent is already gone.

    With neither ``address`` nor ``home`` the sidecar does not know the directory the listener
    will choose: after killing us it leaves it to the next claim's sweep.
    """
    text = os.environ.pop(PARENT_PID_ENV, None)
    if text is None:
        return None  # run by hand: stdin is the lifeline
    try:
        parent = int(text)
    except ValueError:
        log.warning("ignoring malformed $%s %r", PARENT_PID_ENV, text)
        return None
    leftover = home if address is None else Path(address.path) if address.path else None
    try:
        return _lifeline.start(parent, leftover, _ORPHAN_GRACE)
    except _lifeline.ParentGone:
        raise SystemExit(_ORPHANED_EXIT_CODE) from None


def _take_stdin() -> int:
    """Move the parent's pipe off descriptor 0, and give routines ``/dev/null`` as stdin:
    nothing a routine does to its stdin (read it, close it) touches the stop requests and the
    end-of-file the pipe carries. Returns the pipe's new descriptor (not inherited)."""
    control = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return control


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(
            f"must be an int from 1 to {MAX_CONCURRENCY}, got {text!r}")
    return value


def _bind_address(text: str) -> Address:
    try:
        return Address.parse(text, bind=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m anywool.worker``."""
    parser = argparse.ArgumentParser(prog="python -m anywool.worker")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--address", default=None, type=_bind_address,
        help="unix:/path (default: a socket in the runtime dir)"
    )
    parser.add_argument(
        "--home", default=None, type=Path,
        help="the directory to create for the socket (default: a fresh one in the runtime dir)"
    )
    parser.add_argument(
        "--max-concurrency", default=None, type=_positive_int, metavar="N",
        help="run at most N calls at once, refusing more before they run (default: no bound)"
    )
    options = parser.parse_args(argv)
    _apply_parent_environment()
    logging.basicConfig(level=logging.WARNING, format="anywool.worker[%(process)d] %(message)s")
    # Default SIGINT handling would raise KeyboardInterrupt; we want "drain" instead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before any thread, event loop or listener exists: the sidecar is forked from us as we are.
    lifeline = _start_lifeline(options.address, options.home)
    control = _take_stdin()
    try:
        anyio.run(functools.partial(serve, options.address, options.home,
                                    max_concurrency=options.max_concurrency, lifeline=lifeline,
                                    control=control),
                  backend=options.backend)
    finally:
        if lifeline is not None:
            lifeline.close()  # nothing outlives the worker, and no zombie is left
