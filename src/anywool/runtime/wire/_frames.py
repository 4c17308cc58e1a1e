"""Frames: the unit of the worker protocol, and their codec over AnyIO byte streams.

A frame on the wire is a 4-byte big-endian body length followed by the body: the kind (1 byte),
the call id (8 bytes, big-endian) and the payload (opaque bytes, usually msgpack around
cloudpickles). The length is checked against ``max_frame_size`` before any of the body is read,
so a corrupt or hostile length never makes us allocate gigabytes.

A worker first sends ``HELLO`` (call id 0) on every connection: what a client should know of
it before it sends calls (its ``max_concurrency``; see :mod:`anywool.runtime.wire._envelope`).

Per call the worker answers ``Ack (Return | Result* (Exception | End)) | Exception | Nack``:

* ``CALL`` (client → worker) carries the routine, its arguments and what travels with them
  (the caller's deadline, context variables, the pool the call tree started from; see
  :mod:`anywool.runtime.wire._envelope` for every payload);
* ``ACK`` says the worker accepted it, and is written before the routine runs; ``NACK`` that
  it refused it without running anything (it is stopping, or at its ``max_concurrency``: then
  it sends ``ROOM``, call id 0, once it has room again); ``EXCEPTION`` without an ``ACK``, that
  it could not load the call;
* a coroutine answers one ``RETURN`` (its value; the call's end) or ``EXCEPTION``;
* an async generator answers one frame per step the client drives with ``ASEND``, ``ATHROW``
  or ``ACLOSE``: ``RESULT`` (a yielded item), ``END`` (exhausted or closed) or ``EXCEPTION``;
* ``CANCEL`` (client → worker) cancels the routine; the worker answers ``CANCELLING`` as soon
  as its event loop reads it (so the client knows the worker took it, however long the routine
  takes to unwind), and still ends the call with ``EXCEPTION`` (a
  :class:`~anywool.errors.RoutineCancelled`), ``END`` or, when it had already finished,
  whatever ended it (``RETURN`` included);
* ``OUTPUT`` (worker → client) carries what the routine logged or printed while the call ran
  (see :mod:`anywool.runtime._output`); a call's output frames precede its last reply;
* ``STATS`` asks a worker how it is doing (client → worker, with a call id of the client's
  choosing, never a call's) and carries the answer back under the same id;
* ``RECYCLE`` asks a worker's pool for a rolling restart of the workers it spawned (client →
  worker, an id as for ``STATS``; the answer, accepted or refused, comes back under that id).

How the bytes move. A frame is sent with one system call when the socket takes it at once: a
small one (up to :data:`_JOIN_AT_MOST` bytes of payload) joined into one ``bytes`` with its
header, a larger one as a vectored send of its header and its payload's parts
(:class:`Parts`, e.g. a pickle's pieces and out-of-band buffers, never joined: joining 16 MiB
cost 3-4 ms and the peak memory of a second copy). Frames are read from a receive buffer in
reads of up to 64 KiB; a frame whose body is larger than that and not in the buffer yet is
received in place: its payload gets a buffer of exactly its size (what the receive buffer, or
the read that brought its header, holds of it is moved there), which the socket reads straight
into (``recv_into``) for as many bytes as are missing, and which becomes the frame's payload as it is. That buffer is
the previous one's again when nothing refers to the previous one any more (a new
``bytearray`` is zeroed and its memory faulted in as it is made). Growing the receive buffer
as a large body arrived instead (1 MiB at a time, each read a new ``bytes``, then appended,
then the body copied out of the buffer) would copy every byte three times and regrow the
buffer on top of the kernel's copy, which is the only one left.

This module does framing only; it knows nothing of routines or pickles.
"""

from __future__ import annotations

import enum
import socket
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream, ByteSendStream, ByteStream, SocketAttribute

from anywool.errors import WoolError
from anywool.runtime.wire._socket import RECEIVE_SIZE, Buffer, SocketStream, advance

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024  # bytes

