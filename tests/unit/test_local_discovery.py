"""LocalDiscovery in one process: roles, registry semantics, subscriptions, hygiene."""

from __future__ import annotations

import logging
import os
import pickle
import threading
from pathlib import Path

import anyio
import cloudpickle
import pytest

from anywool import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryRegistryCorrupt,
    DiscoverySubscriberLike,
    DiscoveryWorkerNotFound,
    LocalDiscovery,
)
from anywool.discovery import _hub
from anywool.discovery.local import _claim, _keys, _layout

from ..helpers import follow, take, wait_until, worker

pytestmark = pytest.mark.anyio


# -- ownership --------------------------------------------------------------------------------


async def test_entry_claims_and_exit_removes_everything(namespace, runtime_dir: Path):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery:
            assert discovery.path is not None
            assert sorted(os.listdir(discovery.path)) == ["name", "notify", "owner", "registry"]
            assert Path(discovery.path).parent == runtime_dir
        assert os.listdir(runtime_dir) == []


async def test_second_claim_is_rejected_and_owner_stays_intact(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner:
            async with owner.publisher as publisher:
                await publisher.publish("worker-added", worker())
            with pytest.raises(DiscoveryNamespaceInUse) as info:
                async with LocalDiscovery(namespace):
                    pass
            assert info.value.namespace == namespace
            assert info.value.path == owner.path
            assert info.value.owner_pid == os.getpid()
            # The owner's registry still serves borrowers.
            async with owner.publisher as publisher:
                await publisher.publish("worker-added", worker())


@pytest.mark.parametrize("first_outcome", ["rejected", "exited"])
async def test_instance_is_single_use(namespace, first_outcome):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace):
            instance = LocalDiscovery(namespace)
            if first_outcome == "rejected":
                with pytest.raises(DiscoveryNamespaceInUse):
                    async with instance:
                        pass
        if first_outcome == "exited":
            async with instance:
                pass
        with pytest.raises(RuntimeError, match="single-use"):
            async with instance:
                pass


async def test_successor_claims_after_owner_exits(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace):
            pass
        async with LocalDiscovery(namespace) as successor:
            assert successor.path is not None


async def test_fresh_namespace_when_none_given():
    with anyio.fail_after(10):
        async with LocalDiscovery() as a, LocalDiscovery() as b:
            assert a.namespace != b.namespace


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "x" * 10_000, "naïve ☃", "nul\0byte", "/"])
async def test_any_namespace_string_works(name, runtime_dir: Path):
    with anyio.fail_after(10):
        async with LocalDiscovery(name) as discovery:
            assert Path(discovery.path).parent == runtime_dir
            async with LocalDiscovery.Publisher(name) as publisher:
                await publisher.publish("worker-added", worker())


# -- borrowers --------------------------------------------------------------------------------


async def test_publisher_on_missing_namespace_raises_and_creates_nothing(namespace, runtime_dir):
    with anyio.fail_after(10):
        with pytest.raises(DiscoveryNamespaceNotFound) as info:
            async with LocalDiscovery.Publisher(namespace):
                pass
    assert info.value.namespace == namespace
    assert os.listdir(runtime_dir) == []
    # Nor the runtime directory itself, where there is none yet.
    absent = runtime_dir / "absent"
    with anyio.fail_after(10), pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANYWOOL_RUNTIME_DIR", str(absent))
        with pytest.raises(DiscoveryNamespaceNotFound):
            async with LocalDiscovery.Publisher(namespace):
                pass
    assert not absent.exists()


async def test_subscriber_on_missing_namespace_raises_and_creates_nothing(namespace, runtime_dir):
    with anyio.fail_after(10):
        with pytest.raises(DiscoveryNamespaceNotFound):
            async for _ in LocalDiscovery.Subscriber(namespace):
                pass
    assert os.listdir(runtime_dir) == []
    assert all(key[0] != _keys.namespace_key(namespace) for key in _hub.stats())
    # Nor the runtime directory itself, where there is none yet.
    absent = runtime_dir / "absent"
    with anyio.fail_after(10), pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANYWOOL_RUNTIME_DIR", str(absent))
        with pytest.raises(DiscoveryNamespaceNotFound):
            async for _ in LocalDiscovery.Subscriber(namespace):
                pass
    assert not absent.exists()


