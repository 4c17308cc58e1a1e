"""Where a namespace lives in etcd, and what its keys hold (pure: no I/O).

Layout under the prefix ``P`` (default ``/anywool``), with ``H`` the SHA-256 of the namespace
in hex (any string is a valid namespace, and its name never shapes a key)::

    P/ns/H/owner          the owner's record (JSON), bound to the owner's lease
    P/ns/H/workers/UID    a worker's metadata (WorkerMetadata.to_bytes), bound to the lease
                          of the publisher that announced it
    P/ns/H/seq/ID         a publisher's sequence (a random value its every change replaces),
                          bound to its lease: a change sent earlier that takes effect late
                          finds it moved on and changes nothing

The owner key's create revision is the namespace's *generation*: unique and increasing for
every claim, since etcd's revisions are. Writes of publishers and of the owner's exit compare
it, so that a displaced owner or a publisher of an earlier generation changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
from typing import Any
from uuid import UUID

#: The largest encoded metadata a worker key may hold: far below etcd's request limit
#: (1.5 MiB by default), and a snapshot of 1 024 workers stays a few MiB.
MAX_METADATA = 64 * 1024


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def range_end(prefix: bytes) -> bytes:
    """The end of the key range holding every key that starts with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class Keys:
    """The keys of one namespace under one prefix."""

    __slots__ = ("base", "owner", "sequences", "workers", "workers_end", "end")

    def __init__(self, prefix: str, namespace: str) -> None:
        digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()
        self.base = f"{prefix}/ns/{digest}/".encode()
        self.owner = self.base + b"owner"
        self.workers = self.base + b"workers/"
        self.sequences = self.base + b"seq/"
        self.workers_end = range_end(self.workers)
        self.end = range_end(self.base)

    def worker(self, uid: UUID) -> bytes:
        return self.workers + uid.hex.encode()

    def uid_of(self, key: bytes) -> UUID | None:
        """The worker a key names, or ``None`` for any other key (or a malformed one)."""
        if not key.startswith(self.workers):
            return None
        try:
            return UUID(hex=key[len(self.workers):].decode("ascii"))
        except ValueError:
            return None


def namespaces_range(prefix: str) -> tuple[bytes, bytes]:
    """The key range of every namespace under ``prefix`` (for ``anywool ls``)."""
    start = f"{prefix}/ns/".encode()
    return start, range_end(start)


def owner_record(namespace: str, lease_ttl: int) -> bytes:
    """What the owner key holds: enough for an operator (and an error message) to find the
    owner, and the namespace's name for listings."""
    return json.dumps({"namespace": namespace, "pid": os.getpid(), "host": socket.gethostname(),
                       "lease_ttl": lease_ttl}, separators=(",", ":")).encode()


def read_owner(value: bytes) -> dict[str, Any]:
    """An owner record, or ``{}`` when it does not decode (never trusted further than to
    describe the owner)."""
    try:
        record = json.loads(value)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}  # pyright: ignore[reportUnknownVariableType]
