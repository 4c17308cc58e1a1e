"""Frames: the unit of the worker protocol, and their codec over AnyIO byte streams.

A frame on the wire is a 4-byte big-endian body length followed by the body, a msgpack array
``[kind, call_id, payload]`` (``payload`` is opaque bytes, usually cloudpickle). The length is
checked against ``max_frame_size`` before any of the body is read, so a corrupt or hostile
length never makes us allocate gigabytes.

Per call the worker answers ``Ack? (Result* (Exception | End)) | Nack``:

* ``CALL`` (client → worker) carries the routine, its arguments and what travels with them
  (the caller's deadline, context variables, the pool the call tree started from; see
  :mod:`anywool.runtime._envelope` for every payload);
* ``ACK`` says the worker accepted it; ``NACK`` that it refused it without running anything
  (it is stopping, or at its ``max_concurrency``: then it sends ``ROOM``, call id 0, once it
  has room again);
* a coroutine answers one ``RESULT`` then ``END``;
* an async generator answers one frame per step the client drives with ``ASEND``, ``ATHROW``
  or ``ACLOSE``: ``RESULT`` (a yielded item), ``END`` (exhausted or closed) or ``EXCEPTION``;
* ``CANCEL`` (client → worker) cancels the routine; the worker still ends the call with
  ``EXCEPTION`` (a :class:`~anywool.errors.RoutineCancelled`), ``END`` or, when it had already
  finished, whatever it had sent.

This module does framing only; it knows nothing of routines or pickles.
"""

from __future__ import annotations

import enum
import socket
import struct
from dataclasses import dataclass
from typing import cast

import anyio
import msgpack
from anyio.abc import ByteReceiveStream, ByteSendStream, ByteStream, SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from anywool.errors import WoolError

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024  # bytes

_HEADER = struct.Struct(">I")


class Kind(enum.IntEnum):
    """What a frame means; see the module docstring for the sequence per call."""

    CALL = 1
    ACK = 2
    NACK = 3
    RESULT = 4
    EXCEPTION = 5
    END = 6
    CANCEL = 7
    ASEND = 8
    ATHROW = 9
    ACLOSE = 10
    ROOM = 11


@dataclass(frozen=True, slots=True)
class Frame:
    """One protocol message.

    :param kind: the frame kind.
    :param call_id: the call it belongs to, an unsigned 64-bit integer chosen by the client.
    :param payload: opaque bytes (empty when the kind carries nothing).
    """

    kind: Kind
    call_id: int
    payload: bytes = b""


class FrameError(WoolError):
    """The byte stream does not carry well-formed frames (truncated, oversized or garbled).

    :param reason: what was wrong, in words.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"malformed frame stream: {self.reason}"


# The msgpack envelope around a payload: array, kind, call id (up to 9 bytes), bin32 header.
ENVELOPE_OVERHEAD = 16


def payload_limit(max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> int:
    """The largest payload (bytes) that always fits a frame of ``max_frame_size`` bytes."""
    return max_frame_size - ENVELOPE_OVERHEAD


def encode(frame: Frame, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The wire bytes of ``frame`` (header included).

    :raises FrameError: the body would exceed ``max_frame_size`` bytes.
    """
    body = cast(bytes, msgpack.packb([int(frame.kind), frame.call_id, frame.payload], use_bin_type=True))
    if len(body) > max_frame_size:
        raise FrameError(
            f"a {frame.kind.name} frame of {len(body)} bytes exceeds the maximum of "
            f"{max_frame_size} bytes"
        )
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> Frame:
    """Parse a frame body (without its length header).

    :raises FrameError: the body is not ``[kind, call_id, payload]`` with a known kind.
    """
    try:
        # Every length a body may declare is bounded by the body itself: a few hostile bytes
        # never make the decoder reserve more than they could hold.
        kind, call_id, payload = msgpack.unpackb(
            body, raw=False, max_bin_len=len(body), max_str_len=0, max_array_len=3,
            max_map_len=0, max_ext_len=0)
        return Frame(Kind(kind), int(call_id), bytes(payload))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable frame body ({exc})") from None


