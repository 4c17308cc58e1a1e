"""This host's addresses: which one to advertise for a wildcard bind, and what is loopback.

A worker bound to the wildcard (``0.0.0.0`` or ``::``) listens on every interface, but it must
announce one address that other hosts can reach: the first non-loopback, non-link-local address
of an interface that is up, IPv4 before IPv6 (interfaces listed by ``ifaddr``, which zeroconf
uses too). With none, it announces loopback, and LAN discovery warns
(:class:`~anywool.errors.LoopbackAdvertisementWarning`).
"""

from __future__ import annotations

import ipaddress

WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or host name) names this host only: ``127.0.0.0/8``,
    ``::1`` (also as an IPv4-mapped address), ``localhost`` or a name under it."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _is_up(name: str) -> bool:
    """Whether the interface ``name`` is up (Linux: its ``operstate``; elsewhere, or when
    unreadable, it counts as up)."""
    try:
        with open(f"/sys/class/net/{name}/operstate") as state:
            return state.read().strip() != "down"
    except OSError:
        return True


def routable_host(wildcard: str = "0.0.0.0") -> str:
    """The address to announce for a listener bound to ``wildcard`` (``"0.0.0.0"``: IPv4 only;
    ``"::"``: IPv6 first), or the loopback address of that family when there is none."""
    v4: list[str] = []
    v6: list[str] = []
    import ifaddr  # here: only a wildcard host needs it (a few ms of a worker's start)

    for adapter in ifaddr.get_adapters():
        if not _is_up(adapter.name):
            continue
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(ip.ip)
            else:
                address = ipaddress.IPv6Address(ip.ip[0])
            if address.is_loopback or address.is_link_local or address.is_unspecified \
                    or address.is_multicast:
                continue
            (v4 if address.version == 4 else v6).append(str(address))
    if wildcard == "::":
        return (v6 or v4 or ["::1"])[0]
    return (v4 or ["127.0.0.1"])[0]
