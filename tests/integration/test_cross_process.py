"""LocalDiscovery and WorkerPool across real interpreters."""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import aclosing

import anyio
import psutil
import pytest

from anywool import DiscoveryNamespaceInUse, DiscoveryNamespaceNotFound, LocalDiscovery, WorkerPool
from anywool.discovery.local import _claim
from anywool.testing import owner_process, suspended

from ..helpers import follow, take, wait_until, worker
from .children import start, start_detached, stop
from .routines import whoami

pytestmark = pytest.mark.anyio

# Each claimant gets ready (interpreter started, anywool imported, event loop running), says
# so, then waits for a shared lock the test holds (LOCK_EX) as a barrier: the test releases
# it once every claimant waits there, and the kernel wakes them all at once to claim.
CLAIMANT = """
import fcntl, os, sys, anyio
from anywool import LocalDiscovery, DiscoveryNamespaceInUse
namespace, barrier = sys.argv[1], sys.argv[2]
async def main():
    fd = os.open(barrier, os.O_RDONLY)
    print("ready", flush=True)
    fcntl.flock(fd, fcntl.LOCK_SH)  # blocks the loop on purpose: nothing else runs here
    os.close(fd)
    try:
        async with LocalDiscovery(namespace):
            print("won", os.getpid(), flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)
    except DiscoveryNamespaceInUse as error:
        print("in-use", error.owner_pid, error.path, flush=True)
anyio.run(main, backend=sys.argv[-1])
"""


def _lock_waiters(path: str) -> int:
    """How many processes wait, blocked, for a lock on ``path`` (Linux's ``/proc/locks``:
    a waiter's line has ``->`` and the file's ``major:minor:inode``)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as locks:
        return sum(1 for line in locks
                   if "->" in line and line.split()[6].rsplit(":", 1)[-1] == str(inode))


SUBSCRIBER = """
import sys, anyio
from anywool import LocalDiscovery
async def main():
    async for event in LocalDiscovery.Subscriber(sys.argv[1], poll_interval=float(sys.argv[2])):
        print(event.type, event.metadata.uid, flush=True)
anyio.run(main, backend=sys.argv[-1])
"""

PUBLISHER = """
import sys, uuid, os, anyio
from anywool import LocalDiscovery, WorkerMetadata
async def main():
    async with LocalDiscovery.Publisher(sys.argv[1]) as publisher:
        metadata = WorkerMetadata(uuid.UUID(sys.argv[2]), "unix:/tmp/none", os.getpid(), "x")
        await publisher.publish("worker-added", metadata)
        print("published", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[-1])
"""

POOL_OWNER = """
import os, sys, anyio
from anywool import LocalDiscovery, WorkerPool
print(os.getpid(), flush=True)
async def main():
    async with WorkerPool(spawn=1, discovery=LocalDiscovery(sys.argv[1])) as pool:
        print("ready", *[w.metadata.pid for w in pool.workers], flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[2])
