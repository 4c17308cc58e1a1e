"""``anywool show NS``: one generation and its workers, each with its publisher's lease.

Presentation only: the facts are :func:`anywool.discovery.local._survey.find`'s. Reads, never
writes. Exit 1 when no generation of NS exists (nothing on standard output then).

``--json`` prints one document: ``runtime_dir`` (str) and ``namespace`` (the namespace document
with ``workers``, see :mod:`anywool.cli._ops`).
"""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from anywool.cli._ops import (
    TABLE_STYLE,
    console,
    emit,
    json_option,
    label,
    leases_cell,
    namespace_document,
    number_cell,
    plural,
    refused,
    runtime_dir_option,
    runtime_root,
    short,
    state_text,
    text,
    where,
    worker_cells,
    worker_columns,
)
from anywool.discovery.local import _survey

__all__ = ["show"]


@click.command()
@click.argument("namespace")
@json_option
@runtime_dir_option
def show(namespace: str, as_json: bool, runtime_dir: str | None) -> None:
    """Show NAMESPACE's generation and its workers, with each publisher's lease and liveness.

    NAMESPACE is a namespace's name, or an entry as ls shows it (ns-<key>, dead-<hex>,
    tmp-<hex>).
    """
    root, exists = runtime_root(runtime_dir)
    with refused(runtime_dir):
        state = _survey.find(namespace, root) if exists else None
    if state is None:
        raise click.ClickException(f"no generation of namespace {namespace!r} in {where(root)}")
    if as_json:
        emit({"runtime_dir": str(root), "namespace": namespace_document(state, workers=True)})
        return
    out = console()
    out.print(header(state))
    if state.workers is None:
        out.print(Text(f"workers unknown: {state.error}", "yellow"))
        return
    if not state.workers:
        out.print(Text("no workers", "dim"))
        return
    table = Table(**TABLE_STYLE)
    worker_columns(table)
    table.add_column("version", no_wrap=True)
    table.add_column("publisher", no_wrap=True)
    for entry in state.workers:
        metadata = entry.metadata
        if entry.lease is None:
            publisher = Text("no lease", "dim")
        elif entry.publisher_alive:
            publisher = Text.assemble(short(entry.lease), " ", ("alive", "green"))
        else:
            publisher = Text.assemble(short(entry.lease), " ", ("dead", "red"))
        table.add_row(*worker_cells(metadata), text(metadata.version, limit=16), publisher)
    out.print(table)


def header(state: _survey.NamespaceState) -> Text:
    """Two lines: ``jobs  live · owner pid 41 · capacity 128 · 5 changes``, then
    ``2 workers · leases 1 alive · entry ns-…``."""
    count = "? workers" if state.workers is None else plural(len(state.workers), "worker")
    return Text.assemble(
        label(state), "  ", state_text(state),
        f" · owner pid {number_cell(state.owner_pid)} · capacity {number_cell(state.capacity)}"
        f" · {number_cell(state.changes)} changes\n{count} · leases ",
        leases_cell(state), (f" · entry {state.entry}", "dim"))
