"""``anywool ls``: every generation in the runtime directory, and the worker sockets left there.

Presentation only: the facts are :func:`anywool.discovery.local._survey.survey`'s. Reads,
never writes; a missing runtime directory is an empty one (exit 0).

``--json`` prints one document: ``runtime_dir`` (str), ``exists`` (bool), ``namespaces`` (list
of namespace documents, in entry order) and ``sockets`` (list of socket documents); see
:mod:`anywool.cli._ops` for both.
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
    refused,
    runtime_dir_option,
    runtime_root,
    socket_document,
    state_text,
    where,
    workers_cell,
)
from anywool.discovery.local import _survey

__all__ = ["ls"]


@click.command()
@json_option
@runtime_dir_option
def ls(as_json: bool, runtime_dir: str | None) -> None:
    """List every namespace of this host: state, owner, workers and publishers' leases.

    A namespace is shown by the name its owner recorded, else by its entry (ns-<key>), which
    show and reclaim accept as well.
    """
    root, _ = runtime_root(runtime_dir)
    with refused(runtime_dir):
        found = _survey.survey(root)
    if as_json:
        emit({"runtime_dir": str(found.root), "exists": found.exists,
              "namespaces": [namespace_document(state) for state in found.namespaces],
              "sockets": [socket_document(socket) for socket in found.sockets]})
        return
    out = console()
    if not found.exists:
        out.print(Text(f"no runtime directory at {where(root)}: nothing there"))
        return
    if not found.namespaces:
        out.print(Text(f"no namespaces in {where(found.root)}"))
    else:
        table = Table(title=Text(f"namespaces in {where(found.root)}"), title_justify="left",
                      **TABLE_STYLE)
        table.add_column("namespace", overflow="fold")
        table.add_column("state")
        table.add_column("owner pid", justify="right")
        table.add_column("workers", justify="right")
        table.add_column("leases")
        for state in found.namespaces:
            table.add_row(label(state), state_text(state), number_cell(state.owner_pid),
                          workers_cell(state), leases_cell(state))
        out.print(table)
        for state in found.namespaces:
            if state.error is not None:
                out.print(Text.assemble(label(state), Text(f": {state.error}", "yellow")))
    if found.sockets:
        dead = sum(not socket.alive for socket in found.sockets)
        reclaimable = sum(socket.reclaimable for socket in found.sockets)
        line = f"worker socket directories: {len(found.sockets) - dead} live, {dead} dead"
        out.print(Text(line + f" ({reclaimable} reclaimable)" if dead else line))
