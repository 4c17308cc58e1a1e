"""Discovery on an etcd cluster, through its v3 JSON gateway: :class:`EtcdDiscovery` and its
borrowers.

Machinery, one concept per module: ``_config`` (endpoints, prefix, TLS, credentials, timeouts:
checked once), ``_keys`` (where a namespace lives and what its keys hold; pure), ``_gateway``
(requests, failover, authentication), ``_http`` (connections), ``_lease`` (a lease kept alive from a thread),
``_source`` (the shared watch of a namespace) and ``_etcd`` (EtcdDiscovery, Publisher,
Subscriber), over ``_http`` (HTTP/1.1 connections, framed by h11: install ``anywool[etcd]``).
"""

try:
    import h11  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("EtcdDiscovery needs h11: pip install 'anywool[etcd]'") from exc

from anywool.discovery.etcd._etcd import EtcdDiscovery

__all__ = ["EtcdDiscovery"]
