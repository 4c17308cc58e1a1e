"""Bindings: a borrower's descriptors on the live generation of a namespace, and leases.

A binding never creates anything: with no live owner, :func:`bind` raises
:class:`~anywool.errors.DiscoveryNamespaceNotFound`. Through it publishers change the registry
(each holding a :class:`Lease` that proves them alive) and sources read it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from anywool._errno import exhausted
from anywool._runtime_dir import runtime_dir
from anywool.discovery.local import _watch
from anywool.discovery.local._flock import (
    LOCK_HOLDERS,
    close_quietly,
    locked,
    open_dir,
    open_file,
    owner_alive,
    try_lock,
    unlink_quietly,
)
from anywool.discovery.local._keys import (
    MAX_NAME_BYTES,
    NAME_FILE,
    decode_name,
    namespace_digest,
    namespace_path,
)
from anywool.discovery.local._layout import (
    EMPTY_UID,
    Change,
    Header,
    Table,
    check_header,
    read_counter,
    read_header,
    verify,
)
from anywool.errors import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    DiscoveryNamespaceNotFound,
    DiscoveryRegistryCorrupt,
    DiscoveryWorkerNotFound,
)
from anywool.metadata import WorkerMetadata

log = logging.getLogger("anywool.discovery.local")

class Generation:
    """Descriptors on one generation (its directory and registry) and the registry's layout."""

    def __init__(self, namespace: str, path: Path, dir_fd: int, registry_fd: int,
                 header: Header, owner_fd: int = -1, notify_fd: int = -1) -> None:
        self.namespace = namespace
        self.path = path
        self.dir_fd = dir_fd
        # The ``owner`` file, locked by the owner for life: borrowers probe its lock (never the
        # directory's, which claimants probe), so that their probes, however many, never make
        # a dead owner look alive to a claimant. -1 for a generation without one.
        self.owner_fd = owner_fd
        # The change hint, kept open: every change writes it (-1: opened for each write).
        self.notify_fd = notify_fd
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
        return owner_alive(self.owner_fd if self.owner_fd >= 0 else self.dir_fd)

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

    def verify(self) -> tuple[int, bool]:
        """(change counter, retired flag), once the registry still reads as the one stamped
        (see :func:`._layout.verify`); call it inside :meth:`_typed`. Writers call it under
        ``LOCK_EX`` before they write, so nothing is ever written into a damaged registry."""
        return verify(self.registry_fd, self.header, self.table.size)

    @property
    def block_size(self) -> int:
        return self.header.block_size

    def hint(self) -> None:
        """Write the change hint (see :mod:`._watch`)."""
        _watch.touch_hint(self.notify_fd, self.dir_fd)

    def close(self) -> None:
        close_quietly(self.registry_fd)
        close_quietly(self.owner_fd)
        close_quietly(self.notify_fd)
        close_quietly(self.dir_fd)
        self.registry_fd = self.owner_fd = self.notify_fd = self.dir_fd = -1


