"""``anywool ls``: every generation in the runtime directory, and the worker sockets left there.

Presentation only: the facts are :func:`anywool.discovery.local._survey.survey`'s. Reads,
never writes; a missing runtime directory is an empty one (exit 0).

``--json`` prints one document: ``runtime_dir`` (str), ``exists`` (bool), ``namespaces`` (list
of namespace documents, in entry order) and ``sockets`` (list of socket documents); see
:mod:`anywool.cli._ops` for both.

With ``--etcd URL``, the namespaces of that cluster under ``--etcd-prefix`` instead (read by
:func:`anywool.cli._etcd_ops.survey`, as of one revision): ``--json`` then prints ``etcd``
(the endpoints), ``prefix`` and ``namespaces`` (etcd namespace documents, in key order).
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from anywool.cli._etcd_ops import EtcdCluster, cluster_for_reading, etcd_options, fetch, survey
from anywool.cli._ops import (
    TABLE_STYLE,
    console,
    emit,
    etcd_label,
    etcd_namespace_document,
    etcd_owner_text,
    json_option,
    label,
    leases_cell,
    leases_text,
    namespace_document,
    number_cell,
    refused,
    runtime_dir_option,
    runtime_root,
    socket_document,
    state_text,
    text,
    where,
    workers_cell,
)
from anywool.discovery.local import _survey

__all__ = ["ls"]


@click.command()
@json_option
@runtime_dir_option
@etcd_options("List the namespaces of this etcd cluster instead of this host's: a member's "
              "client URL (repeatable).")
def ls(as_json: bool, runtime_dir: str | None, **etcd: Any) -> None:
    """List every namespace of this host: state, owner, workers and publishers' leases.

    A namespace is shown by the name its owner recorded, else by its entry (ns-<key>), which
    show and reclaim accept as well. With --etcd, the namespaces of that cluster: owner host
    and pid, generation, workers.
    """
    cluster = cluster_for_reading(runtime_dir, etcd)
    if cluster is not None:
        _ls_etcd(cluster, as_json)
        return
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


def _ls_etcd(cluster: EtcdCluster, as_json: bool) -> None:
    found = fetch(survey, cluster)
    if as_json:
        emit({"etcd": list(cluster.endpoints), "prefix": cluster.prefix,
              "namespaces": [etcd_namespace_document(state) for state in found]})
        return
    out = console()
    if not found:
        out.print(text(f"no namespaces in {cluster.where()}", limit=1 << 16))
        return
    table = Table(title=text(f"namespaces in {cluster.where()}", limit=1 << 16),
                  title_justify="left", **TABLE_STYLE)
    table.add_column("namespace", overflow="fold")
    table.add_column("state")
    table.add_column("owner", overflow="fold")
    table.add_column("generation", justify="right")
    table.add_column("workers", justify="right")
    table.add_column("leases")
    for state in found:
        table.add_row(etcd_label(state), state_text(state), etcd_owner_text(state),
                      number_cell(state.generation), str(state.worker_count),
                      leases_text(len(state.leases), 0))
    out.print(table)
    for state in found:
        if state.error is not None:
            out.print(Text.assemble(etcd_label(state), Text(f": {state.error}", "yellow")))

