"""What is in a runtime directory, read without changing anything, and reclaiming what is dead.

The operations command (``anywool ls``, ``show``, ``reclaim``) reads through here, and here reads
through the library's own code: the registry's :class:`~._layout.Table`, the liveness probes of
:mod:`._flock` and :mod:`._binding`, the sweep of :mod:`._claim`. Nothing is parsed twice.

Synchronous, no event loop: every call returns within its ``lock_timeout`` (the registry lock
is the only thing waited for, and only to read consistently).

Probing is passive. An owner's liveness is read from its ``owner`` file with ``LOCK_SH`` (never
from the directory lock a claimant probes, so that a survey cannot make a dead owner look alive
to a claimant); the other probes hold a lock for an instant at most, which a sweeper or reaper
that meets it treats as "alive, look again later".
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from anywool._runtime_dir import configured_path, runtime_dir
from anywool.discovery.local._binding import (
    lease_ids,
    lease_is_dead,
    recorded_name,
)
from anywool.discovery.local._claim import (
    Swept,
    sweep_dead,
    sweep_entry,
    sweep_leftovers,
    too_young,
)
from anywool.discovery.local._flock import close_quietly, locked, open_dir, open_file, owner_alive
from anywool.discovery.local._keys import namespace_digest, namespace_path
from anywool.discovery.local._layout import (
    EMPTY_UID,
    Table,
    check_header,
    read_counter,
    read_header,
)
from anywool.metadata import WorkerMetadata

__all__ = [
    "LeaseState",
    "NamespaceState",
    "Survey",
    "WorkerEntry",
    "WorkerSocket",
    "find",
    "locate",
    "reclaim",
    "reclaim_state",
    "survey",
]

#: What a generation directory can be, by its state (see :class:`NamespaceState`).
STATES = ("live", "retiring", "dead", "sweeping", "claiming", "abandoned")
_PREFIXES = ("ns-", "dead-", "tmp-")


@dataclass(frozen=True)
class LeaseState:
    """One publisher's lease file in a generation."""

    id: str  # 32 hex digits
    alive: bool  # its publisher holds the lock (it is running)
    workers: int  # slots the registry holds under this lease


@dataclass(frozen=True)
class WorkerEntry:
    """One worker in a registry, and who published it."""

    metadata: WorkerMetadata
    lease: str | None  # the publishing lease (hex), None when the slot names none
    publisher_alive: bool | None  # None: no lease to tell by


@dataclass(frozen=True)
class NamespaceState:
    """One generation directory of the runtime directory.

    ``state`` is one of :data:`STATES`:

    * ``live``: ``ns-<key>``, its owner holds the owner lock (a stopped owner too: the kernel
      lock is what says alive, not the scheduler);
    * ``retiring``: live, but the owner has retired it (it is exiting);
    * ``dead``: ``ns-<key>`` whose owner is gone; reclaimable;
    * ``sweeping``: ``dead-<hex>``, being removed by a live process;
    * ``claiming``: ``tmp-<hex>``, a claimant preparing it;
    * ``abandoned``: ``dead-<hex>`` or ``tmp-<hex>`` whose process was killed midway;
      reclaimable (a ``tmp-`` one once it is a second old).

    ``workers`` is ``None`` when the registry could not be read (``error`` says why: a writer
    held its lock longer than the survey's ``lock_timeout``, or it is damaged).
    """

    entry: str
    name: str | None  # as the claim recorded it; None when it did not (or it does not verify)
    state: str
    reclaimable: bool
    owner_pid: int | None
    capacity: int | None
    block_size: int | None
    changes: int | None  # the registry's change counter
    workers: tuple[WorkerEntry, ...] | None
    leases: tuple[LeaseState, ...]
    error: str | None = None

    @property
    def key(self) -> str:
        """The namespace's key: the entry's name without its prefix (for ``ns-`` entries)."""
        return self.entry.partition("-")[2]


@dataclass(frozen=True)
class WorkerSocket:
    """A worker's socket directory (``w-<hex>``)."""

    entry: str
    alive: bool  # its worker holds the directory's lock
    reclaimable: bool


@dataclass(frozen=True)
class Survey:
    """Everything :func:`survey` found, in name order."""

    root: Path
    exists: bool
    namespaces: tuple[NamespaceState, ...]
    sockets: tuple[WorkerSocket, ...]


