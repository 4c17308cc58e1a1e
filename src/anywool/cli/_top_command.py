"""``anywool top NS``: what each worker of a namespace is doing, read from the workers themselves.

The workers are those ``show`` lists (this host's runtime directory, or with ``--etcd URL`` an
etcd cluster), read again at every refresh. Each is asked for its statistics over a connection
of its own (a ``STATS`` frame, see :mod:`anywool.runtime.wire._envelope`): a TCP worker only once
both sides authenticated (the secret from ``--secret-file``, else ``$ANYWOOL_SECRET``), a Unix
socket's by its file mode. A worker that does not answer within ``--timeout`` seconds, refuses
the connection or our credentials is shown as such, with the reason: that is what ``top`` is for,
not a failure of the command. Exit 1 when NS does not exist (as ``show``), else 0; Ctrl-C ends
the live view with 0.

The table: uid (short), address (never wrapped, also when piped), pid, calls in flight, calls
served, busy % over the last interval (between this sample and the previous one of the same
worker; blank on the first) and over the worker's uptime, resident memory, uptime, and a status.
On a terminal it refreshes in place every ``--interval`` seconds (rich's ``Live``); off a
terminal a table is printed per refresh. ``--once`` prints one table and exits.

``--json`` prints one document and exits: a list of one object per worker: ``uid``,
``address``, ``pid`` (as announced), ``stats`` (the worker's answer: the fields of
:class:`~anywool.WorkerStats` by name, or null) and ``error`` (why there is no answer, or null).

Presentation only (click, rich): the facts are the workers'.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from anywool._tls import MutualTLS
from anywool.cli._etcd_ops import EtcdCluster, cluster_for_reading, etcd_options, read_namespace
from anywool.cli._ops import (
    TABLE_STYLE,
    console,
    emit,
    json_option,
    plural,
    refused,
    runtime_dir_option,
    runtime_root,
    short,
    text,
    where,
)
from anywool.errors import (
    AuthenticationError,
    DiscoveryServiceError,
    DiscoveryUnavailable,
    WorkerError,
)
from anywool.metadata import WorkerMetadata
from anywool.runtime.wire import _auth
from anywool.runtime.wire._frames import FrameError
from anywool.runtime.wire._stats import WorkerStats

__all__ = ["top"]


def _seconds(param: click.Parameter, value: float) -> float:
    """``value`` unless NaN, which ``FloatRange`` lets through (every comparison is false)."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number of seconds", param=param)
    return value


@click.command()
@click.argument("namespace")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              callback=lambda _, param, value: _seconds(param, value),
              help="Seconds between refreshes.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              callback=lambda _, param, value: _seconds(param, value),
              help="Seconds each worker gets to connect and answer.")
@click.option("--once", is_flag=True, help="Print one table and exit.")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File holding the shared secret of TCP workers. Default: $ANYWOOL_SECRET.")
@json_option
@runtime_dir_option
@etcd_options("Read NAMESPACE's workers from this etcd cluster instead of this host: a member's "
              "client URL (repeatable).")
def top(namespace: str, interval: float, timeout: float, once: bool, secret_file: Path | None,
        as_json: bool, runtime_dir: str | None, **etcd: Any) -> None:
    """Show what each worker of NAMESPACE is doing: calls in flight and served, busy time,
    memory, uptime; refreshed every --interval seconds until Ctrl-C.

    NAMESPACE is a namespace's name (or an entry as ls shows it); with --etcd, a namespace's
    name in that cluster.
    """
    from anywool.cli._worker_command import read_secret

    credentials = credentials_for(read_secret(secret_file), None)
    source = source_for(namespace, runtime_dir, etcd)
    out = console()
    try:
        failure = anyio.run(partial(_run, source, credentials, interval, timeout,
                                    once or as_json, as_json, out), backend="asyncio")
    except KeyboardInterrupt:
        return  # Ctrl-C: the live view ends
    if failure is not None:
        raise click.ClickException(failure)




def credentials_for(secret: bytes | None, tls: MutualTLS | None
                    ) -> _auth.Credentials | None:
    """The credentials to reach a namespace's workers with (``$ANYWOOL_SECRET`` by default).

    :raises click.UsageError: the secret is too short.
    """
    try:
        return _auth.Credentials.resolve(secret, tls)
    except ValueError as exc:  # $ANYWOOL_SECRET too short
        raise click.UsageError(str(exc)) from None


def source_for(namespace: str, runtime_dir: str | None, etcd: dict[str, Any]) -> Source:
    """Where ``namespace``'s workers are read from: its etcd cluster, or this host's runtime
    directory.

    :raises click.ClickException: the runtime directory has no such namespace.
    """
    cluster = cluster_for_reading(runtime_dir, etcd)
    root: Path | None = None
    if cluster is None:
        root, exists = runtime_root(runtime_dir)
        if not exists:
            raise click.ClickException(f"no generation of namespace {namespace!r} in "
                                       f"{where(root)}")
    return Source(namespace, cluster, root, runtime_dir)


@dataclass(frozen=True)
class Source:
    """Where NAMESPACE's workers are listed: an etcd cluster, or this host's runtime
    directory."""

    namespace: str
    cluster: EtcdCluster | None
    root: Path | None
    runtime_dir: str | None

    async def workers(self) -> list[WorkerMetadata] | str:
        """The workers announced now, or why they cannot be listed."""
        if self.cluster is not None:
            try:
                state = await read_namespace(self.cluster, self.namespace)
            except (DiscoveryUnavailable, DiscoveryServiceError) as exc:
                return str(exc)
            if state is None:
                return f"no namespace {self.namespace!r} in {self.cluster.where()}"
            return [entry.metadata for entry in state.workers or ()]
        from anywool.discovery.local import _survey

        with refused(self.runtime_dir):
            found = await anyio.to_thread.run_sync(_survey.find, self.namespace, self.root)
        if found is None:
            assert self.root is not None
            return f"no generation of namespace {self.namespace!r} in {where(self.root)}"
        if found.workers is None:
            return f"workers unknown: {found.error}"
        return [entry.metadata for entry in found.workers]


