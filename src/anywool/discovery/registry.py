"""The file-backed namespace registry: claim, bind, read, publish, reap, release.

Everything here is synchronous and blocking-free in the event-loop sense only because callers
run it in worker threads: no event loop, no anyio, no asyncio. It can be unit-tested alone.

On-disk shape (all below the private runtime directory)::

    ns-<key>/           one generation of a namespace; its owner holds flock(LOCK_EX) on it
        registry        header, slot table, change journal, metadata blocks (pread/pwrite)
        notify          the hint: publishers write a byte after every change
        lease-<hex>     one per bound publisher, which holds flock(LOCK_EX) on it for life
    tmp-<hex>/          a claimant preparing its generation
    dead-<hex>/         a generation being removed

Liveness always comes from a kernel ``flock`` held by the live process; the kernel releases it
when the last descriptor closes, so a SIGKILLed owner or publisher frees it at once.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import logging
import math
import hashlib
import os
import secrets
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

from anywool._runtime_dir import runtime_dir
from anywool.errors import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryRegistryCorrupt,
    DiscoveryWorkerNotFound,
)
from anywool.metadata import WorkerMetadata

__all__ = [
    "Binding",
    "Claim",
    "Lease",
    "MAX_BLOCK_SIZE",
    "MAX_CAPACITY",
    "bind",
    "claim",
    "namespace_key",
    "namespace_path",
]

log = logging.getLogger(__name__)

MAGIC = b"AWNSREG\x01"
FORMAT_VERSION = 1
MAX_CAPACITY = 65_536
MAX_BLOCK_SIZE = 512 << 10  # the journal keeps 256 blocks: 1 MiB blocks could never fit the bound
MAX_REGISTRY_BYTES = 256 << 20

# magic, version, capacity, block_size, owner_pid, generation, digest, change counter, retired
_HEADER = struct.Struct("<8sIIIi16s32sQB7x")
_COUNTER_OFFSET = 8 + 4 * 4 + 16 + 32
_HEADER_SPACE = 128
# worker uid, sequence (the change counter at the write), lease id, payload length
_SLOT = struct.Struct("<16sQ16sI4x")
_EMPTY_UID = bytes(16)
# The journal: a ring of the last JOURNAL_LENGTH changes, so a subscriber that keeps up sees
# every change in order instead of only the net effect since its last look. It is also the
# write-ahead log of each change: an entry is complete before the slot it describes is touched,
# so a writer killed mid-change is rolled forward by the next one. Each entry is the change
# counter, the kind, the slot index, the payload length, the worker uid and the lease, then the
# payload itself.
JOURNAL_LENGTH = 256
_ENTRY = struct.Struct("<QBxHI16s16s")
_KINDS = ("worker-added", "worker-updated", "worker-dropped")

# Bytes of blake2b kept for a namespace key (26 base32 characters). Tests shrink it to force
# collisions, which the digest stored in the header must then catch.
KEY_BYTES = 16

# A probe that finds a lock held retries for this long before calling its holder alive: another
# prober may hold it for an instant, a live owner holds it continuously.
_PROBE_WINDOW = 0.002


def namespace_key(namespace: str) -> str:
    """The file-system key of a namespace: a domain-separated blake2b hash in base32.

    The raw name never reaches the file system, so any string (``"a/b"``, ``".."``, NUL,
    10 000 characters) is a valid namespace.
    """
    raw = hashlib.blake2b(b"ns\0" + _encode(namespace), digest_size=KEY_BYTES).digest()
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def namespace_digest(namespace: str) -> bytes:
    """The full 32-byte digest stored in the header and checked at bind."""
    return hashlib.blake2b(b"digest\0" + _encode(namespace), digest_size=32).digest()


def namespace_path(namespace: str, root: Path | None = None) -> Path:
    """The directory a live generation of ``namespace`` occupies."""
    return (root or runtime_dir()) / f"ns-{namespace_key(namespace)}"


def _encode(namespace: str) -> bytes:
    return namespace.encode("utf-8", "surrogatepass")


# -- locks ------------------------------------------------------------------------------------


def _try_lock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _probe_free(fd: int, operation: int = fcntl.LOCK_EX) -> bool:
    """Whether the lock on ``fd`` is free (its holder is dead); the lock is left *taken* if so.

    Retries for ``_PROBE_WINDOW`` seconds so that a concurrent prober's momentary hold is not
    mistaken for a live holder.
    """
    deadline = time.monotonic() + _PROBE_WINDOW
    while True:
        if _try_lock(fd, operation):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0002)


def lock_with_backoff(
    fd: int,
    operation: int,
    *,
    timeout: float | None,
    describe: Callable[[], str],
    checkpoint: Callable[[], None] | None = None,
    started: float | None = None,
) -> None:
    """Take ``flock(operation)`` by polling ``LOCK_NB`` with a 1 ms → 20 ms backoff.

    Never blocks in ``flock`` itself, so the calling thread can always be told to stop:
    ``checkpoint`` is called between attempts and may raise (cancellation).

    :param started: ``time.monotonic()`` when the caller began waiting (default: now); the
        timeout counts from there.
    :raises TimeoutError: not acquired within ``timeout`` seconds (``None``: wait forever).
    """
    if _try_lock(fd, operation):
        return
    begun = time.monotonic() if started is None else started
    deadline = None if timeout is None else begun + timeout
    delay = 0.001
    while True:
        if checkpoint is not None:
            checkpoint()
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{describe()}: lock not acquired within {timeout} s")
            time.sleep(min(delay, remaining))
        else:
            time.sleep(delay)
        if _try_lock(fd, operation):
            return
        delay = min(delay * 2, 0.02)


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _open_file(path: Path, flags: int = os.O_RDWR) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def _close_quietly(fd: int | None) -> None:
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


# -- layout -----------------------------------------------------------------------------------


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
        self.journal_offset = _align(_HEADER_SPACE + capacity * _SLOT.size, 64)
        self.entry_size = _align(_ENTRY.size + block_size, 8)
        self.blocks_offset = _align(self.journal_offset + JOURNAL_LENGTH * self.entry_size, 64)
        self.size = self.blocks_offset + capacity * block_size
        # Blocks the last snapshot could not decode (torn or corrupt), never yielded as workers.
        self.unreadable = 0

    def counter(self) -> tuple[int, bool]:
        return _read_counter(self.fd)

    def slots(self) -> list[tuple[bytes, int, bytes, int]]:
        data = os.pread(self.fd, self.capacity * _SLOT.size, _HEADER_SPACE)
        return list(_SLOT.iter_unpack(data))

    def commit(self, index: int, kind: str, worker: UUID, lease: bytes, payload: bytes) -> None:
        """Write one change: its journal entry (payload, then header), the block and slot, then
        the counter that publishes it. Caller holds ``LOCK_EX`` and ran :meth:`recover`."""
        counter = _read_counter(self.fd)[0] + 1
        if counter > _MAX_COUNTER:
            raise ValueError("its change counter is exhausted")
        offset = self._entry_offset(counter)
        # Space first (ENOSPC here leaves everything as it was), then the writes.
        _reserve(self.fd, offset, self.entry_size)
        if kind != "worker-dropped":
            _reserve(self.fd, self.blocks_offset + index * self.block_size, self.block_size)
        if payload:
            os.pwrite(self.fd, payload, offset + _ENTRY.size)
        os.pwrite(self.fd, _ENTRY.pack(counter, _KINDS.index(kind), index, len(payload),
                                       worker.bytes, lease), offset)
        self._apply(index, kind, worker.bytes, lease, payload, counter)
        os.pwrite(self.fd, struct.pack("<Q", counter), _COUNTER_OFFSET)

    def recover(self) -> bool:
        """Roll forward a change whose writer died after journalling it (caller holds
        ``LOCK_EX``). Returns whether there was one."""
        counter = _read_counter(self.fd)[0] + 1
        offset = self._entry_offset(counter)
        recorded, kind, index, length, uid, lease = _ENTRY.unpack(
            os.pread(self.fd, _ENTRY.size, offset))
        if recorded != counter or index >= self.capacity or length > self.block_size \
                or kind >= len(_KINDS):
            return False
        payload = os.pread(self.fd, length, offset + _ENTRY.size) if length else b""
        self._apply(index, _KINDS[kind], uid, lease, payload, counter)
        os.pwrite(self.fd, struct.pack("<Q", counter), _COUNTER_OFFSET)
        return True

    def _entry_offset(self, counter: int) -> int:
        return self.journal_offset + (counter % JOURNAL_LENGTH) * self.entry_size

    def _apply(self, index: int, kind: str, worker: bytes, lease: bytes, payload: bytes,
               counter: int) -> None:
        if kind == "worker-dropped":
            slot = _SLOT.pack(_EMPTY_UID, counter, _EMPTY_UID, 0)
        else:
            os.pwrite(self.fd, payload, self.blocks_offset + index * self.block_size)
            slot = _SLOT.pack(worker, counter, lease, len(payload))
        os.pwrite(self.fd, slot, _HEADER_SPACE + index * _SLOT.size)

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
        span = (used[-1] + 1) * self.block_size if used else 0
        # One read for all blocks when they are few or small (the usual case), else one each.
        blocks = memoryview(os.pread(self.fd, span, self.blocks_offset)) \
            if span <= _BATCH_READ else None
        for index in used:
            length = slots[index][3]
            if pending is not None and pending[0] == index:
                continue
            start = index * self.block_size
            data = blocks[start:start + length] if blocks is not None else \
                os.pread(self.fd, length, self.blocks_offset + start)
            try:
                metadata = WorkerMetadata.from_bytes(data)
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
        recorded, kind, index, length, uid, _lease = _ENTRY.unpack(
            os.pread(self.fd, _ENTRY.size, offset))
        if recorded != counter + 1 or index >= self.capacity or length > self.block_size \
                or kind >= len(_KINDS):
            return None
        metadata = None
        if _KINDS[kind] != "worker-dropped":
            try:
                metadata = WorkerMetadata.from_bytes(os.pread(self.fd, length,
                                                              offset + _ENTRY.size))
            except ValueError:
                return None
        return index, Change(_KINDS[kind], UUID(bytes=uid), metadata)

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
            head = os.pread(self.fd, _ENTRY.size, offset)
            recorded, kind, _index, length, uid, _lease = _ENTRY.unpack(head)
            if recorded != number or kind >= len(_KINDS) or length > self.block_size:
                return None
            metadata = None
            if _KINDS[kind] != "worker-dropped":
                try:
                    metadata = WorkerMetadata.from_bytes(
                        os.pread(self.fd, length, offset + _ENTRY.size))
                except ValueError:
                    return None
            changes.append(Change(_KINDS[kind], UUID(bytes=uid), metadata))
        return counter, changes


def _read_header(fd: int) -> Header:
    data = os.pread(fd, _HEADER.size, 0)
    if len(data) < _HEADER.size:
        raise ValueError("short registry header")
    magic, version, capacity, block_size, pid, generation, digest, counter, retired = (
        _HEADER.unpack(data)
    )
    if magic != MAGIC or version != FORMAT_VERSION:
        raise ValueError("not an anywool registry of a known format")
    return Header(capacity, block_size, pid, generation, digest, counter, bool(retired))


def _read_counter(fd: int) -> tuple[int, bool]:
    data = os.pread(fd, 9, _COUNTER_OFFSET)
    if len(data) < 9:
        raise ValueError("it is truncated")
    counter, retired = struct.unpack("<QB", data)
    return counter, bool(retired)


_MAX_COUNTER = 2**64 - 1
# Bytes of blocks a snapshot reads in one call rather than one call per block.
_BATCH_READ = 1 << 20


def _owner_alive(dir_fd: int) -> bool:
    """Whether a live owner holds the generation whose directory ``dir_fd`` is (one try:
    ``LOCK_SH`` conflicts only with the owner's ``LOCK_EX``)."""
    if _try_lock(dir_fd, fcntl.LOCK_SH):
        _unlock(dir_fd)
        return False
    return True


# -- fork -------------------------------------------------------------------------------------

# Descriptors that carry a lock proving a process alive (an owner's directory, a publisher's
# lease). flock belongs to the open file description, which fork shares: a child that kept them
# would keep a dead parent "alive". The child closes its copies (closing never unlocks the
# parent's) and its inherited handles become inert.
_LOCK_HOLDERS: weakref.WeakSet[Claim | Lease] = weakref.WeakSet()


def _forget_inherited_locks() -> None:
    for holder in list(_LOCK_HOLDERS):
        holder.forget()


os.register_at_fork(after_in_child=_forget_inherited_locks)


# -- generations -----------------------------------------------------------------------------


class _Open:
    """Descriptors on one generation (its directory and registry) and the registry's layout."""

    def __init__(self, namespace: str, path: Path, dir_fd: int, registry_fd: int,
                 header: Header, owner_fd: int = -1) -> None:
        self.namespace = namespace
        self.path = path
        self.dir_fd = dir_fd
        # The ``owner`` file, locked by the owner for life: borrowers probe its lock (never the
        # directory's, which claimants probe), so that their probes, however many, never make
        # a dead owner look alive to a claimant. -1 for a generation without one.
        self.owner_fd = owner_fd
        self.registry_fd = registry_fd
        self.header = header
        self.table = Table(registry_fd, header.capacity, header.block_size)
        self.guard = threading.Lock()  # the threads sharing registry_fd
        # Blocks snapshots left out because they did not decode (see Binding.snapshot).
        self.unreadable_blocks = 0
        self._reported_unreadable = False

    @property
    def capacity(self) -> int:
        return self.header.capacity

    def _owner_alive(self) -> bool:
        return _owner_alive(self.owner_fd if self.owner_fd >= 0 else self.dir_fd)

    @contextmanager
    def _typed(self) -> Iterator[None]:
        """Turn a registry that does not read as its format says into a typed error: the truth
        about its owner, never a raw ``struct.error``."""
        try:
            yield
        except (struct.error, ValueError) as exc:
            if self._owner_alive():
                raise DiscoveryRegistryCorrupt(self.namespace, str(self.path / "registry"),
                                               str(exc) or type(exc).__name__) from exc
            raise DiscoveryNamespaceNotFound(self.namespace) from None

    @property
    def block_size(self) -> int:
        return self.header.block_size

    def close(self) -> None:
        _close_quietly(self.registry_fd)
        _close_quietly(self.owner_fd)
        _close_quietly(self.dir_fd)
        self.registry_fd = self.owner_fd = self.dir_fd = -1


class Claim(_Open):
    """An owner's hold on one generation of a namespace (``ns-<key>/``).

    The directory descriptor carries ``flock(LOCK_EX)`` for the owner's lifetime (claimants
    probe it), and so does the ``owner`` file's (borrowers probe that one). Created by
    :func:`claim`; :meth:`release` retires and removes the generation.
    """

    def __init__(self, namespace: str, root: Path, path: Path, dir_fd: int, registry_fd: int,
                 header: Header, owner_fd: int = -1) -> None:
        super().__init__(namespace, path, dir_fd, registry_fd, header, owner_fd)
        self.root = root
        self.pid = os.getpid()
        self._released = False
        self._retired = False
        _LOCK_HOLDERS.add(self)

    def forget(self) -> None:
        """In a forked child: drop the inherited descriptors without touching the parent's."""
        self._released = True
        self.close()

    def _owner_alive(self) -> bool:
        # This is the owner: never probe our own lock (flock on our own descriptor would
        # convert, then drop, the very lock that proves us alive).
        return True

    def retire(self, lock_timeout: float | None = 5.0,
               checkpoint: Callable[[], None] | None = None) -> None:
        """Retire the generation under the registry lock and wake its subscribers (graceful).

        Borrowers stop binding a retired generation and subscribers drop its workers. The files
        stay until :meth:`release`.

        :param lock_timeout: seconds the registry lock may be waited for (``None``: forever).
        :param checkpoint: called between lock attempts; it may raise (cancellation).
        :raises TimeoutError: the lock was not taken within ``lock_timeout`` seconds; nothing
            was written.

        Whatever ``checkpoint`` raises propagates with nothing written. A no-op once retired or
        released, and in a process forked from the owner.
        """
        if self._retired or self._released or os.getpid() != self.pid:
            return
        lock_with_backoff(self.registry_fd, fcntl.LOCK_EX, timeout=lock_timeout,
                          describe=lambda: f"discovery namespace {self.namespace!r}",
                          checkpoint=checkpoint)
        try:
            self._mark_retired()
        finally:
            _unlock(self.registry_fd)

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has run (the generation is gone, or this is a forked
        child's copy)."""
        return self._released

    def release(self, lock_timeout: float | None = 5.0,
                checkpoint: Callable[[], None] | None = None) -> None:
        """Retire the generation (see :meth:`retire`), then remove every file of it and close
        its descriptors, which releases the owner's lock.

        When the registry lock is not taken within ``lock_timeout`` seconds (``0``: one
        non-blocking attempt), or ``checkpoint`` raises while waiting for it, the generation is
        retired without the lock (a wedged writer cannot keep a generation that is going away)
        and removed all the same; what ``checkpoint`` raised is then re-raised.

        A process forked from the owner removes nothing (its pid differs from the claimer's).
        Idempotent.
        """
        if self._released:
            return
        self._released = True
        interrupted: BaseException | None = None
        try:
            if os.getpid() != self.pid:
                return
            try:
                if not self._retired:
                    try:
                        lock_with_backoff(self.registry_fd, fcntl.LOCK_EX, timeout=lock_timeout,
                                          describe=lambda: f"discovery namespace {self.namespace!r}",
                                          checkpoint=checkpoint)
                        locked = True
                    except TimeoutError:
                        locked = False
                    except BaseException as exc:  # the checkpoint's cancellation, or worse
                        interrupted, locked = exc, False
                    try:
                        self._mark_retired()
                    finally:
                        if locked:
                            _unlock(self.registry_fd)
            finally:
                # Whatever happened to the registry (even corrupted), its files go.
                _remove_generation(self.root, self.path)
        finally:
            self.close()  # releases the owner's flock
        if interrupted is not None:
            raise interrupted

    def try_release(self) -> bool:
        """:meth:`release` if the registry lock is free right now, without waiting for it.

        For an event loop on a memory file system: every call it makes returns at once.

        :returns: whether the generation was released; if not (a writer holds the lock),
            nothing was done.
        """
        if self._released or os.getpid() != self.pid:
            self.release()
            return True
        if not self._retired:
            if not _try_lock(self.registry_fd, fcntl.LOCK_EX):
                return False
            try:
                self._mark_retired()
            finally:
                _unlock(self.registry_fd)
        self.release()
        return True

    def _mark_retired(self) -> None:
        """Set the retired flag, bump the counter and write the hint (lock held, or not)."""
        try:
            counter, _ = _read_counter(self.registry_fd)
        except ValueError:
            counter = 0  # a truncated registry: the flag still tells readers it is over
        os.pwrite(self.registry_fd, struct.pack("<QB", min(counter + 1, _MAX_COUNTER), 1),
                  _COUNTER_OFFSET)
        self._retired = True
        _touch_hint(self.path)

    def reap(self, lock_timeout: float | None = 5.0,
             checkpoint: Callable[[], None] | None = None) -> list[UUID]:
        """Clear the slots of publishers whose lease lock is free (the process died), remove
        their lease files, and roll forward a change a dead writer left half done.

        :param checkpoint: called between registry lock attempts; it may raise (cancellation).
        :returns: the uids of the workers removed.
        :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` seconds.
        """
        removed: list[UUID] = []
        with _locked(self.registry_fd, self.guard, fcntl.LOCK_EX, lock_timeout, self.namespace,
                     checkpoint), self._typed():
            recovered = self.table.recover()
            slots = self.table.slots()
            dead = {lease for lease in _lease_ids(self.path) if _lease_is_dead(self.path, lease)}
            for index, (uid, _seq, lease, length) in enumerate(slots):
                if length and lease in dead:
                    removed.append(UUID(bytes=uid))
                    self.table.commit(index, "worker-dropped", removed[-1], _EMPTY_UID, b"")
            # A lease file goes once its slots are clear; referenced leases without a file
            # (deleted by hand) count as dead too.
            missing = {e[2] for e in slots if e[3] and e[2] != _EMPTY_UID} - _lease_ids(self.path)
            for index, (uid, _seq, lease, length) in enumerate(slots):
                if length and lease in missing:
                    removed.append(UUID(bytes=uid))
                    self.table.commit(index, "worker-dropped", removed[-1], _EMPTY_UID, b"")
        for lease in dead:
            _unlink_quietly(self.path / f"lease-{lease.hex()}")
        _sweep_pending_leases(self.path)
        if recovered or removed:
            _touch_hint(self.path)
        return removed


def claim(namespace: str, *, capacity: int, block_size: int, reclaim: bool = True,
          root: Path | None = None) -> Claim:
    """Claim ``namespace`` atomically across processes.

    Builds a stamped generation in ``tmp-<random>/`` under its own lock, then renames it to
    ``ns-<key>``; the rename fails when a generation exists, so exactly one racing claimant
    wins. A generation whose owner is dead (its lock can be taken) is swept and the rename
    retried once when ``reclaim`` is true. At most every :data:`SWEEP_INTERVAL` seconds, a
    claim also sweeps what dead processes left in the runtime directory.

    :raises DiscoveryNamespaceInUse: a live owner holds the namespace, or a dead one does and
        ``reclaim`` is false (``owner_pid`` is then ``None``).
    :raises OSError: the registry could not be created (for example no space); nothing created
        is left behind.
    """
    root = root or runtime_dir()
    target = namespace_path(namespace, root)
    sweep_now_and_then(root, keep=target)
    claimed = _claim(namespace, root, target, capacity, block_size, reclaim, blocking=True)
    assert claimed is not None
    return claimed


def try_claim(namespace: str, *, capacity: int, block_size: int,
              root: Path | None = None) -> Claim | None:
    """One attempt at :func:`claim` that never waits: no sweep, no probe, no lock wait.

    For an event loop on a memory file system (see :func:`anywool._runtime_dir.in_memory`),
    where every call it makes returns at once.

    :returns: the claim, or ``None`` (nothing left behind) when a generation of the namespace
        already exists (live or dead: :func:`claim` tells which).
    :raises OSError: as :func:`claim`.
    """
    root = root or runtime_dir()
    return _claim(namespace, root, namespace_path(namespace, root), capacity, block_size,
                  reclaim=False, blocking=False)


def _claim(namespace: str, root: Path, target: Path, capacity: int, block_size: int,
           reclaim: bool, *, blocking: bool) -> Claim | None:
    tmp = root / f"tmp-{secrets.token_hex(8)}"
    os.mkdir(tmp, 0o700)
    dir_fd = registry_fd = owner_fd = None
    try:
        dir_fd = _open_dir(tmp)
        if blocking:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
        elif not _try_lock(dir_fd, fcntl.LOCK_EX):
            raise _Busy  # a sweeper is removing it: let the blocking path start over
        owner_fd = _open_file(tmp / "owner", os.O_RDWR | os.O_CREAT | os.O_EXCL)
        os.fchmod(owner_fd, 0o600)
        fcntl.flock(owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        registry_fd, header = _create_registry(tmp, namespace, capacity, block_size)
        fd = _open_file(tmp / "notify", os.O_RDWR | os.O_CREAT | os.O_EXCL)
        os.fchmod(fd, 0o600)
        os.close(fd)
        for attempt in range(3):
            try:
                os.rename(tmp, target)
                return Claim(namespace, root, target, dir_fd, registry_fd, header, owner_fd)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
            if not blocking:
                raise _Busy
            incumbent = _probe_incumbent(namespace, target)
            if incumbent is not None:
                raise incumbent
            if not reclaim:
                raise DiscoveryNamespaceInUse(namespace, str(target), None)
            _sweep_dead(root, target)
        raise DiscoveryNamespaceInUse(namespace, str(target), _owner_pid(target))
    except BaseException as exc:
        _close_quietly(registry_fd)
        _close_quietly(owner_fd)
        _close_quietly(dir_fd)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, _Busy):
            return None
        raise


class _Busy(Exception):
    """A non-blocking claim found something it would have to wait for."""


def _create_registry(directory: Path, namespace: str, capacity: int,
                     block_size: int) -> tuple[int, Header]:
    fd = _open_file(directory / "registry", os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        os.fchmod(fd, 0o600)
        table = Table(fd, capacity, block_size)
        os.ftruncate(fd, table.size)
        # Reserve the header and slots now; journal entries and blocks are reserved by the
        # write that first needs them (Table.commit), before it writes anything. Zeroing the
        # whole file here cost a claim more than everything else it does.
        _reserve(fd, 0, table.journal_offset)
        header = Header(capacity, block_size, os.getpid(), secrets.token_bytes(16),
                        namespace_digest(namespace), 0, False)
        os.pwrite(fd, _HEADER.pack(MAGIC, FORMAT_VERSION, capacity, block_size, header.owner_pid,
                                   header.generation, header.digest, 0, 0), 0)
        return fd, header
    except BaseException:
        os.close(fd)
        raise


def _reserve(fd: int, offset: int, length: int) -> None:
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


def _probe_incumbent(namespace: str, target: Path) -> DiscoveryNamespaceInUse | None:
    """The error to raise if ``target`` has a live owner; ``None`` if it is dead or gone.

    Something other than a directory there (a symlink, a file) is not a generation: it is
    removed, since nothing of ours put it in our private directory under that name.
    """
    try:
        fd = _open_dir(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        _unlink_quietly(target)
        return None
    try:
        if _probe_free(fd):
            _unlock(fd)
            return None
        return DiscoveryNamespaceInUse(namespace, str(target), _owner_pid(target))
    finally:
        os.close(fd)


def _owner_pid(target: Path) -> int | None:
    try:
        fd = _open_file(target / "registry", os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read_header(fd).owner_pid
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _sweep_dead(root: Path, target: Path) -> None:
    """Remove ``target`` if its owner is dead, holding its lock throughout."""
    try:
        fd = _open_dir(target)
    except FileNotFoundError:
        return
    try:
        if not _probe_free(fd):
            return
        try:
            current = os.stat(target, follow_symlinks=False)
        except FileNotFoundError:
            return
        locked = os.fstat(fd)
        if (current.st_dev, current.st_ino) != (locked.st_dev, locked.st_ino):
            return  # another sweeper replaced it meanwhile
        _remove_generation(root, target)
    finally:
        os.close(fd)


def _remove_generation(root: Path, path: Path) -> None:
    dead = root / f"dead-{secrets.token_hex(8)}"
    try:
        os.rename(path, dead)
    except FileNotFoundError:
        return
    shutil.rmtree(dead, ignore_errors=True)


#: Seconds between the sweeps of a whole runtime directory a process's claims make. A claim
#: whose own namespace is held by a dead owner always sweeps that one at once; the rest
#: (other dead generations, killed claimants' and workers' leftovers) can wait: a sweep costs
#: a probe per entry, which the claim fast path should not pay every time.
SWEEP_INTERVAL = 10.0
_last_sweep = -math.inf


def sweep_due() -> bool:
    """Whether this process's next :func:`claim` sweeps the runtime directory."""
    return time.monotonic() - _last_sweep >= SWEEP_INTERVAL


def sweep_now_and_then(root: Path, keep: Path | None = None) -> None:
    """Sweep the runtime directory (see :func:`_sweep_leftovers`) if this process has not in
    the last :data:`SWEEP_INTERVAL` seconds. ``keep`` is a generation to leave alone."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep >= SWEEP_INTERVAL:
        _last_sweep = now
        _sweep_leftovers(root, keep)


def _sweep_leftovers(root: Path, keep: Path | None) -> None:
    """Remove what dead processes left behind: ``tmp-*`` and ``dead-*`` directories of killed
    claimants, generations (``ns-*``) whose owner died, e.g. the random namespace of a
    SIGKILLed pool that nobody will ever claim again, and the socket directories (``w-*``) of
    killed workers. ``keep`` (the namespace being claimed) is
    left to the claim's own reclaim logic, which honours ``reclaim=False``.

    A lock that can be taken proves its holder is gone; anything locked is left alone.
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    now = time.time()
    for name in names:
        if not name.startswith(("tmp-", "dead-", "ns-", "w-")) or (
                keep is not None and name == keep.name):
            continue
        path = root / name
        try:
            fd = _open_dir(path)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            # A claimant (a worker) locks its tmp (w-) directory right after mkdir: spare very
            # young ones.
            if name.startswith(("tmp-", "w-")) and now - info.st_mtime < 1.0:
                continue
            if not _try_lock(fd, fcntl.LOCK_EX):
                continue
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
                continue  # replaced meanwhile by someone else's generation
            if name.startswith("ns-"):
                _remove_generation(root, path)
            else:
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


# -- bind -------------------------------------------------------------------------------------


class Binding(_Open):
    """A borrower's handle on the live generation of a namespace.

    Holds descriptors on the generation directory and its registry; never holds the owner's
    lock (liveness is probed with ``LOCK_SH | LOCK_NB``, which conflicts only with the owner).
    """

    @property
    def generation(self) -> bytes:
        return self.header.generation

    def is_live(self) -> bool:
        """Whether the owner of this generation is alive and has not retired it."""
        try:
            _, retired = _read_counter(self.registry_fd)
        except OSError:
            return False
        except ValueError:
            retired = False  # unreadable: whether its owner lives is the lock's to say
        if retired:
            return False
        # One try on the owner file (LOCK_SH conflicts only with the owner's LOCK_EX): never on
        # the directory, whose lock claimants probe to tell a dead owner.
        return self._owner_alive()

    def counter(self) -> tuple[int, bool]:
        """(change counter, retired flag) from the header; a cheap unlocked read.

        :raises DiscoveryRegistryCorrupt: the registry is unreadable and its owner alive.
        """
        with self._typed():
            return _read_counter(self.registry_fd)

    # -- reads --

    def snapshot(self, lock_timeout: float | None = 30.0,
                 checkpoint: Callable[[], None] | None = None,
                 ) -> tuple[int, dict[UUID, WorkerMetadata]]:
        """(change counter, every registered worker), read consistently under ``LOCK_SH``.

        Blocks that cannot be decoded are left out and counted in :attr:`unreadable_blocks`;
        the first time one is seen it is logged.
        """
        with _locked(self.registry_fd, self.guard, fcntl.LOCK_SH, lock_timeout, self.namespace, checkpoint), \
                self._typed():
            result = self.table.snapshot()
        if self.table.unreadable:
            self.unreadable_blocks += self.table.unreadable
            if not self._reported_unreadable:
                self._reported_unreadable = True
                log.warning("discovery namespace %r: %d registry block(s) could not be decoded "
                            "(torn or corrupt) and were left out", self.namespace,
                            self.table.unreadable)
        return result

    def changes_since(self, since: int, lock_timeout: float | None = 30.0,
                      checkpoint: Callable[[], None] | None = None,
                      ) -> tuple[int, list[Change]] | None:
        """Every change after counter ``since`` in write order, read from the journal.

        Costs O(changes), whatever the number of workers. ``None`` when the journal no longer
        reaches back to ``since`` (the reader fell more than ``JOURNAL_LENGTH`` changes
        behind): take a :meth:`snapshot` instead.
        """
        with _locked(self.registry_fd, self.guard, fcntl.LOCK_SH, lock_timeout, self.namespace, checkpoint), \
                self._typed():
            return self.table.changes_since(since)

    # -- writes --

    def publish(self, kind: str, metadata: WorkerMetadata, lease: bytes, *,
                lock_timeout: float | None,
                checkpoint: Callable[[], None] | None = None) -> bool:
        """Apply one change under ``LOCK_EX`` and write the hint.

        :returns: whether the registry changed.
        :raises DiscoveryBlockExhausted: the encoded metadata exceeds ``block_size`` bytes.
        :raises DiscoveryCapacityExhausted: no free slot for a new worker.
        :raises DiscoveryWorkerNotFound: ``kind`` is ``"worker-updated"`` for an unknown uid.
        :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` seconds.
        """
        payload = b""
        if kind != "worker-dropped":
            payload = metadata.to_bytes()
            if len(payload) > self.header.block_size:
                raise DiscoveryBlockExhausted(len(payload))
        uid = metadata.uid.bytes
        with _locked(self.registry_fd, self.guard, fcntl.LOCK_EX, lock_timeout, self.namespace, checkpoint), \
                self._typed():
            self.table.recover()
            slots = self.table.slots()
            index = next((i for i, entry in enumerate(slots) if entry[3] and entry[0] == uid),
                         None)
            if kind == "worker-dropped":
                if index is None:
                    return False
            elif kind == "worker-updated":
                if index is None:
                    raise DiscoveryWorkerNotFound(metadata.uid)
                lease = slots[index][2]
            elif index is None:
                index = next((i for i, entry in enumerate(slots) if not entry[3]), None)
                if index is None:
                    raise DiscoveryCapacityExhausted(self.header.capacity)
            self.table.commit(index, kind, metadata.uid, lease, payload)
        _touch_hint(self.path)
        return True

    def withdraw(self, lease: bytes, *, lock_timeout: float | None,
                 checkpoint: Callable[[], None] | None = None) -> int:
        """Clear every slot written under ``lease`` under ``LOCK_EX`` and write the hint.

        :param lock_timeout: seconds the registry lock may be waited for (``None``: forever,
            ``0``: one non-blocking attempt).
        :param checkpoint: called between lock attempts; it may raise (cancellation), and then
            nothing was changed.
        :returns: how many slots were cleared.
        :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` seconds.
        """
        with _locked(self.registry_fd, self.guard, fcntl.LOCK_EX, lock_timeout, self.namespace,
                     checkpoint), self._typed():
            self.table.recover()
            slots = self.table.slots()
            indices = [i for i, entry in enumerate(slots) if entry[3] and entry[2] == lease]
            for index in indices:
                self.table.commit(index, "worker-dropped", UUID(bytes=slots[index][0]),
                                  _EMPTY_UID, b"")
        if indices:
            _touch_hint(self.path)
        return len(indices)

    # -- leases --

    def open_lease(self) -> Lease:
        """Create and lock this publisher's lease file in the generation directory.

        The file is locked under a temporary name and then renamed into place, so the reaper
        never sees a ``lease-*`` file whose lock is not yet held.
        """
        lease_id = secrets.token_bytes(16)
        path = self.path / f"lease-{lease_id.hex()}"
        pending = self.path / f"pending-{lease_id.hex()}"
        fd = _open_file(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(pending, path)
        except BaseException:
            os.close(fd)
            _unlink_quietly(pending)
            raise
        return Lease(lease_id, path, fd)


class Lease:
    """A publisher's liveness token: a file it holds ``flock(LOCK_EX)`` on for its lifetime."""

    def __init__(self, lease_id: bytes, path: Path, fd: int) -> None:
        self.id = lease_id
        self.path = path
        self.fd = fd
        self.pid = os.getpid()
        _LOCK_HOLDERS.add(self)

    def forget(self) -> None:
        """In a forked child: drop the inherited descriptor; the parent's lease stays."""
        _close_quietly(self.fd)
        self.fd = -1

    def release(self) -> None:
        if self.fd >= 0:
            _unlink_quietly(self.path)
            _close_quietly(self.fd)
            self.fd = -1


def bind(namespace: str, root: Path | None = None) -> Binding:
    """Bind to the live generation of ``namespace`` without creating anything.

    :raises DiscoveryNamespaceNotFound: no generation exists, its owner is dead or retired, it
        belongs to another namespace whose key collides with this one, or its registry is not a
        well-formed one (corrupt or truncated) and its owner is dead.
    :raises DiscoveryRegistryCorrupt: the registry is not a well-formed one while its owner is
        alive.
    """
    try:
        path = namespace_path(namespace, root or runtime_dir(create=False))
        dir_fd = _open_dir(path)
    except (FileNotFoundError, NotADirectoryError):
        raise DiscoveryNamespaceNotFound(namespace) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink where a generation should be
            raise DiscoveryNamespaceNotFound(namespace) from None
        raise
    registry_fd = None
    owner_fd = -1
    try:
        try:
            owner_fd = _open_file(path / "owner", os.O_RDONLY)
        except FileNotFoundError:
            owner_fd = -1  # a generation laid out before the owner file: probe the directory
        registry_fd = _open_file(path / "registry", os.O_RDWR)
        header = _read_header(registry_fd)
        if header.digest != namespace_digest(namespace):
            raise DiscoveryNamespaceNotFound(namespace)
        # Never trust sizes read from a file: a corrupt header must not drive allocations.
        if not (1 <= header.capacity <= MAX_CAPACITY and 1 <= header.block_size <= MAX_BLOCK_SIZE):
            raise ValueError("its header names an impossible capacity or block size")
        if os.fstat(registry_fd).st_size < Table(registry_fd, header.capacity,
                                                 header.block_size).size:
            raise ValueError("it is truncated")
        binding = Binding(namespace, path, dir_fd, registry_fd, header, owner_fd)
        if not binding.is_live():
            raise DiscoveryNamespaceNotFound(namespace)
        return binding
    except DiscoveryNamespaceNotFound:
        _close_quietly(registry_fd)
        _close_quietly(owner_fd)
        os.close(dir_fd)
        raise
    except (OSError, ValueError, struct.error) as exc:
        # A registry that does not read as one: if its owner lives, say so rather than
        # "no live owner" (a borrower could not tell the difference otherwise).
        alive = not isinstance(exc, FileNotFoundError) and \
            _owner_alive(owner_fd if owner_fd >= 0 else dir_fd)
        _close_quietly(registry_fd)
        _close_quietly(owner_fd)
        os.close(dir_fd)
        if alive:
            raise DiscoveryRegistryCorrupt(namespace, str(path / "registry"),
                                           str(exc) or type(exc).__name__) from None
        raise DiscoveryNamespaceNotFound(namespace) from None


# -- helpers ----------------------------------------------------------------------------------


class _locked:
    """Hold the registry lock: first ``guard`` (the threads sharing this descriptor), then flock.

    flock excludes open file descriptions, not threads: two threads publishing through one
    descriptor would both "hold" it. The guard serialises them, polled like the flock so that
    the wait stays cancellable and bounded by the same timeout.
    """

    def __init__(self, fd: int, guard: threading.Lock, operation: int, timeout: float | None,
                 namespace: str, checkpoint: Callable[[], None] | None = None) -> None:
        self._fd = fd
        self._operation = operation
        self._timeout = timeout
        self._namespace = namespace
        self._checkpoint = checkpoint
        self._guard = guard

    def _describe(self) -> str:
        return f"discovery namespace {self._namespace!r}"

    def __enter__(self) -> None:
        start = time.monotonic()
        while not self._guard.acquire(timeout=0.02 if self._timeout != 0 else 0):
            if self._checkpoint is not None:
                self._checkpoint()
            if self._timeout is not None and time.monotonic() - start >= self._timeout:
                raise TimeoutError(
                    f"{self._describe()}: lock not acquired within {self._timeout} s")
        try:
            lock_with_backoff(self._fd, self._operation, timeout=self._timeout,
                              describe=self._describe, checkpoint=self._checkpoint,
                              started=start)
        except BaseException:
            self._guard.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            _unlock(self._fd)
        finally:
            self._guard.release()


def _touch_hint(path: Path) -> None:
    """Write the change hint (inotify reports IN_MODIFY); best effort, it is only a hint."""
    try:
        fd = _open_file(path / "notify", os.O_WRONLY)
    except OSError:
        return
    try:
        os.pwrite(fd, b"\x01", 0)
    except OSError:
        pass
    finally:
        os.close(fd)


def _lease_ids(path: Path) -> set[bytes]:
    ids = set()
    for name in os.listdir(path):
        if name.startswith("lease-"):
            try:
                ids.add(bytes.fromhex(name[len("lease-"):]))
            except ValueError:
                continue
    return ids


def _sweep_pending_leases(path: Path) -> None:
    """Remove ``pending-*`` lease files of publishers killed before renaming them."""
    for name in os.listdir(path):
        if not name.startswith("pending-"):
            continue
        try:
            fd = _open_file(path / name, os.O_RDONLY)
        except OSError:
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime > 1.0 and _try_lock(fd, fcntl.LOCK_EX):
                _unlink_quietly(path / name)
        finally:
            os.close(fd)


def _lease_is_dead(path: Path, lease: bytes) -> bool:
    try:
        fd = _open_file(path / f"lease-{lease.hex()}", os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        return _try_lock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