def survey(root: Path | None = None, *, lock_timeout: float = 1.0) -> Survey:
    """Read every generation and worker socket directory of the runtime directory.

    :param root: the runtime directory (default: :func:`~anywool._runtime_dir.runtime_dir`,
        never created here).
    :param lock_timeout: seconds to wait, in all, for registry locks (a reader's ``LOCK_SH``):
        once they are spent, a registry whose lock is held is reported unread (its ``error``
        says so) after one try.
    :raises ValueError, PermissionError: as :func:`~anywool._runtime_dir.runtime_dir` (a
        relative ``$ANYWOOL_RUNTIME_DIR``, a directory that is not safe to trust).
    """
    if root is None:
        root = locate()[0]
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return Survey(root, False, (), ())
    namespaces = []
    sockets = []
    # One budget for the whole survey: however many registries are locked, the survey waits
    # lock_timeout at most in all; once it is spent, each lock gets one non-blocking try.
    deadline = time.monotonic() + lock_timeout
    for name in names:
        if name.startswith(_PREFIXES):
            state = _read(root / name, max(0.0, deadline - time.monotonic()))
            if state is not None:
                namespaces.append(state)
        elif name.startswith("w-"):
            socket = _socket(root / name)
            if socket is not None:
                sockets.append(socket)
    return Survey(root, True, tuple(namespaces), tuple(sockets))


def find(namespace: str, root: Path | None = None, *,
         lock_timeout: float = 1.0) -> NamespaceState | None:
    """The generation of ``namespace`` (its live or dead ``ns-`` entry), or ``None``.

    ``namespace`` may also be an entry's own name (``ns-<key>``, ``dead-<hex>``,
    ``tmp-<hex>``), for generations whose name was not recorded.

    :raises ValueError, PermissionError: as :func:`survey`.
    """
    if root is None:
        root = locate()[0]
    path = namespace_path(namespace, root)
    state = _read(path, lock_timeout, expect=namespace_digest(namespace))
    if state is None and _is_entry(namespace):
        state = _read(root / namespace, lock_timeout)
    return state


def reclaim(root: Path | None = None, namespace: str | None = None) -> list[Swept]:
    """Remove what dead processes left in the runtime directory.

    Without ``namespace``: every dead generation, every abandoned claimant's or remover's
    directory and every dead worker's socket directory (see
    :func:`~._claim.sweep_leftovers`). With it: the generation :func:`find` reports for it (the
    namespace's own, else the entry of that name), if what held it is dead. Whatever a live
    process holds (an owner, a stopped one included; a claimant; a worker) is never touched:
    each removal is decided by taking the kernel lock its holder would hold, and done while
    holding it.

    :returns: what was removed.
    :raises ValueError, PermissionError: as :func:`survey`.
    """
    if root is None:
        root = locate()[0]
    if namespace is None:
        return sweep_leftovers(root)
    state = find(namespace, root, lock_timeout=0)  # only which entry: no registry wait
    return [] if state is None else reclaim_state(root, state)


def reclaim_state(root: Path, state: NamespaceState) -> list[Swept]:
    """Remove the generation ``state`` describes (as :func:`find` read it in ``root``), if
    what held it is dead: :func:`reclaim` of one namespace, for a caller that found it
    already. Decided again under the kernel lock, as :func:`reclaim` decides."""
    if state.entry.startswith("ns-"):
        swept = sweep_dead(root, root / state.entry)
    else:
        swept = sweep_entry(root, state.entry)
    return [] if swept is None else [swept]


# -- reading one entry ---------------------------------------------------------------------------


def locate() -> tuple[Path, bool]:
    """The runtime directory this process uses (see :func:`~anywool._runtime_dir.runtime_dir`)
    and whether it exists; never created, nor its mode changed, by a reader.

    :raises ValueError, PermissionError: as :func:`~anywool._runtime_dir.runtime_dir`.
    """
    try:
        return runtime_dir(create=False), True
    except FileNotFoundError:
        return configured_path(), False


def _is_entry(name: str) -> bool:
    """Whether ``name`` can be a generation directory's own name (``ns-``, ``dead-``, ``tmp-``
    and nothing a path could make more of)."""
    return name.startswith(_PREFIXES) and "/" not in name and "\0" not in name


