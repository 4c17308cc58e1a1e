"""DNS-SD names and records of a LAN namespace: service type, instance names, TXT, signatures.

How a worker appears on the LAN:

- the namespace maps to one service type, ``_aw-<12 hex>._tcp.local.``: a domain-separated
  blake2b hash of 48 bits (a DNS-SD service name has at most 15 characters, ``aw-`` and 12 hex
  digits);
- each worker is one service instance named after its uid, ``<uid hex>.<service type>``;
- its TXT record holds ``WorkerMetadata.to_bytes()`` split into values of at most
  :data:`CHUNK` bytes (a TXT string holds 255 bytes, its key and ``=`` included), a 16-byte
  digest of the full namespace name (two namespaces whose 48-bit hashes collide never see each
  other's workers), a format version, a sequence number the publisher raises with every change
  of the worker (so that of two records of one worker a cache holds, the later change wins,
  whatever order they arrived in), and, with a secret, an HMAC-SHA256 over the service type,
  the instance name, the namespace digest, the sequence number and the metadata bytes.

Pure: no I/O, no zeroconf, no event loop. Everything here is a function of its arguments, so that
the records a publisher writes and the checks a subscriber makes are tested without a network.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from uuid import UUID

from anywool import _interfaces
from anywool._address import Address
from anywool.metadata import WorkerMetadata

__all__ = [
    "CHUNK",
    "MAX_METADATA",
    "InvalidRecord",
    "UnverifiedRecord",
    "decode_txt",
    "encode_txt",
    "instance_name",
    "is_loopback",
    "namespace_digest",
    "parse_txt",
    "sequence_of",
    "service_type",
    "sign",
    "uid_of",
]

#: Bits of the namespace hash in the service type (DESIGN §6: at least 48).
HASH_BITS = 48
#: Bytes of metadata per TXT value: 255 per TXT string, less a key of up to 3 digits and ``=``.
CHUNK = 250
#: The largest encoded metadata a record carries, in bytes: with the other records of an
#: announcement it keeps the mDNS packet under zeroconf's limit of 8966 bytes.
MAX_METADATA = 6000
#: The record format; a subscriber ignores records of any other.
VERSION = b"1"

_SIGNATURE_DOMAIN = b"anywool-lan-v1\0"
_SIGNATURE_BYTES = 32


class InvalidRecord(ValueError):
    """A TXT record that is not a verified worker record of this namespace (the message says why)."""


class UnverifiedRecord(InvalidRecord):
    """A well-formed record of this namespace whose signature does not verify with the
    subscriber's secret (or that is unsigned): another secret's worker, or a forgery.

    :param address: the address the record claims (unverified: for messages only).
    """

    def __init__(self, reason: str, address: str) -> None:
        super().__init__(reason)
        self.address = address


def _encode_name(namespace: str) -> bytes:
    return namespace.encode("utf-8", "surrogatepass")


def service_type(namespace: str) -> str:
    """The DNS-SD service type of ``namespace``: ``_aw-<12 hex>._tcp.local.``."""
    digest = hashlib.blake2b(b"lan-service\0" + _encode_name(namespace),
                             digest_size=HASH_BITS // 8).hexdigest()
    return f"_aw-{digest}._tcp.local."


def namespace_digest(namespace: str) -> bytes:
    """16 bytes that tell namespaces apart even when their service types collide."""
    return hashlib.blake2b(b"lan-namespace\0" + _encode_name(namespace), digest_size=16).digest()


def instance_name(type_: str, uid: UUID) -> str:
    """The service instance name of the worker ``uid``: ``<uid hex>.<type_>``."""
    return f"{uid.hex}.{type_}"


def uid_of(name: str, type_: str) -> UUID | None:
    """The worker uid an instance name of ``type_`` stands for, or ``None`` if it is not one."""
    if not name.lower().endswith("." + type_.lower()):
        return None
    label = name[: -len(type_) - 1]
    if len(label) != 32:
        return None
    try:
        return UUID(hex=label)
    except ValueError:
        return None


def sign(secret: bytes, type_: str, name: str, digest: bytes, sequence: int,
         metadata: bytes) -> bytes:
    """HMAC-SHA256 of one record: its service type, instance name, namespace digest, sequence
    number and metadata (names are UTF-8, surrogates passed: a hostile name never raises)."""
    message = b"".join((_SIGNATURE_DOMAIN, _encode_name(type_.lower()), b"\0",
                        _encode_name(name.lower()), b"\0", digest,
                        sequence.to_bytes(8, "big"), metadata))
    return hmac.new(secret, message, hashlib.sha256).digest()


#: The largest sequence number (it is signed as 8 bytes).
MAX_SEQUENCE = (1 << 64) - 1


def sequence_of(entries: Mapping[bytes, bytes]) -> int:
    """The sequence number of a record (see the module docstring).

    :raises InvalidRecord: it is missing or not a decimal number of at most 20 digits.
    """
    text = entries.get(b"q", b"")
    if not (text.isdigit() and len(text) <= 20 and int(text) <= MAX_SEQUENCE):
        raise InvalidRecord(f"sequence number {text[:24]!r}")
    return int(text)


def encode_txt(type_: str, name: str, digest: bytes, metadata: bytes,
               secret: bytes | None, sequence: int = 1) -> bytes:
    """The TXT record data (RFC 6763 §6: length-prefixed ``key=value`` strings) of a worker.

    :param type_: the service type (:func:`service_type`).
    :param name: the instance name (:func:`instance_name`).
    :param digest: :func:`namespace_digest` of the namespace.
    :param metadata: ``WorkerMetadata.to_bytes()``, at most :data:`MAX_METADATA` bytes.
    :param secret: signs the record when given; ``None`` leaves it unsigned.
    :param sequence: raised by the publisher with every change of the worker (0 to
        :data:`MAX_SEQUENCE`).
    :raises ValueError: ``metadata`` is longer than :data:`MAX_METADATA` bytes.
    """
    if len(metadata) > MAX_METADATA:
        raise ValueError(f"metadata of {len(metadata)} bytes is over the {MAX_METADATA} bytes "
                         "a LAN record carries")
    chunks = [metadata[i:i + CHUNK] for i in range(0, len(metadata), CHUNK)] or [b""]
    entries = [(b"v", VERSION), (b"ns", digest), (b"q", str(sequence).encode()),
               (b"n", str(len(chunks)).encode())]
    entries += [(str(index).encode(), chunk) for index, chunk in enumerate(chunks)]
    if secret is not None:
        entries.append((b"sig", sign(secret, type_, name, digest, sequence, metadata)))
    out = bytearray()
    for key, value in entries:
        item = key + b"=" + value
        assert len(item) <= 255
        out.append(len(item))
        out += item
    return bytes(out)


def parse_txt(data: bytes) -> dict[bytes, bytes]:
    """The ``key=value`` strings of TXT record data as a mapping (the first of a repeated key
    wins, RFC 6763 §6.4; a string without ``=`` is a key without value, kept as ``b""``).

    :raises InvalidRecord: a length prefix runs past the end of ``data``.
    """
    entries: dict[bytes, bytes] = {}
    offset = 0
    while offset < len(data):
        length = data[offset]
        item = data[offset + 1: offset + 1 + length]
        if len(item) != length:
            raise InvalidRecord("a TXT string runs past the end of the record")
        offset += 1 + length
        key, _, value = item.partition(b"=")
        if key and key not in entries:
            entries[key] = value
    return entries


def decode_txt(type_: str, name: str, digest: bytes, entries: Mapping[bytes, bytes],
               secret: bytes | None) -> WorkerMetadata:
    """The worker a TXT record of instance ``name`` announces, once it checks out.

    :param entries: :func:`parse_txt` of the record.
    :param secret: with a secret, only a record signed with it is accepted; ``None`` accepts
        signed and unsigned records alike (nothing to verify them with).
    :raises InvalidRecord: another format version, an instance name that is no worker's,
        another namespace, a malformed sequence number, a missing or malformed chunk, an
        instance name that is not the metadata's uid, undecodable metadata, or (with a secret)
        a missing or wrong signature.
    """
    if entries.get(b"v") != VERSION:
        raise InvalidRecord(f"format version {entries.get(b'v')!r}, not {VERSION!r}")
    uid = uid_of(name, type_)
    if uid is None:  # first: nothing below ever looks at a name that is no uid's
        raise InvalidRecord(f"instance {name[:80]!r} is not named after a worker uid")
    sequence = sequence_of(entries)
    if not hmac.compare_digest(entries.get(b"ns", b""), digest):
        raise InvalidRecord("a record of another namespace (its service type collides)")
    count_text = entries.get(b"n", b"")
    if not (count_text.isdigit() and 1 <= int(count_text) <= MAX_METADATA // CHUNK + 1):
        raise InvalidRecord(f"chunk count {count_text!r}")
    chunks = [entries.get(str(index).encode()) for index in range(int(count_text))]
    if any(chunk is None for chunk in chunks):
        raise InvalidRecord("a metadata chunk is missing")
    metadata = b"".join(chunks)  # type: ignore[arg-type]
    if secret is not None:
        signature = entries.get(b"sig")
        if signature is None or not hmac.compare_digest(
                signature, sign(secret, type_, name, digest, sequence, metadata)):
            try:
                claimed = WorkerMetadata.from_bytes(metadata).address
            except ValueError as exc:
                raise InvalidRecord(str(exc)) from None
            if signature is None:
                raise UnverifiedRecord("unsigned, and this subscriber has a secret", claimed)
            raise UnverifiedRecord("its signature does not verify with this subscriber's "
                                   "secret", claimed)
    try:
        worker = WorkerMetadata.from_bytes(metadata)
    except ValueError as exc:
        raise InvalidRecord(str(exc)) from None
    if uid != worker.uid:
        raise InvalidRecord(f"instance {name!r} announces worker {worker.uid}")
    return worker


def is_loopback(address: str) -> bool:
    """Whether a worker address reaches this host only: a Unix socket, or a TCP host that
    :func:`anywool._interfaces.is_loopback` calls loopback."""
    parsed = Address.parse(address)
    return parsed.host is None or _interfaces.is_loopback(parsed.host)

