"""``anywool recycle NS``: a rolling restart of the pools serving a namespace, host by host.

The workers are those ``show`` lists (this host's runtime directory, or with ``--etcd URL`` an
etcd cluster). Each worker a pool spawned carries that pool's id in its metadata
(``extra["anywool.pool"]``, see :data:`~anywool.runtime.pool._pool.POOL_EXTRA`): the workers with one
id are one *host* (an ``anywool worker`` command, or any spawning ``WorkerPool``); a worker
without one is a host of its own. Hosts are recycled one at a time, in the order of their first
worker in the listing:

1. one of the host's workers is asked, over a connection of its own authenticated as a call
   is (a TCP worker by the handshake: the secret from ``--secret-file`` or ``$ANYWOOL_SECRET``,
   and/or ``--tls-*``; a Unix socket by its file mode), with a ``RECYCLE`` request (see
   :mod:`anywool.runtime.wire._envelope`); it passes it on to its pool, which runs
   :meth:`WorkerPool.recycle <anywool.WorkerPool.recycle>` (one worker at a time, each
   replacement announced before the worker it replaces is withdrawn);
2. the command reads the namespace again every 0.1 s until every worker the host had when it
   was asked has been withdrawn and as many new workers of that host have been announced,
   printing a line as each goes and comes; ``--timeout`` seconds (default 120) bound each host.

A worker that refuses our credentials, or refuses the request (one run by hand, or by a bare
``LocalWorker``, has no pool to replace it: "not run by a pool"), or a host that is not done in
time, ends the command: exit 1, with one line on standard error saying which host, which worker
and why (the hosts after it are not asked). If a host's first worker cannot be reached, the next
is tried. Exit 0 once every host is recycled (also when the namespace has no worker); 1 also when
NS does not exist; 2 for a usage error.

Presentation only (click): the recycling is the pools'.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

import anyio
import click

from anywool.cli._etcd_ops import etcd_options
from anywool.cli._ops import runtime_dir_option, short
from anywool.cli._top_command import Source, credentials_for, source_for
from anywool.errors import AuthenticationError, WorkerError
from anywool.metadata import WorkerMetadata
from anywool.runtime.wire import _auth
from anywool.runtime.wire._frames import FrameError

__all__ = ["recycle"]

#: Seconds between two reads of the namespace while a host recycles.
POLL_INTERVAL = 0.1
# The key of a pool's id in its workers' metadata (runtime.pool._pool.POOL_EXTRA: not
# imported, so that the command does not load the pool's machinery).
_POOL_EXTRA = "anywool.pool"


def _seconds(param: click.Parameter, value: float) -> float:
    if math.isnan(value):
        raise click.BadParameter("nan is not a number of seconds", param=param)
    return value


@click.command()
@click.argument("namespace")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=120.0, show_default=True,
              callback=lambda _, param, value: _seconds(param, value),
              help="Seconds each host gets to replace all its workers.")
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=5.0,
              show_default=True, callback=lambda _, param, value: _seconds(param, value),
              help="Seconds a worker gets to connect and answer the request.")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File holding the shared secret of TCP workers. Default: $ANYWOOL_SECRET.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Mutual TLS: our certificate chain (PEM, with its key unless --tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Mutual TLS: the private key (PEM).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Mutual TLS: the CA bundle the workers' certificates must chain to (PEM).")
@runtime_dir_option
@etcd_options("Read NAMESPACE's workers from this etcd cluster instead of this host: a member's "
              "client URL (repeatable).")
def recycle(namespace: str, timeout: float, connect_timeout: float, secret_file: Path | None,
            tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
            runtime_dir: str | None, **etcd: Any) -> None:
    """Replace every worker of NAMESPACE, one host (pool) at a time, each host one worker at a
    time: no call is lost or fails.

    Each host is asked through one of its workers (authenticated as a call is); the command
    waits until all the workers it had are withdrawn and as many new ones announced, printing a
    line per change. Exit 0 when every host is done; 1 on a refusal, a failed authentication, a
    host not done within --timeout seconds, or no namespace NAMESPACE.
    """
    from anywool.cli._worker_command import read_secret, read_tls

    credentials = credentials_for(read_secret(secret_file),
                                  read_tls(tls_cert, tls_key, tls_ca))
    source = source_for(namespace, runtime_dir, etcd)
    failure = anyio.run(partial(_run, source, credentials, timeout, connect_timeout),
                        backend="asyncio")
    if failure is not None:
        raise click.ClickException(failure)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass
class _Host:
    """The workers one pool spawned (by its id), or a worker with no pool id, alone."""

    key: str
    workers: list[WorkerMetadata] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"host {short(self.key)}" if not self.key.startswith("worker ") else self.key

    def owns(self, metadata: WorkerMetadata) -> bool:
        return _host_key(metadata) == self.key


def _host_key(metadata: WorkerMetadata) -> str:
    pool = metadata.extra.get(_POOL_EXTRA)
    return pool if isinstance(pool, str) and pool else f"worker {short(metadata.uid.hex)}"


def hosts(workers: Sequence[WorkerMetadata]) -> list[_Host]:
    """``workers`` grouped by the pool that spawned them, in the order each first appears."""
    found: dict[str, _Host] = {}
    for metadata in workers:
        key = _host_key(metadata)
        found.setdefault(key, _Host(key)).workers.append(metadata)
    return list(found.values())


async def _run(source: Source, credentials: _auth.Credentials | None, timeout: float,
               connect_timeout: float) -> str | None:
    """Recycle every host of the namespace in turn; why it stopped, else ``None``."""
    workers = await source.workers()
    if isinstance(workers, str):
        return workers
    found = hosts(workers)
    if not found:
        _say(f"no workers in {source.namespace}: nothing to recycle")
        return None
    _say(f"recycling {source.namespace}: {len(found)} host{'s' * (len(found) != 1)}, "
         f"{len(workers)} worker{'s' * (len(workers) != 1)}")
    for host in found:
        failure = await _ask(host, credentials, connect_timeout)
        if failure is not None:
            return failure
        failure = await _until_replaced(source, host, timeout)
        if failure is not None:
            return failure
    _say(f"recycled {len(found)} host{'s' * (len(found) != 1)}")
    return None


async def _ask(host: _Host, credentials: _auth.Credentials | None,
               timeout: float) -> str | None:
    """Ask one of ``host``'s workers to have its pool recycle; why none did, else ``None``."""
    from anywool.runtime.client._connection import WorkerConnection

    reasons: list[str] = []
    for metadata in host.workers:
        where = f"{metadata.address} (pid {metadata.pid})"
        if credentials is None and not metadata.address.startswith("unix:"):
            return (f"{host.name}: {where} is a TCP worker and we have no credentials: pass "
                    "--secret-file, set $ANYWOOL_SECRET, or pass --tls-cert and --tls-ca")
        try:
            async with WorkerConnection(metadata.address, connect_timeout=timeout,
                                        credentials=credentials) as connection:
                refusal = await connection.recycle(timeout)
        except AuthenticationError as exc:
            return f"{host.name}: {where} refused our credentials: {exc.reason}"
        except WorkerError as exc:
            reasons.append(f"{where} unreachable: {exc.reason}")
            continue
        except TimeoutError:
            reasons.append(f"{where} did not answer within {timeout:g} s")
            continue
        except FrameError as exc:
            reasons.append(f"{where} answered malformed: {exc.reason}")
            continue
        if refusal is not None:
            return f"{host.name}: {where} refused to recycle: {refusal}"
        _say(f"{host.name}: recycling its {len(host.workers)} "
             f"worker{'s' * (len(host.workers) != 1)} (asked {metadata.address})")
        return None
    return f"{host.name}: no worker took the request: {'; '.join(reasons)}"


