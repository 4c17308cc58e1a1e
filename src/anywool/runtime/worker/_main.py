"""The worker process: ``python -m anywool.worker --backend asyncio|trio [--home DIR | --address ADDR]``.

It runs its own event loop on the requested backend, listens on a Unix socket in a directory of
its own inside the runtime directory (``0600`` socket in ``0700`` directories: only the same user
can dispatch; the directory is locked for the worker's life, see
:mod:`anywool.runtime._socket_dir`), or on TCP (``--address host:port``, port ``0`` for any),
and prints its address as one line on stdout. A frame is pickled code, so a TCP listener
authenticates every peer before it reads a frame (:mod:`anywool.runtime.wire._auth`), with the secret
its parent handed it (or ``$ANYWOOL_SECRET``) and/or mutual TLS (``--tls-cert``, ``--tls-key``,
``--tls-ca``); without credentials it refuses to listen on TCP. At most 256 handshakes are
pending at once, 2 s each, the oldest dropped for a newcomer
(:mod:`anywool.runtime.worker._gatekeeper`). Bound to the wildcard
(``0.0.0.0`` or ``::``) it announces a routable address of this host
(:func:`anywool._interfaces.routable_host`). Everything it prints afterwards (including routines'
``print``) goes to stderr, so the pipe its parent reads can never fill up and block it.

Calls run concurrently, served by :class:`~anywool.runtime.worker._server.Server`; a connection that
closes cancels its calls. The worker stops:

* on a stop request, a line ``stop <grace>`` on stdin: ``grace`` seconds to drain in-flight calls
  (new ones are refused with ``NACK``), ``0`` to cancel them now, negative to drain for as long
  as they take (a later request with a grace ≥ 0 bounds that drain, from when it comes);
* at EOF on stdin (its parent closed the pipe or died, even by SIGKILL), or when its parent
  exits (seen on a pidfd, also while another process holds the pipe's write end): cancels now.
  If it has not exited 5 s after that (a routine that shields itself, or blocks the event loop,
  even in C code holding the GIL), its lifeline, a sidecar process forked at start-up
  (:mod:`anywool.runtime.worker._lifeline`), SIGKILLs it and removes its socket directory. Without
  pidfds, or run by hand (no ``$ANYWOOL_WORKER_PARENT_PID``), a watchdog thread does the same
  5 s after stdin hangs up, when the GIL lets it run;
* on SIGTERM: cancels now; on SIGINT: drains forever.

The socket file is removed at exit.

The parent's pipe is moved off descriptor 0 at start-up, and routines get ``/dev/null`` as their
stdin: reading or closing it never touches the stop requests.

The parent passes its ``sys.path`` in ``$ANYWOOL_WORKER_SYS_PATH`` (JSON list) and its working
directory as ours, so that routines defined in its modules import here by reference, and its
pid in ``$ANYWOOL_WORKER_PARENT_PID``: a worker whose parent is already gone exits at once (70).
It passes the worker's uid and namespace in ``$ANYWOOL_WORKER_UID`` and
``$ANYWOOL_WORKER_NAMESPACE``, for its spans (:mod:`anywool.runtime._telemetry`). The modules
named in ``$ANYWOOL_WORKER_IMPORT`` (comma-separated; inherited, not consumed) are imported once
the worker is set up, before it serves: where a user configures an OpenTelemetry SDK, say. One
that fails to import fails the start (its error is the line on stdout). Every such name, line
and bound, and what each side does with it, is in :mod:`anywool.runtime.worker._contract`.
"""


from __future__ import annotations

import argparse
import functools
import importlib
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
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

import anyio
from anyio.abc import ByteStream, Listener, SocketAttribute, SocketListener, TaskGroup
from anyio.streams.stapled import MultiListener

