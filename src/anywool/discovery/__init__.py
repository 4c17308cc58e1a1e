"""Discovery: how workers announce themselves and how pools find them."""

from anywool.discovery._filter import afilter
from anywool.discovery._protocols import (
    Discovery,
    DiscoveryEvent,
    DiscoveryEventType,
    DiscoveryLike,
    DiscoveryPublisherLike,
    DiscoverySubscriberLike,
    PredicateFunction,
)
from anywool.discovery.lan import LanDiscovery
from anywool.discovery.local import LocalDiscovery

__all__ = [
    "Discovery",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryLike",
    "DiscoveryPublisherLike",
    "DiscoverySubscriberLike",
    "LanDiscovery",
    "LocalDiscovery",
    "PredicateFunction",
    "afilter",
]
