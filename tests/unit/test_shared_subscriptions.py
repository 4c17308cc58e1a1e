"""Shared subscriptions: one source per process and namespace, one stream per iteration."""

from __future__ import annotations

import gc
import os
import pickle
import select
import threading
import uuid
from contextlib import aclosing

import anyio
import pytest

from anywool import DiscoveryNamespaceNotFound, LocalDiscovery, afilter
from anywool.discovery import _hub
from anywool.discovery.local import _keys

from ..helpers import DescriptorTraps, follow, take, wait_until, worker

pytestmark = pytest.mark.anyio


def source_threads(*namespaces: str) -> list[threading.Thread]:
    """Source threads of these namespaces (other tests' abandoned iterations may still be
    waiting for their event loop to finalize them)."""
    names = {f"anywool-source-{_keys.namespace_key(n)}" for n in namespaces}
    return [t for t in threading.enumerate() if t.name in names]


def sources(*namespaces: str) -> dict:
    keys = {_keys.namespace_key(n) for n in namespaces}
    return {key: value for key, value in _hub.stats().items() if key[0] in keys}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_concurrent_iterations_share_one_source_and_see_every_event(namespace):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                streams = [await follow(tg, owner.subscriber) for _ in range(3)]
                for events in streams:
                    assert await take(events, 1) == [("worker-added", first.uid)]
                [(binds, scans_before, consumers)] = sources(namespace).values()
                assert (binds, consumers) == (1, 3)
                assert len(source_threads(namespace)) == 1
                added = [worker() for _ in range(10)]
                steps = [("worker-added", m) for m in added]
                steps += [("worker-updated", worker(uid=m.uid, pid=1)) for m in added[:5]]
                steps += [("worker-dropped", m) for m in added[:3]]
                for kind, metadata in steps:
                    await publisher.publish(kind, metadata)
                expected = [(kind, m.uid) for kind, m in steps]
                for events in streams:
                    assert await take(events, len(steps)) == expected
                [(binds, scans_after, consumers)] = sources(namespace).values()
                assert binds == 1
                assert scans_after - scans_before <= len(steps)  # one scan per change at most
                tg.cancel_scope.cancel()


async def test_late_iteration_gets_current_workers_then_the_same_deltas(namespace):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            early_worker = worker()
            await publisher.publish("worker-added", early_worker)
            async with anyio.create_task_group() as tg:
                early = await follow(tg, owner.subscriber)
                assert await take(early, 1) == [("worker-added", early_worker.uid)]
                second = worker()
                await publisher.publish("worker-added", second)
                assert await take(early, 1) == [("worker-added", second.uid)]
                late = await follow(tg, owner.subscriber)
                snapshot = await take(late, 2)
                assert sorted(snapshot) == sorted([("worker-added", early_worker.uid),
                                                   ("worker-added", second.uid)])
                await publisher.publish("worker-dropped", second)
                assert await take(early, 1) == await take(late, 1) == [("worker-dropped", second.uid)]
                tg.cancel_scope.cancel()


async def test_breaking_or_cancelling_one_iteration_leaves_the_others_alone(namespace):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                survivor = await follow(tg, owner.subscriber)
                assert await take(survivor, 1) == [("worker-added", first.uid)]

                async for _ in owner.subscriber:  # break out of a second iteration
                    break

                waiting = anyio.Event()

                async def cancelled_mid_receive(scope: anyio.CancelScope) -> None:
                    with scope:
                        async for event in owner.subscriber:
                            if event.metadata.uid == first.uid:
                                waiting.set()  # now blocked waiting for the next event

                scope = anyio.CancelScope()
                tg.start_soon(cancelled_mid_receive, scope)
                await waiting.wait()
                scope.cancel()
                second = worker()
                await publisher.publish("worker-added", second)
                assert await take(survivor, 1) == [("worker-added", second.uid)]
                tg.cancel_scope.cancel()