from anywool import _interfaces, _secret
from anywool._address import Address
from anywool._duration import seconds
from anywool._errno import exhausted
from anywool.runtime import _lifespan, _output, _socket_dir, _telemetry
from anywool.runtime.wire import _serializer as serializer
from anywool.runtime.wire import _socket, _stats
from anywool.runtime.worker import _interrupt, _lifeline
from anywool.runtime.worker._contract import (
    IMPORT_ENV,
    LIFESPAN_ENV,
    MAX_CONCURRENCY,
    NAMESPACE_ENV,
    ORPHANED_EXIT_CODE,
    OUTPUT_LEVEL_ENV,
    PARENT_PID_ENV,
    PARENT_PIDFD_ENV,
    RETIRING,
    SECRET_ENV,
    STARTUP_ERROR,
    STOP_TAIL,
    SYS_PATH_ENV,
    UID_ENV,
)
from anywool.runtime.worker._nested import NestedProxies, idle_timeout_from_environment
from anywool.runtime.worker._server import REPLY_TIMEOUT, Server

if TYPE_CHECKING:  # imported when needed: authentication only when there are credentials
    from anywool.runtime.wire import _auth
    from anywool.runtime.worker import _gatekeeper

log = logging.getLogger("anywool.worker")

#: How often (seconds) a worker with a max_memory looks at its resident set.
MEMORY_CHECK_INTERVAL = 0.1

# Once its parent is gone (stdin hung up), the seconds a worker has to stop by itself before it
# exits regardless: a routine that shields itself or blocks the event loop cannot keep it alive.
_ORPHAN_GRACE = 5.0
# Seconds between tries to accept a connection while the process is out of descriptors.
_ACCEPT_BACKOFF = 0.1


async def _open_listener(
    address: Address | None, home: Path | None
) -> tuple[Listener[ByteStream], Address, _socket_dir.Home | None, Path | None]:
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
    assert address.host is not None and address.port is not None
    host = address.host
    try:
        tcp = await anyio.create_tcp_listener(local_host=host, local_port=address.port)
    except OSError as exc:  # gaierror included: a name that does not resolve
        # Said on stdout, where the parent waits for the address: one line it can raise.
        reason = exc.strerror or str(exc) or type(exc).__name__
        _start_failed(f"cannot listen on {address}: {reason}")
        raise SystemExit(1) from None
    port = tcp.extra(SocketAttribute.local_port)
    if host in _interfaces.WILDCARDS:
        host = _interfaces.routable_host(host)
    return tcp, Address.tcp(host, port), None, None


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
        os._exit(ORPHANED_EXIT_CODE)


def _sockets(listener: Listener[ByteStream]) -> list[SocketListener]:
    """The socket listeners behind ``listener``: a TCP host name may resolve to several
    addresses, one listener each (anyio's ``MultiListener``)."""
    if isinstance(listener, MultiListener):
        return [cast(SocketListener, one) for one in listener.listeners]
    return [cast(SocketListener, listener)]


async def _accept(listener: SocketListener,
                  handler: Callable[[ByteStream], Coroutine[Any, Any, None]],
                  handlers: TaskGroup, gate: _gatekeeper.Gatekeeper | None = None) -> None:
    # Handlers run in ``handlers``, each on a connection of our own (_socket.SocketStream: anyio
    # listens and binds, we accept). Closing the listener (_close_listener) stops accepting,
    # nothing else. Out of descriptors or memory, the worker waits for some to be freed (the
    # pending client stays in the backlog) and goes on serving what it has. With ``gate``, each
    # connection authenticates first, within the gate's bounds (worker._gatekeeper).
    sock = listener.extra(SocketAttribute.raw_socket)
    warned = False
    while True:
        try:
            if gate is not None:
                await gate.make_room(sock)
            stream = await _socket.accept(sock)
        except anyio.ClosedResourceError:
            return
        except OSError as exc:
            cause = exc
            if not exhausted(cause):
                raise
            if not warned:
                log.warning("cannot accept a connection (%s); trying again every %s",
                            cause, seconds(_ACCEPT_BACKOFF))
                warned = True
            await anyio.sleep(_ACCEPT_BACKOFF)
            continue
        warned = False
        if gate is not None:
            gate.admit(stream, handlers)
        else:
            handlers.start_soon(handler, stream)


