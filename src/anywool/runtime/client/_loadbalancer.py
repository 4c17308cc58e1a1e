"""Load balancers: which admitted worker takes the next call.

A balancer only chooses and retries; it never opens connections (the proxy owns them) and never
retries a call a worker may have started: only :class:`~anywool.lowlevel.CallNotDelivered`
moves a call to the next worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from anywool.errors import NoWorkersAvailable
from anywool.metadata import WorkerMetadata
from anywool.runtime.client._call import CallNotDelivered
from anywool.runtime.client._connection import WorkerConnection

T = TypeVar("T")


@runtime_checkable
class LoadBalancerLike(Protocol):
    """Chooses a worker for each call."""

    async def dispatch(
        self,
        workers: Sequence[tuple[WorkerMetadata, WorkerConnection]],
        send: Callable[[WorkerConnection], Awaitable[T]],
    ) -> T:
        """Run ``send`` on the connection of one of ``workers`` and return its result.

        :param workers: the admitted workers with an open connection, in admission order.
        :param send: delivers the call over a connection; raises
            :class:`~anywool.lowlevel.CallNotDelivered` when that worker did not take it
            (:class:`~anywool.lowlevel.WorkerBusy` when it runs its ``max_concurrency`` calls).
            Await it in the task that called ``dispatch``: the context variables the routine
            sets are set in that task's context.
        :raises NoWorkersAvailable: no worker took the call (when every worker was busy, the
            proxy waits for one to have room and calls ``dispatch`` again).
        """
        ...


class RoundRobinLoadBalancer:
    """Hands calls to the workers in turn, skipping broken connections and refusing workers.

    A worker that refuses a call (it is stopping, or runs its ``max_concurrency`` calls), whose
    connection is broken, or that refused an earlier call as busy and has not had room since, is
    skipped and the next one tried, each worker at most once per call. Exceptions other than
    :class:`~anywool.lowlevel.CallNotDelivered` (the routine's own, a connection lost
    mid-call, cancellation) propagate unchanged.
    """

    def __init__(self) -> None:
        self._next = 0

    def __reduce__(self) -> tuple[type[RoundRobinLoadBalancer], tuple[()]]:
        # Its turn is this process's: a copy elsewhere starts afresh (and proxies that differ
        # only in it pickle alike, so that they share their proxies on workers).
        return (RoundRobinLoadBalancer, ())

    async def dispatch(
        self,
        workers: Sequence[tuple[WorkerMetadata, WorkerConnection]],
        send: Callable[[WorkerConnection], Awaitable[T]],
    ) -> T:
        """See :meth:`LoadBalancerLike.dispatch`.

        :raises NoWorkersAvailable: ``workers`` is empty, or every worker refused the call or had a
            broken connection (the message names the last failure).
        """
        count = len(workers)
        if count == 0:
            raise NoWorkersAvailable("no admitted worker is connected")
        start = self._next % count
        self._next = start + 1
        last: CallNotDelivered | None = None
        for offset in range(count):
            _, connection = workers[(start + offset) % count]
            if connection.broken or connection.busy:
                continue
            try:
                return await send(connection)
            except CallNotDelivered as exc:
                last = exc
        reason = f"all {count} workers refused the call or were disconnected"
        raise NoWorkersAvailable(reason if last is None else f"{reason} (last: {last})")

    def pick(self, workers: Sequence[tuple[WorkerMetadata, WorkerConnection]]
             ) -> WorkerConnection | None:
        """The connection :meth:`dispatch` would try first, chosen now, without sending
        anything (``None``: every worker is busy or disconnected); the turn moves past it.
        A proxy hands a call to it directly (a call it refuses goes through
        :meth:`dispatch`)."""
        count = len(workers)
        start = self._next
        for offset in range(count):
            index = (start + offset) % count
            connection = workers[index][1]
            if not (connection.broken or connection.busy):
                self._next = index + 1
                return connection
        return None
