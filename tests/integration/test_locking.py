"""Registry locking, capacity races and torn reads, across real processes."""

from __future__ import annotations

import os
import random
import threading
import time

import anyio
import pytest

from anywool import DiscoveryCapacityExhausted, DiscoveryNamespaceNotFound, LocalDiscovery
from anywool.discovery import _hub
from anywool.discovery.local import _binding, _flock, _keys, _layout

from ..helpers import DescriptorTraps, wait_until, worker
from .children import hold_registry_lock, start, stop

pytestmark = pytest.mark.anyio

CAPACITY_RACER = """
import os, sys, time, uuid, anyio
from anywool import LocalDiscovery, WorkerMetadata, DiscoveryCapacityExhausted
namespace, deadline = sys.argv[1], float(sys.argv[2])
async def main():
    async with LocalDiscovery.Publisher(namespace) as publisher:
        metadata = WorkerMetadata(uuid.uuid4(), "unix:/tmp/none", os.getpid(), "x")
        while time.time() < deadline:
            await anyio.sleep(0.0005)
        try:
            await publisher.publish("worker-added", metadata)
            print("won", flush=True)
        except DiscoveryCapacityExhausted as error:
            print("full", error.capacity, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[-1])
"""

CHURNER = """
import os, sys, time, uuid, random, anyio
from anywool import LocalDiscovery, WorkerMetadata
namespace, seconds = sys.argv[1], float(sys.argv[2])
async def main():
    rng = random.Random(os.getpid())
    live = {}
    changes = 0
    async with LocalDiscovery.Publisher(namespace) as publisher:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            roll = rng.random()
            if not live or (roll < 0.4 and len(live) < 100):
                metadata = WorkerMetadata(uuid.uuid4(), "unix:/tmp/none", os.getpid(), "x",
                                          extra={"pad": "x" * rng.randrange(300)})
                await publisher.publish("worker-added", metadata)
                live[metadata.uid] = metadata
            elif roll < 0.7:
                uid = rng.choice(list(live))
                metadata = WorkerMetadata(uid, "unix:/tmp/none", os.getpid(), str(changes),
                                          extra={"pad": "y" * rng.randrange(300)})
                await publisher.publish("worker-updated", metadata)
                live[uid] = metadata
            else:
                uid = rng.choice(list(live))
                await publisher.publish("worker-dropped", live.pop(uid))
            changes += 1
        print("done", changes, len(live), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[-1])
"""


async def test_lock_timeout_names_namespace_and_timeout_and_waits_without_spinning(namespace):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            holder = await hold_registry_lock(owner)
            try:
                publisher.lock_timeout = 1.0
                wall, cpu = time.monotonic(), time.process_time()
                with pytest.raises(TimeoutError) as info:
                    await publisher.publish("worker-added", worker())
                wall, cpu = time.monotonic() - wall, time.process_time() - cpu
                assert namespace in str(info.value) and "1.0 s" in str(info.value)
                assert wall >= 1.0
                assert cpu < 0.25 * wall  # the waiter polls with backoff: it does not spin
            finally:
                await stop([holder])
            await publisher.publish("worker-added", worker())  # the lock is free again


async def test_killed_lock_holder_frees_the_lock_at_once(namespace):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            holder = await hold_registry_lock(owner)
            try:
                async with anyio.create_task_group() as tg:
                    done = anyio.Event()

                    async def publish() -> None:
                        await publisher.publish("worker-added", worker())
                        done.set()

                    tg.start_soon(publish)
                    holder.kill()
                    await holder.wait()
                    await done.wait()  # well within lock_timeout (30 s) and the test bound
            finally:
                await stop([holder])


async def test_cancelled_publish_leaves_no_lock_and_no_worker(namespace):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            holder = await hold_registry_lock(owner)
            try:
                with anyio.move_on_after(0.3) as scope:
                    await publisher.publish("worker-added", worker())
                assert scope.cancelled_caught
            finally:
                await stop([holder])
            binding = _binding.bind(namespace)
            try:
                assert binding.snapshot(lock_timeout=1)[1] == {}
            finally:
                binding.close()
            publisher.lock_timeout = 1.0
            await publisher.publish("worker-added", worker())


