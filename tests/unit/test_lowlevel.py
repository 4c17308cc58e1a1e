"""anywool.lowlevel: what a custom load balancer is written against."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
import pytest

import anywool.lowlevel
from anywool import LoadBalancerLike, WorkerMetadata, WorkerPool, routine
from anywool.lowlevel import CallNotDelivered, WorkerConnection

pytestmark = pytest.mark.anyio

T = TypeVar("T")


@routine
async def triple(x: int) -> int:
    return 3 * x


class FirstThatTakesIt:
    """Tries the workers in order; counts what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def dispatch(
        self,
        workers: Sequence[tuple[WorkerMetadata, WorkerConnection]],
        send: Callable[[WorkerConnection], Awaitable[T]],
    ) -> T:
        for metadata, connection in workers:
            self.seen.append(connection.address)
            try:
                return await send(connection)
            except CallNotDelivered:
                continue
        raise anywool.NoWorkersAvailable("nobody took it")


def test_lowlevel_exposes_exactly_its_all():
    # Not identifiers: what pytest's assertion rewriting adds ("@py_builtins", "@pytest_ar"),
    # which covers every module of anywool since anywool ships a pytest plugin.
    public = {name for name in vars(anywool.lowlevel)
              if name.isidentifier() and not name.startswith("_")}
    assert public == set(anywool.lowlevel.__all__)


async def test_a_load_balancer_written_against_lowlevel_dispatches_calls():
    balancer = FirstThatTakesIt()
    assert isinstance(balancer, LoadBalancerLike)
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, loadbalancer=balancer) as pool:
            assert await triple(14) == 42
            address = pool.workers[0].address
    assert balancer.seen == [address]


async def test_discovery_stats_count_one_shared_source_and_its_iterations():
    from anywool import LocalDiscovery

    from ..helpers import follow, take, worker

    with anyio.fail_after(10):
        async with LocalDiscovery() as discovery, discovery.publisher as publisher:
            await publisher.publish("worker-added", first := worker())
            assert anywool.lowlevel.discovery_stats() == []
            async with anyio.create_task_group() as tg:
                streams = [await follow(tg, discovery.subscriber) for _ in range(3)]
                for events in streams:
                    assert await take(events, 1) == [("worker-added", first.uid)]
                [stats] = anywool.lowlevel.discovery_stats()
                assert isinstance(stats, anywool.lowlevel.SourceStats)
                assert (stats.binds, stats.consumers, stats.poll_interval) == (1, 3, 1.0)
                assert discovery.namespace not in stats.key  # a hash, never the name
                tg.cancel_scope.cancel()
            assert anywool.lowlevel.discovery_stats() == []
