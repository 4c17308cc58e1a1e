"""What the operations commands (``ls``, ``show``, ``watch``, ``reclaim``) share: their options,
the runtime directory they read, their JSON documents and the cells of their tables.

Presentation only: every fact comes from :mod:`anywool.discovery.local._survey` (or, for
``watch``, from a :class:`~anywool.LocalDiscovery.Subscriber`); nothing here opens a file of
the runtime directory or parses one. Nothing here creates the runtime directory either.

The runtime directory. ``--runtime-dir PATH`` is written to ``$ANYWOOL_RUNTIME_DIR`` for this
process before anything reads it, and everything reads it from there (the survey, and a
subscriber's bind, which has no other way in): one path for every reader. A relative path, or a
directory :func:`~anywool._runtime_dir.runtime_dir` refuses (a symlink, another user's, one
others may write to), is a usage error (exit 2).

JSON documents (``--json``; keys are stable, new keys may be added):

* worker: ``uid`` (str), ``address`` (str), ``pid`` (int), ``version`` (str), ``tags`` (sorted
  list of str), ``secure`` (bool), ``extra`` (object; bytes as hex strings), ``lease`` (32 hex
  digits of the publisher's lease, or null when its slot names none), ``publisher_alive``
  (bool, or null without a lease);
* lease: ``id`` (32 hex digits), ``alive`` (its publisher holds it), ``workers`` (slots under
  it);
* namespace: ``entry`` (the directory's name: ``ns-<key>``, ``dead-<hex>``, ``tmp-<hex>``),
  ``key`` (``entry`` without its prefix), ``name`` (as the owner recorded it, or null),
  ``state`` (``live``, ``retiring``, ``dead``, ``sweeping``, ``claiming``, ``abandoned``),
  ``reclaimable`` (bool), ``owner_pid``, ``capacity``, ``block_size``, ``changes`` (the
  registry's change counter), ``worker_count`` (ints, or null when unknown), ``leases`` (list
  of lease), ``error`` (why the registry could not be read, or null); ``show`` adds ``workers``
  (list of worker, or null when unreadable);
* socket: ``entry`` (``w-<hex>``), ``alive`` (its worker holds it), ``reclaimable``;
* swept: ``entry``, ``kind`` (``dead-namespace``, ``unfinished-removal``, ``killed-claimant``,
  ``worker-socket``), ``namespace`` (the recorded name, or null);
* etcd namespace (``--etcd``): ``key`` (the namespace's key directory, ``<prefix>/ns/<sha256>``),
  ``name``, ``state`` (``live``: it has an owner, ``orphaned``: only workers a displaced owner's
  publishers left), ``owner_pid``, ``owner_host``, ``lease_ttl`` (as the owner recorded them, or
  null), ``generation`` (the owner key's create revision, or null), ``worker_count``,
  ``leases`` (lease documents, ``id`` 16 hex digits; etcd deletes a lapsed lease's keys, so each
  is alive), ``error``; ``show`` adds ``workers`` (worker documents; ``publisher_alive`` is true).

Each command's own document is described in its module.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from anywool import _runtime_dir
from anywool.cli._etcd_ops import EtcdNamespace
from anywool.discovery.local._claim import Swept
from anywool.discovery.local._survey import (
    LeaseState,
    NamespaceState,
    WorkerEntry,
    WorkerSocket,
    locate,
)
from anywool.metadata import WorkerMetadata

__all__ = [
    "MAX_SHOWN",
    "TABLE_STYLE",
    "console",
    "emit",
    "etcd_label",
    "etcd_namespace_document",
    "etcd_owner_text",
    "lease_hex",
    "leases_text",
    "json_option",
    "label",
    "name_text",
    "leases_cell",
    "namespace_document",
    "number_cell",
    "plural",
    "refused",
    "runtime_dir_option",
    "runtime_root",
    "short",
    "silence_stdout",
    "socket_document",
    "state_text",
    "swept_document",
    "text",
    "where",
    "worker_document",
    "worker_columns",
    "workers_cell",
]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Characters of a name, tag or address shown in a table; JSON has them in full.
MAX_SHOWN = 64
#: How the tables are drawn: a rule under the heading and nothing else, so that a worker's
#: address fits a terminal's width more often.
TABLE_STYLE: dict[str, Any] = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False,
                               "padding": (0, 1, 0, 0)}


def _absolute(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not os.path.isabs(value):
        raise click.BadParameter(f"must be an absolute path, got {value!r}")
    return value


def runtime_dir_option(command: _F) -> _F:
    return click.option(
        "--runtime-dir", type=str, default=None, callback=_absolute, metavar="PATH",
        help=f"The runtime directory to read (default: ${_runtime_dir.ENV_VAR}, else "
             "/dev/shm/anywool-<uid>, or <tempdir>/anywool-<uid> without /dev/shm).")(command)


def json_option(command: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON for scripts (keys documented in the README).")(command)


def runtime_root(option: str | None) -> tuple[Path, bool]:
    """Point this process at the runtime directory (``option``, the ``--runtime-dir`` value,
    else ``$ANYWOOL_RUNTIME_DIR``) and check it without creating it: ``(path, exists)``.

    :raises click.UsageError: the library refuses the directory (see :func:`refused`).
    """
    if option is not None:
        os.environ[_runtime_dir.ENV_VAR] = option
    # Any other OSError (a path through a file, a loop of symlinks, one too long) is a path
    # that cannot be a runtime directory: a usage error too.
    with refused(option, (ValueError, OSError)):
        return locate()


@contextmanager
def refused(option: str | None,
            kinds: tuple[type[Exception], ...] = (PermissionError,)) -> Iterator[None]:
    """Around a read of the runtime directory: the library's refusal of it (``kinds``; once
    :func:`runtime_root` has accepted the path, only a ``PermissionError`` can still say so) as
    a usage error naming where the path came from (exit 2)."""
    try:
        yield
    except kinds as exc:
        if option is not None:
            raise click.BadParameter(str(exc), param_hint="'--runtime-dir'") from None
        message = str(exc)
        if os.environ.get(_runtime_dir.ENV_VAR) and _runtime_dir.ENV_VAR not in message:
            message += f" (from ${_runtime_dir.ENV_VAR})"
        raise click.UsageError(message) from None


def silence_stdout() -> None:
    """Point standard output at nothing, once its reader is gone: Python flushes it again at
    exit, which would fail once more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def emit(document: object) -> None:
    """One JSON document on standard output."""
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits with status 1 here; the command group ends such a command quietly with
        # status 0 instead (1 means "not found").
        self.quiet = True
        raise BrokenPipeError