async def _close_listener(listener: Listener[ByteStream]) -> None:
    """Close ``listener``, first waking the accept loops waiting on its sockets (they end)."""
    for one in _sockets(listener):
        try:
            anyio.notify_closing(one.extra(SocketAttribute.raw_socket))
        except (anyio.TypedAttributeLookupError, OSError):
            pass  # closed already
    await listener.aclose()


async def serve(address: Address | None = None, home: Path | None = None, *,
                max_concurrency: int | None = None,
                credentials: _auth.Credentials | None = None,
                lifeline: _lifeline.Lifeline | None = None, control: int = 0,
                lifespan: _lifespan.Lifespan | None = None,
                max_calls: int | None = None, max_memory: int | None = None) -> None:
    """Listen, enter the lifespan, announce the address on stdout, serve until stopped, exit
    the lifespan, clean up.

    :param credentials: what a TCP peer must authenticate with (required for TCP; unused on a
        Unix socket, where the file's mode admits the same user only).
    :param max_concurrency: the most calls run at once (``None``: no bound); a call beyond it
        is refused before it runs.
    :param lifeline: the sidecar watching our parent, whose pidfd we watch too; ``None``: a
        watchdog thread watches stdin instead (unless it is a terminal).
    :param control: the descriptor of the parent's pipe (stop requests, EOF), see
        :func:`_take_stdin`.
    :param lifespan: the worker's lifespan (see :mod:`anywool.runtime._lifespan`); one that
        fails on entry is said on stdout instead of the address, and the worker exits 1.
    :param max_calls: retire after taking this many calls (``None``: never).
    :param max_memory: retire once the resident set passes this many bytes, looked at every
        :data:`MEMORY_CHECK_INTERVAL` seconds (``None``: never).

    Retiring (see :meth:`Server.retire`), the worker writes ``retiring <reason>`` as a line
    on its original stdout (where its parent read the address, and goes on reading), and
    waits to be stopped as ever. The pool that spawned it hears there, too, of the recycle
    requests it passes on, its idleness and the call it was asked to report (see
    :class:`Server`).
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
    interrupter: _interrupt.Interrupter | None = None
    failed = False
    try:
        async with anyio.create_task_group() as main_tg:
            worker = _start_server(main_tg, str(announced), idle_timeout, max_concurrency,
                                   control, max_calls, lifeline)
            # Before the worker announces itself: a stop signal from then on is never lost.
            interrupter = worker.interrupter(None if lifeline is None else lifeline.parent)
            interrupter.install()
            main_tg.start_soon(interrupter.heartbeat)
            running = await _enter_lifespan(lifespan, worker, announced)
            if running is None:
                failed = True
                main_tg.cancel_scope.cancel()
                return
            async with running.entered(), anyio.create_task_group() as serving:
                too_large = _over(max_memory)
                if too_large is not None:
                    # It could never take a call: a start that fails (its replacements too,
                    # given up after a few), rather than one that retires at once, for ever.
                    _start_failed(f"once started, {too_large}")
                    failed = True
                    main_tg.cancel_scope.cancel()
                    return
                _start_accepting(serving, listener, worker, announced, credentials)
                if max_memory is not None:
                    # Only now (it runs at the next checkpoint, after the address is said): a
                    # "retiring" line before the address would be taken for it.
                    main_tg.start_soon(_watch_memory, worker, max_memory)
                _announce(announced)
                await worker.stop.requested.wait()
                await _stop(worker, listener)
                serving.cancel_scope.cancel()
            main_tg.cancel_scope.cancel()
    finally:
        if interrupter is not None:
            interrupter.close()
        with anyio.CancelScope(shield=True):
            await _close_listener(listener)
        remove_socket()
        if failed:  # here: its start failed where the main task returns
            raise SystemExit(1)  # noqa: B012


def _start_server(main_tg: TaskGroup, address: str, idle_timeout: float,
                  max_concurrency: int | None, control: int, max_calls: int | None,
                  lifeline: _lifeline.Lifeline | None) -> Server:
    """The worker's server, its nested proxies hosted in ``main_tg``, its notices written to
    the parent on our stdout as it is now (the notices pipe of
    :mod:`anywool.runtime.worker._contract`); and, in ``main_tg``, the tasks that watch the
    parent's pipe (``control``), its pidfd (with a ``lifeline``) and the worker's idleness."""
    notices = os.dup(sys.stdout.fileno())  # stdout itself goes to stderr (see _announce)
    os.set_inheritable(notices, False)

    def say(notice: str) -> None:
        try:
            os.write(notices, f"{notice}\n".encode())
        except OSError:  # our parent closed its end: it stops us anyway
            pass

    def say_retiring(reason: str) -> None:
        say(f"{RETIRING}{reason}")

    worker = Server(address, NestedProxies(main_tg, idle_timeout, address), max_concurrency,
                    control, max_calls=max_calls, on_retire=say_retiring, notify=say)
    main_tg.start_soon(worker.watch_stdin)
    main_tg.start_soon(worker.watch_idle)
    if lifeline is not None:
        main_tg.start_soon(worker.watch_parent, lifeline.parent)
    return worker


async def _enter_lifespan(lifespan: _lifespan.Lifespan | None, worker: Server,
                          announced: Address) -> _lifespan.Running | None:
    """Enter the worker's lifespan (none: just publish ``current_worker()``); ``None``: it
    failed, and the line on stdout says why."""
    info = _lifespan.WorkerInfo(_worker_uid(), _telemetry.worker.get("anywool.namespace"),
                                str(announced), os.getpid())
    # SIGTERM cancels the lifespan's exit, also one under way (a close that hangs).
    running = _lifespan.Running(lifespan, info, worker.stop.cancelled_by_sigterm)
    try:
        await running.__aenter__()
    except Exception as exc:
        _start_failed(f"its lifespan failed to start: {exc!r}")
        return None
    return running


def _start_accepting(serving: TaskGroup, listener: Listener[ByteStream], worker: Server,
                     announced: Address, credentials: _auth.Credentials | None) -> None:
    """Accept connections on every socket of ``listener``, each handled by ``worker`` in
    ``serving``; on TCP, each peer authenticates first
    (:mod:`anywool.runtime.worker._gatekeeper`)."""
    gate = None
    if not announced.is_unix:
        from anywool.runtime.worker import _gatekeeper

        assert credentials is not None
        gate = _gatekeeper.Gatekeeper(credentials, str(announced), worker.handle)
    for one in _sockets(listener):
        serving.start_soon(_accept, one, worker.handle, serving, gate)


def _announce(announced: Address) -> None:
    """Say the address, the line on stdout the parent waits for; from then on, what this
    process writes to stdout goes to stderr (the pipe carries notices only)."""
    sys.stdout.write(f"{announced}\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


async def _stop(worker: Server, listener: Listener[ByteStream]) -> None:
    """Stop, as requested: drain the calls in flight for the grace asked for, stop accepting,
    then, within :data:`~anywool.runtime.worker._contract.STOP_TAIL`, cancel the calls still
    running, close the nested proxies and the connections."""
    worker.stop.draining = True
    await worker.stop.drain()
    with anyio.CancelScope(shield=True):
        await _close_listener(listener)  # stop accepting
    tail = anyio.current_time() + STOP_TAIL
    await worker.cancel_calls(REPLY_TIMEOUT)
    # Before the connections: a proxy connected to this worker hangs up itself.
    with anyio.move_on_at(tail):
        await worker.nested.close()
    # Half-close, so that clients end their streams themselves: a receive that is
    # cancelled rather than ended can make asyncio report InvalidStateError.
    await worker.close_connections(tail)


def _start_failed(reason: str) -> None:
    """Say why the start failed, as the one line on stdout where the parent waits for the
    address (it raises it as a WorkerError)."""
    sys.stdout.write(f"{STARTUP_ERROR}{reason}\n")
    sys.stdout.flush()


def _over(limit: int | None) -> str | None:
    """Why this process's resident set is past ``limit`` bytes, in words; ``None``: it is not
    (or there is no limit, or it cannot be known)."""
    if limit is None:
        return None
    size, _ = _stats.memory()
    if size is not None and size > limit:
        return f"its memory ({size / 2**20:.1f} MiB) passed its max_memory " \
               f"({limit / 2**20:.1f} MiB)"
    return None


async def _watch_memory(worker: Server, limit: int) -> None:
    """Retire ``worker`` once this process's resident set passes ``limit`` bytes."""
    while worker.retiring is None:
        reason = _over(limit)
        if reason is not None:
            worker.retire(reason)
            return
        await anyio.sleep(MEMORY_CHECK_INTERVAL)


