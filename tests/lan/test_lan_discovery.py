"""LanDiscovery over real mDNS, inside the test run's private network namespace.

Processes and zeroconf instances play the hosts; zeroconf only ever multicasts on loopback
(``interfaces=["127.0.0.1"]``), and ``10.213.0.1`` plays a host's routable address.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
import warnings
from contextlib import aclosing

import anyio
import anyio.abc
import pytest

from anywool import LanDiscovery, WorkerPool
from anywool.discovery import _hub
from anywool.discovery.lan import _service
from anywool.errors import (
    DiscoveryBlockExhausted,
    DiscoveryWorkerNotFound,
    LoopbackAdvertisementWarning,
)
from anywool.lowlevel import discovery_stats

from ..helpers import follow, take, wait_until, worker
from ..netns import ROUTABLE

pytestmark = pytest.mark.anyio

LO = ["127.0.0.1"]
SECRET = b"a shared secret for the lan tests"


@pytest.fixture
def lan_namespace() -> str:
    return f"lan-{uuid.uuid4().hex}"


def routable(**fields: object):
    return worker(f"{ROUTABLE}:{40000 + uuid.uuid4().int % 20000}", **fields)


def lan_sources() -> list:
    return [stats for stats in discovery_stats() if stats.key.startswith("lan-")]


async def test_a_late_iteration_gets_the_current_workers_then_the_same_changes(lan_namespace):
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            subscriber = LanDiscovery.Subscriber(lan_namespace, interfaces=LO)
            first, second = routable(), routable()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                early = await follow(tg, subscriber)
                assert await take(early, 1) == [("worker-added", first.uid)]
                await publisher.publish("worker-added", second)
                assert await take(early, 1) == [("worker-added", second.uid)]
                late = await follow(tg, subscriber)
                assert sorted(await take(late, 2)) == sorted(
                    [("worker-added", first.uid), ("worker-added", second.uid)])
                await publisher.publish("worker-dropped", second)
                assert await take(early, 1) == await take(late, 1) == [
                    ("worker-dropped", second.uid)]
                tg.cancel_scope.cancel()


async def test_iterations_in_one_process_share_one_browser(lan_namespace):
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            await publisher.publish("worker-added", first := routable())
            discovery = LanDiscovery(lan_namespace, interfaces=LO)
            async with anyio.create_task_group() as tg:
                streams = [await follow(tg, discovery.subscriber) for _ in range(3)]
                for events in streams:
                    assert await take(events, 1) == [("worker-added", first.uid)]
                [stats] = lan_sources()
                assert (stats.binds, stats.consumers) == (1, 3)
                assert lan_namespace not in stats.key  # a hash, never the name
                tg.cancel_scope.cancel()
            assert lan_sources() == []  # the browser stopped with its last iteration


async def test_iterations_with_different_secrets_do_not_share_a_browser(lan_namespace):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for secret in (None, SECRET, SECRET + b"!"):
                await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO,
                                                         secret=secret))
            # Each source appears as its iteration attaches (nothing to wait on but the table).
            await wait_until(lambda: len(lan_sources()) == 3, "three LAN sources")
            assert sorted(s.consumers for s in lan_sources()) == [1, 1, 1]
            tg.cancel_scope.cancel()


async def test_an_update_is_seen_only_when_something_changed(lan_namespace):
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            metadata = routable(tags={"a"})
            await publisher.publish("worker-added", metadata)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO))
                assert await take(events, 1) == [("worker-added", metadata.uid)]
                # The same metadata again, twice: re-announced, but nothing changed.
                await publisher.publish("worker-updated", metadata)
                await publisher.publish("worker-added", metadata)
                changed = routable(uid=metadata.uid, tags={"a", "b"})
                await publisher.publish("worker-updated", changed)
                event = await events.receive()
                assert event.type == "worker-updated" and event.metadata.same_as(changed)
                tg.cancel_scope.cancel()


async def test_a_publisher_that_exits_withdraws_its_workers_within_two_seconds(lan_namespace):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            events = await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO))
            async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
                workers = [routable() for _ in range(3)]
                for metadata in workers:
                    await publisher.publish("worker-added", metadata)
                await take(events, 3)
            with anyio.fail_after(2):  # the contract: goodbyes, not the records' expiry
                dropped = await take(events, 3)
            assert sorted(dropped) == sorted(("worker-dropped", m.uid) for m in workers)
            tg.cancel_scope.cancel()


async def test_metadata_larger_than_a_txt_value_round_trips(lan_namespace):
    big = routable(tags={f"tag-{index}" for index in range(60)},
                   extra={"description": "x" * 2000, "numbers": list(range(100))})
    assert len(big.to_bytes()) > 3 * 255
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            await publisher.publish("worker-added", big)
            async with aclosing(aiter(LanDiscovery.Subscriber(lan_namespace,
                                                             interfaces=LO))) as events:
                event = await anext(events)
    assert event.type == "worker-added" and event.metadata.same_as(big)


async def test_metadata_up_to_the_record_limit_travels_and_larger_is_refused(lan_namespace):
    def sized(size: int):
        base = routable(extra={"blob": "x" * 1000})  # a blob with msgpack's 3-byte str header
        blob = "x" * (1000 + size - len(base.to_bytes()))
        return worker(base.address, uid=base.uid, extra={"blob": blob})

    largest = sized(_service.MAX_METADATA)
    assert len(largest.to_bytes()) == _service.MAX_METADATA
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            with pytest.raises(DiscoveryBlockExhausted) as info:
                await publisher.publish("worker-added", sized(_service.MAX_METADATA + 1))
            assert info.value.size == _service.MAX_METADATA + 1
            await publisher.publish("worker-added", largest)
            async with aclosing(aiter(LanDiscovery.Subscriber(lan_namespace,
                                                             interfaces=LO))) as events:
                event = await anext(events)
    assert event.type == "worker-added" and event.metadata.same_as(largest)


async def test_a_publisher_updates_only_its_own_workers_and_ignores_unknown_drops(
        lan_namespace):
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            stranger = routable()
            with pytest.raises(DiscoveryWorkerNotFound) as info:
                await publisher.publish("worker-updated", stranger)
            assert info.value.uid == stranger.uid
            await publisher.publish("worker-dropped", stranger)  # a no-op


def _forge(type_: str, records: list[tuple[str, bytes]]):
    """A raw zeroconf registration of ``records`` (instance name, TXT data): no anywool."""
    from zeroconf import ServiceInfo, Zeroconf

    zc = Zeroconf(interfaces=LO)
    try:
        for name, txt in records:
            info = ServiceInfo(type_, name, port=4242, properties=txt, host_ttl=10,
                               other_ttl=10, parsed_addresses=["10.213.0.66"])
            zc.register_service(info, cooperating_responders=True)
    except BaseException:
        zc.close()
        raise
    return zc


async def test_a_subscriber_with_a_secret_ignores_records_that_do_not_verify(lan_namespace):
    type_ = _service.service_type(lan_namespace)
    digest = _service.namespace_digest(lan_namespace)
    forged = []
    for secret in (None, b"not the secret, though 16+ bytes"):  # unsigned, and wrongly signed
        metadata = worker(f"10.213.0.66:{len(forged) + 4000}")
        name = _service.instance_name(type_, metadata.uid)
        forged.append((metadata, name, _service.encode_txt(type_, name, digest,
                                                           metadata.to_bytes(), secret)))
    with anyio.fail_after(15):
        zc = await anyio.to_thread.run_sync(_forge, type_, [(n, t) for _, n, t in forged])
        try:
            async with LanDiscovery.Publisher(lan_namespace, interfaces=LO,
                                              secret=SECRET) as publisher, \
                    anyio.create_task_group() as tg:
                everything = await follow(tg, LanDiscovery.Subscriber(lan_namespace,
                                                                      interfaces=LO))
                verified = await follow(tg, LanDiscovery.Subscriber(lan_namespace,
                                                                    interfaces=LO,
                                                                    secret=SECRET))
                await publisher.publish("worker-added", genuine := routable())
                # Without a secret, every record of the namespace is seen...
                seen = {uid for _, uid in await take(everything, 3)}
                assert seen == {genuine.uid} | {m.uid for m, _, _ in forged}
                # ... and with one, only the genuine one: once the forged records were on the
                # wire (the first subscriber saw them), a change of the genuine worker comes
                # next, with nothing forged before it.
                assert await take(verified, 1) == [("worker-added", genuine.uid)]
                marker = routable(uid=genuine.uid, tags={"marker"})
                await publisher.publish("worker-updated", marker)
                assert await take(verified, 1) == [("worker-updated", genuine.uid)]
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(zc.close)


async def test_an_unpickled_subscriber_takes_the_secret_of_the_process_that_iterates_it(
        lan_namespace, monkeypatch):
    import pickle

    original = LanDiscovery.Subscriber(lan_namespace, interfaces=LO, secret=SECRET)
    data = pickle.dumps(original)
    assert SECRET not in data
    monkeypatch.setenv("ANYWOOL_SECRET", SECRET.decode())
    clone = pickle.loads(data)
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO,
                                          secret=b"another secret, 16+ bytes") as other, \
                LanDiscovery.Publisher(lan_namespace, interfaces=LO) as own:  # $ANYWOOL_SECRET
            await other.publish("worker-added", stranger := routable())
            await own.publish("worker-added", genuine := routable())
            async with anyio.create_task_group() as tg:
                events = await follow(tg, clone)
                assert await take(events, 1) == [("worker-added", genuine.uid)]
                await own.publish("worker-dropped", genuine)
                # Nothing of the stranger's came first: its record was announced before.
                assert await take(events, 1) == [("worker-dropped", genuine.uid)]
                assert stranger.uid != genuine.uid
                tg.cancel_scope.cancel()


async def test_a_consumer_that_stops_reading_is_resynchronised_with_the_net_change(
        lan_namespace, monkeypatch):
    monkeypatch.setattr(_hub, "CONSUMER_BUFFER", 4)
    with anyio.fail_after(15):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            subscriber = LanDiscovery.Subscriber(lan_namespace, interfaces=LO)
            keep = routable()
            await publisher.publish("worker-added", keep)
            stalled = aiter(subscriber)
            try:
                assert (await anext(stalled)).metadata.uid == keep.uid
                async with anyio.create_task_group() as tg:
                    prompt = await follow(tg, subscriber)
                    assert await take(prompt, 1) == [("worker-added", keep.uid)]
                    transient = [routable() for _ in range(6)]
                    for metadata in transient:  # more changes than the stalled buffer holds
                        await publisher.publish("worker-added", metadata)
                        assert await take(prompt, 1) == [("worker-added", metadata.uid)]
                    for metadata in transient:
                        await publisher.publish("worker-dropped", metadata)
                        assert await take(prompt, 1) == [("worker-dropped", metadata.uid)]
                    final = routable(uid=keep.uid, pid=1)
                    await publisher.publish("worker-updated", final)
                    assert await take(prompt, 1) == [("worker-updated", keep.uid)]
                    tg.cancel_scope.cancel()
                # The net change, not the 13 changes: the transient workers came and went.
                event = await anext(stalled)
                assert event.type == "worker-updated" and event.metadata.same_as(final)
            finally:
                await stalled.aclose()


async def test_announcing_a_loopback_address_to_the_lan_warns(lan_namespace):
    with anyio.fail_after(10):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as publisher:
            with pytest.warns(LoopbackAdvertisementWarning, match="127.0.0.1:5000"):
                await publisher.publish("worker-added", worker("127.0.0.1:5000"))
            with pytest.warns(LoopbackAdvertisementWarning):
                await publisher.publish("worker-added", worker("localhost:5000"))
            with pytest.warns(LoopbackAdvertisementWarning, match="unix:/tmp/w.sock"):
                await publisher.publish("worker-added", worker("unix:/tmp/w.sock"))
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                await publisher.publish("worker-added", routable())


_CHILD = """
import sys, uuid, anyio
from anywool import LanDiscovery, WorkerMetadata

