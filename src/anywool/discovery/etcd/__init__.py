"""Discovery on an etcd cluster, through its v3 JSON gateway: :class:`EtcdDiscovery` and its
borrowers.

Machinery, one concept per module: ``_config`` (endpoints, prefix, TLS, credentials, timeouts:
checked once), ``_keys`` (where a namespace lives and what its keys hold; pure), ``_gateway``
(requests, failover, authentication), ``_lease`` (a lease kept alive from a thread),
``_source`` (the shared watch of a namespace) and ``_etcd`` (EtcdDiscovery, Publisher,
Subscriber). httpx is imported here: install ``anywool[etcd]``.
"""

try:
    import httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("EtcdDiscovery needs httpx: pip install 'anywool[etcd]'") from exc

from anywool.discovery.etcd._etcd import EtcdDiscovery

__all__ = ["EtcdDiscovery"]
