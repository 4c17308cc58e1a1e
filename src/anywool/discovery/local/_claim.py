"""Claiming a namespace, sweeping what dead processes left, reaping dead publishers.

A claim builds a stamped generation in ``tmp-<random>/`` under its own lock and renames it to
``ns-<key>``; the rename fails when a generation exists, so exactly one racing claimant wins.
See :mod:`._layout` for the files.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import secrets
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

from anywool._runtime_dir import runtime_dir
from anywool.discovery.local._binding import (
    Generation,
    lease_ids,
    lease_is_dead,
    recorded_name,
    sweep_pending_leases,
)
from anywool.discovery.local._flock import (
    LOCK_HOLDERS,
    close_quietly,
    lock_with_backoff,
    locked,
    open_dir,
    open_file,
    probe_free,
    try_lock,
    unlink_quietly,
    unlock,
)
from anywool.discovery.local._keys import (
    MAX_NAME_BYTES,
    NAME_FILE,
    encode_name,
    namespace_digest,
    namespace_path,
)
from anywool.discovery.local._layout import (
    COUNTER_OFFSET,
    EMPTY_UID,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    MAX_COUNTER,
    Header,
    Table,
    read_counter,
    read_header,
    reserve,
)
from anywool.errors import DiscoveryNamespaceInUse


class Claim(Generation):
    """An owner's hold on one generation of a namespace (``ns-<key>/``).

    The directory descriptor carries ``flock(LOCK_EX)`` for the owner's lifetime (claimants
    probe it), and so does the ``owner`` file's (borrowers probe that one). Created by
    :func:`claim`; :meth:`release` retires and removes the generation.
    """

    def __init__(self, namespace: str, root: Path, path: Path, dir_fd: int, registry_fd: int,
                 header: Header, owner_fd: int = -1, notify_fd: int = -1) -> None:
        super().__init__(namespace, path, dir_fd, registry_fd, header, owner_fd, notify_fd)
        self.root = root
        self.pid = os.getpid()
        self._released = False
        self._retired = False
        LOCK_HOLDERS.add(self)

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
            unlock(self.registry_fd)

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
                            unlock(self.registry_fd)
            finally:
                # Whatever happened to the registry (even corrupted), its files go.
                _remove_generation(self.root, self.path, self.dir_fd)
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
            if not try_lock(self.registry_fd, fcntl.LOCK_EX):
                return False
            try:
                self._mark_retired()
            finally:
                unlock(self.registry_fd)
        self.release()
        return True

    def _mark_retired(self) -> None:
        """Set the retired flag, bump the counter and write the hint (lock held, or not)."""
        try:
            counter, _ = read_counter(self.registry_fd)
        except ValueError:
            counter = 0  # a truncated registry: the flag still tells readers it is over
        os.pwrite(self.registry_fd, struct.pack("<QB", min(counter + 1, MAX_COUNTER), 1),
                  COUNTER_OFFSET)
        self._retired = True
        self.hint()

    def reap(self, lock_timeout: float | None = 5.0,
             checkpoint: Callable[[], None] | None = None) -> list[UUID]:
        """Clear the slots of publishers whose lease lock is free (the process died), remove
        their lease files, and roll forward a change a dead writer left half done.

        :param checkpoint: called between registry lock attempts; it may raise (cancellation).
        :returns: the uids of the workers removed.
        :raises DiscoveryRegistryCorrupt: the registry was damaged from outside; nothing is
            written into it (an owner never guesses what it held: it is recreated only by a
            new claim, after this owner exits).
        :raises TimeoutError: the registry lock was not taken within ``lock_timeout`` seconds.
        """
        removed: list[UUID] = []
        with locked(self.registry_fd, self.guard, fcntl.LOCK_EX, lock_timeout, self.namespace,
                     checkpoint), self._typed():
            self.verify()  # never "repair" a damaged registry: see DiscoveryRegistryCorrupt
            recovered = self.table.recover()
            slots = self.table.slots()
            dead = {lease for lease in lease_ids(self.path) if lease_is_dead(self.path, lease)}
            for index, (uid, _seq, lease, length) in enumerate(slots):
                if length and lease in dead:
                    removed.append(UUID(bytes=uid))
                    self.table.commit(index, "worker-dropped", removed[-1], EMPTY_UID, b"")
            # A lease file goes once its slots are clear; referenced leases without a file
            # (deleted by hand) count as dead too.
            missing = {e[2] for e in slots if e[3] and e[2] != EMPTY_UID} - lease_ids(self.path)
            for index, (uid, _seq, lease, length) in enumerate(slots):
                if length and lease in missing:
                    removed.append(UUID(bytes=uid))
                    self.table.commit(index, "worker-dropped", removed[-1], EMPTY_UID, b"")
        for lease in dead:
            unlink_quietly(self.path / f"lease-{lease.hex()}")
        sweep_pending_leases(self.path)
        if recovered or removed:
            self.hint()
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
    dir_fd = registry_fd = owner_fd = notify_fd = None
    try:
        dir_fd = open_dir(tmp)
        if blocking:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
        elif not try_lock(dir_fd, fcntl.LOCK_EX):
            raise _Busy  # a sweeper is removing it: let the blocking path start over
        # Files are created relative to the directory's descriptor (no path to resolve
        # again); borrowers only read the owner file, so the umask may narrow its mode.
        owner_fd = open_file("owner", os.O_RDWR | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd)
        fcntl.flock(owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        registry_fd, header = _create_registry(dir_fd, namespace, capacity, block_size)
        notify_fd = open_file("notify", os.O_RDWR | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd)
        os.fchmod(notify_fd, 0o600)  # publishers write it, whatever the umask
        _record_name(dir_fd, namespace)
        for attempt in range(3):
            try:
                os.rename(tmp, target)
                return Claim(namespace, root, target, dir_fd, registry_fd, header, owner_fd,
                             notify_fd)
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
            sweep_dead(root, target)
        raise DiscoveryNamespaceInUse(namespace, str(target), _owner_pid(target))
    except BaseException as exc:
        close_quietly(registry_fd)
        close_quietly(owner_fd)
        close_quietly(notify_fd)
        close_quietly(dir_fd)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, _Busy):
            return None
        raise


def _record_name(dir_fd: int, namespace: str) -> None:
    """Write the namespace's name into the generation (see ``_keys.NAME_FILE``): its
    directory's name is a hash, and an operator listing the runtime directory needs the name."""
    encoded = encode_name(namespace)
    if len(encoded) > MAX_NAME_BYTES:
        return  # never read back: such a namespace is listed by its key
    fd = open_file(NAME_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd)
    try:
        data = memoryview(encoded)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


