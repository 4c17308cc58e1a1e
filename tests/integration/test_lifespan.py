"""Worker lifespans (issue 24, item 1): entered in each spawned worker before it takes calls,
exited after its last one, what it yields reached through ``current_worker()``; its failures.
Real workers, both backends."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

import anywool
from anywool import LocalWorker, WorkerPool, current_worker, routine
from anywool.errors import WorkerError

from ..helpers import wait_until

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def journal(path: str) -> AsyncIterator[dict[str, Any]]:
    """Appends ``enter <pid>`` and, at its exit, ``exit <pid>`` to ``path``; yields a state
    that routines change."""
    pid = os.getpid()
    with open(path, "a") as file:
        file.write(f"enter {pid}\n")
    async with anyio.create_task_group():  # it runs in the worker's own event loop
        await anyio.lowlevel.checkpoint()
    state = {"pid": pid, "calls": 0}
    try:
        yield state
    finally:
        with open(path, "a") as file:
            file.write(f"exit {pid} after {state['calls']} calls\n")


@contextlib.asynccontextmanager
async def refusing() -> AsyncIterator[None]:
    raise ConnectionRefusedError("no database at db:5432")
    yield  # pragma: no cover


@contextlib.asynccontextmanager
async def failing_at_exit(path: str) -> AsyncIterator[None]:
    yield
    with open(path, "a") as file:
        file.write("exit ran\n")
    raise RuntimeError("could not close the database")


def not_a_context_manager() -> int:
    return 42


@contextlib.asynccontextmanager
async def hanging_at_exit(path: str) -> AsyncIterator[None]:
    yield
    try:
        await anyio.sleep_forever()  # a close that never ends
    finally:
        with open(path, "a") as file:
            file.write("exit ended\n")


@routine
async def state() -> tuple[Any, int, str | None, str, int]:
    info = current_worker()
    info.state["calls"] += 1
    return info.state, info.pid, None if info.uid is None else str(info.uid), info.address, \
        os.getpid()


@routine
async def namespace_seen() -> str | None:
    return current_worker().namespace


@routine
async def note_when_done(path: str, port: int) -> None:
    """Tells the test it started, waits for its ``go``, then appends ``call done`` to
    ``path``."""
    info = current_worker()
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(b"started")
        assert await stream.receive() == b"go"
    info.state["calls"] += 1
    with open(path, "a") as file:
        file.write("call done\n")


async def test_routines_reach_what_the_lifespan_yields(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2, worker_lifespan=partial(journal, str(path))) as pool:
            seen = [await state() for _ in range(4)]
            workers = {worker.pid: worker for worker in pool.workers}
            namespace = await namespace_seen()
            assert namespace == pool.discovery.namespace
    for value, pid, uid, address, routine_pid in seen:
        assert value["pid"] == pid == routine_pid  # the state made in that very worker
        assert uid == str(workers[pid].metadata.uid)
        assert address == workers[pid].address
    assert sorted(value["calls"] for value, *_ in seen[-2:]) == [2, 2]  # kept across calls
    lines = path.read_text().splitlines()
    assert sorted(lines) == sorted([f"enter {pid}" for pid in workers]
                                   + [f"exit {pid} after 2 calls" for pid in workers]), lines


async def test_the_lifespan_exits_after_the_last_call(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    with anyio.fail_after(30):
        async with listener, anyio.create_task_group() as tg:
            async with WorkerPool(spawn=1, worker_lifespan=partial(journal, str(path))) as pool:
                [worker] = pool.workers
                tg.start_soon(note_when_done, str(path), port)
                stream = await listener.listeners[0].accept()  # type: ignore[attr-defined]
                assert await stream.receive() == b"started"

                async def release() -> None:
                    # The call ends only once the pool's exit has begun: the exit drains it.
                    await wait_until(lambda: pool._supervisor.closing, "the pool's exit to begin")
                    async with stream:
                        await stream.send(b"go")

                tg.start_soon(release)
            # The pool has exited: its call drained first, then the lifespan exited.
    assert path.read_text().splitlines() == [
        f"enter {worker.pid}", "call done", f"exit {worker.pid} after 1 calls"]


async def test_a_lifespan_that_fails_to_start_fails_the_pools_start() -> None:
    with anyio.fail_after(30):
        with pytest.raises(WorkerError, match="no database at db:5432") as caught:
            async with WorkerPool(spawn=1, worker_lifespan=refusing):
                pass  # pragma: no cover
    assert "ConnectionRefusedError" in str(caught.value)


async def test_a_lifespan_that_is_no_context_manager_fails_the_start() -> None:
    with anyio.fail_after(30):
        with pytest.raises(WorkerError, match="not an async context manager"):
            async with WorkerPool(spawn=1, worker_lifespan=not_a_context_manager):
                pass  # pragma: no cover


async def test_a_lifespan_that_fails_at_exit_is_logged(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "journal"
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, worker_lifespan=partial(failing_at_exit, str(path))):
            assert (await who())[0] == (await who())[3]
    assert path.read_text() == "exit ran\n"
    err = capfd.readouterr().err
    assert "the worker's lifespan failed as it exited" in err
    assert "could not close the database" in err


async def test_sigterm_cancels_a_lifespan_exit_that_hangs(tmp_path: Path) -> None:
    # The stop's drain (none here) and its tail pass while the exit hangs; SIGTERM then
    # cancels it (as documented), rather than the worker waiting for SIGKILL, which would
    # leave the lifespan's own cleanup unrun.
    path = tmp_path / "journal"
    with anyio.fail_after(30):
        async with LocalWorker(lifespan=partial(hanging_at_exit, str(path)),
                               shutdown_timeout=0):
            pass
    assert path.read_text() == "exit ended\n"


async def test_a_lifespan_named_by_module_and_name() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1,
                              worker_lifespan="tests.integration.lifespans:counter") as pool:
            value, pid, *_ = await state()
            assert value == {"pid": pool.workers[0].pid, "calls": 1} and pid == value["pid"]


@routine
async def who() -> tuple[int, str, str, int]:
    info = current_worker()
    return info.pid, str(info.uid), info.address, os.getpid()


def test_current_worker_outside_a_worker_says_so() -> None:
    with pytest.raises(RuntimeError, match="only known in an anywool worker"):
        current_worker()


@pytest.mark.parametrize("value, error, message", [
    (42, TypeError, "worker_lifespan must be a callable"),
    ("no_colon_here", ValueError, "worker_lifespan must be 'module:name'"),
    ("no_such_module_anywhere:life", ValueError, "cannot be imported"),
    ("tests.integration.lifespans:missing", ValueError, "cannot be imported"),
    ("tests.integration.lifespans:NOT_CALLABLE", TypeError, "must be a callable"),
])
def test_a_bad_lifespan_is_refused_at_construction(value: object, error: type[Exception],
                                                   message: str) -> None:
    with pytest.raises(error, match=message):
        WorkerPool(spawn=1, worker_lifespan=value)  # type: ignore[arg-type]


def test_a_lifespan_that_cannot_be_sent_is_refused_at_construction() -> None:
    lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def holding() -> AsyncIterator[None]:
        with lock:
            yield

    with pytest.raises(TypeError, match="cannot be sent to the workers"):
        WorkerPool(spawn=1, worker_lifespan=holding)


def test_a_lifespan_for_a_pool_that_spawns_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="spawns none"):
        WorkerPool(discovery=anywool.LocalDiscovery("lifespan-none"), worker_lifespan=journal)


def test_a_lifespan_too_large_to_hand_over_is_refused_at_construction() -> None:
    ballast = bytes(range(256)) * 400  # 100 KiB, pickled with the function (defined here)

    @contextlib.asynccontextmanager
    async def heavy() -> AsyncIterator[int]:
        yield len(ballast)

    with pytest.raises(TypeError, match="too large to hand to a worker"):
        WorkerPool(spawn=1, worker_lifespan=heavy)
