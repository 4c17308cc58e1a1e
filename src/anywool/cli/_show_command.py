"""``anywool show NS``: one generation and its workers, each with its publisher's lease.

Presentation only: the facts are :func:`anywool.discovery.local._survey.find`'s. Reads, never
writes. Exit 1 when no generation of NS exists (nothing on standard output then).

``--json`` prints one document: ``runtime_dir`` (str) and ``namespace`` (the namespace document
with ``workers``, see :mod:`anywool.cli._ops`).

With ``--etcd URL``, NS in that cluster under ``--etcd-prefix`` instead (one range of its keys,
:func:`anywool.cli._etcd_ops.read_namespace`); exit 1 when etcd holds no key of it. ``--json``
then prints ``etcd`` (the endpoints), ``prefix`` and ``namespace`` (the etcd namespace document
with ``workers``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from anywool.cli._etcd_ops import (
    EtcdCluster,
    EtcdNamespace,
    cluster_for_reading,
    etcd_options,
    fetch,
    read_namespace,
)
from anywool.cli._ops import (
    TABLE_STYLE,
    console,
    emit,
    etcd_label,
    etcd_namespace_document,
    etcd_owner_text,
    json_option,
    label,
    lease_hex,
    leases_cell,
    leases_text,
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
from anywool.metadata import WorkerMetadata

__all__ = ["show"]


@click.command()
@click.argument("namespace")
@json_option
@runtime_dir_option
@etcd_options("Show NAMESPACE in this etcd cluster instead of on this host: a member's client "
              "URL (repeatable).")
def show(namespace: str, as_json: bool, runtime_dir: str | None, **etcd: Any) -> None:
    """Show NAMESPACE's generation and its workers, with each publisher's lease and liveness.

    NAMESPACE is a namespace's name, or an entry as ls shows it (ns-<key>, dead-<hex>,
    tmp-<hex>); with --etcd, a namespace's name in that cluster.
    """
    cluster = cluster_for_reading(runtime_dir, etcd)
    if cluster is not None:
        _show_etcd(cluster, namespace, as_json)
        return
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
    out.print(workers_table((entry.metadata, entry.lease, entry.publisher_alive)
                            for entry in state.workers))


def workers_table(workers: Iterable[tuple[WorkerMetadata, str | None, bool | None]]) -> Table:
    """A table of workers, each with its publisher's lease (hex, or ``None``) and whether that
    publisher is alive."""
    table = Table(**TABLE_STYLE)
    worker_columns(table)
    table.add_column("version", no_wrap=True)
    table.add_column("publisher", no_wrap=True)
    for metadata, lease, alive in workers:
        if lease is None:
            publisher = Text("no lease", "dim")
        elif alive:
            publisher = Text.assemble(short(lease), " ", ("alive", "green"))
        else:
            publisher = Text.assemble(short(lease), " ", ("dead", "red"))
        table.add_row(*worker_cells(metadata), text(metadata.version, limit=16), publisher)
    return table


def _show_etcd(cluster: EtcdCluster, namespace: str, as_json: bool) -> None:
    state = fetch(read_namespace, cluster, namespace)
    if state is None:
        raise click.ClickException(f"no namespace {namespace!r} in {cluster.where()}")
    if as_json:
        emit({"etcd": list(cluster.endpoints), "prefix": cluster.prefix,
              "namespace": etcd_namespace_document(state, workers=True)})
        return
    out = console()
    out.print(etcd_header(state))
    if state.error is not None:
        out.print(text(state.error, "yellow", limit=1 << 16))
    if not state.workers:
        out.print(Text("no workers", "dim"))
        return
    out.print(workers_table((entry.metadata, lease_hex(entry.lease) if entry.lease else None,
                             True) for entry in state.workers))


def etcd_header(state: EtcdNamespace) -> Text:
    """Two lines: ``jobs  live · owner pid 41 on host-a · generation 1234 · lease ttl 5 s``,
    then ``2 workers · leases 1 alive · key /anywool/ns/…``."""
    ttl = "" if state.lease_ttl is None else f" · lease ttl {state.lease_ttl} s"
    return Text.assemble(
        etcd_label(state), "  ", state_text(state), " · owner ", etcd_owner_text(state),
        f" · generation {number_cell(state.generation)}{ttl}\n"
        f"{plural(state.worker_count, 'worker')} · leases ",
        leases_text(len(state.leases), 0), text(f" · key {state.key}", "dim", limit=1 << 16))


def header(state: _survey.NamespaceState) -> Text:
    """Two lines: ``jobs  live · owner pid 41 · capacity 128 · 5 changes``, then
    ``2 workers · leases 1 alive · entry ns-…``."""
    count = "? workers" if state.workers is None else plural(len(state.workers), "worker")
    return Text.assemble(
        label(state), "  ", state_text(state),
        f" · owner pid {number_cell(state.owner_pid)} · capacity {number_cell(state.capacity)}"
        f" · {number_cell(state.changes)} changes\n{count} · leases ",
        leases_cell(state), (f" · entry {state.entry}", "dim"))
