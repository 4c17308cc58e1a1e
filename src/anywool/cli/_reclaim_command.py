"""``anywool reclaim [NS]``: remove what dead processes left in the runtime directory.

Presentation only: the removal is :func:`anywool.discovery.local._survey.reclaim`'s, which
decides each entry by taking the kernel lock its holder would hold: a live owner's namespace
(a stopped owner's included), a claimant's or a worker's directory is never touched. With NS,
exit 1 when no generation of NS exists (nothing on standard output then); a live one is left
alone (exit 0).

``--json`` prints one document: ``runtime_dir`` (str), ``namespace`` (NS, or null),
``state`` (NS's state before the reclaim, or null without NS) and ``removed`` (list of swept
documents, see :mod:`anywool.cli._ops`).
"""

from __future__ import annotations

import click
from rich.text import Text

from anywool.cli._ops import (
    console,
    emit,
    json_option,
    label,
    number_cell,
    refused,
    runtime_dir_option,
    runtime_root,
    swept_document,
    text,
    where,
)
from anywool.discovery.local import _survey

__all__ = ["reclaim"]

_HELD = {"live", "retiring", "claiming", "sweeping"}


@click.command()
@click.argument("namespace", required=False)
@json_option
@runtime_dir_option
def reclaim(namespace: str | None, as_json: bool, runtime_dir: str | None) -> None:
    """Remove dead owners' namespaces, killed claimants' leftovers and dead workers' socket
    directories; with NAMESPACE, only that namespace's generation, if its owner is dead.

    NAMESPACE is a namespace's name, or an entry as ls shows it. A live owner's namespace is
    never touched, however long it has been stopped: the kernel lock it holds decides.
    """
    root, exists = runtime_root(runtime_dir)
    state = None
    with refused(runtime_dir):
        if namespace is not None:
            state = _survey.find(namespace, root) if exists else None
            if state is None:
                raise click.ClickException(
                    f"no generation of namespace {namespace!r} in {where(root)}")
            removed = _survey.reclaim_state(root, state)
        else:
            removed = _survey.reclaim(root) if exists else []
    if as_json:
        emit({"runtime_dir": str(root), "namespace": namespace,
              "state": None if state is None else state.state,
              "removed": [swept_document(swept) for swept in removed]})
        return
    out = console()
    for swept in removed:
        line = Text.assemble("removed ", text(swept.entry, "bold"), f" ({swept.kind}")
        if swept.namespace is not None:
            line.append_text(Text.assemble(", namespace ", text(swept.namespace)))
        line.append(")")
        out.print(line)
    if removed:
        out.print(Text(f"{len(removed)} removed from {where(root)}"))
    elif state is None:
        shown = where(root) if exists else f"{where(root)} (no runtime directory)"
        out.print(Text(f"nothing to remove in {shown}"))
    elif state.state in _HELD:
        holder = f"owner pid {number_cell(state.owner_pid)}" if state.owner_pid is not None \
            and state.state in ("live", "retiring") else "a live process holds it"
        out.print(Text.assemble(label(state), f" is {state.state} ({holder}): left alone"))
    else:
        out.print(Text.assemble(
            label(state), f" was {state.state} but was not removed: gone meanwhile, held "
            "again, or less than a second old"))