def _socket(path: Path) -> WorkerSocket | None:
    try:
        fd = open_dir(path)
    except OSError:
        return None
    try:
        alive = owner_alive(fd)
        young = too_young(path.name, os.fstat(fd).st_mtime)
        return WorkerSocket(path.name, alive, not alive and not young)
    finally:
        os.close(fd)


def _read(path: Path, lock_timeout: float, expect: bytes | None = None) -> NamespaceState | None:
    """The state of the generation directory ``path``; ``None`` when it is not there (or, with
    ``expect``, belongs to another namespace whose key collides)."""
    try:
        dir_fd = open_dir(path)
    except OSError:
        return None  # gone meanwhile, or not a directory of ours
    owner_fd = registry_fd = -1
    try:
        try:
            owner_fd = open_file("owner", os.O_RDONLY, dir_fd=dir_fd)
        except OSError:
            owner_fd = -1
        try:
            registry_fd = open_file("registry", os.O_RDONLY, dir_fd=dir_fd)
        except OSError:
            registry_fd = -1
        header = None
        error = None
        if registry_fd >= 0:
            try:
                header = read_header(registry_fd)
                check_header(header, registry_fd)
            except (OSError, ValueError) as exc:
                header, error = None, f"registry unreadable: {exc}"
        else:
            error = "no registry"
        if expect is not None and header is not None and header.digest != expect:
            return None
        entry = path.name
        state, reclaimable = _state(entry, dir_fd, owner_fd, registry_fd)
        name = recorded_name(dir_fd, header.digest) if header is not None else None
        workers: tuple[WorkerEntry, ...] | None = None
        leases: dict[bytes, bool] = {}
        changes = None
        try:
            leases = {lease: not lease_is_dead(path, lease) for lease in sorted(lease_ids(path))}
        except OSError:
            pass  # removed meanwhile
        per_lease: dict[bytes, int] = dict.fromkeys(leases, 0)
        if header is not None:
            table = Table(registry_fd, header.capacity, header.block_size)
            try:
                # A lock of its own for the guard: no other thread of ours uses this descriptor.
                with locked(registry_fd, threading.Lock(), fcntl.LOCK_SH, lock_timeout,
                            name or entry):
                    changes, view = table.snapshot()
                    slots = table.slots()
            except TimeoutError:
                error = ("its registry lock was held by another process" +
                         (f" for more than {lock_timeout:.2g} s" if lock_timeout else ""))
            except (OSError, ValueError, struct.error) as exc:
                error = f"registry unreadable: {exc}"
            else:
                by_uid = {uid: lease for uid, _seq, lease, length in slots if length}
                entries = []
                for uid, metadata in view.items():
                    lease = by_uid.get(uid.bytes)
                    if lease is not None and lease != EMPTY_UID:
                        per_lease[lease] = per_lease.get(lease, 0) + 1
                        alive = leases.get(lease, False)  # a lease without a file is dead
                        entries.append(WorkerEntry(metadata, lease.hex(), alive))
                    else:
                        entries.append(WorkerEntry(metadata, None, None))
                workers = tuple(entries)
        lease_states = tuple(LeaseState(lease.hex(), leases.get(lease, False), count)
                             for lease, count in sorted(per_lease.items()))
        return NamespaceState(
            entry=entry, name=name, state=state, reclaimable=reclaimable,
            owner_pid=None if header is None else header.owner_pid,
            capacity=None if header is None else header.capacity,
            block_size=None if header is None else header.block_size,
            changes=changes, workers=workers, leases=lease_states, error=error)
    finally:
        close_quietly(registry_fd)
        close_quietly(owner_fd)
        os.close(dir_fd)


def _state(entry: str, dir_fd: int, owner_fd: int, registry_fd: int) -> tuple[str, bool]:
    if entry.startswith("ns-"):
        # As a borrower does: the owner file's lock, else (a generation laid out before there
        # was one) the directory's.
        if not owner_alive(owner_fd if owner_fd >= 0 else dir_fd):
            return "dead", True
        try:
            retired = read_counter(registry_fd)[1] if registry_fd >= 0 else False
        except (OSError, ValueError):
            retired = False
        return ("retiring" if retired else "live"), False
    if owner_alive(dir_fd):
        return ("sweeping" if entry.startswith("dead-") else "claiming"), False
    return "abandoned", not too_young(entry, os.fstat(dir_fd).st_mtime)