async def main():
    async with LanDiscovery.Publisher(sys.argv[1], interfaces=["127.0.0.1"]) as publisher:
        await publisher.publish("worker-added", WorkerMetadata(
            uuid.UUID(sys.argv[2]), "10.213.0.1:45678", 1, "child"))
        print("published", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test kills us

anyio.run(main)
"""


async def test_a_worker_of_another_process_is_seen_and_leaves_the_view_when_it_is_killed(
        lan_namespace):
    uid = uuid.uuid4()
    with anyio.fail_after(25):
        process = await anyio.open_process(
            [sys.executable, "-c", _CHILD, lan_namespace, str(uid)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LanDiscovery.Subscriber(lan_namespace,
                                                                  interfaces=LO))
                assert await take(events, 1) == [("worker-added", uid)]
                process.send_signal(signal.SIGKILL)  # no goodbyes: the records expire
                await process.wait()
                with anyio.fail_after(15):
                    assert await take(events, 1) == [("worker-dropped", uid)]
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.aclose()


async def test_a_pool_publishes_its_workers_and_another_pool_borrows_them(lan_namespace):
    from ..integration.routines import whoami

    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, discovery=LanDiscovery(lan_namespace, interfaces=LO),
                              host=ROUTABLE, secret=SECRET) as owner:
            [spawned] = owner.workers
            async with WorkerPool(discovery=LanDiscovery.Subscriber(lan_namespace,
                                                                    interfaces=LO),
                                  lazy=False, quorum=1, secret=SECRET):
                assert await whoami() == spawned.pid


async def test_a_pool_announcing_unix_sockets_to_the_lan_warns(lan_namespace):
    with anyio.fail_after(30):
        with pytest.warns(LoopbackAdvertisementWarning, match="no other host can reach"):
            async with WorkerPool(spawn=1, discovery=LanDiscovery(lan_namespace, interfaces=LO)):
                pass


async def test_an_update_is_never_undone_by_the_record_it_superseded(lan_namespace):
    # zeroconf revives a superseded TXT record for a second whenever the new one arrives (the
    # cache flush of RFC 6762 §10.2); the sequence number keeps the later change in the view.
    # "z" sorts after "a": without the sequence number, the old record won every other round.
    old = routable(tags={"z" * 40})
    new = routable(uid=old.uid, tags={"a" * 40})
    with anyio.fail_after(20):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO, secret=SECRET) as p, \
                anyio.create_task_group() as tg:
            events = await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO,
                                                              secret=SECRET))
            await p.publish("worker-added", old)
            assert await take(events, 1) == [("worker-added", old.uid)]
            await p.publish("worker-updated", new)
            event = await events.receive()
            assert event.type == "worker-updated" and event.metadata.same_as(new)
            # Through several refreshes and resends: nothing more.
            with anyio.move_on_after(6):
                extra = await events.receive()
                pytest.fail(f"a spurious {extra.type} to {sorted(extra.metadata.tags)}")
            tg.cancel_scope.cancel()


_MANY = """
import sys, uuid, anyio
from anywool import LanDiscovery, WorkerMetadata

async def main():
    async with LanDiscovery.Publisher(sys.argv[1], interfaces=["127.0.0.1"]) as publisher:
        for index in range(int(sys.argv[2])):
            await publisher.publish("worker-added", WorkerMetadata(
                uuid.uuid4(), f"10.213.0.1:{1000 + index}", 1, "child", extra={"i": index}))
        print("published", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes it

anyio.run(main)
"""


async def test_a_publisher_of_many_workers_keeps_every_one_alive(lan_namespace):
    # Refreshes are spread and packed: a burst of one packet per worker overflowed receivers'
    # buffers, and the same workers, last in every burst, expired while their publisher lived.
    from anywool.discovery.lan._announcer import RECORD_TTL

    count = 300
    with anyio.fail_after(RECORD_TTL * 2 + 30):
        process = await anyio.open_process(
            [sys.executable, "-c", _MANY, lan_namespace, str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LanDiscovery.Subscriber(lan_namespace,
                                                                  interfaces=LO))
                assert {kind for kind, _ in await take(events, count)} == {"worker-added"}
                # Past more than one record TTL, no worker left the view.
                with anyio.move_on_after(RECORD_TTL + 5):
                    event = await events.receive()
                    pytest.fail(f"{event.type} of a live worker")
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                assert process.stdin is not None
                await process.stdin.aclose()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                await process.aclose()


async def test_a_pools_secret_signs_and_verifies_its_lan_records(lan_namespace):
    # The README's form: the secret given to the pools only. The spawning pool's records are
    # signed with it (its workers' nested proxies verify them with the secret they inherited),
    # and the borrower ignores a forged unsigned record of the namespace.
    from ..integration.routines import whoami, whoami_nested

    connections = 0

    async def count(stream):
        nonlocal connections
        connections += 1
        await stream.aclose()

    with anyio.fail_after(40):
        async with WorkerPool(spawn=2, discovery=LanDiscovery(lan_namespace, interfaces=LO),
                              host=ROUTABLE, secret=SECRET) as owner, \
                await anyio.create_tcp_listener(local_host=ROUTABLE) as trap, \
                anyio.create_task_group() as tg:
            tg.start_soon(trap.serve, count)
            pids = {worker.pid for worker in owner.workers}
            assert await whoami_nested() in pids
            port = trap.extra(anyio.abc.SocketAttribute.local_port)
            forged = worker(f"{ROUTABLE}:{port}")
            async with LanDiscovery.Publisher(lan_namespace, interfaces=LO) as unsigned, \
                    LanDiscovery.Publisher(lan_namespace, interfaces=LO,
                                           secret=SECRET) as signed, \
                    WorkerPool(discovery=LanDiscovery.Subscriber(lan_namespace, interfaces=LO),
                               secret=SECRET, quorum=2, lazy=False):
                everything = await follow(tg, LanDiscovery.Subscriber(lan_namespace,
                                                                      interfaces=LO))
                # The borrower's source: its secret is the pool's, so this iteration shares it.
                verified = await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO,
                                                                    secret=SECRET))
                await unsigned.publish("worker-added", forged)
                while (await everything.receive()).metadata.uid != forged.uid:
                    pass  # the forged record is on the wire now
                assert {await whoami() for _ in range(8)} <= pids
                # A signed change sent after it: once the shared source yields it, it has read
                # the forged record too, and yielded nothing of it.
                await signed.publish("worker-added", marker := routable())
                seen = []
                while not seen or seen[-1] != marker.uid:
                    seen.append((await verified.receive()).metadata.uid)
                assert forged.uid not in seen
                assert connections == 0  # nobody dialed the forged address
            tg.cancel_scope.cancel()


def _forgeries(namespace: str, genuine, count: int) -> tuple[str, str, list[bytes]]:
    """The service type, the genuine worker's instance name, and ``count`` TXT records for that
    name that do not verify with SECRET: other metadata (another address, a forged tag), a
    higher sequence number, alternately unsigned and signed with another secret."""
    type_ = _service.service_type(namespace)
    digest = _service.namespace_digest(namespace)
    name = _service.instance_name(type_, genuine.uid)
    records = []
    for index in range(count):
        forged = worker(f"10.213.0.66:{5000 + index}", uid=genuine.uid, tags={f"forged-{index}"})
        secret = None if index % 2 else b"not the secret, though 16+ bytes"
        records.append(_service.encode_txt(type_, name, digest, forged.to_bytes(), secret,
                                           sequence=1000 + index))
    return type_, name, records


def _forge_repeatedly(type_: str, name: str, records: list[bytes],
                      stop: threading.Event | None = None) -> None:
    """From a raw zeroconf (no anywool): register ``name`` with the first of ``records``, then
    announce the others in turn as updates of it, :data:`FORGERY_PAUSE` seconds apart, once
    through or (with ``stop``) round and round until ``stop`` is set; then unregister it,
    which sends goodbyes for the name's PTR, SRV and TXT.

    zeroconf announces each record three times 225 ms apart with the cache-flush bit, so the
    first of them makes every cache mark the genuine record to expire within a second (RFC 6762
    §10.2); the pause lets it expire (a record flushed again and again would be revived by
    each flush).
    """
    from zeroconf import ServiceInfo, Zeroconf

    def info(txt: bytes) -> ServiceInfo:
        return ServiceInfo(type_, name, port=4242, properties=txt, host_ttl=10, other_ttl=10,
                           parsed_addresses=["10.213.0.66"], server="forger.local.")

    quiet = stop or threading.Event()
    zc = Zeroconf(interfaces=LO)
    try:
        current = info(records[0])
        zc.register_service(current, cooperating_responders=True)
        index = 1
        while (index < len(records)) if stop is None else not stop.is_set():
            if quiet.wait(FORGERY_PAUSE):  # the forger's rhythm (set: stop now)
                break
            current = info(records[index % len(records)])
            zc.update_service(current)
            index += 1
        zc.unregister_service(current)
    finally:
        zc.close()


#: Seconds between two forged announcements: past the second a flushed genuine record has
#: left, and a poll of the subscriber's source.
FORGERY_PAUSE = 1.6


async def _forged_update_seen(everything) -> None:
    """Wait until a subscriber without a secret (it accepts every record) takes a forged
    record: the forgeries are on the wire and in every cache."""
    while not any(tag.startswith("forged-") for tag in (await everything.receive()).metadata.tags):
        pass


def _rare_refreshes(monkeypatch) -> None:
    """Refresh the genuine records every 8 s rather than 2.5 s (still within their TTL of
    10 s): a genuine record that a forged one cut short is not soon replaced by a refresh."""
    from anywool.discovery.lan import _announcer

    assert _announcer.RECORD_TTL > 8
    monkeypatch.setattr(_announcer, "REFRESH_INTERVAL", 8.0)


async def test_forged_records_under_a_live_workers_name_change_nothing(lan_namespace,
                                                                       monkeypatch):
    # Each forged record, sent with the cache-flush bit, makes zeroconf expire the genuine
    # record within a second (RFC 6762 §10.2), and the forger's goodbyes remove the name's PTR:
    # the subscriber keeps the last verified record, so neither drops nor changes the worker.
    _rare_refreshes(monkeypatch)
    genuine = routable()
    type_, name, forged = _forgeries(lan_namespace, genuine, 5)
    with anyio.fail_after(40):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO,
                                          secret=SECRET) as publisher, \
                anyio.create_task_group() as tg:
            await publisher.publish("worker-added", genuine)
            subscriber = LanDiscovery.Subscriber(lan_namespace, interfaces=LO, secret=SECRET)
            verified = await follow(tg, subscriber)
            everything = await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO))
            assert await take(verified, 1) == [("worker-added", genuine.uid)]
            assert await take(everything, 1) == [("worker-added", genuine.uid)]
            # Five forgeries over about eight seconds, then the forger's goodbyes.
            await anyio.to_thread.run_sync(_forge_repeatedly, type_, name, forged)
            await _forged_update_seen(everything)
            # Through the forgeries, and past the second after the last one (when a flushed
            # record would have expired) and a poll: no event at all.
            with anyio.move_on_after(3):
                event = await verified.receive()
                pytest.fail(f"a forged record caused a {event.type} of {event.metadata}")
            late = await follow(tg, subscriber)  # the view itself: the genuine worker, as it was
            event = await late.receive()
            assert event.type == "worker-added" and event.metadata.same_as(genuine)
            tg.cancel_scope.cancel()


async def test_a_withdrawal_is_seen_while_forged_records_flush_the_genuine_one(lan_namespace,
                                                                              monkeypatch):
    # zeroconf delivers a goodbye only for a record it caches: the genuine record that forged
    # ones flushed must still be cached, with its own lifetime, when its goodbye comes.
    _rare_refreshes(monkeypatch)
    genuine = routable()
    type_, name, forged = _forgeries(lan_namespace, genuine, 4)
    stop = threading.Event()
    with anyio.fail_after(40):
        async with LanDiscovery.Publisher(lan_namespace, interfaces=LO,
                                          secret=SECRET) as publisher, \
                anyio.create_task_group() as tg:
            try:
                await publisher.publish("worker-added", genuine)
                verified = await follow(tg, LanDiscovery.Subscriber(lan_namespace, interfaces=LO,
                                                                    secret=SECRET))
                everything = await follow(tg, LanDiscovery.Subscriber(lan_namespace,
                                                                      interfaces=LO))
                assert await take(verified, 1) == [("worker-added", genuine.uid)]
                tg.start_soon(anyio.to_thread.run_sync, _forge_repeatedly, type_, name, forged,
                              stop)
                await _forged_update_seen(everything)
                await _forged_update_seen(everything)  # a second round of forged records
                await publisher.publish("worker-dropped", genuine)
                with anyio.fail_after(2):  # goodbyes, not the record's expiry
                    assert await take(verified, 1) == [("worker-dropped", genuine.uid)]
            finally:
                stop.set()
            tg.cancel_scope.cancel()
