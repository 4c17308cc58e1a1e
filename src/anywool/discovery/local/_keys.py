"""Namespace keys: how any namespace string becomes a name in the runtime directory.

The raw name never reaches the file system; a domain-separated blake2b hash of it does. The
header of a registry keeps a longer digest, checked at bind, so that two namespaces whose keys
collide can never share a registry.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from pathlib import Path

from anywool._runtime_dir import runtime_dir

# Bytes of blake2b kept for a namespace key (26 base32 characters). Tests shrink it to force
# collisions, which the digest stored in the header must then catch.
KEY_BYTES = 16


def namespace_key(namespace: str) -> str:
    """The file-system key of a namespace: a domain-separated blake2b hash in base32.

    The raw name never reaches the file system, so any string (``"a/b"``, ``".."``, NUL,
    10 000 characters) is a valid namespace.
    """
    return _key(namespace, KEY_BYTES)


# A few entries serve the hot path (one namespace's snapshots and binds, again and again). Many
# would keep every namespace a process ever used, fresh ``anywool-<uuid>`` ones of short-lived
# pools included, and a namespace may be long: the cache was a pool cycle's main leftover.
@functools.lru_cache(maxsize=32)
def _key(namespace: str, size: int) -> str:
    raw = hashlib.blake2b(b"ns\0" + _encode(namespace), digest_size=size).digest()
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def namespace_digest(namespace: str) -> bytes:
    """The full 32-byte digest stored in the header and checked at bind."""
    return hashlib.blake2b(b"digest\0" + _encode(namespace), digest_size=32).digest()


def namespace_path(namespace: str, root: Path | None = None) -> Path:
    """The directory a live generation of ``namespace`` occupies."""
    return (root or runtime_dir()) / f"ns-{namespace_key(namespace)}"


#: The file of a generation that records its namespace's name, written by the claim: the
#: directory's name is a hash, so this is how ``anywool ls`` can say whose it is.
NAME_FILE = "name"
#: The longest name recorded in full is read back (a namespace may be any string, but a file
#: read from disk must not drive an unbounded read).
MAX_NAME_BYTES = 1 << 20


def encode_name(namespace: str) -> bytes:
    """What :data:`NAME_FILE` holds for ``namespace``: UTF-8, lone surrogates kept."""
    return _encode(namespace)


def decode_name(data: bytes, digest: bytes) -> str | None:
    """The namespace a :data:`NAME_FILE` holds, or ``None`` when it does not hash to the
    registry header's ``digest`` (damaged, or another generation's)."""
    try:
        name = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return name if namespace_digest(name) == digest else None


def _encode(namespace: str) -> bytes:
    return namespace.encode("utf-8", "surrogatepass")
