"""Where anywool keeps its per-user files: namespaces and worker sockets.

Synchronous, no event loop. The directory is private to the user (``0700``) and is refused when
it is a symlink or belongs to someone else, because everything below it is trusted: a namespace
registry names the sockets that receive pickled code.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path

ENV_VAR = "ANYWOOL_RUNTIME_DIR"


def runtime_dir(create: bool = True) -> Path:
    """Return the runtime directory, creating it (mode ``0700``) when missing.

    ``$ANYWOOL_RUNTIME_DIR`` when set, else ``/dev/shm/anywool-<uid>`` where ``/dev/shm`` is a
    directory, else ``<tempdir>/anywool-<uid>``.

    An existing directory of ours that others may read is narrowed to ``0700`` when ``create``
    is true (by those that write in it); readers leave its mode as it is. One that others may
    write to (``0o022`` bits, e.g. mode ``0777``) is refused either way, since anyone could have
    planted files in it.

    :param create: create the directory when it does not exist, and narrow its mode: true for
        writers (claims, workers), false for readers (borrowers, ``anywool ls``), which change
        nothing.
    :raises ValueError: ``$ANYWOOL_RUNTIME_DIR`` is a relative path (it would name a different
        directory for every working directory, and worker socket addresses must be absolute).
    :raises PermissionError: the path is a symlink, not a directory, owned by another user, or
        writable by others.
    :raises FileNotFoundError: it does not exist and ``create`` is false, or its parent does
        not exist.
    """
    path = configured_path()
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # created meanwhile by another process
        except FileNotFoundError:
            raise FileNotFoundError(
                f"cannot create runtime directory {path}: its parent does not exist "
                f"(set {ENV_VAR} to a directory that can be created)") from None
        info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(f"refusing runtime directory {path}: it is a symlink")
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"refusing runtime directory {path}: it is not a directory")
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"refusing runtime directory {path}: owned by uid {info.st_uid}, not {os.getuid()}"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise PermissionError(
            f"refusing runtime directory {path}: writable by others (mode {mode:o}); "
            "make it 0700 or point ANYWOOL_RUNTIME_DIR elsewhere")
    if mode & 0o077 and create:
        os.chmod(path, 0o700)
    return path


def configured_path() -> Path:
    """The runtime directory's path as configured (``$ANYWOOL_RUNTIME_DIR``, else the
    default), neither checked nor created.

    :raises ValueError: ``$ANYWOOL_RUNTIME_DIR`` is a relative path.
    """
    return _path_for(os.environ.get(ENV_VAR), os.getuid())


@functools.lru_cache(maxsize=16)
def _path_for(configured: str | None, uid: int) -> Path:
    if configured:
        path = Path(configured)
        if not path.is_absolute():
            raise ValueError(f"{ENV_VAR} must be an absolute path, got {configured!r}")
        return path
    if os.path.isdir("/dev/shm"):
        base = Path("/dev/shm")
    else:
        import tempfile  # here: only without /dev/shm

        base = Path(tempfile.gettempdir())
    return base / f"anywool-{uid}"


#: File systems that keep everything in memory: no call on them waits for a device.
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def in_memory() -> bool:
    """Whether the runtime directory lives on a memory file system (tmpfs, ramfs).

    There, creating, locking, renaming and removing a handful of files never waits for a
    device, so an event loop may do it itself instead of paying a thread hop. Elsewhere (a
    disk, NFS) or when it cannot be told (no ``/proc``), ``False``: such work goes to a
    thread. Read from ``/proc/self/mountinfo`` once per directory path.

    :raises ValueError: as :func:`runtime_dir` (a relative ``$ANYWOOL_RUNTIME_DIR``).
    """
    return _on_memory_filesystem(str(configured_path()))


@functools.lru_cache(maxsize=16)
def _on_memory_filesystem(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            table = mounts.read()
    except OSError:
        return False
    # The directory may not exist yet: its nearest existing ancestor has the same mount.
    return filesystem_type(os.path.realpath(path), table) in _MEMORY_FILESYSTEMS


def filesystem_type(path: str, mountinfo: str) -> str | None:
    """The type of the file system that absolute ``path`` is on, by the mount table in the
    format of ``/proc/self/mountinfo``; ``None`` when no mount contains it."""
    best, fstype = "", None
    for line in mountinfo.splitlines():
        # "<id> <parent> <dev> <root> <mount point> <options> [optional...] - <type> ..."
        fields, _, tail = line.partition(" - ")
        parts = fields.split(" ")
        if len(parts) < 5 or not tail:
            continue
        point = _unescape(parts[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the last of equal mounts is the visible one
            best, fstype = point, tail.split(" ", 1)[0]
    return fstype


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in mount points as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