class Binding(Generation):
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
            _, retired = read_counter(self.registry_fd)
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
        """(change counter, retired flag) from the header; a cheap unlocked read, which also
        checks that the registry still reads as the one bound (see :meth:`verify`).

        :raises DiscoveryRegistryCorrupt: the registry is damaged and its owner alive.
        :raises DiscoveryNamespaceNotFound: the registry is damaged and its owner dead.
        """
        with self._typed():
            return self.verify()

    def reachable(self) -> bool:
        """Whether a borrower binding the namespace now would open this very registry.

        ``False`` when nothing is there any more, or when the owner retired or died meanwhile:
        the generation is over for every new borrower (:func:`bind` says
        ``DiscoveryNamespaceNotFound``). Running out of descriptors says nothing: ``True``.

        :raises DiscoveryRegistryCorrupt: something else is there (another file renamed over
            it) or it cannot be opened any more, while its owner is alive and has not retired:
            a new borrower would be told the same.
        """
        path = self.path / "registry"
        try:
            fd = open_file(path, os.O_RDWR)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            if exhausted(exc):
                return True
            reason = f"it can no longer be opened ({os.strerror(exc.errno or 0)})"
        else:
            try:
                if os.path.samestat(os.fstat(fd), os.fstat(self.registry_fd)):
                    return True
            finally:
                os.close(fd)
            reason = "another file was put in its place"
        # An exit retires the generation before it removes anything: checked after the look,
        # so an owner leaving meanwhile is never taken for damage.
        if not self.is_live():
            return False
        raise DiscoveryRegistryCorrupt(self.namespace, str(path), reason)

    # -- reads --

    def snapshot(self, lock_timeout: float | None = 30.0,
                 checkpoint: Callable[[], None] | None = None,
                 ) -> tuple[int, dict[UUID, WorkerMetadata]]:
        """(change counter, every registered worker), read consistently under ``LOCK_SH``.

        Blocks that cannot be decoded are left out and counted in :attr:`unreadable_blocks`;
        the first time one is seen it is logged.
        """
        with locked(self.registry_fd, self.guard, fcntl.LOCK_SH, lock_timeout, self.namespace, checkpoint), \
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
        with locked(self.registry_fd, self.guard, fcntl.LOCK_SH, lock_timeout, self.namespace, checkpoint), \
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
        :raises DiscoveryRegistryCorrupt: the registry is damaged (nothing is written).
        :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` seconds.
        """
        payload = b""
        if kind != "worker-dropped":
            payload = metadata.to_bytes()
            if len(payload) > self.header.block_size:
                raise DiscoveryBlockExhausted(len(payload))
        uid = metadata.uid.bytes
        with locked(self.registry_fd, self.guard, fcntl.LOCK_EX, lock_timeout, self.namespace, checkpoint), \
                self._typed():
            self.verify()
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
        self.hint()
        return True

    def withdraw(self, lease: bytes, *, lock_timeout: float | None,
                 checkpoint: Callable[[], None] | None = None) -> int:
        """Clear every slot written under ``lease`` under ``LOCK_EX`` and write the hint.

        :param lock_timeout: seconds the registry lock may be waited for (``None``: forever,
            ``0``: one non-blocking attempt).
        :param checkpoint: called between lock attempts; it may raise (cancellation), and then
            nothing was changed.
        :returns: how many slots were cleared.
        :raises DiscoveryRegistryCorrupt: the registry is damaged (nothing is written).
        :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` seconds.
        """
        with locked(self.registry_fd, self.guard, fcntl.LOCK_EX, lock_timeout, self.namespace,
                     checkpoint), self._typed():
            self.verify()
            self.table.recover()
            slots = self.table.slots()
            indices = [i for i, entry in enumerate(slots) if entry[3] and entry[2] == lease]
            for index in indices:
                self.table.commit(index, "worker-dropped", UUID(bytes=slots[index][0]),
                                  EMPTY_UID, b"")
        if indices:
            self.hint()
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
        fd = open_file(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(pending, path)
        except BaseException:
            os.close(fd)
            unlink_quietly(pending)
            raise
        return Lease(lease_id, path, fd)


class Lease:
    """A publisher's liveness token: a file it holds ``flock(LOCK_EX)`` on for its lifetime."""

    def __init__(self, lease_id: bytes, path: Path, fd: int) -> None:
        self.id = lease_id
        self.path = path
        self.fd = fd
        self.pid = os.getpid()
        LOCK_HOLDERS.add(self)

    def forget(self) -> None:
        """In a forked child: drop the inherited descriptor; the parent's lease stays."""
        close_quietly(self.fd)
        self.fd = -1

    def release(self) -> None:
        if self.fd >= 0:
            unlink_quietly(self.path)
            close_quietly(self.fd)
            self.fd = -1


