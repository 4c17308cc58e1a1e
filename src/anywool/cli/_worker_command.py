"""``anywool worker``: host workers announced into a namespace until SIGINT or SIGTERM.

The workers are a :class:`~anywool.WorkerPool`'s spawned workers, announced through
``LanDiscovery(namespace)`` (TCP, authenticated, on every interface by default),
``EtcdDiscovery(namespace, ...)`` (TCP likewise; the command owns the namespace in the cluster
the ``--etcd*`` options name, or with ``--join`` borrows one another process owns:
``own=False``) or ``LocalDiscovery(namespace)`` (this host; the command owns the namespace). A
pool elsewhere dispatches to them by subscribing to that namespace. On SIGINT or SIGTERM the command stops
taking calls, withdraws the workers, lets their calls drain for ``--drain`` seconds, stops them
and exits 0; a second signal cuts the drain short.

Standard output is for scripts: ``starting`` once the command handles the signals itself, one
``worker <address> pid <pid>`` line per worker, then ``ready``; ``stopping`` when the first
signal arrives, and ``stopped`` at the end; each line is flushed at once. A signal that arrives
after ``starting`` and before ``ready`` cuts the start short: the workers already spawned are
stopped, ``stopping`` and ``stopped`` are said and the command exits 0 without ``ready``. One
that arrives before ``starting`` ends the command at once the default way (SIGTERM kills it,
SIGINT interrupts it as it does any Python program).

Signals are never ignored between ``starting`` and the end: until the event loop's receiver is
open, and again after it closes, a handler notes them (a signal noted before the receiver opened
stops the command before it starts anything); only once the command is done are they ignored,
so that one arriving as the interpreter exits does not kill it after it said ``stopped``.

SIGHUP, once ``ready``, replaces every worker one at a time (:meth:`WorkerPool.recycle
<anywool.WorkerPool.recycle>`: new code and configuration, no call lost): ``recycling``, then
``worker <address> pid <pid>`` per new worker and ``recycled``, or ``recycle failed: <why>``
(the workers not replaced keep running). One that arrives during a recycle is taken after it;
before ``ready`` SIGHUP is ignored (from ``starting`` on). ``anywool recycle NS``, from another
process or host, does the same through one of the workers (see
:mod:`anywool.cli._recycle_command`), with the same lines.

``--idle-timeout SECONDS`` retires a worker that ran no call for that long, not replaced, while
more than ``--min-workers`` run; calls coming again start them again, one at a time, up to
``--workers`` (see ``WorkerPool(idle_timeout=..., min_workers=...)``).
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import click

from anywool import _interfaces, _secret
from anywool._tls import MutualTLS
from anywool.cli._etcd_ops import DEFAULT_ENDPOINT, EtcdCluster, etcd_options, given_options
from anywool.errors import (
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryServiceError,
    DiscoveryUnavailable,
    WorkerError,
)
from anywool.runtime.pool._pool import MAX_SPAWN, WorkerPool

__all__ = ["worker"]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def read_tls(tls_cert: str | None, tls_key: str | None, tls_ca: str | None
              ) -> MutualTLS | None:
    """The mutual TLS the --tls-* options give (``None``: none given).

    :raises click.UsageError: --tls-cert or --tls-ca missing, or the files are unusable.
    """
    if not (tls_cert or tls_key or tls_ca):
        return None
    if not (tls_cert and tls_ca):
        raise click.UsageError("mutual TLS needs --tls-cert and --tls-ca")
    try:
        return MutualTLS(tls_cert, tls_key, cafile=tls_ca)
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None


def read_secret(path: Path | None) -> bytes | None:
    """The secret in ``path``: its bytes without surrounding whitespace (what an editor or
    ``echo`` leaves at the end is not part of it). Refused when others may read the file."""
    if path is None:
        return None
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}",
                                 param_hint="--secret-file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise click.BadParameter(
            f"{path} is accessible to other users (mode {stat.S_IMODE(mode):04o}): whoever "
            f"reads the secret can run code on the workers; chmod 600 {path}",
            param_hint="--secret-file")
    secret = data.strip()
    try:
        return _secret.resolve(secret, "the secret in --secret-file")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--secret-file") from None


@click.command()
@click.option("--discovery", type=click.Choice(["lan", "etcd", "local"]), default="lan",
              show_default=True,
              help="lan: announce over mDNS to the LAN (TCP workers); etcd: in an etcd cluster "
                   "(TCP workers; see --etcd); local: this host only.")
@click.option("--namespace", "-n", required=True, help="The namespace to announce the workers in.")
@click.option("--workers", "-w", type=click.IntRange(min=1, max=MAX_SPAWN), default=1,
              show_default=True, help="Worker processes to host.")
@click.option("--host", default=None,
              help="Address the workers listen on (TCP). Default with lan and etcd: the first "
                   "non-loopback --interface (lan), else 0.0.0.0, announcing a routable address "
                   "of this host; with local: a Unix socket.")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"File holding the shared secret (at least {_secret.MIN_LENGTH} bytes). "
                   f"Default: ${_secret.ENV}.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Mutual TLS: this host's certificate chain (PEM, with its key unless "
                   "--tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Mutual TLS: the private key (PEM).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Mutual TLS: the CA bundle peers' certificates must chain to (PEM).")
@click.option("--tag", "tags", multiple=True, help="A tag for the workers (repeatable).")
@click.option("--interface", "interfaces", multiple=True,
              help="lan: the IP address of an interface to multicast on (repeatable; default: "
                   "all).")
@etcd_options(f"etcd: a member's client URL (repeatable; default {DEFAULT_ENDPOINT}).")
@click.option("--etcd-lease-ttl", type=click.IntRange(min=1), default=None,
              help="etcd: seconds a dead owner's claim and dead workers outlive their last "
                   "lease renewal (default: 5).")
@click.option("--join", is_flag=True,
              help="etcd: borrow a namespace another process owns instead of owning it.")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True, help="Event loop of this command and its workers. (trio: pip install 'anywool[trio]')")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="The most calls each worker runs at once (default: no bound).")
@click.option("--drain", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds in-flight calls get to finish at shutdown.")
@click.option("--lifespan", default=None, metavar="MODULE:NAME",
              help="An async context manager factory each worker enters before it takes "
                   "calls and exits after its last one (routines reach what it yields as "
                   "anywool.current_worker().state); imported from the current directory or "
                   "sys.path.")
@click.option("--max-calls", type=click.IntRange(min=1), default=None, metavar="N",
              help="Each worker retires after N calls and is replaced (default: never).")
@click.option("--max-memory", type=click.IntRange(min=1 << 20), default=None, metavar="BYTES",
              help="Each worker retires once its resident set passes BYTES and is replaced "
                   "(default: never).")
@click.option("--idle-timeout", type=float, default=None, metavar="SECONDS",
              help="Retire a worker that ran no call for SECONDS (at least 0.1), not replaced, "
                   "while more than --min-workers run; calls coming again start them again, "
                   "one at a time, up to --workers (default: never).")
@click.option("--min-workers", type=int, default=None, metavar="N",
              help="With --idle-timeout: the fewest workers idleness leaves running (1 to "
                   "--workers; default 1).")
def worker(discovery: str, namespace: str, workers: int, host: str | None,
           secret_file: Path | None, tls_cert: str | None, tls_key: str | None,
           tls_ca: str | None, tags: tuple[str, ...], interfaces: tuple[str, ...],
           etcd_lease_ttl: int | None, join: bool, backend: str, max_concurrency: int | None,
           drain: float, lifespan: str | None, max_calls: int | None,
           max_memory: int | None, idle_timeout: float | None, min_workers: int | None,
           **etcd: Any) -> None:
    """Host worker processes announced into the --namespace NS until SIGINT or SIGTERM.

    A pool in another process, or on another host, dispatches to them with
    WorkerPool(discovery=LanDiscovery.Subscriber(NS), secret=...) (lan),
    WorkerPool(discovery=EtcdDiscovery.Subscriber(NS, endpoints=...), secret=...) (etcd) or
    WorkerPool(discovery=LocalDiscovery.Subscriber(NS)) (local).
    """
    if not namespace:
        raise click.BadParameter("must not be empty", param_hint="--namespace")
    if discovery != "etcd":
        given = given_options(etcd) + ["--etcd-lease-ttl"] * (etcd_lease_ttl is not None) \
            + ["--join"] * join
        if given:
            raise click.UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} "
                                   "for --discovery etcd only")
    if interfaces and discovery != "lan":
        raise click.UsageError("--interface applies to --discovery lan only")
    if discovery != "local" and host is None:
        # On the network mDNS is told to use, when it is told: bound to that address, the
        # workers announce it (a wildcard bind announces the first address of any interface).
        chosen = [i for i in interfaces if not _interfaces.is_loopback(i)]
        host = chosen[0] if chosen else "0.0.0.0"
    if host is None and (secret_file or tls_cert or tls_key or tls_ca):
        raise click.UsageError("--secret-file and --tls-* are for workers on TCP: add --host "
                               "(with --discovery local, workers use Unix sockets otherwise)")
    secret = read_secret(secret_file)
    tls = read_tls(tls_cert, tls_key, tls_ca)
    if host and secret is None and tls is None and not os.environ.get(_secret.ENV):
        raise click.UsageError(
            "workers on TCP accept only peers that authenticate: pass --secret-file (a file of "
            f"at least {_secret.MIN_LENGTH} bytes), set ${_secret.ENV}, or pass --tls-cert and "
            "--tls-ca")
    cluster = EtcdCluster.from_options(**etcd) if discovery == "etcd" else None
    try:
        if discovery == "lan":
            from anywool.discovery.lan import LanDiscovery

            where: Any = LanDiscovery(namespace, interfaces=list(interfaces) or None,
                                      secret=secret)
        elif cluster is not None:
            where = cluster.discovery(namespace, lease_ttl=etcd_lease_ttl, own=not join)
        else:
            from anywool.discovery.local import LocalDiscovery

            where = LocalDiscovery(namespace)
        if lifespan is not None and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` would: the project's modules
        pool = _HostPool(spawn=workers, discovery=where, tags=tags, backend=backend, host=host,
                          secret=secret, tls=tls, max_concurrency=max_concurrency,
                          shutdown_timeout=drain, worker_lifespan=lifespan,
                          max_calls=max_calls, max_memory=max_memory,
                          idle_timeout=idle_timeout, min_workers=min_workers)
    except (TypeError, ValueError) as exc:
        message = str(exc).replace("worker_lifespan", "--lifespan")
        for name in ("idle_timeout", "min_workers"):
            message = message.replace(name, "--" + name.replace("_", "-"))
        raise click.UsageError(message.replace("spawn (", "--workers (")) from None
    except ImportError as exc:  # an extra not installed (lan, trio): the message names it
        raise click.ClickException(str(exc)) from None
    # Noted, never ignored, until the event loop's receiver takes over: one that arrives while
    # the command starts must stop it (it is honoured as soon as the receiver opens).
    _noted.clear()
    for number in _SIGNALS:
        signal.signal(number, _note_signal)
    previous_hangup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until ready (recycle)
    _say("starting")
    try:
        anyio.run(partial(_host, pool), backend=backend)
    except BaseException as exc:
        reason = _expected(exc)
        if reason is None:
            raise
        raise click.ClickException(str(reason)) from None
    finally:
        # Done: a signal now must not kill the command as it exits (Python restores the
        # default handlers during its shutdown, except for ignored signals).
        for number in _SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, previous_hangup)


class _HostPool(WorkerPool):
    """The command's pool, a plain :class:`~anywool.WorkerPool` but for two things: its workers
    serve other processes, so every record they log reaches their callers, whose levels decide
    (this process's own logging says nothing of theirs); and a recycle request a worker passes
    on (``anywool recycle``) says what it does, as SIGHUP."""

    _single_use_name = "WorkerPool"
    _output_level = logging.NOTSET

    async def _recycle_requested(self) -> None:
        await _recycle(self)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# The signals that arrived while the event loop's receiver was not open.
_noted: list[int] = []


def _note_signal(number: int, _frame: object) -> None:
    _noted.append(number)


def _expected(exc: BaseException) -> BaseException | None:
    """The error a user is told in one line (a namespace in use, or without an owner to join,
    an etcd cluster that does not answer or refuses, a worker that cannot start, an interface
    zeroconf cannot use), also from inside the exception groups of task groups; ``None`` for
    anything else."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, _EXPECTED) else None


_EXPECTED = (DiscoveryNamespaceInUse, DiscoveryNamespaceNotFound, DiscoveryUnavailable,
             DiscoveryServiceError, WorkerError, OSError)


async def _host(pool: WorkerPool) -> None:
    """Run the pool until the first signal, then exit it (drain, withdraw, stop); a second
    signal cuts the drain short. A signal before the pool is ready cuts its start short, and one
    noted before the receiver opened stops the command before the pool is entered."""
    try:
        with anyio.open_signal_receiver(*_SIGNALS) as signals:
            # Every signal from here on reaches the receiver: signal.signal() runs the pending
            # handlers before it replaces them, so one that arrived in between was noted.
            if _noted:
                _say("stopping")
            else:
                await _serve(pool, signals)
    finally:
        for number in _SIGNALS:  # asyncio resets them to the default as the receiver closes
            signal.signal(number, _note_signal)
    _say("stopped")


async def _serve(pool: WorkerPool, signals: AsyncIterator[signal.Signals]) -> None:
    async with anyio.create_task_group() as tg:
        stop = anyio.Event()
        start_up = anyio.CancelScope()
        ready = False

        async def watch() -> None:
            async for _ in signals:
                if stop.is_set():
                    tg.cancel_scope.cancel()  # the pool's exit still stops its workers
                else:
                    _say("stopping")
                    stop.set()
                    if not ready:
                        start_up.cancel()

        tg.start_soon(watch)
        # Cancelled only while the pool starts: its entry then stops what it had spawned.
        with start_up:
            async with pool:
                ready = True
                for hosted in pool.workers:
                    _say(f"worker {hosted.address} pid {hosted.pid}")
                _say("ready")
                with anyio.open_signal_receiver(signal.SIGHUP) as hangups:
                    async with anyio.create_task_group() as recycler:
                        recycler.start_soon(_recycle_on_hangup, pool, hangups)
                        await stop.wait()
                        recycler.cancel_scope.cancel()  # a recycle under way: the exit wins
                # The receiver restores the default (which would end the command) as it closes.
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
        tg.cancel_scope.cancel()


async def _recycle_on_hangup(pool: WorkerPool, hangups: AsyncIterator[signal.Signals]) -> None:
    """Each SIGHUP: replace every worker (those that arrive meanwhile: one more after)."""
    async for _ in hangups:
        await _recycle(pool)


async def _recycle(pool: WorkerPool) -> None:
    """Replace every worker, saying so: ``recycling``, a line per new worker, ``recycled``
    (or ``recycle failed: <why>``)."""
    _say("recycling")
    before = {hosted.pid for hosted in pool.workers}
    try:
        await pool.recycle()
    except Exception as exc:
        _say(f"recycle failed: {exc}")
        return
    for hosted in pool.workers:
        if hosted.pid not in before:
            _say(f"worker {hosted.address} pid {hosted.pid}")
    _say("recycled")