async def _until_replaced(source: Source, host: _Host, timeout: float) -> str | None:
    """Follow the namespace until every worker ``host`` had is withdrawn and as many new ones
    of it are announced, within ``timeout`` seconds; why not, else ``None``."""
    before = {metadata.uid: metadata for metadata in host.workers}
    gone: set[UUID] = set()
    new: dict[UUID, WorkerMetadata] = {}
    with anyio.move_on_after(timeout):
        while True:
            workers = await source.workers()
            if isinstance(workers, str):
                return f"{host.name}: cannot follow its workers: {workers}"
            now = {metadata.uid: metadata for metadata in workers}
            for uid, metadata in now.items():
                if uid not in before and uid not in new and host.owns(metadata):
                    new[uid] = metadata
                    _say(f"{host.name}: + worker {short(uid.hex)} {metadata.address} "
                         f"pid {metadata.pid}")
            for uid, metadata in before.items():
                if uid not in now and uid not in gone:
                    gone.add(uid)
                    _say(f"{host.name}: - worker {short(uid.hex)} {metadata.address} "
                         f"pid {metadata.pid}")
            if len(gone) == len(before) and len(new) >= len(before):
                _say(f"{host.name}: recycled")
                return None
            await anyio.sleep(POLL_INTERVAL)
    return (f"{host.name}: not recycled within {timeout:g} s: {len(before) - len(gone)} of its "
            f"{len(before)} workers still there, {len(new)} new")