async def test_borrowers_work_without_entering_the_owner_instance(namespace):
    # publisher/subscriber are borrowers whether or not their instance is entered.
    with anyio.fail_after(10):
        unentered = LocalDiscovery(namespace)
        with pytest.raises(DiscoveryNamespaceNotFound):
            async with unentered.publisher:
                pass
        async with LocalDiscovery(namespace):
            async with unentered.publisher as publisher:
                await publisher.publish("worker-added", worker())


@pytest.mark.parametrize("borrower", [LocalDiscovery.Publisher, LocalDiscovery.Subscriber])
@pytest.mark.parametrize("keyword", ["capacity", "block_size"])
def test_borrowers_cannot_declare_capacity(borrower, keyword):
    with pytest.raises(TypeError, match=keyword):
        borrower("jobs", **{keyword: 4})


async def test_orphaned_publisher_raises_then_rebinds_to_successor(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace):
            publisher = LocalDiscovery.Publisher(namespace)
            await publisher.__aenter__()
        try:
            with pytest.raises(DiscoveryNamespaceNotFound):
                await publisher.publish("worker-added", worker())
            async with LocalDiscovery(namespace) as successor:
                async with anyio.create_task_group() as tg:
                    new = worker()
                    await publisher.publish("worker-added", new)
                    events = await follow(tg, successor.subscriber)
                    assert await take(events, 1) == [("worker-added", new.uid)]
                    tg.cancel_scope.cancel()
        finally:
            await publisher.__aexit__(None, None, None)


async def test_publish_requires_an_entered_publisher(namespace):
    async with LocalDiscovery(namespace):
        with pytest.raises(RuntimeError, match="entered"):
            await LocalDiscovery.Publisher(namespace).publish("worker-added", worker())


# -- registry semantics -----------------------------------------------------------------------


