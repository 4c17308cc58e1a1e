"""Frame codec: round trip, size limit checked before the body, truncated streams."""

from __future__ import annotations

import struct

import anyio
import pytest

from anywool.runtime.wire import _frames
from anywool.runtime.wire._frames import Frame, FrameError, FrameStream, Kind, encode

pytestmark = pytest.mark.anyio


class _Bytes(anyio.abc.ByteReceiveStream):
    """A byte receive stream over fixed chunks that records how much was read."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)
        self.delivered = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        chunk = self._chunks.pop(0)
        self.delivered += len(chunk)
        return chunk

    async def aclose(self) -> None:
        self._chunks.clear()


class _Sink(anyio.abc.ByteSendStream):
    def __init__(self) -> None:
        self.data = bytearray()

    async def send(self, item: bytes) -> None:
        self.data += item

    async def aclose(self) -> None:
        pass


async def test_frames_round_trip_in_order() -> None:
    frames = [
        Frame(Kind.CALL, 1, b"payload"),
        Frame(Kind.ACK, 1),
        Frame(Kind.RESULT, 2**63, bytes(range(256)) * 10),
        Frame(Kind.END, 1),
    ]
    sink = _Sink()
    with anyio.fail_after(5):
        writer = FrameStream(sink, _Bytes())
        for frame in frames:
            await writer.send(frame)
        data = bytes(sink.data)
        # Deliver the bytes in awkward 3-byte pieces: frames must not depend on chunking.
        reader = FrameStream(_Sink(), _Bytes(*[data[i : i + 3] for i in range(0, len(data), 3)]))
        received = [await reader.receive() for _ in frames]
        with pytest.raises(anyio.EndOfStream):
            await reader.receive()
    assert received == frames


async def test_oversize_frame_is_rejected_before_its_body_is_read() -> None:
    header = struct.pack(">I", 1024 * 1024)
    source = _Bytes(header, b"x" * 1024 * 1024)
    reader = FrameStream(_Sink(), source, max_frame_size=1024)
    with anyio.fail_after(5):
        with pytest.raises(FrameError, match="exceeds the maximum of 1024 bytes"):
            await reader.receive()
    assert source.delivered == len(header)


async def test_oversize_frame_is_not_sent() -> None:
    sink = _Sink()
    writer = FrameStream(sink, _Bytes(), max_frame_size=64)
    with anyio.fail_after(5), pytest.raises(FrameError, match="exceeds the maximum"):
        await writer.send(Frame(Kind.RESULT, 1, b"y" * 100))
    assert sink.data == b""


async def test_stream_ending_inside_a_body_is_an_error() -> None:
    data = encode(Frame(Kind.RESULT, 7, b"z" * 50))
    reader = FrameStream(_Sink(), _Bytes(data[:-10]))
    with anyio.fail_after(5), pytest.raises(FrameError, match="inside a frame body"):
        await reader.receive()


async def test_stream_ending_inside_a_header_is_an_error() -> None:
    reader = FrameStream(_Sink(), _Bytes(b"\x00\x00"))
    with anyio.fail_after(5), pytest.raises(FrameError, match="inside a frame header"):
        await reader.receive()


@pytest.mark.parametrize(("body", "error"), [
    (b"\xc1" + bytes(8) + b"payload", "unknown frame kind 193"),
    (b"\x01\x00\x00", "shorter than its kind and call id"),
])
async def test_garbled_body_is_an_error(body: bytes, error: str) -> None:
    reader = FrameStream(_Sink(), _Bytes(struct.pack(">I", len(body)) + body))
    with anyio.fail_after(5), pytest.raises(FrameError, match=error):
        await reader.receive()


async def test_frames_cross_a_real_socket_pair() -> None:
    with anyio.fail_after(5):
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            received: list[Frame] = []

            async def serve_one(stream: anyio.abc.ByteStream) -> None:
                frames = FrameStream(stream, stream)
                frame = await frames.receive()
                await frames.send(Frame(Kind.RESULT, frame.call_id, frame.payload[::-1]))
                await stream.aclose()

            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, serve_one)
                async with await anyio.connect_tcp("127.0.0.1", port) as client:
                    frames = FrameStream(client, client)
                    await frames.send(Frame(Kind.CALL, 3, b"abc"))
                    received.append(await frames.receive())
                tg.cancel_scope.cancel()
    assert received == [Frame(Kind.RESULT, 3, b"cba")]


# -- large payloads: sent in parts, received in place (issue 20) ----------------------------


def _socket_pair() -> tuple[FrameStream, FrameStream]:
    """Frames over both ends of a Unix socket pair (the raw-socket paths)."""
    import socket

    from anywool.runtime.wire._socket import SocketStream

    left, right = (SocketStream(sock) for sock in socket.socketpair())
    return FrameStream(left, left), FrameStream(right, right)


def _close(*frames: FrameStream) -> None:
    from anywool.runtime.wire._socket import SocketStream

    for each in frames:
        stream = each.stream
        assert isinstance(stream, SocketStream)
        stream.close()


def _random_bytes(size: int, seed: int = 0) -> bytes:
    import random

    return random.Random(seed).randbytes(size)


async def test_a_payload_in_parts_arrives_as_if_joined() -> None:
    from anywool.runtime.wire._frames import Parts

    big = _random_bytes(3 * 1024 * 1024)
    pieces = [b"head", big, bytearray(b"middle" * 5000), memoryview(big)[::-1].tobytes(), b""]
    parts = Parts(list(pieces), sum(len(p) for p in pieces))
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sender.send_parts, Kind.RESULT, 9, parts)
                frame = await receiver.receive()
                tg.start_soon(sender.send_parts, Kind.RESULT, 10, Parts([b"ab", b"cd"], 4))
                small = await receiver.receive()
    finally:
        _close(sender, receiver)
    assert (frame.kind, frame.call_id) == (Kind.RESULT, 9)
    assert bytes(frame.payload) == parts.join()
    assert small == Frame(Kind.RESULT, 10, b"abcd")


async def test_large_payloads_in_parts_cross_a_tls_stream() -> None:
    # Over anything but a plain socket the parts go through the stream's own send.
    from anywool.runtime.wire._frames import Parts

    big = _random_bytes(2 * 1024 * 1024, seed=1)
    sink = _Sink()
    writer = FrameStream(sink, _Bytes())
    with anyio.fail_after(10):
        await writer.send_parts(Kind.CALL, 4, Parts([b"x" * 10, big, b"y" * 10], len(big) + 20))
        data = bytes(sink.data)
        reader = FrameStream(_Sink(), _Bytes(*[data[i:i + 100_000]
                                               for i in range(0, len(data), 100_000)]))
        frame = await reader.receive()
    assert frame == Frame(Kind.CALL, 4, b"x" * 10 + big + b"y" * 10)


async def test_a_body_received_in_place_is_not_reused_while_its_frame_is_held() -> None:
    payloads = [_random_bytes(1024 * 1024 + 7, seed=seed) for seed in range(4)]
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for call_id, payload in enumerate(payloads):
                    tg.start_soon(sender.send, Frame(Kind.RESULT, call_id, payload))
                held = await receiver.receive()       # kept while the next ones arrive
                second = await receiver.receive()
                assert bytes(second.payload) == payloads[second.call_id]
                del second                            # its buffer may serve the next one
                third = await receiver.receive()
                fourth = await receiver.receive()
    finally:
        _close(sender, receiver)
    got = {frame.call_id: bytes(frame.payload) for frame in (held, third, fourth)}
    assert got == {i: payloads[i] for i in got}
    assert bytes(held.payload) == payloads[held.call_id]


def _decoy_body(size: int, call_id: int) -> bytes:
    """A CALL frame body whose payload is CANCEL frames for ``call_id`` over and over: what a
    look-ahead that lost its place would take for the real thing."""
    decoy = encode(Frame(Kind.CANCEL, call_id))
    payload = (decoy * (size // len(decoy) + 1))[:size]
    return encode(Frame(Kind.CALL, 1, payload))


async def _write_raw(frames: FrameStream, data: bytes) -> None:
    await frames.stream.send(data)


async def test_pending_finds_a_cancel_behind_a_body_being_received_in_place() -> None:
    big = _decoy_body(900 * 1024, call_id=5)
    cancel = encode(Frame(Kind.CANCEL, 5))
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            await _write_raw(sender, big[:200 * 1024])
            with anyio.move_on_after(0.2):  # reads what is there: the body is begun in place
                await receiver.receive()
            assert not receiver.pending(Kind.CANCEL, 5)
            await _write_raw(sender, big[200 * 1024:])
            assert not receiver.pending(Kind.CANCEL, 5)  # the decoys are payload, not frames
            await _write_raw(sender, cancel)
            assert receiver.pending(Kind.CANCEL, 5)
            assert not receiver.pending(Kind.CANCEL, 6)
            assert not receiver.pending(Kind.ACK, 5)
            frame = await receiver.receive()
            assert receiver.pending(Kind.CANCEL, 5)  # still not received
            assert await receiver.receive() == Frame(Kind.CANCEL, 5)
            assert not receiver.pending(Kind.CANCEL, 5)
    finally:
        _close(sender, receiver)
    assert encode(frame) == big


async def test_pending_looks_past_a_large_frame_the_socket_holds_whole() -> None:
    # A frame of more than the look-ahead's step, all of it in the socket, then the cancel.
    big = _decoy_body(1024 * 1024, call_id=5)
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            await _write_raw(sender, big + encode(Frame(Kind.CANCEL, 5)))
            assert receiver.pending(Kind.CANCEL, 5)
            assert not receiver.pending(Kind.CANCEL, 6)
    finally:
        _close(sender, receiver)


async def test_pending_finds_a_cancel_behind_many_small_frames() -> None:
    # Small frames filling several times the first look, then the cancel: the look widens.
    calls = b"".join(encode(Frame(Kind.CALL, i, b"x" * 300)) for i in range(10, 410))
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            await _write_raw(sender, calls + encode(Frame(Kind.CANCEL, 5)))
            assert len(calls) > 4 * _frames._PEEK_FIRST
            assert receiver.pending(Kind.CANCEL, 5)
            assert not receiver.pending(Kind.CANCEL, 6)
            assert receiver.pending(Kind.CALL, 409)
    finally:
        _close(sender, receiver)


async def test_pending_says_no_when_the_cancel_lies_beyond_what_it_may_look_at(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_frames, "_PEEK_MAX", 512 * 1024)
    big = _decoy_body(700 * 1024, call_id=5)
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            await _write_raw(sender, big + encode(Frame(Kind.CANCEL, 5)))
            assert not receiver.pending(Kind.CANCEL, 5)  # cannot tell: never a false yes
            await _write_raw(sender, b"")
            await receiver.receive()
            assert receiver.pending(Kind.CANCEL, 5)
    finally:
        _close(sender, receiver)


async def test_a_sender_cancelled_in_a_large_frame_still_writes_it_whole() -> None:
    big = _random_bytes(6 * 1024 * 1024, seed=3)
    sender, receiver = _socket_pair()
    received: list[Frame] = []

    async def receive_two() -> None:
        await anyio.sleep(0.1)  # the sender is cancelled while the socket is full
        received.extend([await receiver.receive(), await receiver.receive()])

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive_two)
                with anyio.move_on_after(0.02) as scope:  # the socket takes 2 MiB, then waits
                    await sender.send(Frame(Kind.CALL, 1, big))
                await sender.send(Frame(Kind.CALL, 2, b"after"))
    finally:
        _close(sender, receiver)
    assert not scope.cancelled_caught  # a frame, once started, is written whole, shielded
    first, second = received
    assert (first.call_id, bytes(first.payload) == big) == (1, True)
    assert second == Frame(Kind.CALL, 2, b"after")


async def test_a_stream_ending_inside_a_body_received_in_place_is_an_error() -> None:
    data = encode(Frame(Kind.RESULT, 7, b"z" * 200_000))
    reader = FrameStream(_Sink(), _Bytes(data[:100_000], data[100_000:-10]))
    with anyio.fail_after(5), pytest.raises(FrameError, match="inside a frame body"):
        await reader.receive()


async def test_a_stream_giving_more_than_a_body_lacks_keeps_the_rest_for_the_next_frames(
        ) -> None:
    # _Bytes ignores how much is asked for, as a careless stream might.
    first, second = Frame(Kind.RESULT, 1, b"a" * 200_000), Frame(Kind.RESULT, 2, b"b" * 10)
    data = encode(first) + encode(second)
    reader = FrameStream(_Sink(), _Bytes(data[:100_000], data[100_000:]))
    with anyio.fail_after(5):
        assert [await reader.receive(), await reader.receive()] == [first, second]


@pytest.mark.parametrize("size", [10, 100_000])
async def test_a_frame_arriving_a_few_bytes_at_a_time_over_a_socket(size: int) -> None:
    data = encode(Frame(Kind.RESULT, 3, b"p" * size))
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            for piece in (data[:1], data[1:2], data[2:20]):
                await _write_raw(sender, piece)
                with anyio.move_on_after(0.05):
                    await receiver.receive()
            await _write_raw(sender, data[20:])
            frame = await receiver.receive()
    finally:
        _close(sender, receiver)
    assert frame == Frame(Kind.RESULT, 3, b"p" * size)


async def test_a_body_received_in_place_is_reused_once_nothing_refers_to_it() -> None:
    # The next large frame is received into the same memory (a new bytearray would be zeroed
    # and faulted in again); one still held is never received into.
    payloads = [_random_bytes(1024 * 1024 + 7, seed=seed) for seed in range(3)]
    sender, receiver = _socket_pair()
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sender.send, Frame(Kind.RESULT, 0, payloads[0]))
                first = await receiver.receive()
                buffer = id(first.payload)
                del first
                tg.start_soon(sender.send, Frame(Kind.RESULT, 1, payloads[1]))
                second = await receiver.receive()
                assert isinstance(second.payload, memoryview)
                assert id(second.payload.obj) == buffer
                tg.start_soon(sender.send, Frame(Kind.RESULT, 2, payloads[2]))
                third = await receiver.receive()  # second is held: another buffer
    finally:
        _close(sender, receiver)
    assert bytes(second.payload) == payloads[1] and bytes(third.payload) == payloads[2]
    assert isinstance(third.payload, bytearray) or id(third.payload.obj) != buffer