class FrameStream:
    """Frames over a byte stream; safe for many concurrent senders and one receiver.

    :param send_stream: where frames are written (usually the same object as ``receive_stream``).
    :param receive_stream: where frames are read.
    :param max_frame_size: largest accepted body, in bytes (≥ 1), in both directions.
    """

    def __init__(
        self,
        send_stream: ByteSendStream,
        receive_stream: ByteReceiveStream,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        if isinstance(max_frame_size, bool) or not isinstance(max_frame_size, int):
            raise TypeError(f"max_frame_size must be an int, got {max_frame_size!r}")
        if max_frame_size < 1:
            raise ValueError(f"max_frame_size must be at least 1, got {max_frame_size}")
        self._send_stream = send_stream
        self._receive = BufferedByteReceiveStream(receive_stream)
        self._max = max_frame_size
        self._send_lock = anyio.Lock()
        self.send_timeout = 30.0

    @property
    def max_frame_size(self) -> int:
        return self._max

    async def send(self, frame: Frame) -> None:
        """Write one frame atomically with respect to other senders.

        :raises FrameError: the frame is too large; nothing was written.
        :raises anyio.BrokenResourceError: the peer is gone.
        :raises anyio.ClosedResourceError: the stream was closed locally.

        Cancellation: waiting for the send lock is cancellable, and a cancellation raised here
        means that nothing was written; once writing starts the frame is written whole
        (shielded, for at most ``send_timeout`` seconds, after which the stream is closed and
        ``BrokenResourceError`` raised), so a cancelled sender never corrupts it.
        """
        data = encode(frame, self._max)
        async with self._send_lock:
            # Shielded: a frame cut short by a cancelled sender would corrupt the stream for
            # every other call on it. Bounded: a peer that stops reading breaks the stream.
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + self.send_timeout
                await self._send_stream.send(data)
            if scope.cancelled_caught:
                await anyio.aclose_forcefully(self._send_stream)
                raise anyio.BrokenResourceError(
                    f"the peer read nothing for {self.send_timeout} s; the stream was closed")

    @property
    def stream(self) -> ByteSendStream:
        """The stream frames are written to."""
        return self._send_stream

    @property
    def writing(self) -> bool:
        """Whether a frame is being written (or a half-close waits to be made)."""
        return self._send_lock.locked()

    async def wait_written(self) -> None:
        """Wait until no frame is being written."""
        async with self._send_lock:
            pass

    async def send_eof(self) -> None:
        """Half-close the send side once the frame being written, if any, is written whole.

        No write is ever pending when the stream is half-closed (anyio refuses a half-close
        under a write with ``BusyResourceError``), and every later send fails at once
        (``BrokenResourceError``) instead of waiting to write: so after it the stream can be
        closed with no write pending on it.

        :raises anyio.BrokenResourceError: the peer is gone.
        :raises anyio.ClosedResourceError: the stream was closed locally.
        :raises OSError: the OS reported the failure unwrapped (e.g. ``ENOTCONN``).

        Cancellation: only the wait for the frame being written is cancellable; nothing is
        done then.
        """
        stream = self._send_stream
        if not isinstance(stream, ByteStream):
            raise TypeError(f"cannot half-close {stream!r}: not a ByteStream")
        async with self._send_lock:
            try:
                await stream.send_eof()
            except NotImplementedError:
                # A TLS stream cannot half-close (TLS 1.2 has no half-close; anyio implements
                # none for 1.3): shut down the socket's send side under it. The peer reads a
                # ragged end-of-stream, which a stream wrapped with standard_compatible=False
                # reports as its end.
                raw = stream.extra(SocketAttribute.raw_socket, None)
                if raw is None:
                    raise
                try:
                    raw.shutdown(socket.SHUT_WR)
                except OSError as exc:
                    raise anyio.BrokenResourceError from exc

    async def receive(self) -> Frame:
        """Read the next frame.

        :raises anyio.EndOfStream: the peer closed the stream cleanly between frames.
        :raises FrameError: the stream ended inside a frame, announced a body larger than
            ``max_frame_size`` (checked before reading the body), or the body is garbled.
        :raises anyio.BrokenResourceError: the connection failed.
        """
        try:
            header = await self._receive.receive_exactly(_HEADER.size)
        except anyio.IncompleteRead:
            if self._receive.buffer:
                raise FrameError("the stream ended inside a frame header") from None
            raise anyio.EndOfStream from None
        (length,) = _HEADER.unpack(header)
        if length > self._max:
            raise FrameError(
                f"announced frame body of {length} bytes exceeds the maximum of {self._max} bytes"
            )
        try:
            body = await self._receive.receive_exactly(length)
        except anyio.IncompleteRead:
            raise FrameError(
                f"the stream ended inside a frame body ({length} bytes announced)"
            ) from None
        return decode_body(body)


def shut_down(stream: object) -> None:
    """Shut a socket stream down both ways (``SHUT_RDWR``) without closing it.

    Its pending receive then ends with end-of-stream and its pending send with a broken pipe,
    each woken by the socket turning ready, as any receive or send is. Closing the stream under
    them instead resolves their waits itself: under asyncio, anyio then reports
    ``InvalidStateError`` when the socket turned ready in the same loop iteration, and
    ``EBADF`` when a receive and a send were both pending. Not a socket: nothing to do.
    """
    extra = getattr(stream, "extra", None)
    sock = None if extra is None else extra(SocketAttribute.raw_socket, None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more: nothing is pending on it