"""


async def test_racing_interpreters_admit_exactly_one_owner(namespace, runtime_dir, tmp_path,
                                                           anyio_backend):
    barrier = tmp_path / "barrier"
    barrier.touch()
    children = []
    with anyio.fail_after(30), open(barrier) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            for _ in range(4):
                children.append(await start(CLAIMANT, namespace, str(barrier), anyio_backend))
            for child in children:
                assert await child.readline() == "ready"
            # Every claimant blocked at the barrier, then all released at once.
            await wait_until(lambda: _lock_waiters(str(barrier)) == 4,
                             "every claimant to wait at the barrier")
            fcntl.flock(held, fcntl.LOCK_UN)
            lines = [(await child.readline()).split() for child in children]
            winners = [int(line[1]) for line in lines if line[0] == "won"]
            assert len(winners) == 1
            losers = [line for line in lines if line[0] == "in-use"]
            assert len(losers) == 3
            for _, owner_pid, path in losers:
                assert int(owner_pid) == winners[0]
                assert os.path.dirname(path) == str(runtime_dir)
        finally:
            await stop(children)
    assert os.listdir(runtime_dir) == []


async def test_subscriber_in_another_process_is_woken_by_the_hint(namespace, anyio_backend):
    # A 60 s poll interval: within the 10 s bound only the hint can deliver the changes.
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            child = await start(SUBSCRIBER, namespace, "60", anyio_backend)
            try:
                assert await child.readline() == f"worker-added {first.uid}"
                second = worker()
                await publisher.publish("worker-added", second)
                assert await child.readline() == f"worker-added {second.uid}"
                await publisher.publish("worker-updated", worker(uid=first.uid, pid=9))
                assert await child.readline() == f"worker-updated {first.uid}"
                await publisher.publish("worker-dropped", second)
                assert await child.readline() == f"worker-dropped {second.uid}"
            finally:
                child.kill()
                await stop([child])


async def test_publisher_in_another_process_reaches_this_subscriber(namespace, anyio_backend):
    with anyio.fail_after(15):
        async with LocalDiscovery(namespace) as owner, anyio.create_task_group() as tg:
            events = await follow(tg, owner.subscriber)
            uid = worker().uid
            child = await start(PUBLISHER, namespace, str(uid), anyio_backend)
            try:
                assert await child.readline() == "published"
                assert await take(events, 1) == [("worker-added", uid)]
                await child.close_stdin()  # the publisher exits and withdraws its worker
                assert await take(events, 1) == [("worker-dropped", uid)]
            finally:
                await stop([child])
            tg.cancel_scope.cancel()


async def test_borrowing_pool_dispatches_to_another_interpreters_worker(namespace, anyio_backend):
    with anyio.fail_after(60):
        child = await start_detached(POOL_OWNER, namespace, anyio_backend)
        try:
            ready, *worker_pids = (await child.readline()).split()
            assert ready == "ready"
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)) as pool:
                assert pool.workers == []
                served_by = await whoami()
            mine = {p.pid for p in psutil.Process().children(recursive=True)}
            assert served_by not in mine and served_by != os.getpid()
            assert served_by == int(worker_pids[0])
            assert psutil.Process(served_by).ppid() == child.pid
        finally:
            await stop([child])


async def test_borrowing_pool_on_missing_namespace_raises_not_found(namespace):
    with anyio.fail_after(20):
        with pytest.raises(DiscoveryNamespaceNotFound):
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum_timeout=5):
                await whoami()


OWNER = """
import os, sys, anyio
from anywool import LocalDiscovery
async def main():
    async with LocalDiscovery(sys.argv[1]):
        print("owner", os.getpid(), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[-1])
