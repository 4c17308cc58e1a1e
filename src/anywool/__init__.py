"""anywool: run async routines on worker processes found through discovery, on asyncio or trio."""

from anywool.discovery.filter import afilter
from anywool.discovery.local import LocalDiscovery
from anywool.discovery.protocols import (
    Discovery,
    DiscoveryEvent,
    DiscoveryEventType,
    DiscoveryLike,
    DiscoveryPublisherLike,
    DiscoverySubscriberLike,
    PredicateFunction,
)
from anywool.errors import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    DiscoveryError,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryWorkerNotFound,
    NoWorkersAvailable,
    RoutineCancelled,
    WoolError,
    WorkerError,
)
from anywool.metadata import WorkerMetadata

__version__ = "0.1.0"

__all__ = [
    "Discovery",
    "DiscoveryBlockExhausted",
    "DiscoveryCapacityExhausted",
    "DiscoveryError",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryLike",
    "DiscoveryNamespaceInUse",
    "DiscoveryNamespaceNotFound",
    "DiscoveryPublisherLike",
    "DiscoverySubscriberLike",
    "DiscoveryWorkerNotFound",
    "LocalDiscovery",
    "NoWorkersAvailable",
    "PredicateFunction",
    "RoutineCancelled",
    "WoolError",
    "WorkerError",
    "WorkerMetadata",
    "afilter",
]
