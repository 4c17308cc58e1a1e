"""LAN discovery over mDNS/DNS-SD (zeroconf): :class:`LanDiscovery` and its borrowers.

Machinery, one concept per module: ``_service`` (service type, instance names, TXT records and
their signatures; pure), ``_zeroconf`` (the one place that touches zeroconf and its event loop),
``_announcer`` (a publisher's records and their lifetime), ``_source`` (the shared
subscription's zeroconf browser) and ``_lan`` (LanDiscovery, Publisher, Subscriber).
"""

from anywool.discovery.lan._lan import LanDiscovery

__all__ = ["LanDiscovery"]