def bind(namespace: str, root: Path | None = None) -> Binding:
    """Bind to the live generation of ``namespace`` without creating anything.

    :raises DiscoveryNamespaceNotFound: no generation exists, its owner is dead or retired, it
        belongs to another namespace whose key collides with this one, or its registry is not a
        well-formed one (corrupt or truncated) and its owner is dead.
    :raises DiscoveryRegistryCorrupt: the registry is not a well-formed one while its owner is
        alive.
    :raises OSError: the process ran out of descriptors or memory (``EMFILE``, ``ENFILE``,
        ``ENOMEM``, ``ENOBUFS``), or opening the generation failed otherwise.
    """
    try:
        path = namespace_path(namespace, root or runtime_dir(create=False))
        dir_fd = open_dir(path)
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
            owner_fd = open_file("owner", os.O_RDONLY, dir_fd=dir_fd)
        except FileNotFoundError:
            owner_fd = -1  # a generation laid out before the owner file: probe the directory
        registry_fd = open_file("registry", os.O_RDWR, dir_fd=dir_fd)
        header = read_header(registry_fd)
        if header.digest != namespace_digest(namespace):
            raise DiscoveryNamespaceNotFound(namespace)
        check_header(header, registry_fd)
        try:
            notify_fd = open_file("notify", os.O_WRONLY, dir_fd=dir_fd)
        except OSError:
            notify_fd = -1  # the hint is best effort: opened again at each change
        binding = Binding(namespace, path, dir_fd, registry_fd, header, owner_fd, notify_fd)
        if not binding.is_live():
            raise DiscoveryNamespaceNotFound(namespace)
        return binding
    except DiscoveryNamespaceNotFound:
        close_quietly(registry_fd)
        close_quietly(owner_fd)
        os.close(dir_fd)
        raise
    except (OSError, ValueError, struct.error) as exc:
        # A registry that does not read as one: if its owner lives, say so rather than
        # "no live owner" (a borrower could not tell the difference otherwise). Running out of
        # descriptors or memory says nothing about the registry: that is raised as it is.
        alive = not isinstance(exc, FileNotFoundError) and not exhausted(exc) and \
            owner_alive(owner_fd if owner_fd >= 0 else dir_fd)
        close_quietly(registry_fd)
        close_quietly(owner_fd)
        os.close(dir_fd)
        if exhausted(exc):
            raise
        if alive:
            raise DiscoveryRegistryCorrupt(namespace, str(path / "registry"),
                                           str(exc) or type(exc).__name__) from None
        raise DiscoveryNamespaceNotFound(namespace) from None


def recorded_name(dir_fd: int, digest: bytes | None = None) -> str | None:
    """The name of the namespace whose generation ``dir_fd`` is, as its claim recorded it
    (``None``: not recorded, unreadable, or not matching the registry's digest).

    :param digest: the registry header's digest, when the caller has read it already.
    """
    try:
        if digest is None:
            fd = open_file("registry", os.O_RDONLY, dir_fd=dir_fd)
            try:
                digest = read_header(fd).digest
            finally:
                os.close(fd)
        name_fd = open_file(NAME_FILE, os.O_RDONLY, dir_fd=dir_fd)
        try:
            data = os.read(name_fd, MAX_NAME_BYTES + 1)
        finally:
            os.close(name_fd)
    except (OSError, ValueError):
        return None
    return decode_name(data, digest) if len(data) <= MAX_NAME_BYTES else None


def lease_ids(path: Path) -> set[bytes]:
    ids = set()
    for name in os.listdir(path):
        if name.startswith("lease-"):
            try:
                ids.add(bytes.fromhex(name[len("lease-"):]))
            except ValueError:
                continue
    return ids


def sweep_pending_leases(path: Path) -> None:
    """Remove ``pending-*`` lease files of publishers killed before renaming them."""
    for name in os.listdir(path):
        if not name.startswith("pending-"):
            continue
        try:
            fd = open_file(path / name, os.O_RDONLY)
        except OSError:
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime > 1.0 and try_lock(fd, fcntl.LOCK_EX):
                unlink_quietly(path / name)
        finally:
            os.close(fd)


def lease_is_dead(path: Path, lease: bytes) -> bool:
    try:
        fd = open_file(path / f"lease-{lease.hex()}", os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        return try_lock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)
