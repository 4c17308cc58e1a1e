"""WorkerProxy: construction, pickling, the pool-URI form, quorum, lease and reconnection."""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from anyio.abc import ByteStream

from anywool import (
    DiscoveryEvent,
    DiscoveryNamespaceNotFound,
    LocalDiscovery,
    LocalWorker,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    WorkerError,
    WorkerProxy,
    afilter,
    routine,
)
from anywool.metadata import WorkerMetadata
from tests.helpers import worker
from tests.unit._fakes import FakeDiscovery

pytestmark = pytest.mark.anyio


@routine
async def pid() -> int:
    return os.getpid()


class ContextSubscriber:
    """A subscriber that is also an async context manager."""

    async def __aenter__(self) -> ContextSubscriber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pass

    def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return FakeDiscovery().subscriber.__aiter__()


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or current in seen:
            continue
        seen.append(current)
        pending += [current.__cause__, current.__context__]
    return seen


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "discovery",
    [LocalDiscovery.Subscriber, lambda: LocalDiscovery.Subscriber("x"), object(), 42,
     LocalDiscovery("x")],
    ids=["class", "callable", "object", "int", "discovery-like"],
)
@pytest.mark.parametrize("keyword", [False, True], ids=["positional", "discovery="])
def test_construction_refuses_what_is_not_a_subscriber_instance(discovery: object,
                                                                keyword: bool) -> None:
    with pytest.raises(TypeError, match="discovery must be a DiscoverySubscriberLike"):
        if keyword:
            WorkerProxy(discovery=discovery)  # type: ignore[arg-type]
        else:
            WorkerProxy(discovery)  # type: ignore[arg-type]


def test_extra_positional_tags_belong_to_the_pool_uri_form() -> None:
    with pytest.raises(TypeError, match="pool-URI form"):
        WorkerProxy(LocalDiscovery.Subscriber("x"), "gpu")


def test_a_subscriber_given_as_discovery_is_the_proxys_as_given() -> None:
    subscriber = LocalDiscovery.Subscriber("jobs")
    proxy = WorkerProxy(discovery=subscriber, lazy=False)
    assert proxy.discovery is subscriber
    assert repr(proxy) == repr(WorkerProxy(subscriber))
    assert pickle.loads(pickle.dumps(proxy)).discovery == subscriber


def test_a_discovery_given_both_positionally_and_as_discovery_is_refused() -> None:
    with pytest.raises(TypeError, match="takes its discovery once.*got both"):
        WorkerProxy(LocalDiscovery.Subscriber("x"),  # type: ignore[call-overload]
                    discovery=LocalDiscovery.Subscriber("y"))
    with pytest.raises(TypeError, match="takes its discovery once"):
        WorkerProxy("jobs", "gpu", discovery=LocalDiscovery.Subscriber("y"))  # type: ignore[call-overload]


def test_a_proxy_without_a_discovery_is_refused_naming_both_forms() -> None:
    with pytest.raises(TypeError, match=r"needs its discovery.*discovery=subscriber.*pool URI"):
        WorkerProxy()  # type: ignore[call-overload]


