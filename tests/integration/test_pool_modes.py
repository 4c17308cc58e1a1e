"""WorkerPool's modes: who owns what, what is entered, quorum, lease, owner turnover, failures."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psutil
import pytest

import anywool.runtime.pool._pool as pool_module
from anywool import (
    DiscoveryEvent,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryRegistryCorrupt,
    LocalDiscovery,
    LocalWorker,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    WorkerPool,
)
from anywool.discovery.local import _keys
from anywool.metadata import WorkerMetadata

from ..helpers import Signal, follow, take, wait_until
from .children import start, stop
from .routines import value_after, whoami

pytestmark = pytest.mark.anyio


class Counted:
    """Wraps an object in an async context manager that counts its entries and exits."""

    def __init__(self, value: object) -> None:
        self.value = value
        self.entered = 0
        self.exited = 0

    async def __aenter__(self) -> object:
        self.entered += 1
        return self.value

    async def __aexit__(self, *exc_info: object) -> None:
        self.exited += 1


class SubscriberContext:
    """A subscriber that is its own async context manager (iterable only while entered)."""

    instances: list[SubscriberContext] = []

    def __init__(self, namespace: str) -> None:
        self.inner = LocalDiscovery.Subscriber(namespace)
        self.entered = 0
        self.exited = 0
        SubscriberContext.instances.append(self)

    async def __aenter__(self) -> SubscriberContext:
        self.entered += 1
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.exited += 1

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        assert self.entered == 1 and self.exited == 0, "iterated outside its lifetime"
        return self.inner.__aiter__()


class BothProtocols(LocalDiscovery):
    """A DiscoveryLike that is also iterable: a durable pool must use its ``subscriber``."""

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        raise AssertionError("the pool iterated the service instead of its subscriber")


class Owner:
    """An owning, spawning pool run in a task of its own, so it can exit while others stay."""

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.ready = anyio.Event()
        self.leave = anyio.Event()
        self.done = anyio.Event()

    @property
    def worker_pid(self) -> int:
        assert self.pool is not None
        return self.pool.workers[0].pid

    async def run(self, namespace: str) -> None:
        try:
            async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)) as pool:
                self.pool = pool
                self.ready.set()
                await self.leave.wait()
        finally:
            self.done.set()

    async def exit(self) -> None:
        self.leave.set()
        await self.done.wait()


async def start_owner(tg: anyio.abc.TaskGroup, namespace: str) -> Owner:
    owner = Owner()
    tg.start_soon(owner.run, namespace)
    await owner.ready.wait()
    return owner


@contextlib.asynccontextmanager
async def owner_pool(namespace: str) -> AsyncIterator[WorkerPool]:
    async with anyio.create_task_group() as tg:
        owner = await start_owner(tg, namespace)
        try:
            assert owner.pool is not None
            yield owner.pool
        finally:
            owner.leave.set()


# -- what a pool accepts and owns (reference cases 16, 17, 18) -------------------------------


async def test_a_durable_pool_hands_a_bare_subscriber_to_its_proxy_as_given(namespace: str) -> None:
    subscriber = LocalDiscovery.Subscriber(namespace)
    with anyio.fail_after(30):
        async with owner_pool(namespace) as owner:
            async with WorkerPool(discovery=subscriber) as pool:
                assert pool.discovery is subscriber and pool.proxy.discovery is subscriber
                assert await whoami() == owner.workers[0].pid


async def test_a_durable_pool_uses_the_subscriber_of_a_service_satisfying_both(namespace: str) -> None:
    service = BothProtocols(namespace)
    with anyio.fail_after(30):
        async with WorkerPool(discovery=service) as pool, LocalWorker() as worker:
            assert pool.discovery is service and service.claimed  # it owns the namespace
            assert pool.proxy.discovery == LocalDiscovery.Subscriber(namespace)
            async with service.publisher as publisher:
                await publisher.publish("worker-added", worker.metadata)
                assert await whoami() == worker.pid
        assert not service.claimed


@pytest.mark.parametrize("form", ["instance", "class"])
async def test_a_context_manager_subscriber_is_entered_and_exited_once_by_the_pool(
    namespace: str, form: str
) -> None:
    SubscriberContext.instances.clear()
    factory = (SubscriberContext(namespace) if form == "instance"
               else type("Bound", (SubscriberContext,), {
                   "__init__": lambda self: SubscriberContext.__init__(self, namespace)}))
    with anyio.fail_after(30):
        async with owner_pool(namespace) as owner:
            async with WorkerPool(discovery=factory) as pool:
                (subscriber,) = SubscriberContext.instances
                assert pool.proxy.discovery is subscriber
                assert (subscriber.entered, subscriber.exited) == (1, 0)
                assert await whoami() == owner.workers[0].pid
            assert (subscriber.entered, subscriber.exited) == (1, 1)


@pytest.mark.parametrize("spawn", [None, 1], ids=["durable", "spawning"])
async def test_a_pool_given_the_wrong_kind_of_discovery_names_the_protocols_and_exits_it(
    namespace: str, spawn: int | None
) -> None:
    # A durable pool accepts either protocol; a spawning one only a DiscoveryLike (it publishes).
    produced = 42 if spawn is None else LocalDiscovery.Subscriber(namespace)
    context = Counted(produced)
    expected = ("DiscoveryLike or DiscoverySubscriberLike" if spawn is None else "DiscoveryLike, but")
    with anyio.fail_after(30), pytest.raises(TypeError, match=f"discovery must resolve to a {expected}"):
        async with WorkerPool(spawn=spawn, discovery=context):
            pytest.fail("entered")
    assert (context.entered, context.exited) == (1, 1)
    assert psutil.Process().children() == []  # no worker was spawned


def test_a_spawning_pool_given_a_bare_subscriber_instance_is_refused_at_construction(namespace: str) -> None:
    with pytest.raises(TypeError, match="discovery must be a DiscoveryLike"):
        WorkerPool(spawn=1, discovery=LocalDiscovery.Subscriber(namespace))


# -- ownership at pool level (reference case 25) ---------------------------------------------


async def test_pools_claiming_an_owned_namespace_fail_and_leave_it_usable(namespace: str) -> None:
    with anyio.fail_after(60):
        async with owner_pool(namespace) as owner:
            for contender in (WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)),
                              WorkerPool(discovery=LocalDiscovery(namespace))):
                with pytest.raises(DiscoveryNamespaceInUse) as info:
                    async with contender:
                        pytest.fail("two owners")
                assert info.value.namespace == namespace and info.value.owner_pid == os.getpid()
            # The owner's namespace is intact: a borrower still reaches its worker.
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)):
                assert await whoami() == owner.workers[0].pid
        assert psutil.Process().children() == []


async def test_a_non_lazy_borrowing_pool_without_owner_fails_fast_and_creates_nothing(
    namespace: str, runtime_dir
) -> None:
    # quorum_timeout is 60 s; the bound shows the failed bind ended the quorum wait at once.
    with anyio.fail_after(5), pytest.raises(DiscoveryNamespaceNotFound) as info:
        async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), lazy=False,
                              quorum_timeout=60):
            pytest.fail("entered")
    assert info.value.namespace == namespace
    chain = [info.value.__cause__, info.value.__context__]
    assert not any(isinstance(e, TimeoutError) for e in chain)
    assert list(runtime_dir.iterdir()) == []
    async with LocalDiscovery(namespace):  # and the namespace can still be claimed
        pass


# -- a durable owner, another process's workers ----------------------------------------------

PUBLISHING_WORKER = """
import sys, anyio
from anywool import LocalDiscovery, LocalWorker
async def main():
    async with LocalWorker(backend=sys.argv[2]) as worker, \\
            LocalDiscovery.Publisher(sys.argv[1]) as publisher:
        await publisher.publish("worker-added", worker.metadata)
        print(worker.pid, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[2])
