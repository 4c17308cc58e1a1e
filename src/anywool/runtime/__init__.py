"""The worker runtime: routines, the wire protocol, workers, proxies and pools."""

from typing import TYPE_CHECKING

from anywool._lazy import exports

if TYPE_CHECKING:
    from anywool._tls import MutualTLS
    from anywool.runtime._context import ContextVar
    from anywool.runtime._lifespan import WorkerInfo, current_worker
    from anywool.runtime._map import MapResults, map
    from anywool.runtime._output import OutputLine
    from anywool.runtime._routine import RoutineTask, current_task, routine, run_sync
    from anywool.runtime.client._loadbalancer import LoadBalancerLike, RoundRobinLoadBalancer
    from anywool.runtime.client._proxy import WorkerProxy
    from anywool.runtime.client._resolve import Factory, resolved
    from anywool.runtime.pool._local_worker import LocalWorker
    from anywool.runtime.pool._pool import WorkerPool
    from anywool.runtime.wire._serializer import SerializationWarning
    from anywool.runtime.wire._stats import WorkerStats

__all__ = [
    "ContextVar",
    "Factory",
    "LoadBalancerLike",
    "LocalWorker",
    "MapResults",
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
    "map",
    "resolved",
    "routine",
    "run_sync",
]

_WHERE = {
    "ContextVar": "anywool.runtime._context",
    "Factory": "anywool.runtime.client._resolve",
    "LoadBalancerLike": "anywool.runtime.client._loadbalancer",
    "LocalWorker": "anywool.runtime.pool._local_worker",
    "MapResults": "anywool.runtime._map",
    "MutualTLS": "anywool._tls",
    "OutputLine": "anywool.runtime._output",
    "RoundRobinLoadBalancer": "anywool.runtime.client._loadbalancer",
    "RoutineTask": "anywool.runtime._routine",
    "SerializationWarning": "anywool.runtime.wire._serializer",
    "WorkerPool": "anywool.runtime.pool._pool",
    "WorkerProxy": "anywool.runtime.client._proxy",
    "WorkerInfo": "anywool.runtime._lifespan",
    "WorkerStats": "anywool.runtime.wire._stats",
    "current_task": "anywool.runtime._routine",
    "current_worker": "anywool.runtime._lifespan",
    "map": "anywool.runtime._map",
    "resolved": "anywool.runtime.client._resolve",
    "routine": "anywool.runtime._routine",
    "run_sync": "anywool.runtime._routine",
}
# The machinery, by side: the bytes between processes, the caller, a worker process, a host's
# workers. Internal: dir() leaves them out once imported.
_INTERNAL = ("wire", "client", "worker", "pool")
__getattr__, __dir__ = exports(__name__, _WHERE, _INTERNAL)
