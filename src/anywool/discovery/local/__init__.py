"""The file-backed discovery of one host: :class:`LocalDiscovery` and its borrowers.

Machinery, one concept per module: ``_keys`` (namespace names on disk), ``_flock`` (descriptors
and their locks), ``_layout`` (the registry's on-disk format and journal), ``_claim`` (claim,
sweep, reap), ``_binding`` (borrowers' bindings and leases), ``_watch`` (the change hint),
``_local`` (LocalDiscovery, Publisher, Subscriber) and ``_survey`` (a runtime directory read
without changing it, for the operations commands).
"""

from anywool.discovery.local._local import LocalDiscovery

__all__ = ["LocalDiscovery"]