"""


async def test_a_durable_owner_pool_dispatches_to_workers_other_processes_publish(
    namespace: str, anyio_backend: str
) -> None:
    with anyio.fail_after(60):
        async with WorkerPool(discovery=LocalDiscovery(namespace)) as pool:
            assert pool.workers == [] and isinstance(pool.discovery, LocalDiscovery)
            child = await start(PUBLISHING_WORKER, namespace, anyio_backend)
            try:
                worker_pid = int(await child.readline())
                assert await whoami() == worker_pid
                assert worker_pid not in {os.getpid(), child.pid}
            finally:
                await stop([child])


# -- quorum, lease, load balancers -----------------------------------------------------------


def test_a_quorum_larger_than_the_pools_own_workers_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="quorum must be at most the 2 workers"):
        WorkerPool(spawn=2, quorum=3)


async def test_a_non_lazy_pool_enters_with_its_quorum_connected() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2, lazy=False, quorum=2) as pool:
            assert len(pool.proxy.workers) == 2


async def test_a_hybrid_pool_admits_at_most_its_lease_of_discovered_workers(namespace: str) -> None:
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher, \
                LocalWorker() as first, LocalWorker() as second:
            await publisher.publish("worker-added", first.metadata)
            await publisher.publish("worker-added", second.metadata)
            async with WorkerPool(spawn=1, discovery=discovery, lease=1, lazy=False,
                                  quorum=2) as pool:
                own = pool.workers[0].pid
                served = {await whoami() for _ in range(12)}
                assert own in served and len(served) == 2
                assert len(pool.proxy._waiting) == 1  # the other discovered worker waits its turn


@pytest.mark.parametrize("form", ["class", "callable", "async_cm"])
async def test_a_loadbalancer_is_accepted_in_factory_forms(form: str) -> None:
    context = Counted(RoundRobinLoadBalancer())
    factory = {"class": RoundRobinLoadBalancer, "callable": lambda: RoundRobinLoadBalancer(),
               "async_cm": context}[form]
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2, loadbalancer=factory) as pool:
            assert isinstance(pool.proxy._balancer, RoundRobinLoadBalancer)
            assert {await whoami() for _ in range(4)} == {w.pid for w in pool.workers}
    if form == "async_cm":
        assert (context.entered, context.exited) == (1, 1)


def test_a_bad_loadbalancer_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="loadbalancer must be a LoadBalancerLike"):
        WorkerPool(spawn=1, loadbalancer=42)


async def test_a_loadbalancer_resolving_to_the_wrong_type_fails_before_any_worker_spawns(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spawn(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker was spawned before the load balancer was checked")

    monkeypatch.setattr(pool_module, "LocalWorker", no_spawn)
    context = Counted(object())
    with anyio.fail_after(10), pytest.raises(TypeError, match="loadbalancer must resolve to a LoadBalancerLike"):
        async with WorkerPool(spawn=1, loadbalancer=context):
            pytest.fail("entered")
    assert (context.entered, context.exited) == (1, 1)


# -- owner turnover (reference case 27) ------------------------------------------------------


async def test_a_borrowing_pool_outlives_its_owner_and_follows_a_successor(namespace: str) -> None:
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            first = await start_owner(tg, namespace)
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace),
                                  quorum_timeout=3):
                first_pid = first.worker_pid
                assert await whoami() == first_pid
                await first.exit()
                # Orphaned: the borrower finds nobody, within the bound.
                with anyio.fail_after(10), pytest.raises(NoWorkersAvailable):
                    await whoami()
                second = await start_owner(tg, namespace)
                assert await whoami() == second.worker_pid != first_pid
                await second.exit()


# -- workers that fail -----------------------------------------------------------------------


async def test_a_spawned_worker_that_dies_is_withdrawn_and_replaced(namespace: str) -> None:
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, anyio.create_task_group() as tg:
            events = await follow(tg, discovery.subscriber)
            async with WorkerPool(spawn=2, discovery=discovery) as pool:
                victim, survivor = pool.workers
                assert sorted(await take(events, 2)) == sorted(
                    ("worker-added", w.metadata.uid) for w in (victim, survivor))
                os.kill(victim.pid, signal.SIGKILL)
                assert await take(events, 1) == [("worker-dropped", victim.metadata.uid)]
                kind, replacement_uid = (await take(events, 1))[0]
                assert kind == "worker-added"
                (replacement,) = [w for w in pool.workers if w is not survivor]
                assert replacement.metadata.uid == replacement_uid
                assert replacement.pid != victim.pid and len(pool.workers) == 2
                served = set()
                with anyio.fail_after(10):
                    while served != {survivor.pid, replacement.pid}:
                        served.add(await whoami())
            tg.cancel_scope.cancel()
        assert not psutil.pid_exists(victim.pid) or psutil.Process(victim.pid).status() == psutil.STATUS_ZOMBIE


async def test_a_worker_that_keeps_failing_at_start_up_is_given_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="anywool")
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2) as pool:
            victim, survivor = pool.workers
            # From now on every replacement exits at once, before reporting an address.
            monkeypatch.setattr(sys, "executable", "/bin/false")
            os.kill(victim.pid, signal.SIGKILL)
            await wait_until(lambda: "giving up a worker slot" in caplog.text, "the slot to be given up")
            assert "after 3 failed starts" in caplog.text
            assert "exited (code 1) before reporting its address" in caplog.text
            monkeypatch.undo()
            assert pool.workers == [survivor]
            assert {await whoami() for _ in range(3)} == {survivor.pid}


async def test_a_worker_that_cannot_be_connected_to_never_disturbs_the_pools_block(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A host name IDNA refuses makes connecting raise ValueError, not OSError: it must count as
    # a failed connection, not end the proxy's task group (which encloses the block).
    caplog.set_level(logging.WARNING, logger="anywool")
    rogue = WorkerMetadata(uuid.uuid4(), "büro_1.local:8080", 1, "test")
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace)) as pool:
            async with LocalDiscovery.Publisher(namespace) as publisher:
                await publisher.publish("worker-added", rogue)
                await wait_until(lambda: "büro_1.local" in caplog.text, "the failed connection")
                assert {await whoami() for _ in range(3)} == {pool.workers[0].pid}


async def test_a_borrowers_call_in_flight_finishes_while_the_owner_exits(namespace: str) -> None:
    # The owner withdraws its worker and drains it: the borrower's call on it must complete.
    results: list[int] = []
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg, Signal() as signal_:
            owner = await start_owner(tg, namespace)
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)):
                async with anyio.create_task_group() as calls:

                    async def call() -> None:
                        results.append(await value_after(0.5, signal_.port))

                    calls.start_soon(call)
                    await signal_.started()
                    await owner.exit()
    assert results == [7]


async def test_a_borrowing_pool_fails_its_calls_once_the_registry_is_damaged(
        namespace: str, runtime_dir: Path) -> None:
    # The subscription ends with DiscoveryRegistryCorrupt; the proxy fails every later call
    # with it (each its own copy) rather than dispatch to workers nobody can vouch for.
    with anyio.fail_after(60):
        async with owner_pool(namespace) as owner:
            subscriber = LocalDiscovery.Subscriber(namespace, poll_interval=0.05)
            async with WorkerPool(discovery=subscriber, quorum_timeout=3):
                assert await whoami() == owner.workers[0].pid
                os.truncate(_keys.namespace_path(namespace, runtime_dir) / "registry", 0)
                errors: list[DiscoveryRegistryCorrupt] = []

                async def fails() -> bool:
                    try:
                        await whoami()
                    except DiscoveryRegistryCorrupt as exc:
                        errors.append(exc)
                        return True
                    return False

                await wait_until(fails, "a call failing with DiscoveryRegistryCorrupt")
                with pytest.raises(DiscoveryRegistryCorrupt) as info:
                    await whoami()
                assert info.value is not errors[-1]
                assert info.value.namespace == namespace


async def test_a_discovery_another_pool_entered_is_refused(namespace: str) -> None:
    shared = LocalDiscovery(namespace)
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, discovery=shared) as first:
            with pytest.raises(RuntimeError, match="belongs to another WorkerPool"):
                async with WorkerPool(spawn=1, discovery=shared):
                    pytest.fail("two pools own one discovery")
            assert shared.claimed and await whoami() == first.workers[0].pid
        assert not shared.claimed


async def test_a_discovery_its_caller_entered_serves_two_pools(namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as shared:
            async with WorkerPool(spawn=1, discovery=shared) as first, \
                    WorkerPool(spawn=1, discovery=shared) as second:
                assert {await whoami() for _ in range(6)} == {
                    first.workers[0].pid, second.workers[0].pid}
            assert shared.claimed


async def test_a_relative_runtime_directory_is_refused_before_anything_is_created(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", "relative/dir")
    with anyio.fail_after(30), pytest.raises(ValueError, match="ANYWOOL_RUNTIME_DIR must be an absolute path"):
        async with WorkerPool(spawn=1):
            pytest.fail("entered")
    assert list(tmp_path.iterdir()) == []
    assert psutil.Process().children() == []
