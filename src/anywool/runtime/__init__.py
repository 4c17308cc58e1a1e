"""The worker runtime: routines, the wire protocol, workers, proxies and pools."""

from anywool.runtime._auth import MutualTLS
from anywool.runtime._context import ContextVar
from anywool.runtime._loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
from anywool.runtime._local_worker import LocalWorker
from anywool.runtime._pool import WorkerPool
from anywool.runtime._proxy import WorkerProxy
from anywool.runtime._resolve import Factory, resolved
from anywool.runtime._routine import RoutineTask, current_task, routine
from anywool.runtime._serializer import SerializationWarning

__all__ = [
    "ContextVar",
    "Factory",
    "LoadBalancerLike",
    "LocalWorker",
    "MutualTLS",
    "RoundRobinLoadBalancer",
    "RoutineTask",
    "SerializationWarning",
    "WorkerPool",
    "WorkerProxy",
    "current_task",
    "resolved",
    "routine",
]