async def test_publishes_cancelled_at_random_points_commit_fully_or_not_at_all(namespace):
    rng = random.Random(1234)
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace, capacity=256) as owner, owner.publisher as publisher:
            committed: dict = {}
            for _ in range(200):
                metadata = worker(extra={"n": rng.randrange(1000)})
                with anyio.move_on_after(rng.random() * 0.002):
                    await publisher.publish("worker-added", metadata)
                    committed[metadata.uid] = metadata
            binding = _binding.bind(namespace)
            try:
                _, view = binding.snapshot(lock_timeout=1)
                # No block a cancelled publish left half written is ever read as torn.
                assert binding.unreadable_blocks == 0
            finally:
                binding.close()
            # Everything acknowledged is there in full; anything else is whole or absent.
            assert set(committed) <= set(view)
            for uid, metadata in committed.items():
                assert view[uid].same_as(metadata)


async def test_concurrent_publishers_at_capacity_one_in_process(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace, capacity=1):
            outcomes: list[str] = []

            async def publish() -> None:
                async with LocalDiscovery.Publisher(namespace) as publisher:
                    try:
                        await publisher.publish("worker-added", worker())
                        outcomes.append("won")
                    except DiscoveryCapacityExhausted:
                        outcomes.append("full")
                    await barrier.wait()

            barrier = anyio.Event()
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(publish)
                await wait_until(lambda: len(outcomes) == 8, "every publisher's outcome")
                barrier.set()
            assert sorted(outcomes) == ["full"] * 7 + ["won"]


async def test_concurrent_publishers_at_capacity_one_across_processes(namespace, anyio_backend):
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace, capacity=1):
            deadline = time.time() + 1.5
            children = [await start(CAPACITY_RACER, namespace, str(deadline), anyio_backend)
                        for _ in range(4)]
            try:
                lines = sorted([await child.readline() for child in children])
            finally:
                await stop(children)
            assert lines == ["full 1"] * 3 + ["won"]


async def test_churning_publishers_never_tear_a_subscribers_view(namespace, anyio_backend):
    seconds = 10.0
    with anyio.fail_after(seconds + 30):
        async with LocalDiscovery(namespace, capacity=256, block_size=512) as owner:
            async with anyio.create_task_group() as tg:
                view: dict = {}
                seen = 0

                changed = anyio.Event()

                async def watch() -> None:
                    nonlocal seen, changed
                    async for event in owner.subscriber:
                        seen += 1
                        changed.set()
                        changed = anyio.Event()
                        if event.type == "worker-dropped":
                            assert view.pop(event.metadata.uid).uid == event.metadata.uid
                        elif event.type == "worker-added":
                            assert event.metadata.uid not in view
                            view[event.metadata.uid] = event.metadata
                        else:
                            assert event.metadata.uid in view
                            view[event.metadata.uid] = event.metadata

                tg.start_soon(watch)
                children = [await start(CHURNER, namespace, str(seconds), anyio_backend)
                            for _ in range(2)]
                try:
                    summaries = [(await child.readline()).split() for child in children]
                    assert all(line[0] == "done" and int(line[1]) > 100 for line in summaries)
                    live = sum(int(line[2]) for line in summaries)
                    binding = _binding.bind(namespace)
                    try:
                        _, registered = binding.snapshot(lock_timeout=5)
                    finally:
                        binding.close()
                    assert len(registered) == live
                    # The subscriber converges on exactly the registry's content.
                    with anyio.fail_after(5):
                        while set(view) != set(registered) or not all(
                            view[uid].same_as(m) for uid, m in registered.items()
                        ):
                            await changed.wait()
                finally:
                    await stop(children)
                assert seen > 0
                tg.cancel_scope.cancel()


@pytest.fixture
def waiting(monkeypatch) -> threading.Event:
    """Set each time a thread starts waiting for a registry lock it could not take at once."""
    event = threading.Event()
    real_lock = _flock.lock_with_backoff

    def lock_noting_the_wait(*args, **kwargs):
        if not _flock.try_lock(args[0], args[1]):
            event.set()
        else:
            _flock.unlock(args[0])
        return real_lock(*args, **kwargs)

    monkeypatch.setattr(_flock, "lock_with_backoff", lock_noting_the_wait)
    return event


