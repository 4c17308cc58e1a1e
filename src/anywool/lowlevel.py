"""What extending anywool takes, and using it does not: for authors of a custom load balancer,
and for whoever watches a process's discovery from the inside.

A :class:`~anywool.LoadBalancerLike` receives, for each call, the admitted workers as
``(WorkerMetadata, WorkerConnection)`` pairs and a ``send`` that delivers the call over one
connection. It may look at :attr:`WorkerConnection.broken` and :attr:`WorkerConnection.address`,
and may retry another worker when ``send`` raises :class:`CallNotDelivered` (the worker certainly
did not run the call; :class:`WorkerBusy` when it runs its ``max_concurrency`` calls, which
:attr:`WorkerConnection.busy` then says until the worker has room again). It never opens,
enters or closes a connection: the proxy owns them.

:func:`discovery_stats` lists the process's shared discovery sources (one per namespace and
poll interval, however many iterations follow it) as :class:`SourceStats`: how often each bound
a generation and read the registry, and how many iterations are attached now.

Less stable than :mod:`anywool`: a name here may change in a minor release, and the change is
announced in the release notes. Re-exports only; the machinery lives in private modules.
"""

from anywool.discovery._hub import SourceStats
from anywool.discovery._hub import source_stats as discovery_stats
from anywool.runtime.client._call import CallNotDelivered, WorkerBusy
from anywool.runtime.client._connection import WorkerConnection

__all__ = [
    "CallNotDelivered",
    "SourceStats",
    "WorkerBusy",
    "WorkerConnection",
    "discovery_stats",
]