async def test_a_consumer_that_stops_reading_is_resynchronised_with_the_net_change(namespace):
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace, capacity=64) as owner, owner.publisher as publisher:
            keep = [worker() for _ in range(10)]
            for metadata in keep:
                await publisher.publish("worker-added", metadata)
            stalled = owner.subscriber.__aiter__()
            view = {}
            for _ in keep:
                event = await stalled.__anext__()
                view[event.metadata.uid] = event.metadata
            async with anyio.create_task_group() as tg:
                counted = 0
                ready = anyio.Event()

                async def keep_up() -> None:  # a consumer that reads everything promptly
                    nonlocal counted
                    async for _ in owner.subscriber:
                        counted += 1
                        if counted == len(keep):
                            ready.set()

                tg.start_soon(keep_up)
                await ready.wait()
                changes = 0
                final = {m.uid: m for m in keep}
                while changes < 10_000:  # churn while the stalled consumer sleeps
                    transient = worker()
                    await publisher.publish("worker-added", transient)
                    await publisher.publish("worker-dropped", transient)
                    updated = worker(uid=keep[changes % 10].uid, pid=changes)
                    await publisher.publish("worker-updated", updated)
                    final[updated.uid] = updated
                    changes += 3
                source = _hub._hub.sources[(_keys.namespace_key(namespace), _hub.DEFAULT_POLL_INTERVAL)]
                assert all(c.queued <= _hub.CONSUMER_BUFFER for c in source.consumers)
                # The stalled consumer catches up with the net change and nothing else.
                caught_up = 0
                while set(view) != set(final) or not all(
                    view[u].same_as(m) for u, m in final.items()
                ):
                    event = await stalled.__anext__()
                    caught_up += 1
                    if event.type == "worker-dropped":
                        view.pop(event.metadata.uid)
                    else:
                        view[event.metadata.uid] = event.metadata
                assert caught_up < changes
                tg.cancel_scope.cancel()
            await stalled.aclose()


async def test_iterations_started_together_on_a_missing_namespace_all_raise(namespace, runtime_dir):
    with anyio.fail_after(20):
        outcomes: list[str] = []

        async def iterate() -> None:
            try:
                async for _ in LocalDiscovery.Subscriber(namespace):
                    outcomes.append("event")
            except DiscoveryNamespaceNotFound:
                outcomes.append("not-found")

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(iterate)
        assert outcomes == ["not-found"] * 5
        assert os.listdir(runtime_dir) == []
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            metadata = worker()
            await publisher.publish("worker-added", metadata)
            async for event in LocalDiscovery.Subscriber(namespace):
                assert event.metadata.uid == metadata.uid
                break


async def test_the_last_iteration_stops_the_source_and_nothing_is_left(namespace):
    async def cycle(name: str) -> None:
        async with LocalDiscovery(name) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker())
            # aclosing: the iteration ends (and the source with it) when the block exits,
            # not whenever the event loop gets round to finalizing an abandoned generator.
            async with aclosing(owner.subscriber.__aiter__()) as events:
                async for _ in events:
                    break
            assert sources(name) == {} and source_threads(name) == []

    with anyio.fail_after(60):
        await cycle(namespace)  # warm up: worker threads, imports
        gc.collect()
        fds = open_fds()
        names = [f"{namespace}-{index}" for index in range(500)]
        for name in names:
            await cycle(name)
        gc.collect()
        assert sources(namespace, *names) == {}
        assert source_threads(namespace, *names) == []
        # At most the baseline: another test's abandoned iteration may close meanwhile.
        assert open_fds() <= fds


def test_consumers_on_two_event_loops_share_the_source(namespace):
    outcomes: dict[str, list] = {}
    attached = threading.Barrier(3, timeout=20)
    published = threading.Event()
    first, second = worker(), worker()

    def consume(backend: str) -> None:
        async def main() -> None:
            seen = []
            async for event in LocalDiscovery.Subscriber(namespace):
                seen.append((event.type, event.metadata.uid))
                if len(seen) == 1:
                    await anyio.to_thread.run_sync(attached.wait)
                if len(seen) == 2:
                    break
            outcomes[backend] = seen

        anyio.run(main, backend=backend)

    async def own() -> None:
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", first)
            threads = [threading.Thread(target=consume, args=(b,)) for b in ("asyncio", "trio")]
            for thread in threads:
                thread.start()
            await anyio.to_thread.run_sync(attached.wait)
            [(binds, _, consumers)] = sources(namespace).values()
            assert (binds, consumers) == (1, 2)
            await publisher.publish("worker-added", second)
            for thread in threads:
                await anyio.to_thread.run_sync(thread.join, 20)
            # A plain break detaches from a finalizer, which defers the detach if a lock is
            # busy at that instant: then the source's thread or a one-off one finishes it.
            await wait_until(lambda: sources(namespace) == {}, "both iterations detached")

    anyio.run(own)
    expected = [("worker-added", first.uid), ("worker-added", second.uid)]
    assert outcomes == {"asyncio": expected, "trio": expected}


