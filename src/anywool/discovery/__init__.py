"""Discovery: how workers announce themselves and how pools find them."""

from typing import TYPE_CHECKING

from anywool._lazy import exports

if TYPE_CHECKING:
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
    from anywool.discovery.etcd import EtcdDiscovery
    from anywool.discovery.lan import LanDiscovery
    from anywool.discovery.local import LocalDiscovery

__all__ = [
    "Discovery",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryLike",
    "DiscoveryPublisherLike",
    "DiscoverySubscriberLike",
    "EtcdDiscovery",
    "LanDiscovery",
    "LocalDiscovery",
    "PredicateFunction",
    "afilter",
]

_WHERE = {
    "Discovery": "anywool.discovery._protocols",
    "DiscoveryEvent": "anywool.discovery._protocols",
    "DiscoveryEventType": "anywool.discovery._protocols",
    "DiscoveryLike": "anywool.discovery._protocols",
    "DiscoveryPublisherLike": "anywool.discovery._protocols",
    "DiscoverySubscriberLike": "anywool.discovery._protocols",
    "EtcdDiscovery": "anywool.discovery.etcd",
    "LanDiscovery": "anywool.discovery.lan",
    "LocalDiscovery": "anywool.discovery.local",
    "PredicateFunction": "anywool.discovery._protocols",
    "afilter": "anywool.discovery._filter",
}
__getattr__, __dir__ = exports(__name__, _WHERE)