async def test_a_subscriber_waiting_on_a_locked_registry_blocks_nothing_and_cancels(namespace, waiting):
    from contextlib import aclosing

    with anyio.fail_after(10):  # the registry lock would be waited on for 30 s
        async with LocalDiscovery(namespace) as owner, \
                LocalDiscovery(f"{namespace}-other") as other, other.publisher as publisher:
            await publisher.publish("worker-added", worker())
            holder = await hold_registry_lock(owner)
            try:
                healthy = aclosing(other.subscriber.__aiter__())
                async with healthy as events:
                    await events.__anext__()
                    async with anyio.create_task_group() as tg:
                        started = anyio.Event()

                        async def stuck() -> None:
                            started.set()
                            async for _ in owner.subscriber:  # waits for the registry lock
                                pass

                        scope = anyio.CancelScope()

                        async def run_stuck() -> None:
                            with scope:
                                await stuck()

                        tg.start_soon(run_stuck)
                        await started.wait()
                        await wait_until(waiting.is_set, "the iteration to wait for the lock")
                        # Ending an unrelated iteration needs the hub: it must not be held.
                        await events.aclose()
                        scope.cancel()  # and the stuck start gives up promptly
            finally:
                await stop([holder])
        assert all(key[0] != _keys.namespace_key(namespace) for key in _hub.stats())


async def test_stopping_a_source_that_waits_for_the_registry_lock_is_prompt(namespace, waiting):
    import struct
    from contextlib import aclosing

    with anyio.fail_after(15):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker())
            async with aclosing(owner.subscriber.__aiter__()) as events:
                await events.__anext__()
                holder = await hold_registry_lock(owner)
                try:
                    # A change the source must read under the lock the holder keeps.
                    with open(os.path.join(owner.path, "registry"), "r+b") as registry_file:
                        registry_file.seek(_layout.COUNTER_OFFSET)
                        counter = struct.unpack("<Q", registry_file.read(8))[0]
                        registry_file.seek(_layout.COUNTER_OFFSET)
                        registry_file.write(struct.pack("<Q", counter + 1))
                    waiting.clear()
                    os.utime(os.path.join(owner.path, "notify"))
                    await wait_until(waiting.is_set, "the source to poll for the lock")
                    await events.aclose()  # joins the source thread (or gives up after 5 s)
                    name = f"anywool-source-{_keys.namespace_key(namespace)}"
                    assert name not in [t.name for t in threading.enumerate()]
                finally:
                    await stop([holder])


async def test_a_binding_is_never_closed_under_a_publish_across_owner_turnover(
    namespace, tmp_path, waiting
):
    # A publish waits for the lock on the first owner's registry; meanwhile that owner goes, a
    # successor claims, and a second publish rebinds. The first publish's binding must stay
    # open until it is done: closed, its descriptor numbers would be reused by the files opened
    # below, and the first publish would then write its registry layout into one of them.
    outcomes: list[object] = []
    publisher = LocalDiscovery.Publisher(namespace, lock_timeout=None)
    with DescriptorTraps(tmp_path) as traps:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as owners:
                ready, leave, gone = anyio.Event(), anyio.Event(), anyio.Event()
                first: list[LocalDiscovery] = []

                async def first_owner() -> None:
                    async with LocalDiscovery(namespace, teardown_timeout=0) as owner:
                        first.append(owner)
                        ready.set()
                        await leave.wait()
                    gone.set()

                owners.start_soon(first_owner)
                await ready.wait()
                async with publisher, anyio.create_task_group() as tg:
                    holder = await hold_registry_lock(first[0])
                    try:
                        async def blocked_publish() -> None:
                            try:
                                await publisher.publish("worker-added", worker())
                                outcomes.append("published")
                            except Exception as exc:
                                outcomes.append(exc)

                        tg.start_soon(blocked_publish)
                        await wait_until(waiting.is_set, "the publish to wait for the lock")
                        leave.set()
                        await gone.wait()  # the first owner retired without the lock
                        async with LocalDiscovery(namespace) as successor:
                            await publisher.publish("worker-added", second := worker())
                            traps.set()
                            await stop([holder])  # the first publish now gets its lock
                            await wait_until(lambda: bool(outcomes), "the first publish to end")
                            binding = _binding.bind(namespace)
                            try:
                                workers = binding.snapshot(lock_timeout=1)[1]
                            finally:
                                binding.close()
                            assert set(workers) == {second.uid}
                            assert successor.claimed
                    finally:
                        await stop([holder])
        assert outcomes == ["published"] or isinstance(outcomes[0], DiscoveryNamespaceNotFound)
        traps.assert_untouched()
