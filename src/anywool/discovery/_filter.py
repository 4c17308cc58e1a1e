"""afilter: a subscriber seen through a predicate on worker metadata.

Pure async iteration over another subscriber; it owns no task, thread or file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from anywool.discovery import _view
from anywool.discovery._protocols import DiscoveryEvent, DiscoverySubscriberLike, PredicateFunction
from anywool.metadata import WorkerMetadata


class afilter:
    """Filter a subscriber's events through ``predicate``, tracking membership per worker.

    A worker that starts passing the predicate is reported as ``worker-added``, one that keeps
    passing as ``worker-updated``, one that stops passing (or is dropped) as ``worker-dropped``
    with its last admitted metadata; events of workers never admitted are not reported.
    Picklable when ``predicate`` and ``subscriber`` are.

    :param predicate: called with each worker's metadata; a truthy result admits it.
    :param subscriber: any :class:`~anywool.DiscoverySubscriberLike`.
    :raises TypeError: ``predicate`` is not callable or ``subscriber`` is not a subscriber.
    """

    def __init__(self, predicate: PredicateFunction, subscriber: DiscoverySubscriberLike) -> None:
        if not callable(predicate):
            raise TypeError(f"predicate must be callable, got {predicate!r}")
        if not isinstance(subscriber, DiscoverySubscriberLike):
            raise TypeError(f"subscriber must be a DiscoverySubscriberLike, got {subscriber!r}")
        self.predicate = predicate
        self.subscriber = subscriber

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[DiscoveryEvent]:
        admitted: dict[UUID, WorkerMetadata] = {}
        events = self.subscriber.__aiter__()
        try:
            async for event in events:
                for filtered in self._admit(admitted, event):
                    yield filtered
        finally:
            # Close the inner iteration now, not when it is garbage collected, so that closing
            # this one releases the underlying source at once.
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    def _admit(self, admitted: dict[UUID, WorkerMetadata],
               event: DiscoveryEvent) -> list[DiscoveryEvent]:
        uid = event.metadata.uid
        passes = event.type != "worker-dropped" and self.predicate(event.metadata)
        events = _view.replay(admitted, [(uid, event.metadata if passes else None)])
        _view.apply(admitted, events)
        return events

    def __reduce__(self) -> tuple[Any, ...]:
        return (afilter, (self.predicate, self.subscriber))

    def __repr__(self) -> str:
        return f"afilter({self.predicate!r}, {self.subscriber!r})"