# A frame: its body's length (4 bytes), then the body: kind (1 byte), call id (8), payload.
_LENGTH = struct.Struct(">I")
_KIND_AND_ID = struct.Struct(">BQ")
_HEADER = struct.Struct(">IBQ")
CALL_ID_LIMIT = 1 << 64  # call ids, a caller's too, are unsigned 64-bit ints: below this


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
    RETURN = 12
    CANCELLING = 13
    HELLO = 14
    OUTPUT = 15
    STATS = 16
    RECYCLE = 17


@dataclass(frozen=True, slots=True)
class Frame:
    """One protocol message.

    :param kind: the frame kind.
    :param call_id: the call it belongs to, an unsigned 64-bit integer chosen by the client.
    :param payload: opaque bytes (empty when the kind carries nothing); a frame received has
        ``bytes``, or for a large body the buffer it was received into: a ``bytearray``, or a
        ``memoryview`` of one that its stream receives into again once nothing refers to it.
    """

    kind: Kind
    call_id: int
    payload: Buffer = b""


class Parts:
    """A payload to send in pieces, as if they were joined (see :meth:`FrameStream.send_parts`).

    :param pieces: bytes-like objects, written in order and never copied here.
    :param nbytes: their total size in bytes.
    """

    __slots__ = ("pieces", "nbytes")

    def __init__(self, pieces: list[Buffer], nbytes: int) -> None:
        self.pieces = pieces
        self.nbytes = nbytes

    def join(self) -> bytes:
        """The payload as one ``bytes`` (a copy)."""
        return b"".join(self.pieces)


