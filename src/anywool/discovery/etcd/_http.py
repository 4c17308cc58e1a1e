"""HTTP/1.1 for etcd's gateway: kept-alive connections on AnyIO streams, messages framed by h11.

The gateway takes small JSON ``POST`` requests and answers each with a ``Content-Length`` body
(unary calls) or a chunked stream of JSON lines (watches, lease keep-alives). h11 does all the
HTTP: request framing, response parsing, chunked decoding, whether a connection may carry
another request. What is left here is a handful of connections per member, on whichever event
loop runs them.

Why not a general HTTP client: measured on this project's machine, a unary call through httpx
took 1.6 to 4.7 ms where the same request written on a kept-alive AnyIO stream took 0.7 to
1 ms; claiming and releasing a namespace takes four of them (see benchmarks/etcd.py).

Connections are closed, shielded, whenever a request on them does not complete (an error, a
deadline, a cancellation): a connection is reused only after a whole response was read. A TLS
handshake that is interrupted closes its TCP connection too.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
from anyio.streams.tls import TLSStream

#: Bytes read from a connection at a time.
_READ_SIZE = 65536
#: Idle connections kept per member (more concurrent requests open more, then close them).
_IDLE_PER_MEMBER = 4


class TransportError(Exception):
    """A connection to a member failed (refused, reset, TLS, not HTTP, closed early)."""


class ConnectError(TransportError):
    """The connection (or its TLS handshake) could not be made: the request was not sent."""


class ReadError(TransportError):
    """The connection failed once the request was sent (its effect is unknown)."""


_FAILURES = (OSError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream,
             anyio.ClosedResourceError, h11.ProtocolError)


def describe(exc: BaseException) -> str:
    """An exception as a short reason: its type and message, and its cause's (trio's TLS
    errors have an empty message, so the type always says something)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text


