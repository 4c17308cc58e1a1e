"""In-memory stand-ins for discovery, for tests that need no file-backed namespace."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from anywool.discovery._protocols import (
    DiscoveryEvent,
    DiscoveryEventType,
    DiscoverySubscriberLike,
    PredicateFunction,
)
from anywool.metadata import WorkerMetadata


class FakeDiscovery:
    """A DiscoveryLike held in memory: one event loop, no persistence, no other processes."""

    def __init__(self) -> None:
        self.workers: dict[object, WorkerMetadata] = {}
        self._streams: list[MemoryObjectSendStream[DiscoveryEvent]] = []

    @property
    def publisher(self) -> FakeDiscovery.Publisher:
        return FakeDiscovery.Publisher(self)

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        return self.subscribe()

    def subscribe(self, filter: PredicateFunction | None = None) -> DiscoverySubscriberLike:
        return FakeDiscovery.Subscriber(self, filter)

    class Publisher:
        def __init__(self, owner: FakeDiscovery) -> None:
            self._owner = owner

        async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
            owner = self._owner
            if type == "worker-dropped":
                if owner.workers.pop(metadata.uid, None) is None:
                    return
            else:
                owner.workers[metadata.uid] = metadata
            for stream in list(owner._streams):
                try:
                    stream.send_nowait(DiscoveryEvent(type, metadata=metadata))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    owner._streams.remove(stream)

    class Subscriber:
        def __init__(self, owner: FakeDiscovery, filter: PredicateFunction | None) -> None:
            self._owner = owner
            self._filter = filter

        async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            send, receive = anyio.create_memory_object_stream[DiscoveryEvent](math.inf)
            for metadata in self._owner.workers.values():
                send.send_nowait(DiscoveryEvent("worker-added", metadata=metadata))
            self._owner._streams.append(send)
            try:
                with receive:
                    async for event in receive:
                        if self._filter is None or self._filter(event.metadata):
                            yield event
            finally:
                if send in self._owner._streams:
                    self._owner._streams.remove(send)
                send.close()


class FailingSubscriber:
    """A subscriber whose every iteration raises ``error`` at once."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return self

    async def __anext__(self) -> DiscoveryEvent:
        raise self.error
