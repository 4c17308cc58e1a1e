"""The discovery vocabulary: events and the protocols every discovery service satisfies.

Only types (and the check of an event's halves) live here; nothing in this module does I/O.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Literal, Protocol, TypeAlias, get_args, runtime_checkable

from anywool.metadata import WorkerMetadata

DiscoveryEventType: TypeAlias = Literal["worker-added", "worker-dropped", "worker-updated"]
EVENT_TYPES: frozenset[str] = frozenset(get_args(DiscoveryEventType))

PredicateFunction: TypeAlias = Callable[[WorkerMetadata], bool]


def check_event(type: object, metadata: object) -> None:
    """Check the two halves of an event (a :class:`DiscoveryEvent`'s, or a publish's arguments).

    :raises ValueError: ``type`` is not one of the three event types.
    :raises TypeError: ``metadata`` is not a :class:`~anywool.WorkerMetadata`.
    """
    if type not in EVENT_TYPES:
        raise ValueError(f"type must be one of {sorted(EVENT_TYPES)}, got {type!r}")
    if not isinstance(metadata, WorkerMetadata):
        raise TypeError(f"metadata must be a WorkerMetadata, got {metadata!r}")


class DiscoveryEvent:
    """One change to the set of workers in a namespace.

    :param type: ``"worker-added"``, ``"worker-updated"`` or ``"worker-dropped"``.
    :param metadata: the worker after the change (for a drop: its last known metadata).
    :raises ValueError: ``type`` is not one of the three event types.
    """

    __slots__ = ("metadata", "type")

    def __init__(self, type: DiscoveryEventType, /, metadata: WorkerMetadata) -> None:
        check_event(type, metadata)
        self.type: DiscoveryEventType = type
        self.metadata = metadata

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DiscoveryEvent):
            return NotImplemented
        return self.type == other.type and self.metadata.same_as(other.metadata)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value object

    def __repr__(self) -> str:
        return f"DiscoveryEvent({self.type!r}, metadata={self.metadata!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (DiscoveryEvent, (self.type, self.metadata))


@runtime_checkable
class DiscoveryPublisherLike(Protocol):
    """Announces worker lifecycle changes to a namespace."""

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None: ...


@runtime_checkable
class DiscoverySubscriberLike(Protocol):
    """An async iterable of :class:`DiscoveryEvent`; each iteration starts from a snapshot."""

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]: ...


@runtime_checkable
class DiscoveryLike(Protocol):
    """A discovery service: hands out a publisher and subscribers for its namespace."""

    @property
    def publisher(self) -> DiscoveryPublisherLike: ...

    @property
    def subscriber(self) -> DiscoverySubscriberLike: ...

    def subscribe(self, filter: PredicateFunction | None = None) -> DiscoverySubscriberLike: ...


class Discovery(ABC):
    """Convenience base class for discovery services (optional: the protocols suffice)."""

    @property
    @abstractmethod
    def publisher(self) -> DiscoveryPublisherLike: ...

    @property
    @abstractmethod
    def subscriber(self) -> DiscoverySubscriberLike: ...

    @abstractmethod
    def subscribe(self, filter: PredicateFunction | None = None) -> DiscoverySubscriberLike: ...
