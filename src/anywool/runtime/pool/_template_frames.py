"""The frames between a pool and its warm template: the codec both ends use.

The pool's end is :mod:`anywool.runtime.pool._template`, the template's
:mod:`anywool.runtime.pool._template_process`; this module is below both, and imports nothing
but the standard library (the template process imports it before anything else).

The template's stdin is one end of a Unix stream socket pair whose other end the pool holds.
Frames both ways are a 4-byte big-endian length and a JSON object; descriptors travel with a
frame as ``SCM_RIGHTS``, and the frame's ``"fds"`` says how many:

* pool → template: ``{"argv": [...], "env": {...}, "cwd": "..."}`` with the worker's stdin
  (a pipe's read end), stdout (a pipe's write end) and stderr (the pool's, as it is now: a
  worker started as a process of its own inherits it so);
* template → pool: ``{"ready": pid}`` once warm; ``{"forked": pid}`` with a pidfd of the child,
  or ``{"failed": why}``; ``{"exited": pid, "code": code}`` once it reaped a child (``code``
  as :attr:`subprocess.Popen.returncode`: negative for a signal).
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

_LENGTH = struct.Struct(">I")
# The most descriptors one frame carries (a request: 3; a reply: 1).
_MAX_FDS = 4
# A frame larger than this is a broken peer (a request holds an environment: well below it).
_MAX_FRAME = 16 << 20


def encode(message: Mapping[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


class Frames:
    """Frames and descriptors read from a stream socket, in order: bytes and descriptors are
    queued as they come, and a frame takes as many descriptors as it says (they travel in
    order, however ``recvmsg`` splits the bytes)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._fds: list[int] = []

    def feed(self, data: bytes, ancillary: Sequence[tuple[int, int, bytes]]) -> None:
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                self._fds.extend(fds)
        self._buffer += data

    def next(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next whole frame and its descriptors, or ``None`` until more bytes come.

        :raises ValueError: the peer sent something that is not a frame of this protocol.
        """
        if len(self._buffer) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if length > _MAX_FRAME:
            raise ValueError(f"a frame of {length} bytes")
        if len(self._buffer) < _LENGTH.size + length:
            return None
        body = bytes(self._buffer[_LENGTH.size:_LENGTH.size + length])
        del self._buffer[:_LENGTH.size + length]
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError(f"a frame holding {type(message).__name__}")
        count = message.get("fds", 0)
        if not isinstance(count, int) or not 0 <= count <= min(_MAX_FDS, len(self._fds)):
            raise ValueError(f"a frame with {count!r} descriptors ({len(self._fds)} came)")
        fds, self._fds[:count] = self._fds[:count], []
        return message, fds

    def close(self) -> None:
        """Close the descriptors no frame took."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def ancillary_space() -> int:
    return socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)


def rights(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
