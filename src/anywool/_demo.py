"""The work and bookkeeping behind ``anywool demo``.

The functions workers run live in an importable module (not in the CLI's ``__main__``) so that
workers import them by reference.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileDigest:
    """What a worker reports for one file."""

    pid: int
    size: int
    sha256: str


def sha256_of(path: str) -> tuple[int, str]:
    """(bytes read, hex SHA-256) of the file at ``path``; blocking.

    :raises OSError: the file cannot be opened or read.
    """
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


@dataclass(frozen=True)
class Unreadable:
    """What a worker reports for a file it could not read."""

    reason: str


def digest(path: str) -> FileDigest | Unreadable:
    """What a worker reports for the file at ``path`` (a plain function, for
    :func:`anywool.map`: hashing holds the worker, so batches spread by work). A file that
    cannot be read is reported, not raised: one such file must not end the whole job.
    """
    try:
        size, hexdigest = sha256_of(path)
    except OSError as exc:
        return Unreadable(f"{type(exc).__name__}: {exc.strerror or exc}")
    return FileDigest(os.getpid(), size, hexdigest)


def regular_files(root: Path, skip: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every regular file below ``root`` (symlinks not followed), in a stable order.

    :param skip: names of directories not to descend into.
    """
    if root.is_file():
        yield str(root)
        return
    for directory, subdirectories, files in os.walk(root, followlinks=False):
        subdirectories[:] = sorted(d for d in subdirectories if d not in skip)
        for name in sorted(files):
            path = os.path.join(directory, name)
            if not os.path.islink(path) and os.path.isfile(path):
                yield path


@dataclass
class Tally:
    """Per-worker counts and the failures seen while hashing."""

    files: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    verified: int = 0
    mismatched: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    def record(self, result: FileDigest, expected: str) -> None:
        self.files[result.pid] = self.files.get(result.pid, 0) + 1
        self.bytes[result.pid] = self.bytes.get(result.pid, 0) + result.size
        if result.sha256 == expected:
            self.verified += 1
        else:
            self.mismatched.append(result.sha256)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    @property
    def total_files(self) -> int:
        return sum(self.files.values())