def _worker_uid() -> UUID | None:
    text = _telemetry.worker.get("anywool.worker.uid")
    try:
        return None if text is None else UUID(text)
    except ValueError:
        return None


def _apply_parent_environment() -> None:
    paths = os.environ.pop(SYS_PATH_ENV, None)
    if paths:
        parent = [p for p in json.loads(paths) if isinstance(p, str)]
        sys.path[:] = parent + [p for p in sys.path if p not in parent]


def _start_lifeline(address: Address | None, home: Path | None) -> _lifeline.Lifeline | None:
    """Fork the sidecar that ends us if our parent dies, when the parent gave its pid (see
    :mod:`anywool.runtime.worker._lifeline`); exit at once, code 70, if that parent is already gone.

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
    # Forked by the pool's template: the pool is our grandparent, and the template checked the
    # pidfd on it we inherit (see pool/_template_process).
    pidfd_text = os.environ.pop(PARENT_PIDFD_ENV, None)
    parent_pidfd = int(pidfd_text) if pidfd_text is not None and pidfd_text.isdigit() else None
    try:
        return _lifeline.start(parent, leftover, _ORPHAN_GRACE, parent_pidfd)
    except _lifeline.ParentGone:
        raise SystemExit(ORPHANED_EXIT_CODE) from None


def _import_setup_modules() -> None:
    """Import the modules ``$ANYWOOL_WORKER_IMPORT`` names; one that fails exits the worker,
    saying why on stdout (where its parent waits for the address)."""
    for name in filter(None, (part.strip() for part in
                              os.environ.get(IMPORT_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except BaseException as exc:
            _start_failed(f"${IMPORT_ENV}: cannot import {name!r}: {exc!r}")
            raise SystemExit(1) from None


def _take_stdin() -> int:
    """Move the parent's pipe off descriptor 0, and give routines ``/dev/null`` as stdin:
    nothing a routine does to its stdin (read it, close it) touches the stop requests and the
    end-of-file the pipe carries. Returns the pipe's new descriptor (not inherited)."""
    control = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return control