#: Width of the console off a terminal: a pipe or a file has no width, and rich's default of
#: 80 columns would fold an address over lines that ``grep`` and ``awk`` then read apart.
PIPED_WIDTH = 1 << 12


def console() -> Console:
    """The console a command prints to: the terminal's width on a terminal, else so wide that
    no row of a table wraps (rows are not padded to it)."""
    out = _Console(highlight=False)
    if not out.is_terminal:
        out.width = PIPED_WIDTH
    return out


# -- JSON documents ------------------------------------------------------------------------------


def _plain(value: object) -> object:
    """``value`` as JSON holds it: bytes as hex, non-str keys as str, anything else unknown
    by its repr (msgpack can decode more than JSON encodes)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(_plain(k)): _plain(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return repr(value)


def worker_document(metadata: WorkerMetadata, lease: str | None = None,
                    publisher_alive: bool | None = None) -> dict[str, object]:
    return {
        "uid": str(metadata.uid),
        "address": metadata.address,
        "pid": metadata.pid,
        "version": metadata.version,
        "tags": sorted(metadata.tags),
        "secure": metadata.secure,
        "extra": _plain(metadata.extra),
        "lease": lease,
        "publisher_alive": publisher_alive,
    }


def _lease_document(lease: LeaseState) -> dict[str, object]:
    return {"id": lease.id, "alive": lease.alive, "workers": lease.workers}


def namespace_document(state: NamespaceState, *, workers: bool = False) -> dict[str, object]:
    """The namespace document; with ``workers``, its list of workers too (``show``)."""
    document: dict[str, object] = {
        "entry": state.entry,
        "key": state.key,
        "name": state.name,
        "state": state.state,
        "reclaimable": state.reclaimable,
        "owner_pid": state.owner_pid,
        "capacity": state.capacity,
        "block_size": state.block_size,
        "changes": state.changes,
        "worker_count": None if state.workers is None else len(state.workers),
        "leases": [_lease_document(lease) for lease in state.leases],
        "error": state.error,
    }
    if workers:
        document["workers"] = None if state.workers is None else [
            _entry_document(entry) for entry in state.workers]
    return document


def _entry_document(entry: WorkerEntry) -> dict[str, object]:
    return worker_document(entry.metadata, entry.lease, entry.publisher_alive)


def lease_hex(lease: int) -> str:
    """An etcd lease id as documents show it: 16 hex digits."""
    return f"{lease:016x}"


def etcd_namespace_document(state: EtcdNamespace, *, workers: bool = False
                            ) -> dict[str, object]:
    """The etcd namespace document; with ``workers``, its list of workers too (``show``)."""
    document: dict[str, object] = {
        "key": state.key,
        "name": state.name,
        "state": state.state,
        "owner_pid": state.owner_pid,
        "owner_host": state.owner_host,
        "lease_ttl": state.lease_ttl,
        "generation": state.generation,
        "worker_count": state.worker_count,
        "leases": [{"id": lease_hex(lease), "alive": True, "workers": count}
                   for lease, count in state.leases.items()],
        "error": state.error,
    }
    if workers:
        document["workers"] = [
            worker_document(entry.metadata, lease_hex(entry.lease) if entry.lease else None,
                            True if entry.lease else None)
            for entry in state.workers or ()]
    return document


def socket_document(socket: WorkerSocket) -> dict[str, object]:
    return {"entry": socket.entry, "alive": socket.alive, "reclaimable": socket.reclaimable}


def swept_document(swept: Swept) -> dict[str, object]:
    return {"entry": swept.entry, "kind": swept.kind, "namespace": swept.namespace}


# -- table cells ---------------------------------------------------------------------------------


def text(value: str, style: str = "", limit: int = MAX_SHOWN) -> Text:
    """``value`` as a cell: never read as markup, control characters (and lone surrogates)
    escaped, at most ``limit`` characters."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape",
                                                        "backslashreplace").decode("ascii")
                    for c in value)
    if len(shown) > limit:
        shown = shown[:limit - 1] + "…"
    return Text(shown, style=style)


