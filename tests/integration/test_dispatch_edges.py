"""Edges of dispatch: owned discovery given entered, oversize payloads, workers closing early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import pytest

from anywool import (
    LocalDiscovery,
    LocalWorker,
    PayloadTooLarge,
    WorkerPool,
    routine,
)
from anywool.runtime._connection import CallNotDelivered, WorkerConnection
from anywool.runtime._wire import FrameStream

from ..helpers import follow, take

pytestmark = pytest.mark.anyio


@routine
async def double(x: int) -> int:
    return 2 * x


@routine
async def blob(size: int) -> bytes:
    return b"x" * size


async def test_pool_publishes_into_a_discovery_its_caller_already_owns(namespace):
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, anyio.create_task_group() as tg:
            events = await follow(tg, discovery.subscriber)
            async with WorkerPool(spawn=2, discovery=discovery) as pool:
                assert pool.discovery is discovery
                assert await double(21) == 42
                added = await take(events, 2)
                assert sorted(added) == sorted(("worker-added", w.metadata.uid) for w in pool.workers)
            dropped = await take(events, 2)
            assert sorted(dropped) == sorted(("worker-dropped", uid) for _, uid in added)
            assert discovery.claimed  # still the caller's: the pool neither entered nor exited it
            tg.cancel_scope.cancel()


async def test_oversize_arguments_fail_at_once_and_nothing_is_sent(namespace):
    with anyio.fail_after(30):
        async with LocalWorker() as worker, WorkerConnection(
            worker.metadata.address, max_frame_size=4096
        ) as connection:
            with pytest.raises(PayloadTooLarge) as info:
                await connection.call(double.__wrapped__, (b"x" * 10_000,), {})
            assert info.value.size > 10_000 and info.value.limit < 4096
            assert "double" in str(info.value)
            # The connection is intact for the next call.
            assert await connection.call(double.__wrapped__, (4,), {}) == 8


async def test_oversize_result_arrives_as_payload_too_large():
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            with pytest.raises(PayloadTooLarge) as info:
                await blob(65 * 1024 * 1024)
            assert "blob" in str(info.value)
            assert await double(1) == 2


async def test_a_worker_closing_before_accepting_means_not_delivered(runtime_dir):
    # A worker that stops between reading a call and acknowledging it never ran the routine:
    # the caller must be able to retry elsewhere.
    path = runtime_dir / "fake.sock"
    listener = await anyio.create_unix_listener(path)
    with anyio.fail_after(10):
        async with listener, anyio.create_task_group() as tg:

            async def accept_then_close() -> None:
                stream = await listener.accept()
                async with stream:
                    await FrameStream(stream, stream).receive()  # the CALL, then close

            tg.start_soon(accept_then_close)
            async with WorkerConnection(f"unix:{path}") as connection:
                with pytest.raises(CallNotDelivered):
                    await connection.call(double.__wrapped__, (1,), {})
    os.unlink(path)


@routine
async def pid_after_a_moment() -> int:
    await anyio.sleep(0.01)
    return os.getpid()


async def test_a_draining_worker_loses_no_call_under_load():
    # SIGINT asks a worker to drain: calls racing with its shutdown are refused or reported
    # "not delivered", and the balancer sends them to the other worker. None may fail.
    served: dict[int, int] = {}
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2) as pool:
            victim = pool.workers[0].metadata.pid

            halfway = anyio.Event()

            async def caller() -> None:
                for _ in range(100):
                    pid = await pid_after_a_moment()
                    served[pid] = served.get(pid, 0) + 1
                    if served.get(victim, 0) >= 50:
                        halfway.set()

            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(caller)
                await halfway.wait()  # the victim is busy serving: drain it now
                os.kill(victim, signal.SIGINT)
    assert sum(served.values()) == 1600


async def test_a_worker_refuses_to_listen_on_tcp_without_authentication():
    # Frames carry pickled code: an unauthenticated TCP listener would run anyone's code.
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, "-m", "anywool.worker", "--address", "127.0.0.1:0"],
            check=False, stdin=subprocess.DEVNULL,
        )
    assert result.returncode != 0
    assert b"authentication" in result.stderr and result.stdout == b""
