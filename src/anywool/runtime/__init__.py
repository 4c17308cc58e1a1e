"""The worker runtime: routines, the wire protocol, workers, proxies and pools."""

from typing import TYPE_CHECKING

from anywool._lazy import exports

if TYPE_CHECKING:
    from anywool.runtime._auth import MutualTLS
    from anywool.runtime._context import ContextVar
    from anywool.runtime._lifespan import WorkerInfo, current_worker
    from anywool.runtime._loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
    from anywool.runtime._local_worker import LocalWorker
    from anywool.runtime._output import OutputLine
    from anywool.runtime._pool import WorkerPool
    from anywool.runtime._proxy import WorkerProxy
    from anywool.runtime._resolve import Factory, resolved
    from anywool.runtime._routine import RoutineTask, current_task, routine, run_sync
    from anywool.runtime._serializer import SerializationWarning
    from anywool.runtime._stats import WorkerStats

__all__ = [
    "ContextVar",
    "Factory",
    "LoadBalancerLike",
    "LocalWorker",
    "MutualTLS",
    "OutputLine",
    "RoundRobinLoadBalancer",
    "RoutineTask",
    "SerializationWarning",
    "WorkerPool",
    "WorkerProxy",
    "WorkerInfo",
    "WorkerStats",
    "current_task",
    "current_worker",
    "resolved",
    "routine",
    "run_sync",
]

_WHERE = {
    "ContextVar": "anywool.runtime._context",
    "Factory": "anywool.runtime._resolve",
    "LoadBalancerLike": "anywool.runtime._loadbalancer",
    "LocalWorker": "anywool.runtime._local_worker",
    "MutualTLS": "anywool.runtime._auth",
    "OutputLine": "anywool.runtime._output",
    "RoundRobinLoadBalancer": "anywool.runtime._loadbalancer",
    "RoutineTask": "anywool.runtime._routine",
    "SerializationWarning": "anywool.runtime._serializer",
    "WorkerPool": "anywool.runtime._pool",
    "WorkerProxy": "anywool.runtime._proxy",
    "WorkerInfo": "anywool.runtime._lifespan",
    "WorkerStats": "anywool.runtime._stats",
    "current_task": "anywool.runtime._routine",
    "current_worker": "anywool.runtime._lifespan",
    "resolved": "anywool.runtime._resolve",
    "routine": "anywool.runtime._routine",
    "run_sync": "anywool.runtime._routine",
}
__getattr__, __dir__ = exports(__name__, _WHERE)
