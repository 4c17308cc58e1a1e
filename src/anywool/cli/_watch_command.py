"""``anywool watch NS``: follow a namespace's workers live until SIGINT or SIGTERM.

Presentation only: the events are a :class:`~anywool.LocalDiscovery.Subscriber`'s (the current
workers as ``worker-added``, then every change; when the owner exits, ``worker-dropped`` for
each, then a successor's workers if one claims the namespace). On a terminal they are a table
that updates in place (rich's ``Live``); otherwise one line per event, flushed at once. The
first SIGINT or SIGTERM cancels the subscription and the command exits 0; a namespace without
a live owner when it starts is exit 1.

``--json`` prints JSON Lines, one document per event, flushed at once: ``type``
(``worker-added``, ``worker-updated``, ``worker-dropped``), ``time`` (when this command received
it: Unix seconds, a float) and ``worker`` (the worker document of :mod:`anywool.cli._ops`; for a
drop, the worker as last known). A subscription's events do not say which lease published a
worker: ``lease`` and ``publisher_alive`` are always null here (``show`` has them).
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator
from functools import partial
from types import TracebackType
from typing import Any
from uuid import UUID

import anyio
import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from anywool.cli._etcd_ops import cluster_for_reading, etcd_options
from anywool.cli._ops import (
    TABLE_STYLE,
    console,
    json_option,
    plural,
    runtime_dir_option,
    runtime_root,
    short,
    silence_stdout,
    text,
    where,
    worker_cells,
    worker_columns,
    worker_document,
)
from anywool.discovery._protocols import DiscoveryEvent
from anywool.errors import DiscoveryError, DiscoveryNamespaceNotFound

__all__ = ["watch"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@click.command()
@click.argument("namespace")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True, help="Event loop of this command. (trio: pip install 'anywool[trio]')")
@json_option
@runtime_dir_option
@etcd_options("Follow NAMESPACE in this etcd cluster instead of on this host: a member's client "
              "URL (repeatable).")
def watch(namespace: str, backend: str, as_json: bool, runtime_dir: str | None,
          **etcd: Any) -> None:
    """Follow NAMESPACE's workers as they come and go, until SIGINT (Ctrl-C) or SIGTERM.

    NAMESPACE must have a live owner when the command starts; the command follows it (and a
    successor, if the owner exits and another claims the namespace) until it is stopped.
    """
    cluster = cluster_for_reading(runtime_dir, etcd)
    subscriber: AsyncIterable[DiscoveryEvent] | None = None
    elsewhere = ""
    if cluster is not None:
        subscriber = cluster.subscriber(namespace)
        elsewhere = f" in {cluster.where()}"
    else:
        root, exists = runtime_root(runtime_dir)
        if not exists:
            raise click.ClickException(f"namespace {namespace!r} has no live owner (no runtime "
                                       f"directory at {where(root)})")
    # Until the event loop's receiver takes over, a signal is only noted (and honoured as soon
    # as it does): one that arrives while the command starts must stop it, and never with a
    # traceback.
    # A signal the command was started with ignored (SIGINT in a shell's background job) stays
    # ignored, as it would for any other command.
    stops = tuple(number for number in _SIGNALS
                  if signal.getsignal(number) is not signal.SIG_IGN)
    for number in stops:
        signal.signal(number, _note_signal)
    out = console()
    view: _View = _JsonLines() if as_json else \
        _LiveTable(namespace, out) if out.is_terminal else _Lines()
    try:
        failure = anyio.run(partial(_follow, namespace, view, stops, subscriber, elsewhere),
                            backend=backend)
    finally:
        # Stopping: a second signal must not kill the command as it exits (Python restores the
        # default handlers during its shutdown, except for ignored signals).
        for number in stops:
            signal.signal(number, signal.SIG_IGN)
    if failure is not None:
        raise click.ClickException(failure)


_noted: list[int] = []


def _note_signal(number: int, _frame: object) -> None:
    _noted.append(number)


async def _follow(namespace: str, view: _View,
                  stops: tuple[signal.Signals, ...] = _SIGNALS,
                  subscriber: AsyncIterable[DiscoveryEvent] | None = None,
                  elsewhere: str = "") -> str | None:
    """Show every event of ``subscriber`` (default: ``LocalDiscovery.Subscriber(namespace)``)
    until one of the signals ``stops``; what went wrong, else ``None`` (``elsewhere`` says
    where the namespace was looked for)."""
    if subscriber is None:
        from anywool.discovery.local import LocalDiscovery

        subscriber = LocalDiscovery.Subscriber(namespace)

    try:
        with anyio.open_signal_receiver(*stops) as signals:
            if _noted:
                return None  # stopped before it could start
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_signal, signals, tg.cancel_scope)
                tg.start_soon(_cancel_when_unread, tg.cancel_scope)
                events = aiter(subscriber)
                try:
                    with view:
                        async for event in events:
                            view.show(event, time.time())
                except DiscoveryNamespaceNotFound:
                    return f"namespace {namespace!r} has no live owner{elsewhere}"
                except (DiscoveryError, TimeoutError, OSError) as exc:
                    return str(exc)
                except _Gone:
                    pass  # nobody reads standard output any more
                finally:
                    close = getattr(events, "aclose", None)
                    if close is not None:
                        with anyio.CancelScope(shield=True):
                            await close()
                    tg.cancel_scope.cancel()
    finally:
        for number in stops:  # asyncio resets them to the default as the receiver closes
            signal.signal(number, _note_signal)
    return None


# Seconds between the checks that standard output, a pipe, still has a reader.
_UNREAD_CHECK = 0.5


async def _cancel_when_unread(scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once nobody reads standard output any more, when it is a pipe
    (``anywool watch NS | head -1``).

    A write would say so, but a quiet namespace writes nothing: a pipe whose reader is gone
    reports an error condition to poll(2) instead, which this checks now and then.
    """
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except (OSError, ValueError):
        return
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: POLLERR and POLLHUP are always reported
    while not poller.poll(0):
        await anyio.sleep(_UNREAD_CHECK)
    silence_stdout()
    scope.cancel()