def where(path: Path) -> str:
    """A path as messages and tables show it: control characters escaped, never cut."""
    return text(str(path), limit=1 << 16).plain


def name_text(name: str, style: str = "") -> Text:
    """A namespace name as a cell: as :func:`text`, quoted when it would not be seen as it is
    (empty, or with spaces at either end)."""
    if not name or name.strip() != name:
        return text(repr(name), style)
    return text(name, style)


def worker_columns(table: Table) -> None:
    """The columns every table of workers starts with: uid, address, pid, tags."""
    table.add_column("uid", no_wrap=True)
    table.add_column("address", overflow="fold")
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("tags", overflow="fold")


def worker_cells(metadata: WorkerMetadata) -> tuple[str | Text, ...]:
    """A worker's cells in the columns of :func:`worker_columns`."""
    return (short(metadata.uid.hex), text(metadata.address, limit=256), str(metadata.pid),
            text(", ".join(sorted(metadata.tags))))


def short(hex_digits: str) -> str:
    """A uid's or lease's first 8 hex digits, as tables show them (JSON has them in full)."""
    return hex_digits[:8]


def label(state: NamespaceState) -> Text:
    """How a generation is named in a table, by what ``show`` and ``reclaim`` accept: a live or
    dead ``ns-`` generation by its recorded name, else by its entry (dim); a ``dead-`` or
    ``tmp-`` directory by its entry, followed by the name it was a generation of."""
    if state.name is not None and state.entry.startswith("ns-"):
        return name_text(state.name, "bold")
    shown = text(state.entry, "dim")
    if state.name is not None:
        shown.append_text(Text.assemble(" (", name_text(state.name), ")"))
    return shown


def etcd_label(state: EtcdNamespace) -> Text:
    """An etcd namespace in a table: by the name its owner recorded, else by its key (dim)."""
    if state.name is not None:
        return name_text(state.name, "bold")
    return text(state.key, "dim", limit=256)


def etcd_owner_text(state: EtcdNamespace) -> Text:
    """``pid 4242 on host-a``: an etcd namespace's owner as it recorded itself."""
    if state.state != "live":
        return Text("none", "dim")
    host = "?" if state.owner_host is None else state.owner_host
    return text(f"pid {number_cell(state.owner_pid)} on {host}")


_STYLES = {"orphaned": "yellow", "live": "green", "retiring": "yellow", "dead": "red", "sweeping": "cyan",
           "claiming": "cyan", "abandoned": "red"}


def state_text(state: NamespaceState | EtcdNamespace) -> Text:
    """``live``, ``dead — reclaimable``, ...: the state, and whether ``reclaim`` may remove it."""
    reclaimable = isinstance(state, NamespaceState) and state.reclaimable
    shown = f"{state.state} — reclaimable" if reclaimable else state.state
    return Text(shown, style=_STYLES.get(state.state, ""))


def plural(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def number_cell(value: int | None) -> str:
    return "?" if value is None else str(value)


def workers_cell(state: NamespaceState) -> str:
    """``2 / 128``: workers registered, of the capacity (``?`` where the registry did not
    read)."""
    count = "?" if state.workers is None else str(len(state.workers))
    return f"{count} / {number_cell(state.capacity)}"


def leases_cell(state: NamespaceState) -> Text:
    """``1 alive, 1 dead``: the publishers' leases of a generation."""
    alive = sum(lease.alive for lease in state.leases)
    return leases_text(alive, len(state.leases) - alive)


def leases_text(alive: int, dead: int) -> Text:
    """``1 alive, 1 dead``, ``none``: counts of publishers' leases."""
    parts = []
    if alive:
        parts.append(Text(f"{alive} alive", "green"))
    if dead:
        parts.append(Text(f"{dead} dead", "red"))
    return Text(", ").join(parts) if parts else Text("none", "dim")
