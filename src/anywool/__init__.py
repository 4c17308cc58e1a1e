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
    DiscoveryRegistryCorrupt,
    DiscoveryWorkerNotFound,
    NoWorkersAvailable,
    PayloadTooLarge,
    RoutineCancelled,
    WoolError,
    WorkerError,
)
from anywool.metadata import WorkerMetadata
from anywool.runtime.loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool.runtime.local_worker import LocalWorker
from anywool.runtime.pool import WorkerPool
from anywool.runtime.proxy import WorkerProxy
from anywool.runtime.resolve import Factory, resolved
from anywool.runtime.routine import routine
from anywool.runtime.serializer import SerializationWarning

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
    "DiscoveryRegistryCorrupt",
    "DiscoverySubscriberLike",
    "DiscoveryWorkerNotFound",
    "Factory",
    "LoadBalancerLike",
    "LocalDiscovery",
    "LocalWorker",
    "NoWorkersAvailable",
    "PayloadTooLarge",
    "PredicateFunction",
    "RoundRobinLoadBalancer",
    "RoutineCancelled",
    "SerializationWarning",
    "WoolError",
    "WorkerError",
    "WorkerMetadata",
    "WorkerPool",
    "WorkerProxy",
    "afilter",
    "resolved",
    "routine",
]
