"""Frame codec: round trip, size limit checked before the body, truncated streams."""

from __future__ import annotations

import struct

import anyio
import pytest

from anywool.runtime._wire import Frame, FrameError, FrameStream, Kind, encode

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
