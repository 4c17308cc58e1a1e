"""NoWorkersAvailable says where it looked and why it found nothing.

The error carries the namespace (``.namespace``) and a reason in words: a pool that spawns no
workers where none are published; workers published without the tags asked for; a namespace
whose owner died; a pool whose every worker slot was given up. A lazy borrower of a namespace
nobody owns fails each waiting call with a ``DiscoveryNamespaceNotFound`` of its own.
"""

from __future__ import annotations

import anyio
import psutil
import pytest

from anywool import DiscoveryNamespaceNotFound, LocalDiscovery, NoWorkersAvailable
from anywool.testing import WorkerPoolFactory, kill_worker, owner_process

from ..helpers import follow, wait_until
from .routines import whoami

pytestmark = pytest.mark.anyio


async def test_a_pool_that_spawns_none_where_none_are_published_says_so(
        worker_pool: WorkerPoolFactory, namespace: str) -> None:
    with anyio.fail_after(30):
        async with worker_pool(discovery=LocalDiscovery(namespace), lazy=True,
                               quorum_timeout=0.3):
            with pytest.raises(NoWorkersAvailable) as info:
                await whoami()
    error = info.value
    assert error.namespace == namespace
    assert "this pool spawns no workers, and none are published there" in error.reason
    assert repr(namespace) in str(error)


async def test_a_pool_requiring_tags_no_published_worker_has_names_them(
        worker_pool: WorkerPoolFactory, namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, \
                worker_pool(spawn=1, discovery=discovery, tags={"cpu"}) as publishing:
            (published,) = publishing.workers
            async with worker_pool(discovery=LocalDiscovery.Subscriber(namespace),
                                   tags={"gpu", "cuda"}, lazy=True, quorum_timeout=1.0):
                with pytest.raises(NoWorkersAvailable) as info:
                    await whoami()
            assert await whoami() == published.pid  # the publishing pool is active again
    error = info.value
    assert error.namespace == namespace
    assert "1 worker(s) are published there, but none carries every tag of " \
           "['cuda', 'gpu']" in error.reason


async def test_a_borrower_whose_owner_died_says_the_namespace_has_no_live_owner(
        worker_pool: WorkerPoolFactory, namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, spawn=1, backend=anyio_backend) as owner, \
                anyio.create_task_group() as tg:
            (borrowed,) = owner.worker_pids
            async with worker_pool(discovery=LocalDiscovery.Subscriber(namespace),
                                   quorum_timeout=0.5):
                events = await follow(tg, LocalDiscovery.Subscriber(namespace))
                assert await whoami() == borrowed  # it used the owner's worker
                owner.kill()
                await owner.wait()
                # The subscription notices the dead owner at its next check (within its 1 s
                # poll interval): its workers drop out.
                while (event := await events.receive()).type != "worker-dropped":
                    pass
                assert event.metadata.pid == borrowed
                with pytest.raises(NoWorkersAvailable) as info:
                    await whoami()
            tg.cancel_scope.cancel()
        async with LocalDiscovery(namespace):  # sweeps what the SIGKILLed owner left
            pass
    error = info.value
    assert error.namespace == namespace
    assert "the namespace has no live owner any more: it exited or died, and its workers " \
           "went with it" in error.reason


async def test_the_call_right_after_the_owner_died_already_says_it_has_no_live_owner(
        worker_pool: WorkerPoolFactory, namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with owner_process(namespace, spawn=1, backend=anyio_backend) as owner:
            (borrowed,) = owner.worker_pids
            # A long poll interval: the subscription does not notice the owner's death by
            # itself during the test (with the default 1 s, only sometimes).
            async with worker_pool(
                    discovery=LocalDiscovery.Subscriber(namespace, poll_interval=60),
                    quorum_timeout=0.5):
                assert await whoami() == borrowed
                owner.kill()
                await owner.wait()
                worker = psutil.Process(borrowed)
                await wait_until(lambda: not worker.is_running()
                                 or worker.status() == psutil.STATUS_ZOMBIE,
                                 "the dead owner's worker to exit by itself")
                with pytest.raises(NoWorkersAvailable) as info:
                    await whoami()
        async with LocalDiscovery(namespace):  # sweeps what the SIGKILLed owner left
            pass
    assert info.value.namespace == namespace
    assert "the namespace has no live owner any more" in info.value.reason, info.value.reason


async def test_a_pool_whose_every_slot_was_given_up_says_so(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=1, lazy=True, quorum_timeout=0.3) as pool, \
                anyio.create_task_group() as tg:
            events = await follow(tg, pool.discovery.subscriber)
            namespace = pool.discovery.namespace
            # Each worker dies right after it starts (well within the 2 s that count as
            # failing at start-up), three times in a row: the first and two replacements.
            killed = []
            for _ in range(3):
                while True:
                    event = await events.receive()
                    if event.type == "worker-added" and event.metadata.pid not in killed:
                        break
                killed.append(kill_worker(pool))
                assert killed[-1] == event.metadata.pid
            errors: list[NoWorkersAvailable] = []

            async def given_up() -> bool:
                # Until the pool has counted the third failure, a call finds its worker
                # merely not running.
                with pytest.raises(NoWorkersAvailable) as info:
                    await whoami()
                errors.append(info.value)
                return "given up" in info.value.reason

            await wait_until(given_up, "a call to say the slot was given up", interval=0)
            tg.cancel_scope.cancel()
    error = errors[-1]
    assert error.namespace == namespace
    assert "every worker slot of this pool was given up after 3 failed starts in a row" \
        in error.reason


async def test_each_call_waiting_on_a_lazy_borrower_of_an_unowned_namespace_gets_its_own_error(
        worker_pool: WorkerPoolFactory, namespace: str) -> None:
    errors: list[DiscoveryNamespaceNotFound] = []

    async def call() -> None:
        with pytest.raises(DiscoveryNamespaceNotFound) as info:
            await whoami()
        errors.append(info.value)

    with anyio.fail_after(30):
        async with worker_pool(discovery=LocalDiscovery.Subscriber(namespace), lazy=True,
                               quorum_timeout=5):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(call)
    assert len(errors) == 5
    assert len({id(error) for error in errors}) == 5  # distinct objects
    assert all(error.namespace == namespace for error in errors)
