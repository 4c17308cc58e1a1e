"""What "the other end of a connection is gone" raises, named once for the whole runtime.

A site that catches one of these tuples treats the peer as gone (a call cannot be delivered, a
reply has nobody to read it, a connection is over) and never retries on the same stream. Where
a site handles the members differently (e.g. a reason per member), it names them one by one.
Constants only: no I/O here.
"""

import anyio

#: Raised by a send on (or a half-close of) a byte stream whose other end is gone:
PEER_GONE: tuple[type[BaseException], ...] = (
    # the stream broke: the peer reset or vanished (anyio wraps the socket's OSError in it)
    anyio.BrokenResourceError,
    # our end was closed already, e.g. by a concurrent teardown of the same connection
    anyio.ClosedResourceError,
    # the OS reported the failure unwrapped: EPIPE, ECONNRESET, a stdin pipe that closed
    OSError,
)

#: Raised by a receive when the peer hung up without an unwrapped OS error: an orderly end
#: (``EndOfStream``), or the first two members of :data:`PEER_GONE`. A worker drops such a
#: connection silently, and logs a bare ``OSError`` instead.
PEER_HUNG_UP: tuple[type[BaseException], ...] = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)