def test_a_consumer_whose_loop_ended_is_dropped(namespace):
    kept: list = []

    def abandon(backend: str) -> None:
        async def main() -> None:
            iterator = LocalDiscovery.Subscriber(namespace).__aiter__()
            kept.append(iterator)  # never closed by us: the loop's shutdown must handle it
            await iterator.__anext__()

        anyio.run(main, backend=backend)

    async def own() -> None:
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker())
            for backend in ("asyncio", "trio"):
                thread = threading.Thread(target=abandon, args=(backend,))
                thread.start()
                await anyio.to_thread.run_sync(thread.join, 20)
                assert sources(namespace) == {}
            await publisher.publish("worker-added", worker())  # nobody left to deliver to

    anyio.run(own)
    assert len(kept) == 2


async def test_afilter_tracks_entry_and_exit_of_the_predicate(namespace):
    def tagged(metadata) -> bool:
        return "gpu" in metadata.tags

    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            plain, gpu = worker(), worker(tags={"gpu"})
            await publisher.publish("worker-added", plain)
            await publisher.publish("worker-added", gpu)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, owner.subscribe(tagged))
                assert await take(events, 1) == [("worker-added", gpu.uid)]
                await publisher.publish("worker-updated", worker(uid=plain.uid, tags={"gpu"}))
                assert await take(events, 1) == [("worker-added", plain.uid)]
                await publisher.publish("worker-updated", worker(uid=gpu.uid, tags={"gpu", "x"}))
                assert await take(events, 1) == [("worker-updated", gpu.uid)]
                await publisher.publish("worker-updated", worker(uid=gpu.uid, tags=set()))
                event = await events.receive()
                assert event.type == "worker-dropped" and event.metadata.tags == {"gpu", "x"}
                await publisher.publish("worker-dropped", gpu)  # never re-admitted: nothing
                await publisher.publish("worker-dropped", plain)
                assert await take(events, 1) == [("worker-dropped", plain.uid)]
                tg.cancel_scope.cancel()


def _has_gpu(metadata) -> bool:
    return "gpu" in metadata.tags


def test_afilter_pickles_with_its_predicate():
    filtered = afilter(_has_gpu, LocalDiscovery.Subscriber("jobs", poll_interval=0.5))
    clone = pickle.loads(pickle.dumps(filtered))
    assert clone.predicate is _has_gpu
    assert clone.subscriber.poll_interval == 0.5


async def test_closing_a_filtered_iteration_releases_the_source_at_once(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker(tags={"gpu"}))
            async with aclosing(owner.subscribe(_has_gpu).__aiter__()) as events:
                async for _ in events:
                    break
            assert sources(namespace) == {} and source_threads(namespace) == []


_REAL_POLL = select.poll


class _DyingPoller:
    """A select.poll whose poll() raises, as poll(inf) raised OverflowError in a source thread."""

    def __init__(self) -> None:
        self._real = _REAL_POLL()

    def register(self, fd: int, events: int) -> None:
        self._real.register(fd, events)

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        raise OverflowError("timeout is too large")