class FrameError(WoolError):
    """The byte stream does not carry well-formed frames (truncated, oversized or garbled).

    :param reason: what was wrong, in words.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"malformed frame stream: {self.reason}"


# What a frame holds besides its payload: the kind (1 byte) and the call id (8 bytes).
ENVELOPE_OVERHEAD = _KIND_AND_ID.size
# Payload bytes up to which a body is sliced out of the read buffer rather than viewed.
_SLICE_AT_MOST = 4096

_KINDS: dict[int, Kind] = {int(kind): kind for kind in Kind}
# Consecutive frames a receiver may take without waiting before it lets other tasks run.
_STREAK = 64
# A frame body larger than this that is not in the receive buffer yet is received in place.
_IN_PLACE_ABOVE = RECEIVE_SIZE
# Payloads up to this size are joined with their frame's header and sent as one bytes (the
# copy costs less than building the vectored send's buffer list); larger ones go as a
# vectored send of their parts.
_JOIN_AT_MOST = 16 * 1024
#: The most FrameStream.send_now writes: less than one buffer of the kernel's for a Unix
#: stream socket (about 36 KiB on Linux), which such a socket takes whole or not at all.
SEND_NOW_AT_MOST = 16 * 1024
# The bytes of the socket that FrameStream.pending looks at past the frames it skips, and the
# most it looks at in all (a socket holds less: its buffers are smaller).
_PEEK_SIZE = 1 << 18
_PEEK_MAX = 1 << 24
# What it looks at first past the frames it skips, doubled up to _PEEK_SIZE as it needs more:
# a worker asks for each call that started late, mostly with a few small frames in the socket,
# and a peek allocates what it asks for (256 KiB is an mmap and its page faults each time).
_PEEK_FIRST = 1 << 14
# The largest body received in place that is kept to receive the next one into.
_SPARE_AT_MOST = 32 << 20
# What sys.getrefcount says of that body in _begin_body when nothing else refers to it.
_UNREFERENCED = 3


def payload_limit(max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> int:
    """The largest payload (bytes) that always fits a frame of ``max_frame_size`` bytes."""
    return max_frame_size - ENVELOPE_OVERHEAD


def _header(kind: Kind, call_id: int, size: int, max_frame_size: int) -> bytes:
    """The length, kind and call id of a frame whose payload has ``size`` bytes.

    :raises FrameError: the body would exceed ``max_frame_size`` bytes, or the call id is not
        an unsigned 64-bit int.
    """
    length = ENVELOPE_OVERHEAD + size
    if length > max_frame_size:
        raise FrameError(
            f"a {kind.name} frame of {length} bytes exceeds the maximum of "
            f"{max_frame_size} bytes"
        )
    if not 0 <= call_id < CALL_ID_LIMIT:
        raise FrameError(f"a call id must be an unsigned 64-bit int, got {call_id!r}")
    return _HEADER.pack(length, kind, call_id)


def encode(frame: Frame, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """The wire bytes of ``frame`` (header included).

    :raises FrameError: the body would exceed ``max_frame_size`` bytes.
    """
    payload = frame.payload
    size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    return _header(frame.kind, frame.call_id, size, max_frame_size) + payload


def encode_parts(kind: Kind, call_id: int, parts: Parts,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """A frame's bytes whose payload is ``parts``, joined.

    :raises FrameError: the frame is too large.
    """
    return _header(kind, call_id, parts.nbytes, max_frame_size) + b"".join(parts.pieces)


def decode_body(body: bytes) -> Frame:
    """Parse a frame body (without its length header).

    :raises FrameError: the body is shorter than a kind and a call id, or the kind is unknown.
    """
    return _parse_body(body, 0, len(body))


def _too_short(length: int) -> FrameError:
    return FrameError(f"a frame body of {length} bytes is shorter than its kind and call id "
                      f"({ENVELOPE_OVERHEAD} bytes)")


def _parse_body(data: bytes | bytearray, start: int, end: int) -> Frame:
    """The frame whose body is ``data[start:end]``.

    :raises FrameError: the body is shorter than a kind and a call id, or the kind is unknown.
    """
    if end - start < ENVELOPE_OVERHEAD:
        raise _too_short(end - start)
    kind, call_id = _KIND_AND_ID.unpack_from(data, start)
    known = _KINDS.get(kind)
    if known is None:
        raise FrameError(f"unknown frame kind {kind}")
    start += ENVELOPE_OVERHEAD
    # A large payload through a view: slicing the buffer would copy it once more. A small one
    # is cheaper sliced than viewed.
    body = data[start:end] if end - start <= _SLICE_AT_MOST else memoryview(data)[start:end]
    return Frame(known, call_id, bytes(body))


class FrameStream:
    """Frames over a byte stream; safe for many concurrent senders and one receiver.

    :param send_stream: where frames are written (usually the same object as ``receive_stream``).
    :param receive_stream: where frames are read.
    :param max_frame_size: largest accepted body, in bytes (≥ 1), in both directions.

    Over a :class:`~anywool.runtime.wire._socket.SocketStream` (a plain Unix or TCP connection) a
    frame the socket takes, or holds, at once is written or read without waiting: one system
    call, no checkpoint. A receiver that finds frame after frame waiting lets other tasks run
    every 64 frames.
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
        if max_frame_size < ENVELOPE_OVERHEAD:
            raise ValueError(f"max_frame_size must be at least {ENVELOPE_OVERHEAD}, "
                             f"got {max_frame_size}")
        self._send_stream = send_stream
        self._receive_stream = receive_stream
        self._raw_send = send_stream if isinstance(send_stream, SocketStream) else None
        self._unix = self._raw_send is not None and self._raw_send.unix
        self._raw_receive = receive_stream if isinstance(receive_stream, SocketStream) else None
        self._buffer = bytearray()
        # The body of the frame being received in place (see _begin_body): its payload, how
        # much of it arrived, its kind and call id. The receive buffer is empty meanwhile.
        self._body: Buffer | None = None
        self._spare: bytearray | None = None  # the last body received in place (_begin_body)
        self._body_view = memoryview(b"")
        self._got = 0
        self._body_kind = Kind.CALL
        self._body_id = 0
        self._reading = False  # a read is being added to the buffer or body (see pending)
        self._ended = False
        self._streak = 0
        # Set by _drain (the readiness callback) for the receiver waiting in _fill: it read.
        self._drained = False
        self._drain_error: Exception | None = None
        self._handler: Callable[[Frame], None] | None = None
        self._max = max_frame_size
        self._send_lock = anyio.Lock(fast_acquire=True)
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
        ``BrokenResourceError`` raised), so a cancelled sender never corrupts it. A frame the
        socket takes at once is written without waiting (a cancellation already pending is
        raised first, and nothing is written).
        """
        await self._send(encode(frame, self._max))

    async def send_parts(self, kind: Kind, call_id: int, parts: Parts, *,
                         not_cancelled: bool = False) -> None:
        """Write one frame whose payload is ``parts`` (as :meth:`send` does), without joining
        large parts: one vectored send of the header and the parts where the socket takes
        them at once. The parts are read as they are written, so they must not change until
        this returns.

        :param not_cancelled: the caller found, with nothing awaited since, that no
            cancellation is pending (``current_effective_deadline()`` ahead of the clock):
            the check of :meth:`send` is not made again.
        :raises FrameError: the frame is too large; nothing was written.
        :raises anyio.BrokenResourceError: the peer is gone.
        :raises anyio.ClosedResourceError: the stream was closed locally.

        Cancellation: as for :meth:`send`.
        """
        header = _header(kind, call_id, parts.nbytes, self._max)
        if parts.nbytes <= _JOIN_AT_MOST:
            await self._send(header + b"".join(parts.pieces), not_cancelled)
        else:
            await self._send([header, *parts.pieces], not_cancelled)

    async def _send(self, data: bytes | Sequence[Buffer], not_cancelled: bool = False) -> None:
        # A cancelled sender writes nothing. (It raises a pending cancellation only, without
        # letting other tasks run: the lock's state below is as seen.) The check walks every
        # enclosing cancel scope: a caller that just did so is spared a second walk.
        if not not_cancelled:
            await anyio.lowlevel.checkpoint_if_cancelled()
        raw, lock = self._raw_send, self._send_lock
        if raw is not None and not lock.locked():
            if isinstance(data, bytes):
                written = raw.try_send(data)
                if written == len(data):
                    return
                rest: Sequence[Buffer] = [memoryview(data)[written:]]
            else:
                views = [memoryview(piece).cast("B") for piece in data]
                written = raw.try_send_many(views)
                rest = advance(views, written)
                if not rest:
                    return
            # Part of it is written: the rest goes before any other frame. Nothing awaited since
            # the lock was seen free, so it is ours at once.
            lock.acquire_nowait()
            try:
                await self._write(rest)
            finally:
                lock.release()
            return
        async with lock:
            await self._write(data)

    async def _write(self, data: bytes | Sequence[Buffer]) -> None:
        # Shielded: a frame cut short by a cancelled sender would corrupt the stream for every
        # other call on it. Bounded: a peer that stops reading breaks the stream.
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self.send_timeout
            stream = self._send_stream
            if isinstance(data, bytes):
                await stream.send(data)
            elif isinstance(stream, SocketStream):
                await stream.send_many(data)
            else:  # TLS: it encrypts (copies) whatever it is given; small pieces go together
                for piece in _coalesced(data):
                    await stream.send(piece)  # type: ignore[arg-type]  # any buffer is fine
        if scope.cancelled_caught:
            await anyio.aclose_forcefully(self._send_stream)
            raise anyio.BrokenResourceError(
                f"the peer read nothing for {self.send_timeout} s; the stream was closed")

    def can_send_now(self) -> bool:
        """Whether :meth:`send_now` may write now (a Unix socket, no frame being written)."""
        return self._unix and not self._send_lock.locked()

    def send_now(self, data: bytes) -> bool:
        """Write ``data`` (whole encoded frames, at most :data:`SEND_NOW_AT_MOST` bytes) at
        once, without waiting and from synchronous code: ``True`` when the socket took it
        whole, ``False`` when nothing was written (not a Unix socket, a frame being written,
        or no room now): send it with :meth:`send`.

        A Unix stream socket takes so small a write whole or not at all (one buffer of the
        kernel's). Should it ever take a part, the stream is shut down and
        ``BrokenResourceError`` raised: the peer then reads an end of stream, never half a
        frame.

        :raises anyio.BrokenResourceError: the peer is gone.
        :raises anyio.ClosedResourceError: the stream was closed locally.
        """
        raw = self._raw_send
        if raw is None or not self._unix or self._send_lock.locked() \
                or len(data) > SEND_NOW_AT_MOST:
            return False
        written = raw.try_send(data)
        if written == len(data):
            return True
        if not written:
            return False
        shut_down(raw)
        raise anyio.BrokenResourceError(f"the socket took {written} of {len(data)} bytes")

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

        Cancellation: cancellable while it waits for bytes; a frame, once read, is returned.
        """
        if self._streak >= _STREAK:  # before taking a frame: none is held across the yield
            self._streak = 0
            await anyio.lowlevel.cancel_shielded_checkpoint()
        while True:
            frame = self._next()
            if frame is not None:
                self._streak += 1
                return frame
            if self._ended:
                if self._body is not None:
                    raise FrameError("the stream ended inside a frame body "
                                     f"({ENVELOPE_OVERHEAD + len(self._body)} bytes announced)")
                if self._buffer:
                    if len(self._buffer) < _HEADER.size:
                        raise FrameError("the stream ended inside a frame header")
                    (length,) = _LENGTH.unpack_from(self._buffer)
                    raise FrameError(f"the stream ended inside a frame body ({length} bytes "
                                     "announced)")
                raise anyio.EndOfStream
            await self._fill()

    def _next(self) -> Frame | None:
        """The first whole frame received, taken out of the buffer (``None``: none yet)."""
        body = self._body
        if body is not None:
            if self._got < len(body):
                return None
            frame = Frame(self._body_kind, self._body_id, body)
            self._body, self._body_view = None, memoryview(b"")
            return frame
        buffer = self._buffer
        if len(buffer) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(buffer)
        if length > self._max:
            raise FrameError(
                f"announced frame body of {length} bytes exceeds the maximum of {self._max} bytes"
            )
        if length < ENVELOPE_OVERHEAD:  # known from the header: no need to wait for the body
            raise _too_short(length)
        end = _LENGTH.size + length
        if len(buffer) < end:
            if length > _IN_PLACE_ABOVE and len(buffer) >= _HEADER.size:
                self._begin_body(length)
            return None
        frame = _parse_body(buffer, _LENGTH.size, end)
        del buffer[:end]
        return frame

    def _begin_body(self, length: int, source: bytes | bytearray | None = None) -> None:
        """Receive the frame at the start of ``source`` (a body of ``length`` bytes, more than
        ``source`` holds) in place: into a buffer of its payload's size, which takes what
        ``source`` holds of it. ``source`` is the receive buffer (then emptied) or, when
        that is empty, what a read just returned (``_reading`` still set)."""
        buffer = self._buffer
        if source is None:
            source = buffer
        kind, call_id = _KIND_AND_ID.unpack_from(source, _LENGTH.size)
        known = _KINDS.get(kind)
        if known is None:
            raise FrameError(f"unknown frame kind {kind}")
        size = length - ENVELOPE_OVERHEAD
        spare = self._spare
        # The last body is used again if nothing refers to it any more (its frame and every
        # view of it are gone: only self._spare, the local spare and getrefcount's argument
        # hold it) and it is not much larger than needed; else a new one, which is kept for
        # next time if not too large. (A new bytearray is zeroed, and its pages faulted in,
        # as it is made: 2-20 ms per 16 MiB here, depending on whether the allocator has to
        # grow the heap.)
        if spare is not None and size <= len(spare) <= 2 * size \
                and sys.getrefcount(spare) == _UNREFERENCED:
            body: Buffer = memoryview(spare)[:size]
        else:
            body = bytearray(size)
            self._spare = body if size <= _SPARE_AT_MOST else None
        view = memoryview(body)
        held = len(source) - _HEADER.size
        with memoryview(source) as held_view:
            view[:held] = held_view[_HEADER.size:]
        # One step for pending (the signal handler runs between bytecodes): what it reads is
        # either the buffer or the body, never half of each.
        self._reading = True
        try:
            self._body, self._body_view, self._got = body, view, held
            self._body_kind, self._body_id = known, call_id
            buffer.clear()
        finally:
            self._reading = False

    def deliver_while_waiting(self, handler: Callable[[Frame], None]) -> None:
        """Let the event loop hand frames to ``handler`` itself while the receiver waits.

        Under asyncio over a :class:`~anywool.runtime.wire._socket.SocketStream`, the frames that
        arrive while the one receiving task waits for bytes go straight to ``handler`` from
        the loop's readiness callback, in order, saving that task a wake-up per batch; the
        task itself still gets (from :meth:`receive`) every frame that was not handed over, the
        end of the stream, and every error. ``handler`` runs outside any task and must not
        block; an ``Exception`` it raises ends the handing over and is raised by the
        receiver's :meth:`receive`. Elsewhere (trio, TLS) this does nothing: the receiver gets
        every frame.
        """
        if self._raw_receive is not None:
            self._handler = handler
            self._raw_receive.on_readable = self._drain

    def _drain(self) -> bool:
        """The readiness callback: read once, hand over the whole frames; ``False`` wakes the
        receiver (the stream ended, failed, or a frame is malformed: it finds out itself)."""
        raw, handler = self._raw_receive, self._handler
        assert raw is not None and handler is not None
        try:
            read = self._read_now(raw)
        except Exception as exc:  # broken or closed: the receiver raises it
            self._drain_error, self._drained = exc, True
            return False
        if read is None:
            return True  # nothing after all
        self._drained = True
        if not read:
            return False
        while True:
            try:
                frame = self._next()
            except FrameError:
                return False  # left in the buffer: the receiver's _next raises it again
            if frame is None:
                return True
            try:
                handler(frame)
            except Exception as exc:  # a FrameError too: that frame has left the buffer
                self._drain_error = exc
                return False

    def _read_now(self, raw: SocketStream) -> bool | None:
        """Read what the socket holds into the buffer: ``True`` when something was read,
        ``None`` when nothing is there yet, ``False`` at the end of the stream. Between the
        read and the append, :meth:`pending` cannot look (see ``_reading``)."""
        self._reading = True
        try:
            if self._body is not None:
                read = raw.try_receive_into(self._body_view[self._got:])
                if read:
                    self._got += read
            else:
                data = raw.try_receive(RECEIVE_SIZE)
                read = None if data is None else len(data)
                if data:
                    # (data[0] or data[1]: the length is 64 KiB or more, else no look.)
                    if not self._buffer and len(data) >= _HEADER.size \
                            and (data[0] or data[1]) and self._starts_large_frame(data):
                        # Straight from the read into the body: one copy less than through
                        # the buffer.
                        self._begin_body(_LENGTH.unpack_from(data)[0], data)
                    else:
                        self._buffer += data
        finally:
            self._reading = False
        if read is None:
            return None
        if not read:
            self._ended = True
            return False
        return True

    def _starts_large_frame(self, data: bytes) -> bool:
        """Whether ``data`` starts with the header of a well-formed frame to receive in place
        (anything else goes through the buffer, where :meth:`_next` judges it)."""
        if len(data) < _HEADER.size:
            return False
        (length,) = _LENGTH.unpack_from(data)
        return (_IN_PLACE_ABOVE < length <= self._max and _LENGTH.size + length > len(data)
                and data[_LENGTH.size] in _KINDS)

    def pending(self, kind: Kind, call_id: int, *, look_in_socket: bool = True) -> bool:
        """Whether a frame of ``kind`` for ``call_id`` has arrived and is not received yet (in
        the buffer, or still in the socket), as far as it shows without reading: synchronous,
        and it changes nothing, so a signal handler may ask while the receiver is suspended.

        ``False`` when it cannot say: over TLS, while a read is being added to the buffer (or
        to the body being received in place), or when the frame lies beyond the first
        :data:`_PEEK_MAX` bytes the socket holds. It looks at up to :data:`_PEEK_SIZE` bytes of
        the socket past the frames it skips (from :data:`_PEEK_FIRST`, doubled as needed):
        the rest of a body being received in place, and every frame ahead, however large (so
        a frame of several MiB that the socket holds whole does not hide the frames behind
        it). With ``look_in_socket`` false, only the frames read already are looked at (no
        system call).
        """
        return any(found_kind == kind and found_id == call_id
                   for found_kind, found_id in self._ahead(look_in_socket))

    def _ahead(self, look_in_socket: bool = True) -> Iterator[tuple[int, int]]:
        """The (kind, call id) of each frame arrived and not received yet, in order, as far as
        :meth:`pending` can tell."""
        raw = self._raw_receive
        if raw is None or self._reading:
            return
        if not look_in_socket:
            if self._body is None:
                yield from _frames_in(self._buffer)
            return
        body = self._body
        if body is not None:
            # The socket holds the rest of that body first, then the frames after it.
            buffer, held, offset = bytearray(), 0, len(body) - self._got
        else:
            buffer, offset = self._buffer, 0
            held = len(buffer)
        reach = _PEEK_FIRST
        window = max(offset - held, 0) + reach
        if window > _PEEK_MAX:
            return
        ahead = raw.peek(window)
        while True:
            header = _header_at(buffer, held, ahead, offset)
            if header is None:
                if len(ahead) < window:
                    return  # the socket holds no more
                # The peek ended first: look further, within bounds.
                reach = min(reach * 2, _PEEK_SIZE)
                window = offset - held + reach
                if window > _PEEK_MAX:
                    return
                ahead = raw.peek(window)
                continue
            length, found_kind, found_id = header
            yield found_kind, found_id
            if length > self._max or length < ENVELOPE_OVERHEAD:
                return  # malformed: the receiver will say so
            offset += _LENGTH.size + length

    async def _fill(self) -> None:
        raw = self._raw_receive
        if raw is not None:
            read = self._read_now(raw)
            while read is None:
                self._streak = 0
                await raw.wait_readable()
                if self._drained:  # the readiness callback read (see deliver_while_waiting)
                    self._drained = False
                    error, self._drain_error = self._drain_error, None
                    if error is not None:
                        raise error
                    return
                read = self._read_now(raw)
            return
        self._streak = 0
        body = self._body
        try:
            data = await self._receive_stream.receive(
                RECEIVE_SIZE if body is None else len(body) - self._got)
        except anyio.EndOfStream:
            data = b""
        if not data:
            self._ended = True
        elif body is None:
            self._buffer += data
        else:  # what the stream returns is a new bytes anyway (TLS decrypts into it)
            room = len(body) - self._got
            if len(data) > room:  # more than asked for: the rest is the next frames'
                self._buffer += memoryview(data)[room:]
                data = memoryview(data)[:room]
            self._body_view[self._got:self._got + len(data)] = data
            self._got += len(data)


def _frames_in(buffer: bytearray) -> Iterator[tuple[int, int]]:
    """The (kind, call id) of each whole frame header in ``buffer``, in order."""
    offset, end = 0, len(buffer)
    while offset + _HEADER.size <= end:
        length, kind, call_id = _HEADER.unpack_from(buffer, offset)
        yield kind, call_id
        if length < ENVELOPE_OVERHEAD:
            return  # malformed: the receiver will say so
        offset += _LENGTH.size + length


def _coalesced(pieces: Sequence[Buffer]) -> list[Buffer]:
    """``pieces`` with each run of small ones (up to :data:`_JOIN_AT_MOST` bytes) joined."""
    out: list[Buffer] = []
    run: list[Buffer] = []
    for piece in pieces:
        if memoryview(piece).nbytes <= _JOIN_AT_MOST:
            run.append(piece)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(piece)
    if run:
        out.append(b"".join(run))
    return out


def _header_at(buffer: bytearray, held: int, ahead: bytes, offset: int
               ) -> tuple[int, int, int] | None:
    """The (length, kind, call id) of the frame at ``offset`` of the bytes ``buffer[:held]``
    then ``ahead``, or ``None`` where they end first."""
    end = offset + _HEADER.size
    if end <= held:
        return _HEADER.unpack_from(buffer, offset)
    if offset >= held:
        if end - held > len(ahead):
            return None
        return _HEADER.unpack_from(ahead, offset - held)
    if end - held > len(ahead):
        return None
    return _HEADER.unpack(bytes(buffer[offset:held]) + ahead[:end - held])


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
