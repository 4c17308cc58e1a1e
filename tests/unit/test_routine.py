"""@routine: outside any pool, and dispatched through a WorkerProxy over in-memory discovery."""

from __future__ import annotations

import pickle

import anyio
import pytest

from anywool.errors import DiscoveryNamespaceNotFound, NoWorkersAvailable
from anywool.runtime._routine import is_routine, routine, routine_body
from anywool.runtime.client._proxy import WorkerProxy
from anywool.runtime.pool._local_worker import LocalWorker
from tests.unit._fakes import FailingSubscriber, FakeDiscovery

pytestmark = pytest.mark.anyio


@routine
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@routine
async def count(n: int):
    for i in range(n):
        yield i


async def test_coroutine_routine_without_a_pool_raises_runtime_error() -> None:
    with anyio.fail_after(5), pytest.raises(RuntimeError, match="no WorkerPool or WorkerProxy is active"):
        await add(1, 2)


async def test_async_generator_routine_without_a_pool_raises_runtime_error() -> None:
    with anyio.fail_after(5), pytest.raises(RuntimeError, match="no WorkerPool or WorkerProxy is active"):
        async for _ in count(2):
            pass


async def test_routine_body_is_the_undecorated_function() -> None:
    with anyio.fail_after(5):
        assert await routine_body(add)(1, 2) == 3
        assert [i async for i in routine_body(count)(3)] == [0, 1, 2]


def test_routine_keeps_metadata_and_pickles_by_reference() -> None:
    assert add.__name__ == "add" and add.__doc__ == "Add two numbers."
    assert is_routine(add) and is_routine(count) and not is_routine(routine_body(add))
    assert pickle.loads(pickle.dumps(add)) is add


def test_routine_rejects_plain_functions() -> None:
    def plain() -> None:
        pass

    with pytest.raises(TypeError, match="async def"):
        routine(plain)


# -- dispatch through a WorkerProxy over in-memory discovery ---------------------------------


def test_proxy_rejects_what_is_not_a_subscriber() -> None:
    with pytest.raises(TypeError, match="DiscoverySubscriberLike"):
        WorkerProxy(object())  # type: ignore[arg-type]


async def test_proxy_dispatches_to_a_worker_it_discovers() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(20):
        async with LocalWorker() as worker:
            await discovery.publisher.publish("worker-added", worker.metadata)
            async with WorkerProxy(discovery.subscriber) as proxy:
                assert await add(2, 3) == 5
                assert [i async for i in count(3)] == [0, 1, 2]
                assert proxy.workers == [worker.metadata]


async def test_proxy_fails_dispatch_at_once_when_its_subscriber_raises() -> None:
    error = DiscoveryNamespaceNotFound("nowhere")
    with anyio.fail_after(5):  # far below the quorum timeout: no stall
        async with WorkerProxy(FailingSubscriber(error), quorum_timeout=60):
            with pytest.raises(DiscoveryNamespaceNotFound) as info:
                await add(1, 1)
    assert info.value.args == error.args


async def test_every_waiting_call_fails_with_its_own_copy_of_the_subscribers_error() -> None:
    # Not one object raised by every task: its tracebacks would chain, and a task group would
    # list it as many times as there were calls.
    error = DiscoveryNamespaceNotFound("nowhere")
    raised: list[BaseException] = []

    async def call() -> None:
        try:
            await add(1, 1)
        except DiscoveryNamespaceNotFound as exc:
            raised.append(exc)

    with anyio.fail_after(5):
        async with WorkerProxy(FailingSubscriber(error), quorum_timeout=60):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(call)
    assert len({id(exc) for exc in raised}) == 3
    assert all(exc is not error and exc.args == error.args for exc in raised)


async def test_proxy_without_workers_raises_no_workers_available() -> None:
    with anyio.fail_after(5):
        async with WorkerProxy(FakeDiscovery().subscriber, quorum_timeout=0.2):
            with pytest.raises(NoWorkersAvailable, match=r"no worker is published there \(waited 0.2 s\)"):
                await add(1, 1)


async def test_proxy_is_single_use_and_resets_the_active_proxy() -> None:
    proxy = WorkerProxy(FakeDiscovery().subscriber)
    with anyio.fail_after(5):
        async with proxy:
            pass
        with pytest.raises(RuntimeError, match="single-use"):
            async with proxy:
                pass
        with pytest.raises(RuntimeError, match="no WorkerPool or WorkerProxy is active"):
            await add(1, 1)