async def test_a_source_that_dies_fails_its_iterations_and_never_writes_to_a_closed_descriptor(
    namespace, tmp_path, caplog
):
    # The data loss this pins: a dead source's stop pipe was closed, its descriptor numbers
    # reused by the user's next files, and ending the iteration then wrote a NUL byte into one.
    with DescriptorTraps(tmp_path) as traps:
        with anyio.fail_after(10):
            async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
                await publisher.publish("worker-added", first := worker())
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(_hub.select, "poll", _DyingPoller)
                    async with aclosing(aiter(LocalDiscovery.Subscriber(namespace))) as events:
                        assert (await anext(events)).metadata.uid == first.uid
                        with pytest.raises(RuntimeError, match="discovery source .* failed") as info:
                            await anext(events)
                        assert isinstance(info.value.__cause__, OverflowError)
                        traps.set()  # whatever descriptors the source closed, these take
                # A fresh iteration starts a fresh source.
                async with aclosing(aiter(LocalDiscovery.Subscriber(namespace))) as events:
                    assert (await anext(events)).metadata.uid == first.uid
        traps.assert_untouched()
    assert "the discovery source for" in caplog.text


def _source_threads_and_descriptors() -> tuple[int, int]:
    threads = sum(t.name.startswith("anywool-source-") for t in threading.enumerate())
    return threads, len(os.listdir("/proc/self/fd"))


async def test_iterations_left_with_a_plain_break_release_everything_without_a_gc_pass():
    # No aclosing, no garbage collection: dropping the iteration must be enough.
    gc.disable()
    try:
        with anyio.fail_after(60):
            baseline = _source_threads_and_descriptors()
            for _ in range(100):
                namespace = f"break-{uuid.uuid4().hex}"
                async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
                    await publisher.publish("worker-added", worker())
                    async for _event in LocalDiscovery.Subscriber(namespace):
                        break
                    assert sources(namespace) == {}  # detached at the break, not later
            await wait_until(lambda: _source_threads_and_descriptors() == baseline,
                             "threads and descriptors back to the baseline", timeout=2)
    finally:
        gc.enable()


@pytest.mark.parametrize("busy", ["hub", "source"])
@pytest.mark.parametrize("started", [True, False], ids=["thread-running", "thread-never-started"])
async def test_a_detach_a_finalizer_had_to_defer_is_done_without_further_help(namespace, busy,
                                                                            started):
    # A plain break while another thread holds a hub lock: the finalizer may not wait for it,
    # so the detach is deferred. With nothing else touching the hub, the source's own thread
    # finishes it, or, for a source whose thread never started (its only consumer never
    # waited for a change), a one-off thread does.
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker())
            baseline = _source_threads_and_descriptors()
            subscriber = LocalDiscovery.Subscriber(namespace, poll_interval=0.05)
            iteration = aiter(subscriber)
            await anext(iteration)
            if started:  # waiting for a change starts the source's thread
                await publisher.publish("worker-added", worker())
                await anext(iteration)
            key = (_keys.namespace_key(namespace), 0.05)
            source = _hub._hub.sources[key]
            assert source.started is started
            lock = _hub._hub.lock if busy == "hub" else source.lock
            with lock:  # as another thread holding it at that instant would
                del iteration
                assert len(source.consumers) == 1  # not detached: deferred
            await wait_until(
                lambda: key not in _hub._hub.sources and not _hub._hub.deferred
                and _source_threads_and_descriptors() == baseline,
                "the deferred detach and the source's end", timeout=5)


async def test_an_iteration_that_only_reads_the_current_workers_starts_no_thread(namespace):
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            for _ in range(3):
                await publisher.publish("worker-added", worker())
            threads = _source_threads_and_descriptors()[0]
            iteration = aiter(LocalDiscovery.Subscriber(namespace))
            try:
                assert [(await anext(iteration)).type for _ in range(3)] == ["worker-added"] * 3
                assert _source_threads_and_descriptors()[0] == threads
            finally:
                await iteration.aclose()
            assert sources(namespace) == {}


