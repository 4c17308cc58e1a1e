"""Admission of a TCP worker's peers: each authenticates before its connection is served, and a
flood of peers that never do cannot keep a real client out nor run the worker out of
descriptors.

Every accepted connection becomes a *pending handshake*: a task of the worker's event loop (no
thread) running :func:`anywool.runtime.wire._auth.authenticate_server` on the socket, which reads at
most :data:`~anywool.runtime.wire._auth.MAX_UNAUTHENTICATED_READ` bytes of handshake (TLS records
aside). The bounds:

* At most :data:`MAX_PENDING_HANDSHAKES` (256) are pending at once, one socket descriptor each.
  When every place is taken and another peer waits in the listen backlog, the **oldest** pending
  handshake is dropped (its socket closed at once) and the newcomer accepted. So a flood cannot
  starve a newcomer, as refusing or queueing the newest would: a real client is dropped only if
  256 newer peers arrive while its own handshake runs, which takes a round trip or two (a
  millisecond on a LAN). Peers on one host all share an address, so no per-address bound could
  tell a flooding process from a real client on it; age can.
* Each has :data:`PENDING_HANDSHAKE_TIMEOUT` (2 s) from its accept to finish, TLS included,
  after which it is dropped: a slow flood (below the bound) holds a descriptor that long at most.
* Memory: a task, a socket stream and at most 74 bytes read per pending handshake (with TLS,
  also an ``ssl.SSLObject`` and its buffers, some kilobytes): bounded by the count above.

A dropped or refused peer is closed before any frame of it is read. Refusals are logged once
per :data:`LOG_EVERY` seconds with a count, so that peers cannot fill the log.

What this module must never do: read a frame from, or hand to the server, a peer that has not
authenticated; let the number of sockets it holds exceed :data:`MAX_PENDING_HANDSHAKES`.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import ByteStream, TaskGroup

from anywool.errors import AuthenticationError
from anywool.runtime.wire import _auth
from anywool.runtime.wire._socket import SocketStream

log = logging.getLogger("anywool.worker")

#: The most handshakes a TCP worker keeps pending at once (one descriptor each); when they are
#: all taken, a new peer replaces the oldest.
MAX_PENDING_HANDSHAKES: int = 256
#: Seconds a peer has, from its accept, to complete its handshake (TLS included) with a worker.
#: Shorter than the client's own bound (:data:`anywool.runtime.wire._auth.HANDSHAKE_TIMEOUT`), which
#: also covers the wait in the listen backlog and a worker whose event loop is held.
PENDING_HANDSHAKE_TIMEOUT: float = 2.0
#: Seconds between two log lines about refused peers (the others are counted in the next).
LOG_EVERY = 60.0

Handler = Callable[[ByteStream], Coroutine[Any, Any, None]]


class Gatekeeper:
    """Authenticates each accepted TCP peer before handing its connection to ``handler``.

    The accept loop calls :meth:`make_room` before each accept and :meth:`admit` with what it
    accepted (see the module docstring for the bounds).

    :param credentials: what a peer must authenticate with.
    :param address: the address the worker announces (the client's proof covers it).
    :param handler: serves an authenticated connection (the stream to frame over).
    :param capacity: the most pending handshakes, >= 1.
    :param timeout: seconds (> 0) a peer has from its accept to authenticate.
    :raises ValueError: ``capacity`` < 1 or ``timeout`` not > 0.
    """

    def __init__(self, credentials: _auth.Credentials, address: str, handler: Handler, *,
                 capacity: int = MAX_PENDING_HANDSHAKES,
                 timeout: float = PENDING_HANDSHAKE_TIMEOUT) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        if math.isnan(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.credentials = credentials
        self.address = address
        self.capacity = capacity
        self.timeout = timeout
        self._handler = handler
        # The pending handshakes, oldest first (a dict keeps insertion order), each with the
        # cancel scope that drops it.
        self._pending: dict[SocketStream, anyio.CancelScope] = {}
        self._refused = 0
        self._logged_at = -math.inf

    @property
    def pending(self) -> int:
        """How many handshakes are pending (each holds one socket)."""
        return len(self._pending)

    async def make_room(self, listener: socket.socket) -> None:
        """Return once the next accept keeps within :attr:`capacity`: at once while there is a
        place; otherwise when a peer waits in ``listener``'s backlog, having dropped the oldest
        pending handshake for it.

        :raises anyio.ClosedResourceError: the listener was closed (``anyio.notify_closing``).
        Cancellation: cancellable; nothing is dropped then.
        """
        while len(self._pending) >= self.capacity:
            await anyio.wait_readable(listener)
            if len(self._pending) >= self.capacity:  # none ended meanwhile
                self._drop_oldest()
                return

    def admit(self, stream: SocketStream, handlers: TaskGroup) -> None:
        """Take ``stream``, just accepted, as a pending handshake run in ``handlers``; on
        success its connection is served there by ``handler``. Never waits."""
        scope = anyio.CancelScope()
        self._pending[stream] = scope
        handlers.start_soon(self._handshake, stream, scope)

    def _drop_oldest(self) -> None:
        stream, scope = next(iter(self._pending.items()))
        del self._pending[stream]
        peer = _auth.peer_address(stream)  # while the socket is open
        scope.cancel()  # first: its task then wakes cancelled, not on a closed socket
        # Closed now, not when its task next runs: the descriptor is free for the newcomer.
        stream.close()
        self._refuse(peer, f"dropped its pending handshake for a newer peer ({self.capacity} "
                           "were pending)")

    async def _handshake(self, stream: SocketStream, scope: anyio.CancelScope) -> None:
        authenticated: ByteStream | None = None
        with scope:
            try:
                authenticated = await _auth.authenticate_server(
                    stream, self.credentials, address=self.address, timeout=self.timeout)
            except AuthenticationError as exc:
                if not scope.cancel_called:  # else logged as dropped already
                    self._refuse(exc.address, exc.reason)
            except anyio.ClosedResourceError:
                if not scope.cancel_called:
                    raise
                # Dropped while its wake-up was on its way: it found its socket closed.
            finally:
                self._pending.pop(stream, None)
        if authenticated is None:
            return  # refused, or dropped (its stream is closed either way)
        if scope.cancel_called:  # dropped as it finished: its socket is closed already
            await anyio.aclose_forcefully(authenticated)
            return
        await self._handler(authenticated)

    def _refuse(self, peer: str, reason: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            more = (f" ({self._refused - 1} more refused in the last {LOG_EVERY:.0f} s)"
                    if self._refused > 1 else "")
            log.warning("refused a connection from %s: %s%s", peer, reason, more)
            self._logged_at, self._refused = now, 0
        else:
            log.debug("refused a connection from %s: %s", peer, reason)