def _positive_int(text: str, upper: int = MAX_CONCURRENCY) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= upper:
        raise argparse.ArgumentTypeError(f"must be an int from 1 to {upper}, got {text!r}")
    return value


def _count(text: str) -> int:
    return _positive_int(text, 1 << 62)


def _bind_address(text: str) -> Address:
    try:
        return Address.parse(text, bind=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _credentials(parser: argparse.ArgumentParser,
                 options: argparse.Namespace) -> _auth.Credentials | None:
    """The worker's credentials, also made its process's own (for the proxies its routines'
    nested calls go through); exits with a usage error when they are invalid, or missing for a
    TCP address."""
    address = options.address
    wants_tls = bool(options.tls_cert or options.tls_key or options.tls_ca)
    try:
        secret = _secret.resolve(None, "secret")
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    credentials = tls = None
    if secret is not None or wants_tls:
        # Only then the authentication machinery: the usual Unix worker of a pool without a
        # secret saves importing it (and ssl), a few ms of every worker's start.
        from anywool._tls import MutualTLS
        from anywool.runtime.wire import _auth

        if wants_tls:
            if not (options.tls_cert and options.tls_ca):
                parser.error("mutual TLS needs --tls-cert and --tls-ca (and --tls-key unless "
                             "the key is in the certificate file)")
            try:
                tls = MutualTLS(options.tls_cert, options.tls_key, cafile=options.tls_ca)
            except (TypeError, ValueError) as exc:
                parser.error(str(exc))
        credentials = _auth.Credentials.resolve(secret, tls)
        if tls is not None:
            _auth.set_process_tls(tls)
    if address is not None and not address.is_unix and credentials is None:
        parser.error(_no_credentials(address))
    return credentials


def _no_credentials(address: Address) -> str:
    return (f"refusing to listen on {str(address)!r} without credentials: a TCP peer can send "
            f"code, so it must authenticate; set ${_secret.ENV} (at least "
            f"{_secret.MIN_LENGTH} bytes) or pass --tls-cert and --tls-ca")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m anywool.worker``."""
    parser = argparse.ArgumentParser(prog="python -m anywool.worker")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--address", default=None, type=_bind_address,
        help="unix:/path or host:port, port 0 for any (default: a socket in the runtime dir); "
             "TCP needs credentials: a secret ($ANYWOOL_SECRET) or --tls-*"
    )
    parser.add_argument("--tls-cert", default=None, metavar="PEM",
                        help="mutual TLS: this worker's certificate chain (and key)")
    parser.add_argument("--tls-key", default=None, metavar="PEM",
                        help="mutual TLS: the private key, when not in --tls-cert")
    parser.add_argument("--tls-ca", default=None, metavar="PEM",
                        help="mutual TLS: the CA bundle that peers' certificates must chain to")
    parser.add_argument(
        "--home", default=None, type=Path,
        help="the directory to create for the socket (default: a fresh one in the runtime dir)"
    )
    parser.add_argument(
        "--max-concurrency", default=None, type=_positive_int, metavar="N",
        help="run at most N calls at once, refusing more before they run (default: no bound)"
    )
    parser.add_argument(
        "--max-calls", default=None, type=_count, metavar="N",
        help="retire after taking N calls: refuse more, finish those running, say so on "
             "stdout and wait to be stopped (default: never)"
    )
    parser.add_argument(
        "--max-memory", default=None, type=_count, metavar="BYTES",
        help="retire once the resident set passes BYTES (default: never)"
    )
    options = parser.parse_args(argv)
    _secret.inherit(os.environ.pop(SECRET_ENV, None))
    credentials = _credentials(parser, options)
    _apply_parent_environment()
    logging.basicConfig(level=logging.WARNING, format="anywool.worker[%(process)d] %(message)s")
    # What routines log and print goes to their callers (see runtime._output); the rest here.
    _output.install(_output.decode_level(os.environ.pop(OUTPUT_LEVEL_ENV, None),
                                         OUTPUT_LEVEL_ENV))
    # Default SIGINT handling would raise KeyboardInterrupt; we want "drain" instead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serializer.take_interrupts_as_values()  # so only a value can raise one here
    # An ignored signal stays ignored across exec: a parent that ignores SIGTERM (a
    # supervisor's or a shell's choice) must not make us ignore it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Before any thread, event loop or listener exists: the sidecar is forked from us as we are.
    lifeline = _start_lifeline(options.address, options.home)
    control = _take_stdin()
    # After the fork: what these modules start (an exporter's thread, say) stays here.
    _telemetry.set_worker(os.environ.pop(UID_ENV, None), os.environ.pop(NAMESPACE_ENV, None))
    _import_setup_modules()
    try:
        lifespan = _lifespan.decode(os.environ.pop(LIFESPAN_ENV, None), LIFESPAN_ENV)
    except ValueError as exc:
        _start_failed(str(exc))
        raise SystemExit(1) from None
    backend_options = {}
    if options.backend == "asyncio":
        from anywool.runtime.worker._asyncio_loop import loop_factory

        backend_options["loop_factory"] = loop_factory
    try:
        anyio.run(functools.partial(serve, options.address, options.home,
                                    max_concurrency=options.max_concurrency,
                                    credentials=credentials, lifeline=lifeline,
                                    control=control, lifespan=lifespan,
                                    max_calls=options.max_calls,
                                    max_memory=options.max_memory),
                  backend=options.backend, backend_options=backend_options)
    finally:
        if lifeline is not None:
            lifeline.close()  # nothing outlives the worker, and no zombie is left
