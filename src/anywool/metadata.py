"""WorkerMetadata: what discovery says about one worker, and its msgpack codec.

Pure data: no I/O and no event loop here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any
from uuid import UUID, SafeUUID

import msgpack

from anywool import _address
from anywool._address import Address

__all__ = ["WorkerMetadata"]

# Bumped whenever the encoded layout changes; decoders reject what they do not know.
_CODEC_VERSION = 1


@dataclasses.dataclass(frozen=True, eq=False)
class WorkerMetadata:
    """Identity and address of one worker, as published through discovery.

    Equality and hashing use ``uid`` only, so a set of workers never holds two entries for one
    worker; :meth:`same_as` compares every field.

    :param uid: the worker's identity, unique for its lifetime.
    :param address: ``"unix:/absolute/path"`` for a Unix socket or ``"host:port"`` for TCP.
    :param pid: the worker's process id (informational).
    :param version: the anywool version the worker runs.
    :param tags: free-form labels used by proxies to admit workers.
    :param extra: msgpack-serialisable values (str keys); stored read-only.
    :param secure: whether the worker's listener requires an authenticated peer.
    :raises TypeError: a field has the wrong type.
    :raises ValueError: ``address`` is neither form above (the message says what is wrong).
    """

    uid: UUID
    address: str
    pid: int
    version: str
    tags: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    secure: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.uid, UUID):
            raise TypeError(f"uid must be a UUID, got {self.uid!r}")
        if not isinstance(self.address, str):
            raise ValueError(
                f"address must be 'unix:/path' or 'host:port', got {self.address!r}"
            )
        Address.parse(self.address)  # ValueError naming the address and what is wrong
        if isinstance(self.pid, bool) or not isinstance(self.pid, int):
            raise TypeError(f"pid must be an int, got {self.pid!r}")
        if not isinstance(self.version, str):
            raise TypeError(f"version must be a str, got {self.version!r}")
        if isinstance(self.tags, str) or not all(isinstance(t, str) for t in self.tags):
            raise TypeError(f"tags must be an iterable of str, got {self.tags!r}")
        if not isinstance(self.extra, Mapping) or not all(isinstance(k, str) for k in self.extra):
            raise TypeError(f"extra must be a mapping with str keys, got {self.extra!r}")
        object.__setattr__(self, "tags", frozenset(self.tags))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        object.__setattr__(self, "secure", bool(self.secure))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerMetadata):
            return NotImplemented
        return self.uid == other.uid

    def __hash__(self) -> int:
        return hash(self.uid)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            WorkerMetadata,
            (self.uid, self.address, self.pid, self.version, self.tags, dict(self.extra), self.secure),
        )

    def same_as(self, other: WorkerMetadata) -> bool:
        """Whether every field, not just ``uid``, is equal."""
        return self._fields() == other._fields()

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.uid,
            self.address,
            self.pid,
            self.version,
            self.tags,
            dict(self.extra),
            self.secure,
        )

    def to_bytes(self) -> bytes:
        """Encode as msgpack.

        :raises TypeError: a value in ``extra`` is not msgpack-serialisable.
        """
        encoded = msgpack.packb(
            [
                _CODEC_VERSION,
                self.uid.bytes,
                self.address,
                self.pid,
                self.version,
                sorted(self.tags),
                dict(self.extra),
                self.secure,
            ],
            use_bin_type=True,
        )
        assert isinstance(encoded, bytes)  # packb returns None only when given a stream
        return encoded

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> WorkerMetadata:
        """Decode what :meth:`to_bytes` produced.

        :raises ValueError: the bytes are not a metadata record of a known version (whatever
            else decoding hostile bytes raises is turned into this).
        """
        try:
            fields = msgpack.unpackb(data, raw=False, strict_map_key=True)
            version, uid, address, pid, worker_version, tags, extra, secure = fields
            if version != _CODEC_VERSION:
                raise ValueError(f"unknown WorkerMetadata codec version {version!r}")
            if (type(uid) is bytes and len(uid) == 16 and type(address) is str
                    and type(pid) is int and type(worker_version) is str and type(tags) is list
                    and type(extra) is dict and type(secure) is bool
                    and (not tags or _STR.issuperset(map(type, tags)))
                    and (not extra or _STR.issuperset(map(type, extra)))
                    and (address.startswith("unix:/") or _address.is_valid(address))):
                # Exactly what to_bytes writes: build without re-validating. Snapshots decode
                # one record per worker, so this halves their cost.
                self = object.__new__(cls)
                state = self.__dict__  # (a frozen dataclass: its own setattr refuses)
                state["uid"] = _uuid_from_bytes(uid)
                state["address"] = address
                state["pid"] = pid
                state["version"] = worker_version
                state["tags"] = frozenset(tags) if tags else _NO_TAGS
                state["extra"] = MappingProxyType(extra) if extra else _NO_EXTRA
                state["secure"] = secure
                return self
            if not isinstance(tags, list):
                raise ValueError(f"tags are {type(tags).__name__}")
            if not isinstance(uid, bytes) or len(uid) != 16:
                raise ValueError(f"its uid is {uid!r:.60}")
            return cls(UUID(bytes=uid), address, pid, worker_version, frozenset(tags), extra,
                       secure)
        except Exception as exc:  # whatever hostile bytes make decoding raise
            raise ValueError(f"not an encoded WorkerMetadata: {exc}") from exc


def _uuid_from_bytes_directly(raw: bytes) -> UUID:
    # What UUID(bytes=raw) stores, without its argument checks (raw is known to be 16 bytes):
    # a third of the time, per worker of every snapshot.
    uid = object.__new__(UUID)
    object.__setattr__(uid, "int", int.from_bytes(raw, "big"))
    object.__setattr__(uid, "is_safe", _UNKNOWN_SAFETY)
    return uid


_UNKNOWN_SAFETY = SafeUUID.unknown
# Immutable, so every record without tags or extra shares these.
_NO_TAGS: frozenset[str] = frozenset()
_STR = frozenset({str})  # the one type of tags and extra's keys
_NO_EXTRA: Mapping[str, Any] = MappingProxyType({})  # an enum member's lookup costs as much as the rest


def _checked_uuid_constructor() -> Callable[[bytes], UUID]:
    """The direct construction where it builds exactly what ``UUID(bytes=...)`` does (it relies
    on how CPython's UUID stores itself), else the documented one."""
    sample = bytes(range(16))
    try:
        direct = _uuid_from_bytes_directly(sample)
        if direct == UUID(bytes=sample) and str(direct) == str(UUID(bytes=sample)) \
                and hash(direct) == hash(UUID(bytes=sample)) and direct.is_safe is SafeUUID.unknown:
            return _uuid_from_bytes_directly
    except (AttributeError, TypeError):
        pass
    return lambda raw: UUID(bytes=raw)


_uuid_from_bytes = _checked_uuid_constructor()