"""


@pytest.mark.parametrize("group", [False, True], ids=["process", "process-group"])
async def test_sigkilled_owner_is_reclaimed_by_successor(namespace, runtime_dir, group,
                                                         anyio_backend):
    with anyio.fail_after(20):
        child = await start(OWNER, namespace, anyio_backend, new_group=group,
                            capture_stderr=True)
        try:
            assert (await child.readline()).split()[0] == "owner"
            with pytest.raises(DiscoveryNamespaceInUse) as info:
                async with LocalDiscovery(namespace):
                    pass
            assert info.value.owner_pid == child.pid
            child.kill(group=group)
            await child.wait()
            assert os.listdir(runtime_dir) == [os.path.basename(info.value.path)]
            contents = sorted(os.listdir(info.value.path))
            # Borrowers of an ownerless namespace raise and create nothing.
            with pytest.raises(DiscoveryNamespaceNotFound):
                async with LocalDiscovery.Publisher(namespace):
                    pass
            with pytest.raises(DiscoveryNamespaceNotFound):
                async for _ in LocalDiscovery.Subscriber(namespace):
                    pass
            assert sorted(os.listdir(info.value.path)) == contents
            async with LocalDiscovery(namespace) as successor:
                assert sorted(os.listdir(successor.path)) == ["name", "notify", "owner", "registry"]
                # The dead generation was swept, not left beside the new one.
                assert os.listdir(runtime_dir) == [os.path.basename(successor.path)]
            assert await child.read_stderr() == b""
        finally:
            await stop([child])
    assert os.listdir(runtime_dir) == []


async def test_stopped_owner_is_never_reclaimed(namespace, anyio_backend):
    with anyio.fail_after(20):
        async with owner_process(namespace, backend=anyio_backend) as owner:
            with suspended(owner.pid):
                for _ in range(3):
                    with pytest.raises(DiscoveryNamespaceInUse) as info:
                        async with LocalDiscovery(namespace):
                            pass
                    assert info.value.owner_pid == owner.pid
                with pytest.raises(DiscoveryNamespaceInUse):
                    async with LocalDiscovery(namespace, reclaim=False):
                        pass


async def test_sigkilled_publishers_workers_are_reaped(namespace, anyio_backend):
    with anyio.fail_after(15):
        async with LocalDiscovery(namespace, reap_interval=0.2, capacity=1) as owner:
            async with anyio.create_task_group() as tg:
                events = await follow(tg, owner.subscriber)
                uid = worker().uid
                child = await start(PUBLISHER, namespace, str(uid), anyio_backend)
                try:
                    assert await child.readline() == "published"
                    assert await take(events, 1) == [("worker-added", uid)]
                    child.kill()
                    await child.wait()
                    assert await take(events, 1) == [("worker-dropped", uid)]
                finally:
                    await stop([child])
                # The slot is free again (capacity 1).
                async with owner.publisher as publisher:
                    await publisher.publish("worker-added", replacement := worker())
                assert await take(events, 2) == [("worker-added", replacement.uid),
                                                 ("worker-dropped", replacement.uid)]
                tg.cancel_scope.cancel()


SCRIPT = """
import os, sys, anyio, anywool
sys.path.insert(0, sys.argv[2])          # a directory only this script knows about
import private_routines

@anywool.routine
async def where() -> tuple:
    return os.getpid(), os.getcwd()

async def main():
    async with anywool.WorkerPool(spawn=1):
        pid, cwd = await where()                     # defined in __main__: pickled by value
        print(pid != os.getpid(), cwd == os.getcwd(), await private_routines.triple(5))

