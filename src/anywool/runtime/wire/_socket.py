"""Connected sockets as AnyIO byte streams that the frame codec can also drive without waiting.

:class:`SocketStream` is a :class:`~anyio.abc.ByteStream` over one non-blocking stream socket
(Unix or TCP) on either backend, plus calls that never wait: :meth:`SocketStream.try_send`
and :meth:`SocketStream.try_receive`, and for large payloads :meth:`SocketStream.try_send_many`
(several buffers, one ``sendmsg``, nothing joined) and :meth:`SocketStream.try_receive_into`
(``recv_into`` a buffer the caller owns). The frame codec (:mod:`anywool.runtime.wire._frames`) uses
those so that a frame the socket takes or holds at once costs one system call and no trip
through the event loop; it waits (``anyio.wait_readable`` / ``anyio.wait_writable``) only when
the socket would block. A Unix socket asks for 1 MiB send and receive buffers (see
``_grow_buffers``), so that a large frame needs few such waits. AnyIO's own socket streams checkpoint on every send and receive, and under asyncio
put TCP behind a transport whose buffer a direct write would overtake; owning the socket avoids
both. TLS is layered on top by :class:`~anyio.streams.tls.TLSStream`, as on any byte stream.

Errors follow AnyIO's streams: a peer that reset or vanished raises
``anyio.BrokenResourceError`` (with the ``OSError`` as its cause), a stream closed here
``anyio.ClosedResourceError``, an orderly end ``anyio.EndOfStream``.

Here: connecting (:func:`connect`), accepting (:func:`accept`), the stream. No frames.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import sniffio
from anyio.abc import ByteStream, SocketAttribute

from anywool._address import Address

if TYPE_CHECKING:  # asyncio is imported under asyncio only: a trio worker never needs it
    import asyncio

#: What a send takes: bytes-like objects.
Buffer = bytes | bytearray | memoryview

#: The most bytes one receive asks the socket for (into a new ``bytes``; a large frame's body is
#: received in place instead, see :meth:`SocketStream.try_receive_into`).
RECEIVE_SIZE = 65536
#: The send and receive buffer sizes (bytes) asked for on a Unix socket (see _grow_buffers).
SOCKET_BUFFER = 1 << 20
#: The most buffers one vectored send passes (Linux's ``IOV_MAX`` is 1024).
_IOV_MAX = 512
# A peek's flags, as a plain int: or-ing the enum members costs two enum calls per peek.
_PEEK_FLAGS = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)


class SocketStream(ByteStream):
    """A byte stream over a connected stream socket, which it owns (and sets non-blocking).

    :param sock: a connected ``SOCK_STREAM`` socket (``AF_UNIX``, ``AF_INET`` or ``AF_INET6``).

    One task may receive and one may send at a time (the frame codec serialises its senders).
    Closing wakes a task waiting on the socket with ``anyio.ClosedResourceError``.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Frames are written whole, one send each: Nagle would only hold small ones back.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if sock.family == socket.AF_UNIX:
            _grow_buffers(sock)
        self._sock = sock
        self._closed = False
        # Under asyncio, how this stream waits to read (see _AsyncioReadable); None: anyio's
        # wait_readable (trio, or not known yet).
        self._readable: _AsyncioReadable | None = None
        self._backend_known = False
        #: Under asyncio, called from the event loop when the socket turns readable while a
        #: task waits in :meth:`wait_readable`: ``True`` means it read what it needed and the
        #: task goes on waiting (see FrameStream.deliver_while_waiting). Unused under trio.
        self.on_readable: Callable[[], bool] | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unix(self) -> bool:
        """Whether the socket is a Unix one (``AF_UNIX``)."""
        return self._sock.family == socket.AF_UNIX

    def _broken(self, exc: OSError) -> Exception:
        if self._closed or exc.errno == errno.EBADF:
            return anyio.ClosedResourceError()
        error = anyio.BrokenResourceError(f"{exc.strerror or exc}")
        error.__cause__ = exc
        return error

    def try_send(self, data: bytes | memoryview) -> int:
        """Write what the socket takes now; the number of bytes written (0: it would block).

        :raises anyio.ClosedResourceError: the stream was closed here.
        :raises anyio.BrokenResourceError: the peer is gone.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise self._broken(exc) from exc

    def try_send_many(self, buffers: Sequence[Buffer]) -> int:
        """Write what the socket takes now of ``buffers`` (in order, as if joined, without
        joining them: one ``sendmsg``); the number of bytes written (0: it would block).

        :raises anyio.ClosedResourceError: the stream was closed here.
        :raises anyio.BrokenResourceError: the peer is gone.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self._sock.sendmsg(buffers[:_IOV_MAX] if len(buffers) > _IOV_MAX else buffers)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise self._broken(exc) from exc

    def try_receive_into(self, buffer: memoryview) -> int | None:
        """Read what the socket holds now into ``buffer``, up to its size: the number of bytes
        read (``None``: nothing yet; 0: the peer ended its side).

        :raises anyio.ClosedResourceError: the stream was closed here.
        :raises anyio.BrokenResourceError: the connection failed.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise self._broken(exc) from exc

    def try_receive(self, max_bytes: int = RECEIVE_SIZE) -> bytes | None:
        """What the socket holds now, up to ``max_bytes`` (``None``: nothing yet; ``b""``: the
        peer ended its side).

        :raises anyio.ClosedResourceError: the stream was closed here.
        :raises anyio.BrokenResourceError: the connection failed.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self._sock.recv(max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise self._broken(exc) from exc

    def peek(self, max_bytes: int) -> bytes:
        """What the socket holds now, up to ``max_bytes``, left in it for the next receive
        (``b""``: nothing, or the peer ended its side, or the stream is broken or closed)."""
        if self._closed:
            return b""
        try:
            return self._sock.recv(max_bytes, _PEEK_FLAGS)
        except OSError:
            return b""

    async def wait_readable(self) -> None:
        """Wait until a receive would not block (cancellable).

        :raises anyio.ClosedResourceError: the stream was closed, before or meanwhile.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        if not self._backend_known:
            self._backend_known = True
            if sniffio.current_async_library() == "asyncio":
                import asyncio

                self._readable = _AsyncioReadable(asyncio.get_running_loop(),
                                                  self._sock.fileno(), self)
        if self._readable is not None:
            await self._readable.wait()
        else:
            await anyio.wait_readable(self._sock)
        if self._closed:
            raise anyio.ClosedResourceError

    async def wait_writable(self) -> None:
        """Wait until a send would not block (cancellable).

        :raises anyio.ClosedResourceError: the stream was closed, before or meanwhile.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        await anyio.wait_writable(self._sock)
        if self._closed:
            raise anyio.ClosedResourceError

    async def receive(self, max_bytes: int = RECEIVE_SIZE) -> bytes:
        await anyio.lowlevel.checkpoint_if_cancelled()
        while True:
            data = self.try_receive(max_bytes)
            if data is None:
                await self.wait_readable()
            elif not data:
                raise anyio.EndOfStream
            else:
                return data

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        view = memoryview(item)
        while view:
            written = self.try_send(view)
            if written:
                view = view[written:]
            else:
                await self.wait_writable()

    async def send_many(self, buffers: Sequence[Buffer]) -> None:
        """Write ``buffers`` in order, as :meth:`send` would write them joined, with vectored
        sends (no copy of them is made here).

        :raises anyio.ClosedResourceError: the stream was closed here.
        :raises anyio.BrokenResourceError: the peer is gone.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        pending = [memoryview(buffer).cast("B") for buffer in buffers]
        while pending:
            written = self.try_send_many(pending)
            if written:
                pending = advance(pending, written)
            else:
                await self.wait_writable()

    async def send_eof(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise self._broken(exc) from exc

    async def aclose(self) -> None:
        self.close()
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        """Close now (synchronous; what :meth:`aclose` does besides its checkpoint)."""
        if not self._closed:
            self._closed = True
            if self._readable is not None:
                self._readable.close()
            try:
                anyio.notify_closing(self._sock)
            except RuntimeError:
                pass  # no event loop: nobody can be waiting on it
            self._sock.close()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        sock = self._sock
        attributes: dict[Any, Callable[[], Any]] = {
            SocketAttribute.family: lambda: sock.family,
            SocketAttribute.local_address: lambda: _address(sock.getsockname()),
            SocketAttribute.raw_socket: lambda: sock,
        }
        if sock.family != socket.AF_UNIX:
            attributes[SocketAttribute.remote_address] = lambda: _address(sock.getpeername())
            attributes[SocketAttribute.local_port] = lambda: sock.getsockname()[1]
            attributes[SocketAttribute.remote_port] = lambda: sock.getpeername()[1]
        return attributes


class _AsyncioReadable:
    """Waits for a socket to turn readable under asyncio, leaving it registered between waits.

    ``anyio.wait_readable`` registers the descriptor with the selector for each wait and
    removes it after (two ``epoll_ctl`` calls and the selector's bookkeeping, per frame read).
    A reader that waits again as soon as it has read keeps one registration instead. Readiness
    is level-triggered, so the callback unregisters the descriptor when it finds nobody
    waiting, rather than run at every loop iteration until somebody reads.
    """

    __slots__ = ("_loop", "_fd", "_stream", "_waiter", "_registered")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, stream: SocketStream) -> None:
        self._loop = loop
        self._fd = fd
        self._stream = stream
        self._waiter: asyncio.Future[None] | None = None
        self._registered = False

    def _ready(self) -> None:
        waiter = self._waiter
        if waiter is None:
            self._loop.remove_reader(self._fd)
            self._registered = False
            return
        handler = self._stream.on_readable
        if handler is not None and handler():
            return  # the handler read for the waiting task, which goes on waiting
        self._waiter = None
        if not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        if self._waiter is not None:
            raise anyio.BusyResourceError("waiting to read from")
        if not self._registered:
            self._loop.add_reader(self._fd, self._ready)
            self._registered = True
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def close(self) -> None:
        """Unregister (before the descriptor is closed) and wake a waiter, which then finds the
        stream closed."""
        if self._registered:
            self._loop.remove_reader(self._fd)
            self._registered = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _grow_buffers(sock: socket.socket) -> None:
    """Ask for :data:`SOCKET_BUFFER` bytes of send and receive buffer (the kernel caps it at
    ``net.core.wmem_max``/``rmem_max``; a refusal is ignored).

    Unix sockets only: on TCP, setting them turns off Linux's autotuning, which may grow them
    further. Measured on 16 MiB echoes: with the default 208 KiB, a frame took
    about 80 waits for the socket each way and the round trip 41-84 ms; with 1 MiB, 32-38 ms
    (4 MiB: 25-52 ms, the copies no longer in cache). Memory is taken only as data waits in
    the socket.
    """
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            if sock.getsockopt(socket.SOL_SOCKET, option) < SOCKET_BUFFER:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        except OSError:
            pass


def advance(buffers: list[memoryview], written: int) -> list[memoryview]:
    """What is left of ``buffers`` (flat byte views) once their first ``written`` bytes went."""
    for index, buffer in enumerate(buffers):
        size = buffer.nbytes
        if written < size:
            return [buffer[written:], *buffers[index + 1:]]
        written -= size
    return []


def _address(name: Any) -> Any:
    # anyio's convention: (host, port) for IP, the path for a Unix socket.
    return tuple(name[:2]) if isinstance(name, tuple) else name


async def connect(address: Address) -> SocketStream:
    """Connect to ``address`` (a Unix socket path, or a TCP host and port).

    A host name is resolved with ``anyio.getaddrinfo`` and its addresses tried in order.

    :raises OSError: the connection failed (the last address's error, for several).
    :raises ValueError: the host cannot be encoded (IDNA).
    Cancellation: cancellable; nothing is left open. Always a checkpoint, as trio's functions
    are, also when a Unix socket connects at once: other tasks run first.
    """
    await anyio.lowlevel.checkpoint()
    if address.path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            while True:
                try:
                    sock.connect(address.path)
                    break
                except BlockingIOError:  # the listener's backlog is full: wait, then retry
                    await anyio.wait_writable(sock)
        except BaseException:
            sock.close()
            raise
        return SocketStream(sock)
    assert address.host is not None and address.port is not None
    infos = await anyio.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    failure: OSError = OSError(f"{address.host!r} resolved to no address")
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            code = sock.connect_ex(sockaddr)
            if code in (errno.EINPROGRESS, errno.EAGAIN):
                await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, f"{errno.errorcode.get(code, code)}: connecting to "
                                    f"{sockaddr!r}")
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        return SocketStream(sock)
    raise failure


async def accept(listener: socket.socket) -> SocketStream:
    """The next connection to ``listener`` (a listening socket, set non-blocking here).

    :raises anyio.ClosedResourceError: the listener was closed (after
        ``anyio.notify_closing``), before or meanwhile.
    :raises OSError: accepting failed (e.g. ``EMFILE``: out of descriptors).
    Cancellation: cancellable; nothing is accepted then.
    """
    while True:
        if listener.fileno() == -1:  # before setblocking, which a closed socket fails
            raise anyio.ClosedResourceError
        listener.setblocking(False)
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            await anyio.wait_readable(listener)
            continue
        return SocketStream(sock)
