"""Closing a connection, on either side, never closes a socket under a pending write or read.

Under asyncio, anyio's socket stream waits for readiness with ``loop.add_writer(sock,
future.set_result, None)`` (``add_reader`` for reads). Closing the stream resolves a pending
wait's future itself; when the socket turned ready in the same loop iteration, the callback the
selector had already queued then calls ``set_result`` on a done future, and the loop reports
``InvalidStateError``. Under trio the frame being written is cut short instead. And a half-close
made while a write is pending raises ``BusyResourceError``. Found by stressing nested calls with
large arguments while workers stopped.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import anyio
import pytest

from anywool import LocalWorker, routine
from anywool.lowlevel import CallNotDelivered, WorkerConnection
from anywool.runtime.wire._frames import Frame, FrameStream, Kind

from ..helpers import call_payload, wait_until, worker_frames

pytestmark = pytest.mark.anyio


async def length(data: bytes) -> int:  # never runs: the fake workers below only read
    return len(data)


@routine
async def big_result(size: int) -> bytes:
    return b"r" * size


def _loop_errors(anyio_backend: str) -> list[dict[str, Any]]:
    """What the event loop reports through its exception handler (asyncio only)."""
    errors: list[dict[str, Any]] = []
    if anyio_backend == "asyncio":
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    return errors


async def test_a_lost_connection_closes_only_once_the_frame_being_written_is_whole(
        runtime_dir: Path, anyio_backend: str) -> None:
    errors = _loop_errors(anyio_backend)
    path = runtime_dir / "fake.sock"
    received = bytearray()
    outcome: list[BaseException] = []
    entered, lost, go, closed, drained = (anyio.Event() for _ in range(5))
    connections: list[WorkerConnection] = []

    async def owner() -> None:  # enters and exits the connection in one task, as a proxy does
        async with WorkerConnection(f"unix:{path}", on_lost=lost.set) as connection:
            connections.append(connection)
            entered.set()
            await go.wait()
        closed.set()

    async def caller(connection: WorkerConnection) -> None:
        try:
            await connection.call(length, (b"x" * 8_000_000,), {})
        except Exception as exc:
            outcome.append(exc)

    async def read_until_eof(stream: Any) -> None:
        try:
            while True:
                received.extend(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        drained.set()

    with anyio.fail_after(20):
        async with await anyio.create_unix_listener(path) as listener, \
                anyio.create_task_group() as tg:
            tg.start_soon(owner)
            server = await listener.accept()
            await entered.wait()
            tg.start_soon(caller, connections[0])
            # The fake worker reads nothing: the caller's 8 MB write fills the socket and waits.
            await wait_until(lambda: connections[0]._frames is not None
                             and connections[0]._frames.writing, "the caller's write")
            # The worker stops: it half-closes (the connection's reader reads end-of-stream) and
            # keeps reading. One read makes the caller's socket writable at the next select, in
            # the iteration whose first step is the owner exiting the connection.
            await server.send_eof()
            await lost.wait()
            received.extend(server.extra(anyio.abc.SocketAttribute.raw_socket).recv(4_000_000))
            go.set()
            tg.start_soon(read_until_eof, server)
            await closed.wait()
            await drained.wait()
            await server.aclose()
    path.unlink()
    assert errors == []
    (size,) = struct.unpack(">I", received[:4])
    assert len(received) == 4 + size  # the CALL frame arrived whole, nothing was cut short
    assert len(outcome) == 1 and isinstance(outcome[0], CallNotDelivered)  # and never ran


async def test_a_connection_exits_promptly_while_its_peer_reads_nothing(
        runtime_dir: Path, anyio_backend: str) -> None:
    # A half-close under a pending write raised BusyResourceError, which left the shielded
    # reader waiting for ever: the exit hung.
    errors = _loop_errors(anyio_backend)
    path = runtime_dir / "stalled.sock"
    outcome: list[BaseException] = []
    with anyio.fail_after(20):
        async with await anyio.create_unix_listener(path) as listener:
            connection = WorkerConnection(f"unix:{path}")
            async with anyio.create_task_group() as tg, connection:
                server = await listener.accept()

                async def caller() -> None:
                    try:
                        await connection.call(length, (b"x" * 8_000_000,), {})
                    except Exception as exc:
                        outcome.append(exc)

                tg.start_soon(caller)
                await wait_until(lambda: connection._frames is not None
                                 and connection._frames.writing, "the caller's write")
                started = anyio.current_time()
            await server.aclose()
    path.unlink()
    assert anyio.current_time() - started < 10  # bounded: about 3 s at most
    assert errors == []
    assert len(outcome) == 1 and isinstance(outcome[0], CallNotDelivered)


async def test_a_worker_stops_cleanly_while_a_reply_is_being_written(
        capfd: pytest.CaptureFixture[str]) -> None:
    # A client that reads nothing while a stopped worker writes it a large reply: the worker's
    # half-close must wait for the reply (bounded), not fail with BusyResourceError.
    codes: list[int] = []

    async def exit_code(worker: LocalWorker, *, task_status: Any) -> None:
        task_status.started()
        codes.append(await worker.wait())  # (takes the process before it first awaits)

    with anyio.fail_after(60):
        async with LocalWorker(shutdown_timeout=0) as worker, anyio.create_task_group() as tg:
            await tg.start(exit_code, worker)
            stream = await anyio.connect_unix(worker.address.removeprefix("unix:"))
            async with stream:
                frames = await worker_frames(stream)
                await frames.send(Frame(Kind.CALL, 1, call_payload(
                    big_result.__wrapped__, (30_000_000,))))
                assert (await frames.receive()).kind == Kind.ACK
                await stream.receive(4)  # the reply is being written; read no more of it
                await worker.stop(0)
    assert codes == [0]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BusyResourceError" not in err, err
