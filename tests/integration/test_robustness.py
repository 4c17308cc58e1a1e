"""A worker under bad clients, many clients and its own death: only what failed fails."""

from __future__ import annotations

import os
import signal
import struct
from contextlib import aclosing
from pathlib import Path

import anyio
import anyio.abc
import psutil
import pytest

from anywool import LocalWorker, WorkerError, WorkerPool, routine
from anywool._address import Address
from anywool.lowlevel import WorkerConnection
from anywool.runtime.wire._auth import Credentials
from anywool.runtime.wire._frames import (
    DEFAULT_MAX_FRAME_SIZE,
    Frame,
    FrameError,
    FrameStream,
    Kind,
)

from ..helpers import Signal, call_payload, exception_of, step_payload, wait_until, worker_frames

pytestmark = pytest.mark.anyio


@routine
async def double(x: int) -> int:
    return 2 * x


@routine
async def held(port: int, path: str) -> int:
    """Tells the test it runs, then waits to be cancelled; its ``finally`` writes ``path``."""
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(str(os.getpid()).encode())
        await anyio.sleep_forever()
    finally:
        Path(path).write_text("finally ran")
    return 0


@routine
async def held_stream(port: int, path: str):
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(str(os.getpid()).encode())
        yield 1
        await anyio.sleep_forever()
        yield 2
    finally:
        Path(path).write_text("finally ran")


async def _until_closed(stream: anyio.abc.ByteStream) -> None:
    """Read (and drop) what the worker sends until it closes the connection."""
    try:
        while True:
            await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        pass


def _header(length: int) -> bytes:
    return struct.pack(">I", length)