async def test_subscriber_sees_every_change_in_order(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                assert await take(events, 1) == [("worker-added", first.uid)]
                # Published back to back: the journal keeps each change, not just the net.
                added = [worker() for _ in range(10)]
                steps = [("worker-added", m) for m in added]
                steps += [("worker-updated", worker(uid=m.uid, pid=7)) for m in added[:5]]
                steps += [("worker-dropped", m) for m in added[:3]]
                steps += [("worker-added", transient := worker()), ("worker-dropped", transient)]
                for kind, metadata in steps:
                    await publisher.publish(kind, metadata)
                received = [await events.receive() for _ in steps]
                assert [(e.type, e.metadata.uid) for e in received] == [
                    (kind, m.uid) for kind, m in steps
                ]
                for event, (kind, metadata) in zip(received, steps):
                    if kind != "worker-dropped":
                        assert event.metadata.same_as(metadata)
                tg.cancel_scope.cancel()


async def test_late_subscriber_first_sees_current_workers(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            current = [worker() for _ in range(3)]
            gone = worker()
            for metadata in [*current, gone]:
                await publisher.publish("worker-added", metadata)
            await publisher.publish("worker-dropped", gone)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                snapshot = await take(events, 3)
                assert sorted(snapshot) == sorted(("worker-added", m.uid) for m in current)
                later = worker()
                await publisher.publish("worker-added", later)
                assert await take(events, 1) == [("worker-added", later.uid)]
                tg.cancel_scope.cancel()


async def test_readd_refreshes_in_place_as_update(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace, capacity=1) as discovery, discovery.publisher as publisher:
            original = worker()
            await publisher.publish("worker-added", original)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                assert await take(events, 1) == [("worker-added", original.uid)]
                # capacity=1: a second slot would raise DiscoveryCapacityExhausted.
                await publisher.publish("worker-added", worker(uid=original.uid, tags={"x"}))
                assert await take(events, 1) == [("worker-updated", original.uid)]
                tg.cancel_scope.cancel()


async def test_unchanged_update_emits_nothing(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            a, b = worker(), worker()
            await publisher.publish("worker-added", a)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                assert await take(events, 1) == [("worker-added", a.uid)]
                await publisher.publish("worker-updated", a)  # same metadata
                await publisher.publish("worker-added", b)
                assert await take(events, 1) == [("worker-added", b.uid)]
                tg.cancel_scope.cancel()


async def test_update_of_unknown_worker_raises_and_drop_is_noop(namespace):
    async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
        stranger = worker()
        with pytest.raises(DiscoveryWorkerNotFound) as info:
            await publisher.publish("worker-updated", stranger)
        assert info.value.uid == stranger.uid
        await publisher.publish("worker-dropped", stranger)


async def test_the_filter_keeps_non_matching_workers_out_of_the_subscriber(namespace):
    def gpu(metadata) -> bool:
        return "gpu" in metadata.tags

    with anyio.fail_after(10):
        async with LocalDiscovery(namespace, filter=gpu) as discovery, \
                discovery.publisher as publisher:
            cpu, first = worker(tags={"cpu"}), worker(tags={"gpu"})
            await publisher.publish("worker-added", cpu)
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                assert await take(events, 1) == [("worker-added", first.uid)]
                await publisher.publish("worker-updated", worker(uid=cpu.uid, tags={"cpu", "x"}))
                last = worker(tags={"gpu"})
                await publisher.publish("worker-added", last)
                # Events arrive in order: cpu, in the snapshot or updated, would come first.
                assert await take(events, 1) == [("worker-added", last.uid)]
                tg.cancel_scope.cancel()


async def test_capacity_is_stamped_by_owner_and_governs_borrowers(namespace):
    async with LocalDiscovery(namespace, capacity=2), LocalDiscovery.Publisher(namespace) as publisher:
        await publisher.publish("worker-added", worker())
        await publisher.publish("worker-added", worker())
        with pytest.raises(DiscoveryCapacityExhausted) as info:
            await publisher.publish("worker-added", worker())
        assert info.value.capacity == 2


async def test_block_size_boundary(namespace):
    probe = worker(extra={"pad": ""})
    base = len(probe.to_bytes())
    block = base + 40
    async with LocalDiscovery(namespace, block_size=block) as discovery, discovery.publisher as publisher:
        fits = worker(uid=probe.uid, extra={"pad": "x" * 40})
        # msgpack's str header grows by one byte past 31 characters.
        while len(fits.to_bytes()) > block:
            fits = worker(uid=probe.uid, extra={"pad": fits.extra["pad"][:-1]})
        while len(fits.to_bytes()) < block:
            fits = worker(uid=probe.uid, extra={"pad": fits.extra["pad"] + "x"})
        assert len(fits.to_bytes()) == block
        await publisher.publish("worker-added", fits)
        too_big = worker(uid=probe.uid, extra={"pad": fits.extra["pad"] + "x"})
        with pytest.raises(DiscoveryBlockExhausted) as info:
            await publisher.publish("worker-added", too_big)
        assert info.value.size == block + 1
        async with anyio.create_task_group() as tg:
            events = await follow(tg, discovery.subscriber)
            event = await events.receive()
            assert event.metadata.same_as(fits)  # the prior registration is intact
            tg.cancel_scope.cancel()


async def test_publisher_exit_withdraws_its_workers(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery:
            kept = worker()
            async with discovery.publisher as other:
                await other.publish("worker-added", kept)
                async with anyio.create_task_group() as tg:
                    events = await follow(tg, discovery.subscriber)
                    assert await take(events, 1) == [("worker-added", kept.uid)]
                    mine = [worker(), worker()]
                    async with discovery.publisher as publisher:
                        for metadata in mine:
                            await publisher.publish("worker-added", metadata)
                        assert await take(events, 2) == [("worker-added", m.uid) for m in mine]
                    got = await take(events, 2)
                    assert sorted(got) == sorted(("worker-dropped", m.uid) for m in mine)
                    tg.cancel_scope.cancel()


async def test_owner_exit_drops_workers_then_successor_appears(namespace):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            claimed, release, exited = anyio.Event(), anyio.Event(), anyio.Event()

            async def own() -> None:
                async with LocalDiscovery(namespace):
                    claimed.set()
                    await release.wait()
                exited.set()

            tg.start_soon(own)
            await claimed.wait()
            a = worker()
            # The publisher outlives the owner, so the drop comes from the owner's exit.
            async with LocalDiscovery.Publisher(namespace) as publisher:
                await publisher.publish("worker-added", a)
                events = await follow(tg, LocalDiscovery.Subscriber(namespace))
                assert await take(events, 1) == [("worker-added", a.uid)]
                release.set()
                assert await take(events, 1) == [("worker-dropped", a.uid)]
                await exited.wait()
                with pytest.raises(DiscoveryNamespaceNotFound):
                    async for _ in LocalDiscovery.Subscriber(namespace):
                        pass
                # The same iteration follows a successor, and never shows the old worker.
                async with LocalDiscovery(namespace) as successor, successor.publisher as other:
                    b = worker()
                    await other.publish("worker-added", b)
                    assert await take(events, 1) == [("worker-added", b.uid)]
            tg.cancel_scope.cancel()


# -- construction -----------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"capacity": 0}, ValueError, "capacity"),
    ({"capacity": True}, TypeError, "capacity"),
    ({"capacity": 1.5}, TypeError, "capacity"),
    ({"capacity": 10**9}, ValueError, "capacity"),
    ({"block_size": 0}, ValueError, "block_size"),
    ({"block_size": False}, TypeError, "block_size"),
    ({"block_size": 1 << 30}, ValueError, "block_size"),
    ({"lock_timeout": -1}, ValueError, "lock_timeout"),
    ({"poll_interval": 0}, ValueError, "poll_interval"),
    ({"poll_interval": -0.5}, ValueError, "poll_interval"),
    ({"teardown_timeout": -1}, ValueError, "teardown_timeout"),
    ({"teardown_timeout": "x"}, TypeError, "teardown_timeout"),
    ({"teardown_timeout": None}, TypeError, "teardown_timeout"),
    ({"poll_interval": 1e-9}, ValueError, "poll_interval must be at least 0.01"),
    ({"reap_interval": 1e-9}, ValueError, "reap_interval must be at least 0.01"),
    ({"capacity": 256, "block_size": 512 << 10}, ValueError, "takes .* bytes .*journal"),
])
def test_bad_construction_names_parameter_and_value(kwargs, error, words):
    with pytest.raises(error, match=words) as info:
        LocalDiscovery("jobs", **kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"lock_timeout": -1}, ValueError, "lock_timeout"),
    ({"teardown_timeout": -1}, ValueError, "teardown_timeout"),
    ({"teardown_timeout": "x"}, TypeError, "teardown_timeout"),
    ({"teardown_timeout": None}, TypeError, "teardown_timeout"),
])
def test_bad_publisher_construction_names_parameter_and_value(kwargs, error, words):
    with pytest.raises(error, match=words) as info:
        LocalDiscovery.Publisher("jobs", **kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def test_publisher_of_an_owner_inherits_its_timeouts():
    publisher = LocalDiscovery("jobs", lock_timeout=2, teardown_timeout=0).publisher
    assert (publisher.lock_timeout, publisher.teardown_timeout) == (2.0, 0.0)


def test_subscriber_is_subscriber_like_and_pickles_with_poll_interval():
    subscriber = LocalDiscovery.Subscriber("jobs", poll_interval=0.25)
    assert isinstance(subscriber, DiscoverySubscriberLike)
    for dumps, loads in [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)]:
        clone = loads(dumps(subscriber))
        assert clone.namespace == "jobs" and clone.poll_interval == 0.25


