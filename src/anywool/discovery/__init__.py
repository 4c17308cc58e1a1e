"""Discovery: how workers announce themselves and how pools find them."""

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

__all__ = [
    "Discovery",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryLike",
    "DiscoveryPublisherLike",
    "DiscoverySubscriberLike",
    "LocalDiscovery",
    "PredicateFunction",
    "afilter",
]
