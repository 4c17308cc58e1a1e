"""The on-disk format of a namespace registry, readable on its own.

One generation of a namespace is a directory in the private runtime directory::

    ns-<key>/           one generation; its owner holds flock(LOCK_EX) on it for life
        owner           locked by the owner for life: borrowers probe this one
        name            the namespace's name, UTF-8 (the digest in the header vouches for it)
        registry        the file below (pread/pwrite, never mmap)
        notify          the change hint: publishers write a byte after every change
        lease-<hex>     one per bound publisher, which holds flock(LOCK_EX) on it for life
    tmp-<hex>/          a claimant preparing its generation (renamed to ns-<key> to claim)
    dead-<hex>/         a generation being removed

The registry file, all integers little-endian::

    header   (128 bytes)  magic, format version, capacity, block size, owner pid,
                          generation id (16 random bytes), namespace digest (32 bytes),
                          change counter (u64), retired flag (u8)
    slots    capacity x   worker uid, sequence (the counter at its last write), lease id,
                          payload length (0: free)
    journal  256 x        change number, kind, slot index, payload length, worker uid,
                          lease id: a ring of the last 256 changes
    payloads 256 x        each journal entry's encoded WorkerMetadata (block_size bytes,
                          rounded up to 8); none for a drop
    blocks   capacity x   each worker's encoded WorkerMetadata, at most block_size bytes

A claim reserves (``posix_fallocate``) the header, slots and journal; a change that writes a
payload and a block reserves them first, so ``ENOSPC`` leaves the registry as it was, and a
drop never needs more space.

Readers hold ``LOCK_SH``, writers ``LOCK_EX`` on the registry. A change is journalled before
its slot is touched and published by the counter write last, so a writer killed mid-change is
rolled forward by the next writer (and read as rolled forward by snapshots meanwhile).
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from typing import NamedTuple
from uuid import UUID

from anywool.metadata import WorkerMetadata

MAGIC = b"AWNSREG\x01"
FORMAT_VERSION = 2  # 2: journal headers apart from their payloads
MAX_CAPACITY = 65_536
MAX_BLOCK_SIZE = 512 << 10  # the journal keeps 256 blocks: 1 MiB blocks could never fit the bound
MAX_REGISTRY_BYTES = 256 << 20
#: Registries of at most this many bytes (the default one, 128 workers of 1 KiB, takes about
#: 410 KiB) are claimed, read, written and removed in an event loop's own thread on a memory
#: file system: none of that takes more than about a millisecond. Larger ones go to a thread.
IN_LOOP_BYTES = 1 << 20

# magic, version, capacity, block_size, owner_pid, generation, digest, change counter, retired
HEADER = struct.Struct("<8sIIIi16s32sQB7x")
COUNTER_OFFSET = 8 + 4 * 4 + 16 + 32
HEADER_SPACE = 128
# worker uid, sequence (the change counter at the write), lease id, payload length
SLOT = struct.Struct("<16sQ16sI4x")
EMPTY_UID = bytes(16)
# The journal: a ring of the last JOURNAL_LENGTH changes, so a subscriber that keeps up sees
# every change in order instead of only the net effect since its last look. It is also the
# write-ahead log of each change: an entry is complete before the slot it describes is touched,
# so a writer killed mid-change is rolled forward by the next one. Each entry is the change
# counter, the kind, the slot index, the payload length, the worker uid and the lease; the
# entries sit together, and their payloads in a second array: a claim reserves the headers with
# the slots, so that a drop, which writes no payload, never needs space the file does not have.
JOURNAL_LENGTH = 256
ENTRY = struct.Struct("<QBxHI16s16s")
KINDS = ("worker-added", "worker-updated", "worker-dropped")


@dataclass(frozen=True)
class Header:
    capacity: int
    block_size: int
    owner_pid: int
    generation: bytes
    digest: bytes
    counter: int
    retired: bool


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


class Change(NamedTuple):
    kind: str
    uid: UUID
    metadata: WorkerMetadata | None  # None for a drop


def registry_size(capacity: int, block_size: int) -> int:
    """Bytes of a registry file: header, slots, journal and blocks (what the owner allocates)."""
    return Table(-1, capacity, block_size).size


class Table:
    """The registry file of one generation: its layout and the primitive reads and writes.

    Callers hold the registry lock: ``LOCK_SH`` to read, ``LOCK_EX`` to write.
    """

    def __init__(self, fd: int, capacity: int, block_size: int) -> None:
        self.fd = fd
        self.capacity = capacity
        self.block_size = block_size
        self.journal_offset = _align(HEADER_SPACE + capacity * SLOT.size, 64)
        # Everything before this is reserved at claim; payloads and blocks by the change that
        # first writes them.
        self.payloads_offset = _align(self.journal_offset + JOURNAL_LENGTH * ENTRY.size, 64)
        self.payload_size = _align(block_size, 8)
        self.blocks_offset = _align(self.payloads_offset + JOURNAL_LENGTH * self.payload_size,
                                    64)
        self.size = self.blocks_offset + capacity * block_size
        # Blocks the last snapshot could not decode (torn or corrupt), never yielded as workers.
        self.unreadable = 0

    def counter(self) -> tuple[int, bool]:
        return read_counter(self.fd)

    def slots(self) -> list[tuple[bytes, int, bytes, int]]:
        data = os.pread(self.fd, self.capacity * SLOT.size, HEADER_SPACE)
        return list(SLOT.iter_unpack(data))

    def commit(self, index: int, kind: str, worker: UUID, lease: bytes, payload: bytes) -> None:
        """Write one change: its journal entry (payload, then header), the block and slot, then
        the counter that publishes it. Caller holds ``LOCK_EX`` and ran :meth:`recover`."""
        counter = read_counter(self.fd)[0] + 1
        if counter > MAX_COUNTER:
            raise ValueError("its change counter is exhausted")
        offset = self._entry_offset(counter)
        if kind != "worker-dropped":
            # Space first (ENOSPC here leaves everything as it was), then the writes. A drop
            # writes only reserved bytes: removing a worker never fails for want of space.
            reserve(self.fd, self._payload_offset(counter), self.payload_size)
            reserve(self.fd, self.blocks_offset + index * self.block_size, self.block_size)
        if payload:
            os.pwrite(self.fd, payload, self._payload_offset(counter))
        os.pwrite(self.fd, ENTRY.pack(counter, KINDS.index(kind), index, len(payload),
                                       worker.bytes, lease), offset)
        self._apply(index, kind, worker.bytes, lease, payload, counter)
        os.pwrite(self.fd, struct.pack("<Q", counter), COUNTER_OFFSET)

    def recover(self) -> bool:
        """Roll forward a change whose writer died after journalling it (caller holds
        ``LOCK_EX``). Returns whether there was one."""
        counter = read_counter(self.fd)[0] + 1
        offset = self._entry_offset(counter)
        recorded, kind, index, length, uid, lease = ENTRY.unpack(
            os.pread(self.fd, ENTRY.size, offset))
        if recorded != counter or index >= self.capacity or length > self.block_size \
                or kind >= len(KINDS):
            return False
        payload = os.pread(self.fd, length, self._payload_offset(counter)) if length else b""
        self._apply(index, KINDS[kind], uid, lease, payload, counter)
        os.pwrite(self.fd, struct.pack("<Q", counter), COUNTER_OFFSET)
        return True

    def _entry_offset(self, counter: int) -> int:
        return self.journal_offset + (counter % JOURNAL_LENGTH) * ENTRY.size

    def _payload_offset(self, counter: int) -> int:
        return self.payloads_offset + (counter % JOURNAL_LENGTH) * self.payload_size

    def _apply(self, index: int, kind: str, worker: bytes, lease: bytes, payload: bytes,
               counter: int) -> None:
        if kind == "worker-dropped":
            slot = SLOT.pack(EMPTY_UID, counter, EMPTY_UID, 0)
        else:
            os.pwrite(self.fd, payload, self.blocks_offset + index * self.block_size)
            slot = SLOT.pack(worker, counter, lease, len(payload))
        os.pwrite(self.fd, slot, HEADER_SPACE + index * SLOT.size)

    def snapshot(self) -> tuple[int, dict[UUID, WorkerMetadata]]:
        """(change counter, every registered worker in slot order).

        A change a writer journalled and then died before finishing (only a dead writer's can
        be seen here: a live one holds ``LOCK_EX``) is read as if rolled forward, as the next
        writer will roll it: a refresh killed between its block and its slot writes neither
        hides the worker nor shows a torn block. Blocks that still do not decode are counted
        in :attr:`unreadable` and never yielded.
        """
        counter, _ = self.counter()
        pending = self._pending(counter)
        view: dict[UUID, WorkerMetadata] = {}
        unreadable = 0
        slots = self.slots()
        used = [index for index, slot in enumerate(slots) if slot[3]]
        size = self.block_size
        span = (used[-1] + 1) * size if used else 0
        # One read for all blocks when they are few or small (the usual case), else one each.
        blocks = memoryview(os.pread(self.fd, span, self.blocks_offset)) \
            if span <= _BATCH_READ else None
        skip = -1 if pending is None else pending[0]
        decode = WorkerMetadata.from_bytes
        for index in used:
            length = slots[index][3]
            if index == skip:
                continue
            if length > size:  # a damaged slot: never read past its block
                unreadable += 1
                continue
            start = index * size
            try:
                metadata = decode(blocks[start:start + length] if blocks is not None else
                                  os.pread(self.fd, length, self.blocks_offset + start))
            except ValueError:
                unreadable += 1
                continue
            view[metadata.uid] = metadata
        if pending is not None:
            _index, change = pending
            if change.metadata is None:
                view.pop(change.uid, None)
            else:
                view[change.uid] = change.metadata
        self.unreadable = unreadable
        return counter, view

    def _pending(self, counter: int) -> tuple[int, Change] | None:
        """(slot index, change) of a journalled change after ``counter`` that its writer did
        not finish, or ``None``."""
        offset = self._entry_offset(counter + 1)
        recorded, kind, index, length, uid, _lease = ENTRY.unpack(
            os.pread(self.fd, ENTRY.size, offset))
        if recorded != counter + 1 or index >= self.capacity or length > self.block_size \
                or kind >= len(KINDS):
            return None
        metadata = None
        if KINDS[kind] != "worker-dropped":
            try:
                metadata = WorkerMetadata.from_bytes(os.pread(self.fd, length,
                                                              self._payload_offset(counter + 1)))
            except ValueError:
                return None
        return index, Change(KINDS[kind], UUID(bytes=uid), metadata)

    def changes_since(self, since: int) -> tuple[int, list[Change]] | None:
        """The changes after counter ``since``, oldest first, with the current counter.

        :returns: ``None`` when the journal no longer reaches back that far (the caller
            resynchronises from :meth:`snapshot`).
        """
        counter, _ = self.counter()
        if since < 0 or counter - since > JOURNAL_LENGTH or counter < since:
            return None
        changes: list[Change] = []
        for number in range(since + 1, counter + 1):
            offset = self._entry_offset(number)
            head = os.pread(self.fd, ENTRY.size, offset)
            recorded, kind, _index, length, uid, _lease = ENTRY.unpack(head)
            if recorded != number or kind >= len(KINDS) or length > self.block_size:
                return None
            metadata = None
            if KINDS[kind] != "worker-dropped":
                try:
                    metadata = WorkerMetadata.from_bytes(
                        os.pread(self.fd, length, self._payload_offset(number)))
                except ValueError:
                    return None
            changes.append(Change(KINDS[kind], UUID(bytes=uid), metadata))
        return counter, changes


def read_header(fd: int) -> Header:
    data = os.pread(fd, HEADER.size, 0)
    if len(data) < HEADER.size:
        raise ValueError("short registry header")
    magic, version, capacity, block_size, pid, generation, digest, counter, retired = (
        HEADER.unpack(data)
    )
    if magic != MAGIC or version != FORMAT_VERSION:
        raise ValueError("not an anywool registry of a known format")
    return Header(capacity, block_size, pid, generation, digest, counter, bool(retired))


def check_header(header: Header, fd: int) -> None:
    """Refuse a header whose sizes are impossible or that the file is too short for: sizes read
    from a file must never drive an allocation or a read.

    :raises ValueError: saying which.
    """
    if not (1 <= header.capacity <= MAX_CAPACITY and 1 <= header.block_size <= MAX_BLOCK_SIZE):
        raise ValueError("its header names an impossible capacity or block size")
    if os.fstat(fd).st_size < Table(fd, header.capacity, header.block_size).size:
        raise ValueError("it is truncated")


def verify(fd: int, stamped: Header, size: int) -> tuple[int, bool]:
    """(change counter, retired flag) of a bound registry, once it still reads as the one its
    owner stamped: the same magic, format, sizes, owner, generation and namespace, a retired
    flag of 0 or 1, and at least ``size`` bytes.

    Nothing but a claim writes those fields (before the generation can be bound), the file
    never shrinks, and the flag is only ever written 0 or 1: a registry that fails this was
    damaged from outside, never caught mid-write, so no lock is needed for the verdict.

    :raises ValueError: saying what is wrong.
    """
    data = os.pread(fd, HEADER.size, 0)
    if len(data) < HEADER.size:
        raise ValueError("it is truncated")
    magic, version, capacity, block_size, pid, generation, digest, counter, retired = (
        HEADER.unpack(data)
    )
    if magic != MAGIC or version != FORMAT_VERSION:
        raise ValueError("not an anywool registry of a known format")
    if (capacity, block_size, pid, generation, digest) != (
            stamped.capacity, stamped.block_size, stamped.owner_pid, stamped.generation,
            stamped.digest) or retired > 1:
        raise ValueError("its header was overwritten")
    if os.fstat(fd).st_size < size:
        raise ValueError("it is truncated")
    return counter, bool(retired)


def read_counter(fd: int) -> tuple[int, bool]:
    data = os.pread(fd, 9, COUNTER_OFFSET)
    if len(data) < 9:
        raise ValueError("it is truncated")
    counter, retired = struct.unpack("<QB", data)
    return counter, bool(retired)


MAX_COUNTER = 2**64 - 1
# Bytes of blocks a snapshot reads in one call rather than one call per block.
_BATCH_READ = 1 << 20


def reserve(fd: int, offset: int, length: int) -> None:
    """Allocate ``length`` bytes at ``offset`` of a registry, so that writing them later cannot
    fail for want of space.

    :raises OSError: ``ENOSPC`` (nothing was written); a file system without the call is
        left sparse.
    """
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