async def test_concurrent_publishes_on_one_publisher_lose_nothing(namespace):
    # One publisher shares one lock descriptor among its threads: flock alone cannot
    # serialise them, so the publisher must.
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            workers = [worker() for _ in range(60)]
            async with anyio.create_task_group() as tg:
                for metadata in workers:
                    tg.start_soon(publisher.publish, "worker-added", metadata)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                got = await take(events, len(workers))
                assert sorted(got) == sorted(("worker-added", m.uid) for m in workers)
                tg.cancel_scope.cancel()


# -- a registry damaged under a live owner ------------------------------------------------------

# Ways someone outside anywool can spoil a live owner's registry. As root, permission bits stop
# nobody; "unopenable" (a directory where the file was) is what a new borrower then meets.
DAMAGE = ["garbage", "truncated", "empty", "other-format", "replaced", "unopenable"]


def _damage(registry: Path, how: str) -> None:
    if how == "garbage":  # overwritten in place, end to end, with bytes that are no registry
        size = registry.stat().st_size
        with open(registry, "r+b") as file:
            file.write(b"\xa5" * size)
    elif how == "truncated":
        os.truncate(registry, 200)  # within the slot table: the header still reads
    elif how == "empty":
        os.truncate(registry, 0)
    elif how == "other-format":  # a registry of a format version this anywool does not know
        with open(registry, "r+b") as file:
            file.seek(len(_layout.MAGIC))
            file.write((_layout.FORMAT_VERSION + 1).to_bytes(4, "little"))
    elif how == "replaced":  # another file renamed over it
        other = registry.with_name("other")
        other.write_bytes(b"not a registry")
        os.replace(other, registry)
    else:  # "unopenable"
        os.unlink(registry)
        os.mkdir(registry)