@pytest.mark.parametrize("sent", [
    pytest.param(_header(DEFAULT_MAX_FRAME_SIZE + 1), id="oversized"),
    pytest.param(_header(100) + b"\x93\x01", id="truncated-body"),
    pytest.param(b"\x00\x00", id="truncated-header"),
    pytest.param(_header(3) + b"\xc1\xc1\xc1", id="garbled"),
    pytest.param(_header(4) + b"\x93\x63\x01\xc0", id="unknown-kind"),
])
async def test_a_bad_frame_closes_that_connection_only(sent: bytes, tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    with anyio.fail_after(30):
        async with LocalWorker() as worker, Signal() as started, \
                WorkerConnection(worker.address) as good:
            bad = await anyio.connect_unix(worker.address.removeprefix("unix:"))
            async with bad:
                # A call of the bad connection is running when it misbehaves: it is cancelled
                # with its connection (its finally runs).
                frames = FrameStream(bad, bad)
                await frames.send(Frame(Kind.CALL, 1, call_payload(
                    held.__wrapped__, (started.port, str(marker)))))
                await started.started()
                await bad.send(sent)
                await bad.send_eof()
                await _until_closed(bad)  # the worker closed it
            await wait_until(marker.exists, "the bad connection's call to be cancelled")
            # The connection that was open all along is served as before.
            assert await good.call(double.__wrapped__, (21,), {}) == 42


async def test_a_malformed_call_header_fails_that_call_only() -> None:
    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            stream = await anyio.connect_unix(worker.address.removeprefix("unix:"))
            async with stream:
                frames = await worker_frames(stream)
                await frames.send(Frame(Kind.CALL, 1, b"\x92\x01\x02"))  # not a call's header
                reply = await frames.receive()
                assert reply.kind == Kind.EXCEPTION and reply.call_id == 1
                assert isinstance(exception_of(reply.payload), FrameError)
                await frames.send(Frame(Kind.CALL, 2, call_payload(double.__wrapped__, (2,))))
                assert [(await frames.receive()).kind for _ in range(2)] == [
                    Kind.ACK, Kind.RETURN]


async def test_five_hundred_connections_at_once_do_not_stop_the_worker() -> None:
    with anyio.fail_after(60):
        async with LocalWorker() as worker, WorkerConnection(worker.address) as good:
            process = psutil.Process(worker.pid)
            before = process.num_fds()
            path = worker.address.removeprefix("unix:")
            streams: list[anyio.abc.ByteStream] = []

            async def connect(index: int) -> None:
                stream = await anyio.connect_unix(path)
                streams.append(stream)
                if index % 2:
                    await stream.send(_header(64))  # a frame that never comes: a slow client

            async with anyio.create_task_group() as tg:
                for index in range(500):
                    tg.start_soon(connect, index)
            assert await good.call(double.__wrapped__, (4,), {}) == 8
            await wait_until(lambda: process.num_fds() >= before + 500,
                             "the worker to accept the 500 connections")
            assert await good.call(double.__wrapped__, (4,), {}) == 8  # holding them all
            async with WorkerConnection(worker.address) as late:  # a new one is accepted too
                assert await late.call(double.__wrapped__, (5,), {}) == 10
            for stream in streams:
                await stream.aclose()
            # Every one of them is let go (give or take what an event loop opens lazily).
            await wait_until(lambda: process.num_fds() < before + 10,
                             "the worker to close the 500 connections")
            assert await good.call(double.__wrapped__, (6,), {}) == 12


@pytest.mark.parametrize("kind", ["coroutine", "generator"])
async def test_a_client_that_disconnects_mid_call_cancels_its_calls(kind: str,
                                                                    tmp_path: Path) -> None:
    marker = tmp_path / "finally"
    fn = held.__wrapped__ if kind == "coroutine" else held_stream.__wrapped__
    with anyio.fail_after(30):
        async with LocalWorker() as worker, Signal() as started:
            stream = await anyio.connect_unix(worker.address.removeprefix("unix:"))
            async with stream:
                frames = await worker_frames(stream)
                await frames.send(Frame(Kind.CALL, 1, call_payload(
                    fn, (started.port, str(marker)))))
                if kind == "generator":
                    assert (await frames.receive()).kind == Kind.ACK
                    await frames.send(Frame(Kind.ASEND, 1, step_payload()))
                await started.started()
            # Gone without a word: the worker cancels what it was running for it.
            await wait_until(marker.exists, "the routine's finally on the worker")
            async with WorkerConnection(worker.address) as connection:
                assert await connection.call(double.__wrapped__, (1,), {}) == 2


async def test_a_worker_that_dies_mid_call_fails_that_call_and_is_evicted(
        tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2) as pool:
            async with Signal() as started, anyio.create_task_group() as tg:
                failures: list[BaseException] = []

                async def doomed() -> None:
                    try:
                        await held(started.port, str(tmp_path / "never"))
                    except WorkerError as exc:
                        failures.append(exc)

                tg.start_soon(doomed)
                victim = int(await started.started())
                dead = next(w.metadata for w in pool.workers if w.pid == victim)
                os.kill(victim, signal.SIGKILL)
            assert len(failures) == 1 and failures[0].address == dead.address  # typed, named
            # At once out of the proxy's choice: the next calls all go elsewhere and succeed.
            assert dead.uid not in {m.uid for m in pool.proxy.workers}
            assert [await double(i) for i in range(20)] == [2 * i for i in range(20)]
            assert not (tmp_path / "never").exists()


SECRET = b"the robustness tests' secret"


async def _connect(address: str) -> anyio.abc.ByteStream:
    parsed = Address.parse(address)
    if parsed.path is not None:
        return await anyio.connect_unix(parsed.path)
    assert parsed.host is not None and parsed.port is not None
    return await anyio.connect_tcp(parsed.host, parsed.port)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_a_worker_out_of_descriptors_waits_for_some_and_goes_on_serving(
        transport: str) -> None:
    # Under asyncio, anyio reports a TCP listener's EMFILE unwrapped, a Unix one's wrapped.
    tcp = {"host": "127.0.0.1", "secret": SECRET} if transport == "tcp" else {}
    credentials = Credentials(SECRET) if tcp else None
    with anyio.fail_after(60):
        async with LocalWorker(**tcp) as worker, WorkerConnection(
                worker.address, credentials=credentials) as good:
            process = psutil.Process(worker.pid)
            soft, hard = process.rlimit(psutil.RLIMIT_NOFILE)
            limit = process.num_fds() + 2
            process.rlimit(psutil.RLIMIT_NOFILE, (limit, hard))
            waiting = [await _connect(worker.address) for _ in range(6)]  # in the backlog
            try:
                await wait_until(lambda: process.num_fds() >= limit,
                                 "the worker to run out of descriptors")
                assert await good.call(double.__wrapped__, (3,), {}) == 6  # still serving
                process.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
                # With descriptors again, it accepts what waited, and new clients.
                await wait_until(lambda: process.num_fds() >= limit + 4,
                                 "the worker to accept the waiting clients")
                async with WorkerConnection(worker.address, credentials=credentials) as late:
                    assert await late.call(double.__wrapped__, (4,), {}) == 8
                assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE
            finally:
                for stream in waiting:
                    await stream.aclose()


async def test_a_flood_of_unauthenticated_peers_holds_a_bounded_number_of_descriptors() -> None:
    from anywool.runtime.worker._gatekeeper import MAX_PENDING_HANDSHAKES

    with anyio.fail_after(60):
        async with LocalWorker(host="127.0.0.1", secret=SECRET) as worker, WorkerConnection(
                worker.address, credentials=Credentials(SECRET)) as good:
            process = psutil.Process(worker.pid)
            before = process.num_fds()
            # The worker's descriptors, read after every connection: pending handshakes also
            # end at their 2 s deadline, so on a slow machine the flood may never fill every
            # place at one moment (test_handshake_flood keeps it full), but it never exceeds it.
            most = before
            silent = []
            for _ in range(MAX_PENDING_HANDSHAKES + 40):
                silent.append(await _connect(worker.address))
                most = max(most, process.num_fds())
            try:
                assert before < most <= before + MAX_PENDING_HANDSHAKES
                assert await good.call(double.__wrapped__, (5,), {}) == 10
            finally:
                for stream in silent:
                    await stream.aclose()
            async with WorkerConnection(worker.address, credentials=Credentials(SECRET)) as late:
                assert await late.call(double.__wrapped__, (6,), {}) == 12


@routine
async def meddle_with_stdin() -> str:
    import sys

    read = sys.stdin.read()  # the worker's stop requests are not there to steal
    sys.stdin.close()
    os.close(0)
    return read


async def test_a_routine_that_reads_or_closes_stdin_leaves_the_worker_stoppable() -> None:
    codes: list[int] = []

    async def exit_code(worker: LocalWorker, *, task_status) -> None:
        task_status.started()
        codes.append(await worker.wait())

    with anyio.fail_after(60):
        async with LocalWorker() as worker, anyio.create_task_group() as tg:
            await tg.start(exit_code, worker)
            async with WorkerConnection(worker.address) as connection:
                assert await connection.call(meddle_with_stdin.__wrapped__, (), {}) == ""
                assert await connection.call(double.__wrapped__, (5,), {}) == 10
            await worker.stop(5)
    assert codes == [0]  # it took the stop request and stopped cleanly


@routine
async def slow_to_close():
    try:
        while True:
            yield 1
    finally:
        await anyio.sleep_forever()  # not shielded: only the worker's close bound ends it


@routine
async def endless():
    while True:
        yield 1


@pytest.mark.parametrize("how", ["stop", "SIGTERM"])
async def test_a_stream_its_worker_ended_while_suspended_says_it_was_cancelled(how: str) -> None:
    # The worker answers the suspended call RoutineCancelled, then closes the connection: the
    # next step's send fails, and what the worker said is the answer, not the lost connection.
    from anywool import RoutineCancelled
    from anywool.runtime.client._call import drive_stream

    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            async with WorkerConnection(worker.address) as connection:
                items = drive_stream(lambda: connection.stream(endless.__wrapped__, (), {}))
                async with aclosing(items):
                    assert await items.__anext__() == 1
                    if how == "stop":
                        await worker.stop(0)
                    else:
                        process = worker._process
                        assert process is not None
                        process.send_signal(signal.SIGTERM)
                        await process.wait()
                    with pytest.raises(RoutineCancelled):
                        await items.__anext__()


async def test_a_step_whose_send_fails_on_a_connection_left_open_fails_not_waits(
        tmp_path: Path) -> None:
    # A peer that stops reading but keeps the connection open: after a moment for an answer
    # it may have written, the failed send is the step's error, not a wait for a frame that
    # cannot come. The connection is failed with it.
    import socket

    from anyio.abc import SocketAttribute

    from anywool.runtime.client._call import drive_stream
    from anywool.runtime.wire import _envelope, _serializer

    path = str(tmp_path / "fake.sock")  # (short enough for sun_path under pytest's tmp)
    with anyio.fail_after(20):
        async with await anyio.create_unix_listener(path) as listener, \
                anyio.create_task_group() as tg:

            async def fake_worker() -> None:
                async with await listener.accept() as stream:
                    frames = FrameStream(stream, stream)
                    call = await frames.receive()
                    await frames.send(Frame(Kind.ACK, call.call_id))
                    assert (await frames.receive()).kind == Kind.ASEND
                    await frames.send(Frame(Kind.RESULT, call.call_id,
                                            _envelope.encode_reply(_serializer.dump(1)).join()))
                    stream.extra(SocketAttribute.raw_socket).shutdown(socket.SHUT_RD)
                    await anyio.sleep_forever()

            tg.start_soon(fake_worker)
            async with WorkerConnection(f"unix:{path}") as connection:
                items = drive_stream(lambda: connection.stream(endless.__wrapped__, (), {}))
                assert await items.__anext__() == 1
                with pytest.raises(WorkerError, match="connection failed"):
                    await items.__anext__()
                assert connection.broken
            tg.cancel_scope.cancel()


async def test_a_stream_slow_to_close_does_not_stretch_the_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    # Suspended at a yield when its worker stops: the close the worker runs itself gets what
    # the stop gives its cancelled calls, not a budget of its own that outlasts the stop (5 s,
    # against the grace plus 3.5 s its parent waits).
    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            stream = await anyio.connect_unix(worker.address.removeprefix("unix:"))
            async with stream:
                frames = await worker_frames(stream)
                await frames.send(Frame(Kind.CALL, 1, call_payload(slow_to_close.__wrapped__)))
                assert (await frames.receive()).kind == Kind.ACK
                await frames.send(Frame(Kind.ASEND, 1, step_payload()))
                assert (await frames.receive()).kind == Kind.RESULT  # suspended at its yield
                process = worker._process
                assert process is not None
                await worker.stop(0)
                assert process.returncode == 0
    assert "finishing forcefully" not in caplog.text


@pytest.mark.parametrize("reads", [False, True], ids=["never-reads", "reads"])
async def test_a_client_that_never_hangs_up_does_not_stretch_the_stop(
        reads: bool, caplog: pytest.LogCaptureFixture) -> None:
    # The worker half-closes and lingers for its clients, but within the one budget its parent
    # waits for: it exits by itself (code 0), not by SIGTERM after a logged overrun.
    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            lingering = await anyio.connect_unix(worker.address.removeprefix("unix:"))
            async with lingering, anyio.create_task_group() as tg:
                frames = await worker_frames(lingering)
                await frames.send(Frame(Kind.CALL, 1, call_payload(double.__wrapped__, (1,))))
                assert [(await frames.receive()).kind for _ in range(2)] == [Kind.ACK,
                                                                             Kind.RETURN]
                if reads:  # reads its end-of-stream, and still does not hang up
                    tg.start_soon(_until_closed, lingering)
                process = worker._process
                assert process is not None
                await worker.stop(0)
                assert process.returncode == 0
                tg.cancel_scope.cancel()
    assert "finishing forcefully" not in caplog.text