async def _cancel_on_signal(signals: AsyncIterator[signal.Signals],
                            scope: anyio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


class _Gone(Exception):
    """Standard output was closed (``anywool watch NS --json | head -1``)."""


class _View:
    """Where events go; a context manager around the whole subscription."""

    def __enter__(self) -> _View:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pass

    def show(self, event: DiscoveryEvent, when: float) -> None:
        raise NotImplementedError


def _write_line(line: str) -> None:
    """``line`` on standard output, flushed; :class:`_Gone` once nobody reads it."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        raise _Gone from None


class _JsonLines(_View):
    def show(self, event: DiscoveryEvent, when: float) -> None:
        _write_line(json.dumps({"type": event.type, "time": when,
                                "worker": worker_document(event.metadata)}))


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when)) + f".{int(when % 1 * 1000):03d}"


class _Lines(_View):
    """One line per event, for standard output that is not a terminal (no styles)."""

    def show(self, event: DiscoveryEvent, when: float) -> None:
        metadata = event.metadata
        tags = ",".join(sorted(metadata.tags)) or "-"
        _write_line(f"{_clock(when)} {event.type:<14} {metadata.uid} "
                    f"{text(metadata.address, limit=256).plain} pid {metadata.pid} "
                    f"tags {text(tags).plain}")


class _LiveTable(_View):
    """The current workers with their last event, redrawn in place.

    Redrawn by rich's refresh thread, a few times a second, however fast events come (the
    current workers arrive as one burst of ``worker-added``); the lock keeps it from reading
    the view halfway through an event.
    """

    def __init__(self, namespace: str, out: Console) -> None:
        self._namespace = namespace
        self._out = out
        self._lock = threading.Lock()
        self._workers: dict[UUID, tuple[DiscoveryEvent, float]] = {}
        self._last: tuple[DiscoveryEvent, float] | None = None
        self._count = 0
        # Transient: a namespace that is not found leaves no empty table behind; the final
        # table is printed once more when the watch stops.
        self._live = Live(console=out, get_renderable=self._render, refresh_per_second=8,
                          transient=True)

    def __enter__(self) -> _LiveTable:
        self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._live.__exit__(exc_type, exc, tb)
        if exc_type is None or not issubclass(exc_type, (DiscoveryError, TimeoutError,
                                                         OSError)):
            self._out.print(self._render(final=True))

    def show(self, event: DiscoveryEvent, when: float) -> None:
        with self._lock:
            self._count += 1
            self._last = (event, when)
            if event.type == "worker-dropped":
                self._workers.pop(event.metadata.uid, None)
            else:
                self._workers[event.metadata.uid] = (event, when)

    def _render(self, final: bool = False) -> Table:
        with self._lock:
            workers = list(self._workers.values())
            last, count = self._last, self._count
        title = Text.assemble("watching ", text(self._namespace, "bold"),
                              f" · {plural(count, 'event')}",
                              "" if final else " · Ctrl-C to stop")
        table = Table(title=title, title_justify="left", caption_justify="left", **TABLE_STYLE)
        worker_columns(table)
        table.add_column("last event", no_wrap=True)
        table.add_column("at", no_wrap=True)
        for event, when in workers:
            table.add_row(*worker_cells(event.metadata), event.type, _clock(when))
        if last is None:
            table.caption = "no events yet"
        else:
            event, when = last
            table.caption = f"last: {event.type} {short(event.metadata.uid.hex)} at {_clock(when)}"
        return table
