"""The worker runtime: routines, the wire protocol, workers, proxies and pools."""

from anywool.runtime.loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool.runtime.local_worker import LocalWorker
from anywool.runtime.pool import WorkerPool
from anywool.runtime.proxy import WorkerProxy
from anywool.runtime.resolve import Factory, resolved
from anywool.runtime.routine import routine
from anywool.runtime.serializer import SerializationWarning

__all__ = [
    "Factory",
    "LoadBalancerLike",
    "LocalWorker",
    "RoundRobinLoadBalancer",
    "SerializationWarning",
    "WorkerPool",
    "WorkerProxy",
    "resolved",
    "routine",
]