@dataclass(frozen=True)
class _Sample:
    """One worker, and its answer (``stats``) or why there is none (``error``)."""

    metadata: WorkerMetadata
    stats: WorkerStats | None
    error: str | None


async def sample(metadata: WorkerMetadata, credentials: _auth.Credentials | None,
                 timeout: float) -> _Sample:
    """Ask one worker for its statistics over a connection of its own, within about
    ``timeout`` seconds (plus the connection's bounded close)."""
    from anywool.runtime.client._connection import WorkerConnection

    if credentials is None and not metadata.address.startswith("unix:"):
        return _Sample(metadata, None, "refused: no credentials for a TCP worker: pass "
                                       "--secret-file or set $ANYWOOL_SECRET")
    try:
        async with WorkerConnection(metadata.address, connect_timeout=timeout,
                                    credentials=credentials) as connection:
            return _Sample(metadata, await connection.stats(timeout), None)
    except AuthenticationError as exc:
        return _Sample(metadata, None, f"refused: {exc.reason}")
    except WorkerError as exc:
        return _Sample(metadata, None, f"unreachable: {exc.reason}")
    except TimeoutError:
        return _Sample(metadata, None, f"no answer within {timeout:g} s")
    except FrameError as exc:
        return _Sample(metadata, None, f"malformed answer: {exc.reason}")


async def sample_all(workers: Sequence[WorkerMetadata], credentials: _auth.Credentials | None,
                     timeout: float) -> list[_Sample]:
    """Every worker's :func:`sample`, asked concurrently, in the order of ``workers``."""
    samples: list[_Sample | None] = [None] * len(workers)

    async def one(index: int, metadata: WorkerMetadata) -> None:
        samples[index] = await sample(metadata, credentials, timeout)

    async with anyio.create_task_group() as tg:
        for index, metadata in enumerate(workers):
            tg.start_soon(one, index, metadata)
    return [each for each in samples if each is not None]


async def _run(source: Source, credentials: _auth.Credentials | None, interval: float,
               timeout: float, once: bool, as_json: bool, out: Console) -> str | None:
    """Sample and show until Ctrl-C (once with ``once``); what went wrong, else ``None``."""
    previous: dict[tuple[str, int], WorkerStats] = {}
    live: Live | None = None
    try:
        while True:
            started = anyio.current_time()
            workers = await source.workers()
            if isinstance(workers, str):
                return workers
            samples = await sample_all(workers, credentials, timeout)
            if as_json:
                emit([_document(each) for each in samples])
                return None
            table = _table(samples, previous, time.strftime("%H:%M:%S"), out.is_terminal)
            previous = {(each.metadata.uid.hex, each.stats.pid): each.stats
                        for each in samples if each.stats is not None}
            if once or not out.is_terminal:
                out.print(table)
                if once:
                    return None
            elif live is None:
                live = Live(table, console=out, auto_refresh=False)
                live.start()
            else:
                live.update(table, refresh=True)
            await anyio.sleep_until(started + interval)
    finally:
        if live is not None:
            live.stop()


def _document(each: _Sample) -> dict[str, object]:
    return {"uid": str(each.metadata.uid), "address": each.metadata.address,
            "pid": each.metadata.pid,
            "stats": None if each.stats is None else asdict(each.stats),
            "error": each.error}


def _table(samples: Sequence[_Sample], previous: dict[tuple[str, int], WorkerStats],
           now: str, fold: bool) -> Table:
    """The table of ``samples``; with ``fold`` (a terminal, whose width is all there is) a
    long address folds onto more lines rather than squeeze the numbers, else nothing wraps."""
    table = Table(**TABLE_STYLE, title=f"{plural(len(samples), 'worker')} · {now}",
                  title_justify="left")
    table.add_column("uid", no_wrap=True)
    table.add_column("address", no_wrap=not fold, overflow="fold" if fold else "ellipsis")
    for heading in ("pid", "in flight", "served", "busy", "busy total", "rss", "uptime"):
        table.add_column(heading, justify="right", no_wrap=True)
    table.add_column("status", overflow="fold" if fold else "ellipsis", no_wrap=not fold)
    for each in samples:
        metadata, stats = each.metadata, each.stats
        cells: list[str | Text] = [short(metadata.uid.hex), text(metadata.address, limit=1024)]
        if stats is None:
            cells += [str(metadata.pid), "", "", "", "", "", "",
                      text(each.error or "", "red", limit=1024)]
        else:
            before = previous.get((metadata.uid.hex, stats.pid))
            cells += [str(stats.pid), str(stats.in_flight), str(stats.served),
                      _interval_busy(before, stats), f"{100 * stats.busy_fraction:.0f} %",
                      _size(stats.rss_bytes, stats.rss_peak), _duration(stats.uptime_seconds),
                      Text("ok", "green")]
        table.add_row(*cells)
    return table


def _interval_busy(before: WorkerStats | None, after: WorkerStats) -> str:
    """The busy share between two samples of one worker (blank without an earlier one)."""
    if before is None:
        return ""
    elapsed = after.uptime_seconds - before.uptime_seconds
    if elapsed <= 0:
        return ""
    busy = min(1.0, max(0.0, (after.busy_seconds - before.busy_seconds) / elapsed))
    return f"{100 * busy:.0f} %"


def _size(value: int | None, peak: bool) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    shown = f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
    return f"{shown} (peak)" if peak else shown


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