class Connection:
    """One HTTP/1.1 connection to one member."""

    def __init__(self, stream: anyio.abc.ByteStream, host: str) -> None:
        self._stream = stream
        self._host = host
        self._h11 = h11.Connection(h11.CLIENT)
        self.closed = False
        #: Whether the last request got any answer at all (a kept-alive connection the member
        #: closed meanwhile fails before any).
        self.answered = False

    @classmethod
    async def open(cls, url: str, ssl_context: ssl.SSLContext | None,
                   connect_timeout: float) -> Connection:
        """Connect to ``url``'s host and port (TLS for ``https``).

        :raises ConnectError: the connection or the handshake failed, or took longer than
            ``connect_timeout`` seconds.
        """
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 0
        try:
            with anyio.fail_after(connect_timeout):
                tcp = await anyio.connect_tcp(host, port)
        except (*_FAILURES, TimeoutError) as exc:
            raise ConnectError(describe(exc)) from exc
        stream: anyio.abc.ByteStream = tcp
        if parts.scheme == "https":
            try:
                with anyio.fail_after(connect_timeout):
                    stream = await TLSStream.wrap(tcp, ssl_context=ssl_context or
                                                  ssl.create_default_context(), hostname=host,
                                                  standard_compatible=False)
            except BaseException as exc:
                with anyio.CancelScope(shield=True):
                    await tcp.aclose()
                if isinstance(exc, (*_FAILURES, TimeoutError)):
                    raise ConnectError(describe(exc)) from exc
                raise
        return cls(stream, parts.netloc)

    async def aclose(self) -> None:
        """Close the connection (shielded; idempotent)."""
        if not self.closed:
            self.closed = True
            with anyio.CancelScope(shield=True):
                try:
                    await self._stream.aclose()
                except _FAILURES:
                    pass

    @property
    def reusable(self) -> bool:
        return not self.closed and self._h11.our_state is h11.IDLE \
            and self._h11.their_state is h11.IDLE

    def _frame(self, framer: h11.Connection, path: str, body: bytes,
               headers: dict[str, str]) -> bytes:
        fields = [("Host", self._host), ("Content-Type", "application/json"),
                  ("Content-Length", str(len(body))), *headers.items()]
        data = framer.send(h11.Request(method="POST", target=path, headers=fields)) or b""
        data += framer.send(h11.Data(data=body)) or b""
        data += framer.send(h11.EndOfMessage()) or b""
        return data

    async def _next(self, framer: h11.Connection) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = framer.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            try:
                data = await self._stream.receive(_READ_SIZE)
            except anyio.EndOfStream:
                data = b""  # h11 says whether the message was complete
            self.answered = self.answered or bool(data)
            framer.receive_data(data)

    async def _head(self, framer: h11.Connection) -> int:
        while True:
            event = await self._next(framer)
            if isinstance(event, h11.Response):
                return event.status_code
            if isinstance(event, h11.ConnectionClosed):
                raise ReadError("the member closed the connection without answering")

    async def _answer(self, framer: h11.Connection) -> tuple[int, bytes]:
        status = await self._head(framer)
        chunks: list[bytes] = []
        while True:
            event = await self._next(framer)
            if isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise ReadError("the member closed the connection mid-answer")

    async def request(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """Send a ``POST`` and read the whole answer: its status and body.

        :raises ReadError: the connection failed (the request may have taken effect).
        """
        return (await self.requests([(path, body)], headers))[0]

    async def requests(self, batch: Sequence[tuple[str, bytes]],
                       headers: dict[str, str]) -> list[tuple[int, bytes]]:
        """Send ``POST`` requests at once and read every answer, in order.

        HTTP/1.1 pipelining: the member reads one request after the other, each once it
        answered the one before, so they take effect in order, for one round trip. (h11
        frames one message at a time: each request after the first gets a framer of its own,
        fed what the one before read past its answer.)

        :raises ReadError: the connection failed (some requests may have taken effect).
        """
        self.answered = False
        framers = [self._h11, *(h11.Connection(h11.CLIENT) for _ in batch[1:])]
        answers: list[tuple[int, bytes]] = []
        try:
            await self._stream.send(b"".join(
                self._frame(framer, path, body, headers)
                for framer, (path, body) in zip(framers, batch)))
            for i, framer in enumerate(framers):
                if i:
                    leftover, closed = framers[i - 1].trailing_data
                    if leftover:  # (to h11, empty data means the connection closed)
                        framer.receive_data(bytes(leftover))
                    if closed:
                        framer.receive_data(b"")
                answers.append(await self._answer(framer))
        except _FAILURES as exc:
            await self.aclose()
            raise ReadError(describe(exc)) from exc
        except BaseException:
            await self.aclose()
            raise
        last = framers[-1]
        if last.our_state is h11.DONE and last.their_state is h11.DONE \
                and not last.trailing_data[0]:
            last.start_next_cycle()
            self._h11 = last
        else:
            await self.aclose()
        return answers

    async def start_stream(self, path: str, body: bytes,
                           headers: dict[str, str]) -> tuple[int, AsyncIterator[bytes]]:
        """Send a ``POST`` whose answer streams: its status and its body's pieces as they
        come. The connection is the stream's (close it when done).

        :raises ReadError: the connection failed.
        """
        try:
            await self._stream.send(self._frame(self._h11, path, body, headers))
            status = await self._head(self._h11)
        except _FAILURES as exc:
            await self.aclose()
            raise ReadError(describe(exc)) from exc

        async def pieces() -> AsyncIterator[bytes]:
            try:
                while True:
                    event = await self._next(self._h11)
                    if isinstance(event, h11.Data):
                        yield bytes(event.data)
                    elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                        return
            except _FAILURES as exc:
                raise ReadError(describe(exc)) from exc

        return status, pieces()


class Pool:
    """Kept-alive connections to the members of one cluster, for one event loop."""

    def __init__(self, ssl_context: ssl.SSLContext | None, connect_timeout: float) -> None:
        self._ssl_context = ssl_context
        self._connect_timeout = connect_timeout
        self._idle: dict[str, list[Connection]] = {}
        self._closed = False

    async def requests(self, url: str, batch: Sequence[tuple[str, bytes]],
                       headers: dict[str, str]) -> list[tuple[int, bytes]]:
        """``POST`` to the member at ``url`` on an idle connection (else a new one),
        pipelined when there are several (see :meth:`Connection.requests`).

        :raises ConnectError: a new connection could not be made.
        :raises ReadError: the connection failed once the requests were sent.
        """
        idle = self._idle.setdefault(url, [])
        while idle:
            connection = idle.pop()
            try:
                answers = await connection.requests(batch, headers)
            except ReadError:
                if connection.answered:
                    raise
                # Not a word back: a kept-alive connection the member closed meanwhile (or a
                # member that died: then the new connection is refused). Once more, anew.
                break
            await self._keep(url, connection)
            return answers
        connection = await Connection.open(url, self._ssl_context, self._connect_timeout)
        answers = await connection.requests(batch, headers)
        await self._keep(url, connection)
        return answers

    async def _keep(self, url: str, connection: Connection) -> None:
        idle = self._idle.setdefault(url, [])
        if connection.reusable and not self._closed and len(idle) < _IDLE_PER_MEMBER:
            idle.append(connection)
        else:
            await connection.aclose()

    async def aclose(self) -> None:
        """Close every idle connection (shielded); those in use close as their request ends."""
        self._closed = True
        connections = [c for idle in self._idle.values() for c in idle]
        self._idle.clear()
        for connection in connections:
            await connection.aclose()