class _Busy(Exception):
    """A non-blocking claim found something it would have to wait for."""


def _create_registry(dir_fd: int, namespace: str, capacity: int,
                     block_size: int) -> tuple[int, Header]:
    fd = open_file("registry", os.O_RDWR | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)  # borrowers write it, whatever the umask
        table = Table(fd, capacity, block_size)
        os.ftruncate(fd, table.size)
        # Reserve the header and slots now; journal entries and blocks are reserved by the
        # write that first needs them (Table.commit), before it writes anything. Zeroing the
        # whole file here cost a claim more than everything else it does.
        reserve(fd, 0, table.payloads_offset)
        header = Header(capacity, block_size, os.getpid(), secrets.token_bytes(16),
                        namespace_digest(namespace), 0, False)
        os.pwrite(fd, HEADER.pack(MAGIC, FORMAT_VERSION, capacity, block_size, header.owner_pid,
                                   header.generation, header.digest, 0, 0), 0)
        return fd, header
    except BaseException:
        os.close(fd)
        raise


def _probe_incumbent(namespace: str, target: Path) -> DiscoveryNamespaceInUse | None:
    """The error to raise if ``target`` has a live owner; ``None`` if it is dead or gone.

    Something other than a directory there (a symlink, a file) is not a generation: it is
    removed, since nothing of ours put it in our private directory under that name.
    """
    try:
        fd = open_dir(target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        unlink_quietly(target)
        return None
    try:
        if probe_free(fd):
            unlock(fd)
            return None
        return DiscoveryNamespaceInUse(namespace, str(target), _owner_pid(target))
    finally:
        os.close(fd)


def _owner_pid(target: Path) -> int | None:
    try:
        fd = open_file(target / "registry", os.O_RDONLY)
    except OSError:
        return None
    try:
        return read_header(fd).owner_pid
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


class Swept(NamedTuple):
    """One thing a sweep removed from the runtime directory."""

    entry: str  # its name there: ns-<key>, dead-<hex>, tmp-<hex> or w-<hex>
    kind: str  # one of SWEPT_KINDS' values
    namespace: str | None  # the namespace it was a generation of, when recorded


def too_young(name: str, mtime: float, now: float | None = None) -> bool:
    """Whether the entry ``name``, last modified at ``mtime``, is too young for a sweep to take
    its lock being free for its owner's death: a claimant locks its ``tmp-`` directory, a
    worker its ``w-`` one, just after making it."""
    return name.startswith(("tmp-", "w-")) and \
        (time.time() if now is None else now) - mtime < _YOUNG


# Seconds after which an unlocked tmp- or w- directory is dead, not on its way (see too_young).
_YOUNG = 1.0

#: What each kind of entry a sweep removes is, by its prefix.
SWEPT_KINDS = {
    "ns-": "dead-namespace",  # a generation whose owner died
    "dead-": "unfinished-removal",  # a generation whose remover was killed midway
    "tmp-": "killed-claimant",  # a generation its claimant never got to rename into place
    "w-": "worker-socket",  # the socket directory of a worker that died
}


def _swept(name: str, fd: int) -> Swept:
    kind = next(kind for prefix, kind in SWEPT_KINDS.items() if name.startswith(prefix))
    return Swept(name, kind, None if kind == "worker-socket" else recorded_name(fd))


def sweep_dead(root: Path, target: Path) -> Swept | None:
    """Remove the generation ``target`` if its owner is dead, holding its lock throughout.

    :returns: what was removed, or ``None`` (it is gone, or its owner lives).
    """
    try:
        fd = open_dir(target)
    except FileNotFoundError:
        return None
    try:
        if not probe_free(fd):
            return None
        try:
            current = os.stat(target, follow_symlinks=False)
        except FileNotFoundError:
            return None
        locked = os.fstat(fd)
        if (current.st_dev, current.st_ino) != (locked.st_dev, locked.st_ino):
            return None  # another sweeper replaced it meanwhile
        swept = _swept(target.name, fd)
        _remove_generation(root, target, fd)
        return swept
    finally:
        os.close(fd)


def _remove_generation(root: Path, path: Path, dir_fd: int | None = None) -> None:
    """Rename the generation out of the namespace's way (a successor may claim at once), then
    remove it: through ``dir_fd``, its directory's descriptor, when the caller has one (the
    files of a generation are plain files), else by walking it."""
    dead = os.path.join(root, f"dead-{secrets.token_hex(8)}")
    try:
        os.rename(path, dead)
    except FileNotFoundError:
        return
    if dir_fd is not None:
        try:
            for name in os.listdir(dir_fd):
                os.unlink(name, dir_fd=dir_fd)
            os.rmdir(dead)
            return
        except OSError:
            pass  # something else in it (or it changed meanwhile): walk it
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
    """Sweep the runtime directory (see :func:`sweep_leftovers`) if this process has not in
    the last :data:`SWEEP_INTERVAL` seconds. ``keep`` is a generation to leave alone."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep >= SWEEP_INTERVAL:
        _last_sweep = now
        sweep_leftovers(root, keep)


def sweep_leftovers(root: Path, keep: Path | None = None) -> list[Swept]:
    """Remove what dead processes left behind: ``tmp-*`` and ``dead-*`` directories of killed
    claimants and removers, generations (``ns-*``) whose owner died, e.g. the random namespace
    of a SIGKILLed pool that nobody will ever claim again, and the socket directories (``w-*``)
    of killed workers. ``keep`` (the namespace being claimed) is left to the claim's own
    reclaim logic, which honours ``reclaim=False``.

    A lock that can be taken proves its holder is gone; anything locked is left alone, and so is
    a ``tmp-*`` or ``w-*`` directory younger than a second (its creator locks it right after
    ``mkdir``).

    :returns: what was removed, in directory order.
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    now = time.time()
    swept: list[Swept] = []
    for name in names:
        if keep is not None and name == keep.name:
            continue
        entry = sweep_entry(root, name, now)
        if entry is not None:
            swept.append(entry)
    return swept


def sweep_entry(root: Path, name: str, now: float | None = None) -> Swept | None:
    """Remove the entry ``name`` of the runtime directory (``ns-*``, ``dead-*``, ``tmp-*`` or
    ``w-*``) if the process that held it is gone, by the rules of :func:`sweep_leftovers`.

    :param now: the ``time.time()`` a ``tmp-*`` or ``w-*`` directory's age is judged at
        (default: the time of the call).
    :returns: what was removed, or ``None``: held, younger than a second, gone, replaced
        meanwhile, or not an entry a sweep removes.
    """
    if not name.startswith(tuple(SWEPT_KINDS)):
        return None
    path = root / name
    try:
        fd = open_dir(path)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if too_young(name, info.st_mtime, now):
            return None
        if not try_lock(fd, fcntl.LOCK_EX):
            return None
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
            return None  # replaced meanwhile by someone else's generation
        swept = _swept(name, fd)
        if name.startswith("ns-"):
            _remove_generation(root, path, fd)
        else:
            shutil.rmtree(path, ignore_errors=True)
        return swept
    finally:
        os.close(fd)
