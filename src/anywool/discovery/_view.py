"""Views: the workers a consumer knows, by uid, and the events that change one.

Every place that turns a change of workers into discovery events (the shared source reading
the journal or a snapshot, a consumer resynchronised after overflowing, :func:`afilter`) uses
:func:`event_for`, so that they agree on the contract: ``worker-added`` for a worker the view
did not have, ``worker-updated`` only when some field really changed, ``worker-dropped`` with
the metadata the view last had.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional
from uuid import UUID

from anywool.discovery._protocols import DiscoveryEvent
from anywool.metadata import WorkerMetadata

View = dict[UUID, WorkerMetadata]


def event_for(known: Optional[WorkerMetadata],
              new: Optional[WorkerMetadata]) -> DiscoveryEvent | None:
    """The event that takes one worker from ``known`` to ``new`` (``None``: absent), or
    ``None`` when nothing a consumer can see changed."""
    if new is None:
        return None if known is None else DiscoveryEvent("worker-dropped", known)
    if known is None:
        return DiscoveryEvent("worker-added", new)
    return None if known.same_as(new) else DiscoveryEvent("worker-updated", new)


def diff(old: Mapping[UUID, WorkerMetadata],
         new: Mapping[UUID, WorkerMetadata]) -> list[DiscoveryEvent]:
    """The events that turn view ``old`` into ``new``: drops first, then in ``new``'s order."""
    if not old:  # a first read: every worker is new
        return [DiscoveryEvent("worker-added", m) for m in new.values()]
    events = [DiscoveryEvent("worker-dropped", m) for uid, m in old.items() if uid not in new]
    for uid, metadata in new.items():
        event = event_for(old.get(uid), metadata)
        if event is not None:
            events.append(event)
    return events


def replay(view: Mapping[UUID, WorkerMetadata],
           changes: Iterable[tuple[UUID, Optional[WorkerMetadata]]]) -> list[DiscoveryEvent]:
    """The events of ``changes`` (uid, new metadata or ``None`` for a drop), in order, as seen
    from ``view`` (which is not modified)."""
    current = dict(view)
    events: list[DiscoveryEvent] = []
    for uid, metadata in changes:
        event = event_for(current.get(uid), metadata)
        if metadata is None:
            current.pop(uid, None)
        else:
            current[uid] = metadata
        if event is not None:
            events.append(event)
    return events


def apply(view: View, events: Iterable[DiscoveryEvent]) -> None:
    """Bring ``view`` up to date with ``events``."""
    for event in events:
        if event.type == "worker-dropped":
            view.pop(event.metadata.uid, None)
        else:
            view[event.metadata.uid] = event.metadata
