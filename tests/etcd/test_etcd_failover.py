"""EtcdDiscovery on a 3-member cluster: a subscription survives its member's death (SIGKILL of
the leader) and silence (SIGSTOP), resuming on another member without losing or repeating a
change. Both backends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from anywool import EtcdDiscovery
from anywool.discovery.etcd._config import Config
from anywool.discovery.etcd._gateway import Gateway
from anywool.discovery.etcd._http import TransportError
from anywool.discovery.etcd._keys import Keys, b64
from anywool.discovery.etcd._source import EtcdSource, Snapshot, source_key
from tests.etcd.cluster import EtcdCluster, EtcdMember
from tests.helpers import follow, take, wait_until, worker

pytestmark = pytest.mark.anyio

TTL = 2


def ordered(cluster: EtcdCluster, first: EtcdMember) -> list[str]:
    """The cluster's URLs with ``first``'s first (the member a new watch reads from)."""
    return [first.url] + [m.url for m in cluster.members if m is not first]


async def _through(cluster: EtcdCluster, watched: EtcdMember, fault: str, prefix: str) -> None:
    namespace = f"ns-{uuid.uuid4().hex[:12]}"
    others = [m.url for m in cluster.members if m is not watched]
    # The owner and the publisher talk to the other members; the subscription to ``watched``.
    async with EtcdDiscovery(namespace, endpoints=others, prefix=prefix, lease_ttl=TTL) as owner, \
            owner.publisher as publisher, anyio.create_task_group() as tg:
        events = await follow(tg, EtcdDiscovery.Subscriber(
            namespace, endpoints=ordered(cluster, watched), prefix=prefix))
        expected = []
        for i in range(3):
            metadata = worker(f"10.0.0.{i}:1")
            await publisher.publish("worker-added", metadata)
            expected.append(("worker-added", metadata.uid))
        with anyio.fail_after(5):  # (some may come in the snapshot, which has no order)
            assert set(await take(events, 3)) == set(expected)
        if fault == "kill":
            watched.kill()
        else:
            watched.freeze()
        # Changes made while the subscription moves are all delivered, in order, once.
        during = []
        for i in range(10):
            metadata = worker(f"10.0.1.{i}:1")
            await publisher.publish("worker-added", metadata)
            during.append(("worker-added", metadata.uid))
            await anyio.sleep(0.05)  # the workload's pace: changes spread over the move

        # The bounds of the contract (1 s after a leader's death, 5 s after a member froze)
        # are measured in benchmarks/; here with room for a loaded machine.
        with anyio.fail_after(10):
            assert await take(events, 10) == during
        tg.cancel_scope.cancel()


async def leader_of(cluster: EtcdCluster) -> EtcdMember:
    """The leader, once one is elected (the cluster may be electing as the test starts)."""
    # No event says so: each member's status is asked until one reports itself leader.
    await wait_until(lambda: cluster.leader() is not None, "an elected leader", 5)
    leader = cluster.leader()
    assert leader is not None
    return leader


async def test_a_subscription_survives_the_leaders_death(etcd_cluster3: EtcdCluster,
                                                         etcd_prefix: str) -> None:
    leader = await leader_of(etcd_cluster3)
    await _through(etcd_cluster3, leader, "kill", etcd_prefix)


async def test_a_subscription_leaves_a_frozen_member(etcd_cluster3: EtcdCluster,
                                                     etcd_prefix: str) -> None:
    leader = await leader_of(etcd_cluster3)
    follower = next(m for m in etcd_cluster3.members if m is not leader)
    await _through(etcd_cluster3, follower, "freeze", etcd_prefix)


async def test_a_frozen_member_costs_a_request_its_share_of_the_budget_only(
        etcd_cluster3: EtcdCluster, etcd_prefix: str) -> None:
    leader = await leader_of(etcd_cluster3)
    frozen = next(m for m in etcd_cluster3.members if m is not leader)
    frozen.freeze()
    budget = 1.5  # three members: 0.5 s each
    started = anyio.current_time()
    with anyio.fail_after(10):
        async with EtcdDiscovery(f"ns-{uuid.uuid4().hex[:12]}",
                                 endpoints=ordered(etcd_cluster3, frozen), prefix=etcd_prefix,
                                 lease_ttl=TTL, request_timeout=budget) as owner:
            claimed = anyio.current_time() - started
            assert owner.claimed
    # The frozen member had its share (0.5 s), then the next answered: nowhere near the budget.
    assert claimed < budget / 3 + 0.7


class _ScriptedGateway(Gateway):
    """A member whose watch sends ``messages`` and then fails; records where watches start."""

    def __init__(self, config: Config, messages: list[dict[str, Any]]) -> None:
        super().__init__(config)
        self.messages = messages
        self.starts: list[int] = []

    @asynccontextmanager
    async def stream(self, path: str, body: dict[str, Any],
                     endpoint: str) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        self.starts.append(int(body["create_request"]["start_revision"]))

        async def lines() -> AsyncIterator[dict[str, Any]]:
            for message in self.messages:
                yield message
            raise TransportError("the member died")

        yield lines()


async def test_a_watch_that_fails_while_catching_up_resumes_where_its_events_stopped() -> None:
    # What etcd sends a watch that starts behind (after a failover, say): "created" and then
    # its history in batches of 1 000 revisions, every message headed with the current
    # revision (here 5 000). A watch that fails after the first batch must resume after that
    # batch's last event (1 000), not after the header's revision: that would skip 1 001 to
    # 5 000.
    config = Config.make("http://127.0.0.1:9", "/t", None, None, None, 1.0, 1.0)
    namespace = f"ns-{uuid.uuid4().hex}"
    keys = Keys(config.prefix, namespace)
    header = {"header": {"revision": "5000"}}
    workers = [worker(f"10.0.0.1:{i + 1}") for i in range(2)]
    batch = [{"kv": {"key": b64(keys.worker(m.uid)), "mod_revision": str(revision),
                     "value": b64(m.to_bytes())}}
             for m, revision in zip(workers, (11, 1000))]
    gateway = _ScriptedGateway(config, [{"result": {**header, "created": True}},
                                        {"result": {**header, "events": batch}}])
    source = EtcdSource(source_key(namespace, config), namespace, config,
                        Snapshot(revision=10, values={}, generation=5))
    try:
        with anyio.fail_after(5):
            for _ in range(2):
                with pytest.raises(TransportError):
                    await source._watch(gateway, config.endpoints[0])
        assert gateway.starts == [11, 1001]
    finally:
        source.close()
        await gateway.aclose()