def test_a_pool_uri_given_as_discovery_is_refused_pointing_at_the_positional_form() -> None:
    with pytest.raises(TypeError, match=r"pool URI is given positionally: WorkerProxy\('jobs'\)"):
        WorkerProxy(discovery="jobs")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [({"quorum": 0}, ValueError, "quorum"), ({"lease": -1}, ValueError, "lease"),
     ({"lazy": "no"}, TypeError, "lazy"), ({"loadbalancer": RoundRobinLoadBalancer}, TypeError,
                                           "loadbalancer must be a LoadBalancerLike instance")],
)
def test_bad_options_are_refused_naming_them(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        WorkerProxy(LocalDiscovery.Subscriber("x"), **options)


# -- pickling -------------------------------------------------------------------------------


def test_pickling_a_proxy_whose_subscriber_is_a_context_manager_names_discovery() -> None:
    proxy = WorkerProxy(ContextSubscriber())
    with pytest.raises(TypeError, match="discovery is a context manager"):
        pickle.dumps(proxy)


def test_a_proxy_over_a_plain_subscriber_pickles_as_its_constructor_call() -> None:
    subscriber = LocalDiscovery.Subscriber("jobs", poll_interval=0.25)
    proxy = WorkerProxy(subscriber, tags={"gpu"}, lazy=False, quorum=2, quorum_timeout=3.0,
                        lease=4)
    copy = pickle.loads(pickle.dumps(proxy))
    assert isinstance(copy, WorkerProxy) and copy is not proxy
    assert copy.discovery == subscriber
    assert (copy._tags, copy._lazy, copy._quorum, copy._quorum_timeout, copy._lease) == (
        frozenset({"gpu"}), False, 2, 3.0, 4)


def test_a_pool_uri_proxy_pickles_as_its_uri_and_tags() -> None:
    copy = pickle.loads(pickle.dumps(WorkerProxy("jobs", "gpu")))
    assert repr(copy) == "WorkerProxy('jobs', 'gpu')"
    assert isinstance(copy.discovery, afilter)
    assert copy.discovery.subscriber == LocalDiscovery.Subscriber("jobs")


# -- the pool-URI form ----------------------------------------------------------------------


async def test_a_non_lazy_pool_uri_proxy_without_owner_fails_at_once_naming_it(namespace: str) -> None:
    # quorum_timeout is 60 s; the 5 s bound shows the bind failure ended the wait at once.
    with anyio.fail_after(5), pytest.raises(DiscoveryNamespaceNotFound) as info:
        async with WorkerProxy(namespace, lazy=False, quorum_timeout=60):
            pytest.fail("entered without an owner")
    assert info.value.namespace == namespace
    assert not any(isinstance(e, TimeoutError) for e in _chain(info.value))


async def test_a_pool_uri_proxy_admits_exactly_the_workers_sharing_a_tag(namespace: str) -> None:
    tagged = {
        "namespace": worker(tags=frozenset({namespace})),
        "extra": worker(tags=frozenset({"extra"})),
        "other": worker(tags=frozenset({"other"})),
        "none": worker(),
        "both": worker(tags=frozenset({namespace, "other"})),
    }
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            for metadata in tagged.values():
                await publisher.publish("worker-added", metadata)
            proxy = WorkerProxy(namespace, "extra")
            seen = []
            async with contextlib.aclosing(aiter(proxy.discovery)) as events:
                async for event in events:
                    seen.append((event.type, event.metadata.uid))
                    if event.metadata.uid == tagged["both"].uid:
                        break
    assert seen == [("worker-added", tagged[k].uid) for k in ("namespace", "extra", "both")]


async def test_a_pool_uri_proxy_dispatches_only_to_admitted_workers(namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher, \
                LocalWorker(tags={"extra"}) as admitted, LocalWorker(tags={"other"}) as refused:
            await publisher.publish("worker-added", refused.metadata)
            await publisher.publish("worker-added", admitted.metadata)
            async with WorkerProxy(namespace, "extra", lazy=False) as proxy:
                assert [await pid() for _ in range(4)] == [admitted.pid] * 4
                assert proxy.workers == [admitted.metadata]


async def test_a_proxy_with_tags_never_dispatches_to_a_worker_lacking_one() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker(tags={"gpu"}) as partial, \
                LocalWorker(tags={"gpu", "cuda", "x"}) as carrying:
            await discovery.publisher.publish("worker-added", partial.metadata)
            async with WorkerProxy(discovery.subscriber, tags={"gpu", "cuda"},
                                   quorum_timeout=0.5) as proxy:
                # It carries one of the two tags, not both: it may take no call.
                with pytest.raises(NoWorkersAvailable, match="carries every tag of"):
                    await pid()
                await discovery.publisher.publish("worker-added", carrying.metadata)
                assert [await pid() for _ in range(4)] == [carrying.pid] * 4
                assert proxy.workers == [carrying.metadata]


# -- quorum and lease -----------------------------------------------------------------------


async def test_a_non_lazy_proxy_enters_once_its_quorum_is_connected() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker() as first, LocalWorker() as second:
            await discovery.publisher.publish("worker-added", first.metadata)
            await discovery.publisher.publish("worker-added", second.metadata)
            async with WorkerProxy(discovery.subscriber, lazy=False, quorum=2) as proxy:
                assert {w.uid for w in proxy.workers} == {first.metadata.uid, second.metadata.uid}


async def test_a_proxy_given_its_subscriber_as_discovery_dispatches_to_its_workers() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker() as only:
            await discovery.publisher.publish("worker-added", only.metadata)
            async with WorkerProxy(discovery=discovery.subscriber, lazy=False) as proxy:
                assert proxy.workers == [only.metadata]
                assert [await pid() for _ in range(2)] == [only.pid] * 2


async def test_a_quorum_that_cannot_be_met_times_out_at_entry() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker() as only:
            await discovery.publisher.publish("worker-added", only.metadata)
            with pytest.raises(TimeoutError, match="1 of the quorum of 2 workers"):
                async with WorkerProxy(discovery.subscriber, lazy=False, quorum=2,
                                       quorum_timeout=0.5):
                    pytest.fail("entered without a quorum")


async def test_a_lazy_proxy_waits_for_its_quorum_at_the_first_dispatch() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker() as only:
            await discovery.publisher.publish("worker-added", only.metadata)
            async with WorkerProxy(discovery.subscriber, quorum=2, quorum_timeout=0.5):
                with pytest.raises(NoWorkersAvailable, match="1 of the quorum of 2"):
                    await pid()


async def test_a_lease_caps_the_admitted_workers_and_frees_a_place_on_drop() -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker() as first, LocalWorker() as second:
            await discovery.publisher.publish("worker-added", first.metadata)
            await discovery.publisher.publish("worker-added", second.metadata)
            async with WorkerProxy(discovery.subscriber, lease=1, lazy=False) as proxy:
                assert {await pid() for _ in range(4)} == {first.pid}
                await discovery.publisher.publish("worker-dropped", first.metadata)
                # The waiting worker takes the freed place.
                with anyio.fail_after(10):
                    while proxy.workers != [second.metadata]:
                        await proxy._changed.wait()
                assert await pid() == second.pid


# -- reconnection ---------------------------------------------------------------------------


class Relay:
    """A Unix-socket relay in front of a worker: cutting it is a lost connection to a worker
    that is still alive and still announced."""

    def __init__(self, path: Path, target: str) -> None:
        self.path = path
        self.target = target
        self.accepted = 0
        self._streams: list[ByteStream] = []

    async def _pump(self, source: ByteStream, sink: ByteStream) -> None:
        try:
            async for chunk in source:
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            await sink.aclose()

    async def _handle(self, client: ByteStream) -> None:
        self.accepted += 1
        upstream = await anyio.connect_unix(self.target.removeprefix("unix:"))
        self._streams += [client, upstream]
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._pump, client, upstream)
            tg.start_soon(self._pump, upstream, client)

    async def cut(self) -> None:
        streams, self._streams = self._streams, []
        for stream in streams:
            await stream.aclose()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_unix_listener(self.path)
        task_status.started()
        try:
            await listener.serve(self._handle)
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()
            self.path.unlink(missing_ok=True)


async def test_a_lost_connection_to_an_announced_worker_is_re_established(runtime_dir: Path) -> None:
    discovery = FakeDiscovery()
    with anyio.fail_after(30):
        async with LocalWorker() as real, anyio.create_task_group() as tg:
            relay = Relay(runtime_dir / "relay.sock", real.address)
            await tg.start(relay.serve)
            metadata = WorkerMetadata(real.metadata.uid, f"unix:{relay.path}", real.pid, "test")
            await discovery.publisher.publish("worker-added", metadata)
            async with WorkerProxy(discovery.subscriber, lazy=False) as proxy:
                assert await pid() == real.pid
                await relay.cut()
                # Later calls are served again once the proxy has reconnected by itself.
                while True:
                    try:
                        assert await pid() == real.pid
                        break
                    except (WorkerError, NoWorkersAvailable):
                        await proxy._changed.wait()
                assert relay.accepted >= 2
            tg.cancel_scope.cancel()