class _Followed:
    """One iteration run in a task: what it yielded, and how it ended."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.error: BaseException | None = None
        self.started = anyio.Event()
        self.ended = anyio.Event()

    async def run(self, subscriber: DiscoverySubscriberLike) -> None:
        try:
            async for event in subscriber:
                self.events.append((event.type, event.metadata.uid))
                self.started.set()
        except Exception as exc:
            self.error = exc
        finally:
            self.ended.set()


@pytest.mark.parametrize("damage", DAMAGE)
async def test_a_registry_damaged_under_a_live_owner_ends_every_subscription(namespace, damage):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace, capacity=4, block_size=256,
                                  poll_interval=0.05) as owner, \
                owner.publisher as publisher, anyio.create_task_group() as tg:
            a = worker()
            await publisher.publish("worker-added", a)
            # Two sources (one per poll interval); the first shared by two iterations.
            followed = [_Followed() for _ in range(3)]
            tg.start_soon(followed[0].run, owner.subscriber)
            tg.start_soon(followed[1].run, owner.subscriber)
            tg.start_soon(followed[2].run, LocalDiscovery.Subscriber(namespace, poll_interval=0.08))
            for one in followed:
                await one.started.wait()
            assert owner.path is not None
            registry = Path(owner.path) / "registry"
            _damage(registry, damage)
            # Each ends with the documented error within a few poll intervals (the bound is
            # generous for a loaded machine), having reported nothing else about its view.
            with anyio.fail_after(5):
                for one in followed:
                    await one.ended.wait()
            for one in followed:
                assert isinstance(one.error, DiscoveryRegistryCorrupt), one.error
                assert (one.error.namespace, one.error.path) == (namespace, str(registry))
                assert one.events == [("worker-added", a.uid)]
            assert followed[0].error is not followed[1].error  # each raises its own
            # A new iteration, and a new publisher, are told the same at once.
            with pytest.raises(DiscoveryRegistryCorrupt):
                async for _ in LocalDiscovery.Subscriber(namespace):
                    pass
            with pytest.raises(DiscoveryRegistryCorrupt):
                async with LocalDiscovery.Publisher(namespace):
                    pass
            # The owner is still the owner: nobody may claim over it.
            with pytest.raises(DiscoveryNamespaceInUse):
                async with LocalDiscovery(namespace):
                    pass


async def test_a_registry_replaced_while_a_publisher_keeps_publishing_still_ends_subscriptions(
        namespace):
    # The publisher, bound before, keeps writing to the owner's old file and notifying: the
    # subscription is woken all the time, and must still look at what a new borrower would find.
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace, poll_interval=0.05) as owner, \
                owner.publisher as publisher, anyio.create_task_group() as tg:
            a = worker()
            await publisher.publish("worker-added", a)
            followed = _Followed()
            tg.start_soon(followed.run, owner.subscriber)
            await followed.started.wait()

            async def churn() -> None:
                b = worker()
                while True:  # paced well under the poll interval: the loop never sleeps it out
                    await publisher.publish("worker-added", b)
                    await publisher.publish("worker-dropped", b)
                    await anyio.sleep(0.005)

            tg.start_soon(churn)
            assert owner.path is not None
            registry = Path(owner.path) / "registry"
            _damage(registry, "replaced")
            with anyio.fail_after(5):
                await followed.ended.wait()
            assert isinstance(followed.error, DiscoveryRegistryCorrupt), followed.error
            tg.cancel_scope.cancel()


async def test_a_registry_removed_under_a_live_owner_reads_as_an_owner_gone(namespace):
    # A new borrower finds no registry, as when the owner is gone: a live subscription says
    # the same (its workers dropped) instead of keeping a view nobody else can reach.
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace, poll_interval=0.05) as owner, \
                owner.publisher as publisher, anyio.create_task_group() as tg:
            a = worker()
            await publisher.publish("worker-added", a)
            events = await follow(tg, owner.subscriber)
            assert await take(events, 1) == [("worker-added", a.uid)]
            assert owner.path is not None
            os.unlink(Path(owner.path) / "registry")
            with anyio.fail_after(5):
                assert await take(events, 1) == [("worker-dropped", a.uid)]
            with pytest.raises(DiscoveryNamespaceNotFound):
                async for _ in LocalDiscovery.Subscriber(namespace):
                    pass
            tg.cancel_scope.cancel()


async def test_the_owner_of_a_damaged_registry_neither_repairs_it_nor_logs_it_every_round(
        namespace, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="anywool.discovery")
    reaps: list[None] = []
    real_reap = LocalDiscovery._reap

    def counted_reap(claim: _claim.Claim) -> None:
        reaps.append(None)
        real_reap(claim)

    monkeypatch.setattr(LocalDiscovery, "_reap", staticmethod(counted_reap))
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace, capacity=4, block_size=256,
                                  reap_interval=0.02) as owner:
            async with owner.publisher as publisher:
                await publisher.publish("worker-added", worker())
            assert owner.path is not None
            registry = Path(owner.path) / "registry"
            _damage(registry, "garbage")
            damaged = registry.read_bytes()

            def reaping() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "reaping" in r.getMessage()]

            await wait_until(lambda: len(reaping()) >= 1, "the reaper's warning")
            assert isinstance(reaping()[0].exc_info[1], DiscoveryRegistryCorrupt)
            # Ten more rounds: no second warning, and not a byte written into the registry.
            seen = len(reaps)
            await wait_until(lambda: len(reaps) >= seen + 10, "ten more reap rounds")
            assert len(reaping()) == 1
            assert registry.read_bytes() == damaged


# -- the in-loop fast paths and the thread paths ------------------------------------------------
#
# On a memory file system (the default runtime directory, and the one these tests use), a
# claim, a release and a new iteration's first scan run in the event loop: nothing on the way
# can wait. On a disk, or whenever something would wait (a registry lock held by a writer, a
# sweep that is due, a large registry), they take one thread hop. Both must behave the same.


@pytest.fixture(params=["in-loop", "thread"])
def paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "thread":
        monkeypatch.setattr("anywool._runtime_dir.in_memory", lambda: False)
    return request.param


async def test_either_path_claims_serves_and_removes_everything(namespace, paths, runtime_dir,
                                                                 monkeypatch):
    monkeypatch.setattr(_claim, "_last_sweep", float("inf"))  # no sweep due: the fast path
    claims, attaches, hops = [], [], []
    real_claim, real_attach = _claim.claim, _hub._Hub.attach


    def noting_worker_threads(name: str, real):
        def run(self, *args):
            if threading.current_thread() is not threading.main_thread():
                hops.append(name)
            return real(self, *args)
        return run

    for name in ("_publish", "_withdraw", "_bind_first"):  # what the thread paths run
        monkeypatch.setattr(LocalDiscovery.Publisher, name,
                            noting_worker_threads(name, getattr(LocalDiscovery.Publisher, name)))
    monkeypatch.setattr(_claim, "claim", lambda *a, **k: claims.append(1) or real_claim(*a, **k))
    monkeypatch.setattr(_hub._Hub, "attach",
                        lambda self, *a, **k: attaches.append(k.get("in_loop", False))
                        or real_attach(self, *a, **k))
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                assert await take(events, 1) == [("worker-added", first.uid)]
                second = worker()
                await publisher.publish("worker-added", second)
                assert await take(events, 1) == [("worker-added", second.uid)]
                tg.cancel_scope.cancel()
        assert os.listdir(runtime_dir) == []
    if paths == "in-loop":
        # No blocking claim, no attach, bind, publish or withdrawal in a thread.
        assert claims == [] and attaches == [True] and hops == []
    else:
        assert claims == [1] and attaches == [False]
        assert hops == ["_bind_first", "_publish", "_publish", "_withdraw"]


async def test_a_due_sweep_sends_the_claim_through_the_thread_path(namespace, monkeypatch):
    claims = []
    real_claim = _claim.claim
    monkeypatch.setattr(_claim, "claim", lambda *a, **k: claims.append(1) or real_claim(*a, **k))
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace):  # conftest: the first claim's sweep is due
            pass
        async with LocalDiscovery(namespace):  # swept just now: not due
            pass
    assert claims == [1]


async def test_a_held_registry_lock_sends_exit_and_attach_through_the_thread_path(namespace):
    # A writer holds the registry lock: the in-loop attempts must not wait for it (nor act
    # without it); the thread paths wait, and finish once it is released.
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            await publisher.publish("worker-added", first := worker())
            holder = os.open(os.path.join(discovery.path, "registry"), os.O_RDWR)
            try:
                import fcntl
                fcntl.flock(holder, fcntl.LOCK_EX)
                async with anyio.create_task_group() as tg:
                    events = await follow(tg, discovery.subscriber)
                    await anyio.sleep(0)  # give the attach its chance to (wrongly) go ahead
                    with anyio.move_on_after(0.05):
                        await events.receive()
                        pytest.fail("an attach read the registry under a writer's lock")
                    fcntl.flock(holder, fcntl.LOCK_UN)
                    assert await take(events, 1) == [("worker-added", first.uid)]
                    tg.cancel_scope.cancel()
            finally:
                os.close(holder)


async def test_exit_with_the_registry_lock_held_retires_after_it_is_released(namespace,
                                                                           runtime_dir):
    import fcntl

    entered, leave, left = anyio.Event(), anyio.Event(), anyio.Event()
    paths: list[str] = []

    async def own() -> None:
        async with LocalDiscovery(namespace) as discovery:
            assert discovery.path is not None
            paths.append(discovery.path)
            entered.set()
            await leave.wait()
        left.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(own)
            await entered.wait()
            holder = os.open(os.path.join(paths[0], "registry"), os.O_RDWR)
            try:
                fcntl.flock(holder, fcntl.LOCK_EX)
                leave.set()
                with anyio.move_on_after(0.05):  # a noted wait: the exit waits for the lock
                    await left.wait()
                assert not left.is_set()
                with open(os.path.join(paths[0], "registry"), "rb") as registry_file:
                    header = registry_file.read(_layout.COUNTER_OFFSET + 9)
                assert header[-1] == 0  # not retired while another holds the lock
                fcntl.flock(holder, fcntl.LOCK_UN)
            finally:
                os.close(holder)
        assert os.listdir(runtime_dir) == []


async def test_a_large_registry_is_scanned_in_a_thread(namespace, monkeypatch):
    attaches = []
    real_attach = _hub._Hub.attach

    def attach(self, *args, **kwargs):
        try:
            return real_attach(self, *args, **kwargs)
        finally:
            attaches.append((kwargs.get("in_loop", False), len(_hub.stats())))

    monkeypatch.setattr(_hub._Hub, "attach", attach)
    with anyio.fail_after(10):
        # 2048 slots of 1 KiB: over the in-loop bound (IN_LOOP_BYTES) for every operation.
        async with LocalDiscovery(namespace, capacity=2048) as discovery, \
                discovery.publisher as publisher:
            await publisher.publish("worker-added", first := worker())
            async with anyio.create_task_group() as tg:
                events = await follow(tg, discovery.subscriber)
                assert await take(events, 1) == [("worker-added", first.uid)]
                tg.cancel_scope.cancel()
    # The in-loop attempt gave up before installing anything; the thread attached.
    assert attaches == [(True, 0), (False, 1)]


async def test_a_publish_under_a_held_registry_lock_waits_for_it_in_a_thread(namespace):
    import fcntl

    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            holder = os.open(os.path.join(discovery.path, "registry"), os.O_RDWR)
            try:
                fcntl.flock(holder, fcntl.LOCK_EX)
                done = anyio.Event()

                async def publish() -> None:
                    await publisher.publish("worker-added", worker())
                    done.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(publish)
                    with anyio.move_on_after(0.05):  # a noted wait: it must wait for the lock
                        await done.wait()
                    assert not done.is_set()
                    fcntl.flock(holder, fcntl.LOCK_UN)
            finally:
                os.close(holder)
            async for event in discovery.subscriber:
                assert event.type == "worker-added"
                break


async def test_exit_cancels_a_reap_waiting_for_the_registry_lock(namespace, runtime_dir):
    # The reaper ends by an event at exit, not by cancellation, unless it is inside a reap:
    # a reap waiting for a lock held elsewhere (for up to 5 s) must not hold the exit up.
    import fcntl

    with anyio.fail_after(10):
        owner = LocalDiscovery(namespace, reap_interval=0.01, teardown_timeout=0.1)
        holder = -1
        try:
            async with owner:
                assert owner.path is not None
                holder = os.open(os.path.join(owner.path, "registry"), os.O_RDWR)
                fcntl.flock(holder, fcntl.LOCK_EX)
                await wait_until(lambda: owner._reaping, "a reap waiting for the lock")
                exiting = anyio.current_time()
            # Bounded by the teardown budget, well inside the reap's own 5 s lock timeout.
            assert anyio.current_time() - exiting < 3
        finally:
            if holder >= 0:
                os.close(holder)
    assert os.listdir(runtime_dir) == []


async def test_publishing_in_the_loop_lets_other_tasks_run(namespace):
    # Done in the loop, a publish is still a schedule point: a sibling task is not starved.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher, \
                anyio.create_task_group() as tg:
            tg.start_soon(tick)
            await anyio.lowlevel.checkpoint()
            start = ticks
            metadata = worker()
            await publisher.publish("worker-added", metadata)
            for pid in range(50):
                await publisher.publish("worker-updated", worker(uid=metadata.uid, pid=pid))
            assert ticks - start >= 50
            tg.cancel_scope.cancel()
