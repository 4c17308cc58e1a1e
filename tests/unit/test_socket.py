"""SocketStream: the non-blocking socket the frame codec writes and reads without waiting."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import pytest
from anyio.abc import SocketAttribute

from anywool._address import Address
from anywool.runtime.wire import _socket
from anywool.runtime.wire._frames import SEND_NOW_AT_MOST, Frame, FrameStream, Kind, encode
from anywool.runtime.wire._socket import SocketStream

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SocketStream, SocketStream]]:
    left, right = socket.socketpair()
    a, b = SocketStream(left), SocketStream(right)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


async def test_a_ready_socket_is_read_and_written_without_waiting(pair) -> None:
    a, b = pair
    assert b.try_receive() is None  # nothing yet: no wait, no error
    assert a.try_send(b"hello") == 5
    assert b.try_receive() == b"hello"


async def test_receive_waits_for_data_and_ends_at_the_peers_end(pair) -> None:
    a, b = pair
    received: list[bytes] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def read() -> None:
                received.append(await b.receive())

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the reader waits on the socket
            await a.send(b"late")
        await a.send_eof()
        with pytest.raises(anyio.EndOfStream):
            await b.receive()
    assert received == [b"late"]


async def test_data_that_arrives_while_nobody_waits_is_still_seen(pair) -> None:
    # Under asyncio the reader stays registered between waits and unregisters when readiness
    # finds nobody waiting: a later wait must register again and see the data.
    a, b = pair
    with anyio.fail_after(5):
        await a.send(b"one")
        await b.wait_readable()
        assert b.try_receive() == b"one"
        await a.send(b"two")
        for _ in range(3):  # loop iterations with the socket readable and no waiter
            await anyio.lowlevel.checkpoint()
        await b.wait_readable()
        assert b.try_receive() == b"two"


async def test_closing_wakes_a_waiting_reader_with_closed_resource(pair) -> None:
    _, b = pair
    outcome: list[BaseException] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def wait() -> None:
                try:
                    await b.wait_readable()
                except anyio.ClosedResourceError as exc:
                    outcome.append(exc)

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await b.aclose()
    assert len(outcome) == 1
    with pytest.raises(anyio.ClosedResourceError):
        b.try_send(b"x")
    with pytest.raises(anyio.ClosedResourceError):
        b.try_receive()


async def test_a_vanished_peer_breaks_the_stream(pair) -> None:
    a, b = pair
    b.close()
    with pytest.raises(anyio.BrokenResourceError) as caught:
        for _ in range(100):  # the first send may still be buffered before EPIPE shows
            a.try_send(b"x" * 65536)
    assert isinstance(caught.value.__cause__, OSError)


async def test_frames_larger_than_the_socket_buffer_from_concurrent_senders_arrive_whole(
        pair) -> None:
    a, b = pair
    writer, reader = FrameStream(a, a), FrameStream(b, b)
    big = [bytes([i]) * (3 << 20) for i in range(4)]  # far more than a socketpair buffers
    received: list[Frame] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i, payload in enumerate(big):
                tg.start_soon(writer.send, Frame(Kind.RESULT, i, payload))
            for _ in big:
                received.append(await reader.receive())
    assert sorted((f.call_id, f.payload) for f in received) == list(enumerate(big))


async def test_a_sender_cancelled_while_its_frame_is_half_written_still_writes_it_whole(
        pair) -> None:
    a, b = pair
    writer, reader = FrameStream(a, a), FrameStream(b, b)
    payload = b"z" * (4 << 20)
    received: list[Frame] = []

    async def read_two() -> None:
        for _ in range(2):
            received.append(await reader.receive())

    with anyio.fail_after(20):
        async with anyio.create_task_group() as outer:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(writer.send, Frame(Kind.RESULT, 1, payload))
                    await anyio.wait_all_tasks_blocked()  # part written, the rest waits
                    scope.cancel()
                    outer.start_soon(read_two)  # room for the rest only after the cancel
            await writer.send(Frame(Kind.END, 2))
    first, second = received
    assert (first.call_id, first.payload) == (1, payload)
    assert second == Frame(Kind.END, 2)


async def test_connect_and_accept_over_unix(tmp_path) -> None:
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    try:
        with anyio.fail_after(5):
            client = await _socket.connect(Address.unix(path))
            server = await _socket.accept(listener)
            async with client, server:
                await client.send(b"ping")
                assert await server.receive() == b"ping"
                assert server.extra(SocketAttribute.family) == socket.AF_UNIX
    finally:
        listener.close()


async def test_connect_over_tcp_sets_no_delay_and_reports_addresses() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        with anyio.fail_after(5):
            client = await _socket.connect(Address.tcp("127.0.0.1", port))
            server = await _socket.accept(listener)
            async with client, server:
                raw = client.extra(SocketAttribute.raw_socket)
                assert raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert client.extra(SocketAttribute.remote_address) == ("127.0.0.1", port)
                assert client.extra(SocketAttribute.remote_port) == port
                await server.send(b"pong")
                assert await client.receive() == b"pong"
    finally:
        listener.close()


async def test_connecting_to_nobody_raises_the_os_error(tmp_path) -> None:
    with anyio.fail_after(5):
        with pytest.raises(FileNotFoundError):
            await _socket.connect(Address.unix(str(tmp_path / "nobody")))
        closed = socket.create_server(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
        with pytest.raises(OSError) as caught:
            await _socket.connect(Address.tcp("127.0.0.1", port))
        assert caught.value.errno == errno.ECONNREFUSED


async def test_accept_ends_when_the_listener_is_closed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ended: list[BaseException] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def accept() -> None:
                try:
                    await _socket.accept(listener)
                except anyio.ClosedResourceError as exc:
                    ended.append(exc)

            tg.start_soon(accept)
            await anyio.wait_all_tasks_blocked()
            anyio.notify_closing(listener)
            listener.close()
    assert len(ended) == 1


async def test_accepting_on_a_listener_closed_before_the_first_accept_says_closed() -> None:
    # A worker told to stop as it starts closes its listener before the accepting task has
    # first run: that is the end of accepting, not an OSError.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.close()
    with anyio.fail_after(5), pytest.raises(anyio.ClosedResourceError):
        await _socket.accept(listener)


def test_a_worker_imports_neither_discovery_nor_the_other_backend() -> None:
    # The package's names are imported on first use, so a worker's start-up costs only what
    # it runs: a trio worker imports no asyncio, no worker imports LAN discovery or zeroconf.
    code = (
        "import sys; import anywool.runtime.worker._main; "
        "print(sorted(m for m in ('asyncio', 'zeroconf', 'ifaddr', 'anywool.discovery.lan', "
        "'anywool.runtime.wire._auth', 'anywool._tls', 'anywool.runtime.client._proxy') "
        "if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_package_names_every_public_attribute_lazily() -> None:
    import anywool

    assert set(anywool.__all__) <= set(dir(anywool))
    for name in anywool.__all__:
        assert getattr(anywool, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        anywool.Nope  # noqa: B018


@pytest.mark.parametrize("ending", ["garbled", "end", "reset"])
async def test_frames_handed_over_while_waiting_keep_their_order_and_the_end_reaches_the_receiver(
        pair, ending: str) -> None:
    # Under asyncio the event loop hands arriving frames to the handler while the receiver
    # waits; under trio the receiver gets them. Either way: every frame once, in order, and
    # whatever ends the stream raised in the receiver.
    from anywool.runtime.wire._frames import FrameError, encode

    a, b = pair
    reader = FrameStream(b, b)
    seen: list[int] = []
    reader.deliver_while_waiting(lambda frame: seen.append(frame.call_id))
    expected = {"garbled": FrameError, "end": anyio.EndOfStream,
                "reset": (anyio.BrokenResourceError, anyio.EndOfStream)}[ending]
    outcome: list[BaseException] = []

    async def receive_all() -> None:
        try:
            while True:
                seen.append((await reader.receive()).call_id)
        except expected as exc:  # type: ignore[misc]
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive_all)
            for call_id in range(1, 4):
                await anyio.wait_all_tasks_blocked()
                await a.send(encode(Frame(Kind.RESULT, call_id, b"x")))
            await anyio.wait_all_tasks_blocked()
            await a.send(encode(Frame(Kind.RESULT, 4, b"y")) + encode(Frame(Kind.END, 5)))
            await anyio.wait_all_tasks_blocked()
            if ending == "garbled":
                await a.send(b"\x00\x00\x00\x09\xff" + bytes(8))
            elif ending == "end":
                await a.send_eof()
            else:
                raw = a.extra(SocketAttribute.raw_socket)
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
                a.close()
    assert seen == [1, 2, 3, 4, 5]
    assert len(outcome) == 1


async def test_an_error_the_frame_handler_raises_reaches_the_receiver(pair) -> None:
    # A FrameError too: the frame the handler was given has left the buffer, so the receiver
    # would not meet the error again by parsing; it must be handed on, not dropped. Under trio
    # the handler is never used and the receiver gets every frame.
    import sniffio

    from anywool.runtime.wire._frames import FrameError, encode

    a, b = pair
    reader = FrameStream(b, b)
    raised = FrameError("the handler's own")
    handled: list[int] = []

    def handler(frame: Frame) -> None:
        if frame.call_id == 2:
            raise raised
        handled.append(frame.call_id)

    reader.deliver_while_waiting(handler)
    received: list[int] = []
    outcome: list[BaseException] = []

    async def receive_all() -> None:
        try:
            while True:
                received.append((await reader.receive()).call_id)
        except (FrameError, anyio.EndOfStream) as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive_all)
            await anyio.wait_all_tasks_blocked()
            await a.send(b"".join(encode(Frame(Kind.RESULT, i, b"x")) for i in (1, 2, 3)))
            await anyio.wait_all_tasks_blocked()
            await a.send_eof()
    if sniffio.current_async_library() == "asyncio":
        assert (handled, received, outcome) == ([1], [], [raised])
    else:
        assert handled == [] and received == [1, 2, 3]
        assert len(outcome) == 1 and isinstance(outcome[0], anyio.EndOfStream)


def test_importing_the_package_alone_still_reaches_its_submodules() -> None:
    # Eager imports used to bind them; code that did `import anywool; anywool.errors.X` works.
    code = ("import anywool; print(anywool.errors.WorkerError.__name__, "
            "anywool.metadata.WorkerMetadata.__name__, anywool.discovery.afilter.__name__); "
            "import anywool.runtime as r; print(r.routine.__name__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split() == ["WorkerError", "WorkerMetadata", "afilter", "routine"]
    code = "import anywool; anywool.nonexistent_module"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "has no attribute 'nonexistent_module'" in result.stderr


async def test_send_now_writes_a_small_frame_whole_or_not_at_all(pair) -> None:
    # What a plain function's call run where its frame was routed writes its ACK and reply
    # with: never half a frame, since nothing would write the rest.
    a, b = pair
    frames, reader = FrameStream(a, a), FrameStream(b, b)
    data = encode(Frame(Kind.ACK, 7, b"\x00\x00\x00\x01"))
    assert frames.can_send_now()
    assert frames.send_now(data)
    with anyio.fail_after(5):
        assert await reader.receive() == Frame(Kind.ACK, 7, b"\x00\x00\x00\x01")
    # Fill the socket until it takes nothing: then nothing is written, and it says so.
    filler = b"\x00" * 65536
    while a.try_send(filler):
        pass
    a_socket = a.extra(SocketAttribute.raw_socket)
    queued = _queued(a_socket)
    assert not frames.send_now(data)
    assert _queued(a_socket) == queued  # not a byte of it went


async def test_send_now_leaves_what_it_cannot_write_at_once_to_send(pair) -> None:
    a, b = pair
    frames, reader = FrameStream(a, a), FrameStream(b, b)
    assert not frames.send_now(b"\x00" * (SEND_NOW_AT_MOST + 1))  # too large for one write
    big = Frame(Kind.RETURN, 1, b"\x01" * (8 << 20))  # more than the socket holds
    received: list[Frame] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(frames.send, big)
            await anyio.wait_all_tasks_blocked()  # the big frame is being written
            assert not frames.can_send_now()
            assert not frames.send_now(encode(Frame(Kind.ACK, 2, b"")))  # it must go first
            received.append(await reader.receive())
    assert received == [big]
    assert frames.can_send_now()
    # Room in the socket, but a sender holds the stream (it is between two writes of one
    # frame): nothing may cut in.
    await frames._send_lock.acquire()
    try:
        assert not frames.can_send_now()
        assert not frames.send_now(encode(Frame(Kind.ACK, 3, b"")))
        assert b.try_receive() is None
    finally:
        frames._send_lock.release()


async def test_send_now_writes_nothing_over_tcp() -> None:
    # Over TCP a small write may be taken in part: send_now leaves it to send().
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    finally:
        listener.close()
    a, b = SocketStream(client), SocketStream(server)
    try:
        frames = FrameStream(a, a)
        assert not frames.can_send_now()
        assert not frames.send_now(encode(Frame(Kind.ACK, 1, b"")))
        assert b.try_receive() is None
    finally:
        a.close()
        b.close()


def _queued(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s send queue (Linux SIOCOUTQ)."""
    import fcntl
    import struct
    import termios

    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