anyio.run(main, backend=sys.argv[1])
"""


async def test_routines_from_main_scripts_and_private_paths_run_on_workers(tmp_path, anyio_backend):
    (tmp_path / "script.py").write_text(SCRIPT)
    library = tmp_path / "lib"
    library.mkdir()
    (library / "private_routines.py").write_text(
        "import anywool\n\n@anywool.routine\nasync def triple(x):\n    return 3 * x\n"
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(tmp_path / "script.py"), anyio_backend, str(library)],
            cwd=workdir,
        )
    assert result.stdout.decode().split() == ["True", "True", "15"]


OWNER_WITH_WORKER = """
import os, sys, uuid, anyio
from anywool import LocalDiscovery, WorkerMetadata
async def main():
    async with LocalDiscovery(sys.argv[1]) as owner, owner.publisher as publisher:
        await publisher.publish("worker-added", WorkerMetadata(uuid.uuid4(), "unix:/x", 1, "x"))
        print("owner", os.getpid(), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
anyio.run(main, backend=sys.argv[-1])
"""


async def test_a_new_iteration_never_joins_a_source_whose_owner_was_killed(namespace,
                                                                          anyio_backend):
    with anyio.fail_after(20):
        child = await start(OWNER_WITH_WORKER, namespace, anyio_backend)
        try:
            assert (await child.readline()).split()[0] == "owner"
            async with anyio.create_task_group() as tg:
                # A 60 s poll: the live sibling's source will not notice the death for a while.
                sibling = await follow(tg, LocalDiscovery.Subscriber(namespace, poll_interval=60))
                assert (await sibling.receive()).type == "worker-added"
                child.kill()
                await child.wait()
                with pytest.raises(DiscoveryNamespaceNotFound):
                    async for _ in LocalDiscovery.Subscriber(namespace, poll_interval=60):
                        pass
                tg.cancel_scope.cancel()
        finally:
            await stop([child])
        async with LocalDiscovery(namespace):  # sweeps the dead generation
            pass


BORROWER = """
import sys, uuid, os, anyio
from contextlib import aclosing
from anywool import LocalDiscovery, WorkerMetadata
async def main():
    async with LocalDiscovery.Publisher(sys.argv[1]) as publisher:
        await publisher.publish("worker-added",
                                WorkerMetadata(uuid.uuid4(), "unix:/tmp/none", os.getpid(), "x"))
    async with aclosing(aiter(LocalDiscovery.Subscriber(sys.argv[1]))) as events:
        async for event in events:
            break
    print("borrowed", flush=True)
anyio.run(main, backend=sys.argv[-1])
"""


async def test_a_borrowing_interpreter_that_exits_leaves_the_namespace_to_its_owner(
        namespace, anyio_backend):
    with anyio.fail_after(20):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            before = sorted(os.listdir(owner.path))
            await publisher.publish("worker-added", first := worker())
            child = await start(BORROWER, namespace, anyio_backend, capture_stderr=True)
            try:
                assert await child.readline() == "borrowed"
                assert await child.wait() == 0
                assert await child.read_stderr() == b""
            finally:
                await stop([child])
            # Nothing of the owner's was removed or taken over: files, workers, publishing.
            assert sorted(os.listdir(owner.path)) == before
            await publisher.publish("worker-added", second := worker())
            async with aclosing(aiter(owner.subscriber)) as events:
                seen = {(await anext(events)).metadata.uid for _ in range(2)}
            assert seen == {first.uid, second.uid}


async def test_a_new_iteration_sees_only_the_successors_workers(namespace, anyio_backend):
    with anyio.fail_after(30):
        child = await start(OWNER_WITH_WORKER, namespace, anyio_backend)
        try:
            assert (await child.readline()).split()[0] == "owner"
            async with anyio.create_task_group() as tg:
                # A 60 s poll keeps this sibling's source on the dead generation for a while.
                sibling = await follow(tg, LocalDiscovery.Subscriber(namespace, poll_interval=60))
                dead_uid = (await sibling.receive()).metadata.uid
                child.kill()
                await child.wait()
                async with LocalDiscovery(namespace) as successor, successor.publisher as publisher:
                    await publisher.publish("worker-added", current := worker())
                    async with aclosing(aiter(LocalDiscovery.Subscriber(namespace, poll_interval=60))) as events:
                        first = await anext(events)
                        await publisher.publish("worker-added", marker := worker())
                        seen = [(first.type, first.metadata.uid)]
                        while seen[-1][1] != marker.uid:
                            event = await anext(events)
                            seen.append((event.type, event.metadata.uid))
                    assert dead_uid not in {uid for _, uid in seen}
                    assert seen == [("worker-added", current.uid), ("worker-added", marker.uid)]
                tg.cancel_scope.cancel()
        finally:
            await stop([child])


BINDER = """
import sys
from anywool import DiscoveryNamespaceNotFound, DiscoveryRegistryCorrupt
from anywool.discovery.local import _binding
print("binding", flush=True)
while True:
    try:
        _binding.bind(sys.argv[1]).close()
    except (DiscoveryNamespaceNotFound, DiscoveryRegistryCorrupt):
        pass
"""


def test_a_dead_owner_is_reclaimable_while_borrowers_keep_binding(namespace, runtime_dir):
    # Borrowers probe the owner's liveness many times a second; a claimant must still see a
    # dead owner as dead every time (their probes must not look like a live owner's lock).
    async def main() -> None:
        with anyio.fail_after(60):
            binders = [await start(BINDER, namespace) for _ in range(8)]
            try:
                for binder in binders:
                    assert await binder.readline() == "binding"
                for _ in range(500):
                    dead = _claim.claim(namespace, capacity=4, block_size=256)
                    dead.close()  # its lock goes, its files stay: what a SIGKILL leaves
                    successor = _claim.claim(namespace, capacity=4, block_size=256)
                    successor.release()
            finally:
                for binder in binders:
                    binder.kill()
                await stop(binders)

    anyio.run(main)