async def test_a_joiner_of_a_source_without_its_thread_yet_misses_no_change(namespace):
    # The first iteration read its snapshot and never waited: its source has no thread and its
    # view is as old as that snapshot. A change, then a second iteration joins: both must see
    # the change, promptly (the join starts the thread, whose first round catches up).
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", first := worker())
            one = aiter(LocalDiscovery.Subscriber(namespace, poll_interval=60))
            two = None
            try:
                assert (await anext(one)).metadata.uid == first.uid
                await publisher.publish("worker-added", second := worker())
                two = aiter(LocalDiscovery.Subscriber(namespace, poll_interval=60))
                seen = [(await anext(two)).metadata.uid for _ in range(2)]
                assert seen == [first.uid, second.uid]  # the view, then the catch-up
                event = await anext(one)
                assert (event.type, event.metadata.uid) == ("worker-added", second.uid)
                assert sources(namespace) != {}
                [(binds, scans, consumers)] = sources(namespace).values()
                assert consumers == 2
            finally:
                await one.aclose()
                if two is not None:
                    await two.aclose()


async def test_without_an_inotify_instance_sources_poll(namespace, monkeypatch, caplog):
    from anywool.discovery.local import _watch

    def exhausted() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(_watch.inotify_simple, "INotify", exhausted)
    monkeypatch.setattr(_watch, "_warned", False)
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", first := worker())
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LocalDiscovery.Subscriber(namespace, poll_interval=0.05))
                assert await take(events, 1) == [("worker-added", first.uid)]
                await publisher.publish("worker-added", second := worker())
                assert await take(events, 1) == [("worker-added", second.uid)]
                tg.cancel_scope.cancel()
    assert sum("no inotify instance" in r.getMessage() for r in caplog.records) == 1


async def test_a_source_thread_that_cannot_start_leaves_nothing_behind(namespace, monkeypatch):
    real_start = threading.Thread.start
    failures = [1]

    def start(self) -> None:
        if self.name.startswith("anywool-source-") and failures:
            failures.pop()
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", first := worker())
            one = aiter(LocalDiscovery.Subscriber(namespace))
            try:
                assert (await anext(one)).metadata.uid == first.uid
                two = aiter(LocalDiscovery.Subscriber(namespace))
                with pytest.raises(RuntimeError, match="can't start"):
                    await anext(two)  # joining starts the thread: it fails, two detaches
                [(_, _, consumers)] = sources(namespace).values()
                assert consumers == 1
                await publisher.publish("worker-added", second := worker())
                assert (await anext(one)).metadata.uid == second.uid  # the next start works
            finally:
                await one.aclose()
            assert sources(namespace) == {}


def test_a_forked_child_starts_afresh(namespace):
    # The parent's source has a running thread; the child inherits the source but not the
    # thread. A new iteration in the child must follow changes; an inherited one must raise.
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()

    def child() -> None:
        async def main() -> str:
            inherited_error = ""
            try:
                await anext(inherited)
            except RuntimeError as exc:
                inherited_error = "before the process forked" in str(exc) and "raised" or "?"
            with anyio.fail_after(10):
                iteration = aiter(LocalDiscovery.Subscriber(namespace))
                seen = [(await anext(iteration)).metadata.address]
                os.write(go_w, b"g")  # now publish the post-fork change
                seen.append((await anext(iteration)).metadata.address)
                await iteration.aclose()
            return f"{inherited_error} {' '.join(seen)}"

        try:
            outcome = anyio.run(main)
        except BaseException as exc:  # reported, not raised: this is a forked child
            outcome = f"failed {exc!r}"
        os.write(report_w, outcome.encode())

    async def parent() -> None:
        nonlocal inherited
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker("unix:/before"))
            inherited = aiter(LocalDiscovery.Subscriber(namespace))
            await anext(inherited)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, owner.subscriber)  # waits: its thread runs
                await take(events, 1)

                def fork() -> int:
                    pid = os.fork()
                    if pid == 0:
                        try:
                            child()
                        finally:
                            os._exit(0)
                    return pid

                pid = await anyio.to_thread.run_sync(fork)
                await anyio.to_thread.run_sync(os.read, go_r, 1)
                await publisher.publish("worker-added", worker("unix:/after"))
                await anyio.to_thread.run_sync(os.waitpid, pid, 0)
                tg.cancel_scope.cancel()
            await inherited.aclose()

    inherited = None
    try:
        anyio.run(parent)
        assert os.read(report_r, 1000).decode() == "raised unix:/before unix:/after"
    finally:
        for fd in (report_r, report_w, go_r, go_w):
            os.close(fd)
