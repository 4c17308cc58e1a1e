# pyright: strict
"""A user's module over the whole public API, as an application and its tests would write it.

Checked by pyright (strict) and mypy (strict) in tests/unit/test_typing.py, never imported by
pytest: each ``assert_type`` fails the check when anywool's annotations give another type.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import assert_type
from uuid import UUID

import anyio
import pytest

import anywool
from anywool import (
    ContextVar,
    DiscoveryEvent,
    LanDiscovery,
    LocalDiscovery,
    RoutineCancelled,
    WorkerMetadata,
    WorkerPool,
    WorkerProxy,
    current_task,
    current_worker,
    resolved,
    routine,
    run_sync,
)
from anywool.testing import (
    OwnerProcess,
    WorkerPoolFactory,
    hold_registry_lock,
    kill_worker,
    owner_process,
    suspended,
)

request_id: ContextVar[str] = ContextVar("app.request_id", default="-")
attempts = ContextVar("app.attempts", default=0)

# -- routines, annotated every usual way ----------------------------------------------------------


@routine
async def scale(x: int, factor: float = 2.0) -> float:
    task = current_task()
    assert_type(task.id, int)
    assert_type(task.name, str)
    assert_type(task.caller_id, int | None)
    assert_type(current_worker().pid, int)
    return x * factor


@routine
async def nothing() -> None:
    attempts.set(attempts.get() + 1)


@routine
async def countdown(n: int) -> AsyncGenerator[int, None]:
    while n:
        yield n
        n -= 1


@routine
async def echo() -> AsyncGenerator[str, str]:
    received = yield "ready"
    while True:
        received = yield received.upper()


@routine
async def letters(word: str) -> AsyncIterator[str]:
    for letter in word:
        yield letter


@routine
async def chunks(size: int) -> AsyncIterable[bytes]:
    yield bytes(size)


def digest(path: str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@asynccontextmanager
async def lifespan() -> AsyncGenerator[dict[str, int], None]:
    yield {"ready": 1}


async def calls() -> None:
    assert_type(await scale(21), float)
    assert_type(await scale(2, factor=0.5), float)
    await nothing()
    assert_type(countdown(3), AsyncGenerator[int, None])
    async for n in countdown(3):
        assert_type(n, int)
    stream = echo()
    assert_type(await stream.asend("hi"), str)
    await stream.aclose()
    assert_type(letters("abc"), AsyncIterator[str])  # usable with anext()
    async for letter in letters("abc"):
        assert_type(letter, str)
    assert_type(chunks(8), AsyncIterable[bytes])
    async for chunk in chunks(8):
        assert_type(chunk, bytes)
    assert_type(await run_sync(digest, "/etc/hostname"), str)
    assert_type(await run_sync(os.getpid), int)
    async with anywool.map(digest, ["/etc/hostname", "/etc/hosts"]) as digests:
        assert_type(digests, anywool.MapResults[str])
        async for hexdigest in digests:
            assert_type(hexdigest, str)
    # A routine's results: float under pyright; Any under mypy, which gives Any when two
    # overloads match an argument whose type holds Any (a coroutine's Coroutine[Any, Any, T]).
    scaled: anywool.MapResults[float]
    async with anywool.map(scale, range(3), ordered=False, progress=print) as scaled:
        async for value in scaled:
            print(value + 1.0)
    async with WorkerPool(spawn=1) as pool, pool.map(os.path.getsize, ["/etc/hosts"]) as sizes:
        async for size in sizes:
            assert_type(size, int)
    token = request_id.set("r-1")
    assert_type(request_id.get(), str)
    request_id.reset(token)


# -- pools and discovery ------------------------------------------------------------------------


async def pools(etcd: str) -> None:
    async with WorkerPool(spawn=2, max_concurrency=4, worker_lifespan=lifespan) as pool:
        await calls()
        stats = await pool.stats()
        for uid, worker in stats.items():
            assert_type(uid, UUID)
            if worker is not None:
                assert_type(worker.in_flight, int)
                assert_type(worker.busy_seconds, float)
        await pool.recycle()

    async with LocalDiscovery("jobs") as discovery:
        async with WorkerPool(spawn=1, discovery=discovery):
            pass
        async with discovery.publisher as publisher:
            await publisher.publish("worker-added", WorkerMetadata(
                UUID(int=1), "unix:/tmp/w.sock", os.getpid(), anywool.__version__))

    async with WorkerPool(discovery=LocalDiscovery.Subscriber("jobs"), quorum=1):
        await calls()

    async with WorkerProxy(LocalDiscovery.Subscriber("jobs")) as proxy:
        assert_type(proxy, WorkerProxy)
    async with WorkerProxy(discovery=LocalDiscovery.Subscriber("jobs"), quorum=2):
        pass

    with anyio.move_on_after(1):
        async for event in LocalDiscovery.Subscriber("jobs"):
            assert_type(event, DiscoveryEvent)
            assert_type(event.metadata.address, str)
            assert_type(event.metadata.tags, frozenset[str])

    lan = LanDiscovery("jobs", secret=b"s" * 32)
    async with WorkerPool(spawn=1, discovery=lan, host="0.0.0.0", secret=b"s" * 32):
        pass
    etcd_discovery = anywool.EtcdDiscovery("jobs", endpoints=etcd)
    async with WorkerPool(spawn=1, discovery=etcd_discovery, host="127.0.0.1"):
        pass

    async with resolved(LocalDiscovery("jobs")) as claimed:
        assert_type(claimed, LocalDiscovery)

    try:
        await scale(1)
    except RoutineCancelled:
        pass
    except anywool.NoWorkersAvailable as error:
        assert_type(str(error), str)


def main() -> None:
    anyio.run(pools, "http://127.0.0.1:2379")
    anyio.run(pools, "http://127.0.0.1:2379", backend="trio")


# -- tests with the pytest plugin ---------------------------------------------------------------

pytestmark = pytest.mark.anyio


@pytest.mark.anywool_backends("asyncio", "trio")
async def test_scale(worker_pool: WorkerPoolFactory, anywool_runtime_dir: Path) -> None:
    async with worker_pool(spawn=2) as pool:
        assert await scale(21) == 42
        pid = kill_worker(pool, signal.SIGTERM)
        assert_type(pid, int)
    assert anywool_runtime_dir.is_dir()


async def test_an_owner_in_another_process(namespace: str) -> None:
    async with owner_process(namespace, spawn=1) as owner:
        assert_type(owner, OwnerProcess)
        with suspended(owner.pid):
            pass
        with hold_registry_lock(namespace):
            pass


@pytest.fixture
def namespace() -> Iterator[str]:
    yield "typing-test"
