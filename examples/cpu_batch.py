"""A CPU-bound batch: the SHA-256 of every file under a directory, computed on worker processes.

    python examples/cpu_batch.py [PATH] [--backend asyncio|trio] [--workers N] [--limit N]

PATH defaults to this Python's standard library (without site-packages and bytecode caches):
a few thousand files. Every file's call is started at once, from one task group; the pool keeps
each worker busy until the batch is done. Once every digest is back, each one is computed again
here and compared, and a summary is printed:

    hashing 2450 files (102.3 MB) on 2 workers (asyncio), pids 17022 17024
    worker 17022: 1192 files, 75.1 MB
    worker 17024: 1258 files, 27.2 MB
    hashed 2450 files in 1.19 s: 2063 files/s, 86.1 MB/s
    verified 2450 digests here: 0 mismatched, 0 unreadable

Exit status 0 when every digest matched, 1 when one did not (or a file could not be read), 130
after Ctrl-C. The first Ctrl-C cancels the calls on their workers (hashing a large file is
interrupted mid-file) and the pool stops its workers: nothing is left running. ``--backend trio``
needs ``pip install 'anywool[trio]'``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from functools import partial

import anyio
import anyio.to_thread

import anywool


# -- the work: a plain function, run on a worker by anywool.run_sync ---------------------------


def sha256_of(path: str) -> tuple[int, int, str]:
    """(pid of the process that read it, bytes read, hex SHA-256) of the file at ``path``.

    It never awaits: it holds its worker's event loop until it returns, so the pool gives that
    worker its next call only as this one ends, and calls spread by work, not by count.
    The function travels to the workers by value (cloudpickle), since it lives in ``__main__``.
    """
    with open(path, "rb") as file:
        digest = hashlib.file_digest(file, "sha256")  # reads in chunks: a Python loop
        size = file.tell()
    return os.getpid(), size, digest.hexdigest()


# -- which files -------------------------------------------------------------------------------


def files_under(root: str, skip: frozenset[str], limit: int | None) -> list[str]:
    """Regular files under ``root`` (symlinks not followed), in a stable order, at most
    ``limit`` of them; directories named in ``skip`` are not entered."""
    if os.path.isfile(root):
        return [root]
    found: list[str] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(name for name in subdirectories if name not in skip)
        for name in sorted(names):
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
                if len(found) == limit:
                    return found
    return found


# -- the batch ---------------------------------------------------------------------------------


@dataclass
class Batch:
    """What came back: one result per file that was hashed, the reason for each that was not."""

    results: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


async def hash_all(paths: list[str], size: int, workers: int, backend: str) -> Batch:
    batch = Batch()

    async def hash_one(path: str) -> None:
        try:
            batch.results[path] = await anywool.run_sync(sha256_of, path)
        except OSError as error:  # raised on the worker, re-raised here with its traceback
            batch.unreadable[path] = f"{type(error).__name__}: {error.strerror or error}"

    # A fresh namespace of our own with `workers` processes; lazy=False waits for all of them,
    # so that the timing below is the batch's and not the workers' start.
    async with anywool.WorkerPool(spawn=workers, lazy=False, quorum=workers) as pool:
        pids = " ".join(str(worker.pid) for worker in pool.workers)
        print(f"hashing {len(paths)} files ({size / 1e6:.1f} MB) on {workers} "
              f"worker{'s' if workers > 1 else ''} ({backend}), pids {pids}", flush=True)
        started = time.perf_counter()
        # Every call at once: the pool hands them out as workers have room. If one call
        # raises something other than OSError, the task group cancels the others and the
        # error propagates out of the pool, which stops its workers first.
        async with anyio.create_task_group() as tg:
            for path in paths:
                tg.start_soon(hash_one, path)
        batch.seconds = time.perf_counter() - started
    return batch


def check(batch: Batch) -> list[str]:
    """The files whose digest differs from the one computed here (blocking: run in a thread).
    A file that can no longer be read moves from the results to the unreadable ones."""
    mismatched = []
    for path, (_, _, digest) in list(batch.results.items()):
        try:
            _, _, expected = sha256_of(path)
        except OSError as error:  # removed, or made unreadable, since it was hashed
            del batch.results[path]
            batch.unreadable[path] = f"{type(error).__name__}: {error.strerror or error}"
            continue
        if digest != expected:
            mismatched.append(path)
    return mismatched


def report(batch: Batch, mismatched: list[str]) -> None:
    per_worker: dict[int, list[int]] = {}
    for pid, size, _ in batch.results.values():
        files_and_bytes = per_worker.setdefault(pid, [0, 0])
        files_and_bytes[0] += 1
        files_and_bytes[1] += size
    for pid, (files, size) in sorted(per_worker.items()):
        print(f"worker {pid}: {files} files, {size / 1e6:.1f} MB")
    count = len(batch.results)
    size = sum(size for _, size, _ in batch.results.values())
    seconds = max(batch.seconds, 1e-9)
    print(f"hashed {count} files in {batch.seconds:.2f} s: {count / seconds:.0f} files/s, "
          f"{size / seconds / 1e6:.1f} MB/s")
    print(f"verified {count} digests here: {len(mismatched)} mismatched, "
          f"{len(batch.unreadable)} unreadable")
    for path in mismatched:
        print(f"mismatched: {path}")
    for path, reason in sorted(batch.unreadable.items()):
        print(f"unreadable: {path}: {reason}")


async def main(paths: list[str], size: int, workers: int, backend: str) -> int:
    batch = await hash_all(paths, size, workers, backend)
    # The check is not part of the batch: it runs after the pool exited, in a thread, so that
    # the event loop stays free (it would matter if this program did anything else meanwhile).
    mismatched = await anyio.to_thread.run_sync(check, batch)
    report(batch, mismatched)
    return 1 if mismatched or batch.unreadable else 0


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="SHA-256 every file under PATH on worker processes and check each digest.")
    parser.add_argument("path", nargs="?", help="a directory or a file (default: the standard "
                        "library, without site-packages and __pycache__)")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio",
                        help="event loop of this program and of its workers")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes to spawn (default: one per CPU)")
    parser.add_argument("--limit", type=int, default=None,
                        help="hash only the first N files (in sorted order)")
    arguments = parser.parse_args()
    if arguments.workers < 1:
        parser.error("--workers must be at least 1")
    if arguments.limit is not None and arguments.limit < 1:
        parser.error("--limit must be at least 1")
    return arguments


if __name__ == "__main__":
    arguments = parse_arguments()
    if arguments.path is None:
        root = sysconfig.get_paths()["stdlib"]
        skip = frozenset({"site-packages", "dist-packages", "__pycache__"})
    else:
        root, skip = arguments.path, frozenset()
    if not os.path.exists(root):
        sys.exit(f"{root}: no such file or directory")
    paths = files_under(root, skip, arguments.limit)
    size = sum(os.path.getsize(path) for path in paths)  # before the event loop runs: it blocks
    try:
        status = anyio.run(partial(main, paths, size, arguments.workers, arguments.backend),
                           backend=arguments.backend)
    except* KeyboardInterrupt:
        # Ctrl-C. By the time anyio.run raises, the calls were cancelled on their workers, the
        # pool has stopped and reaped them and removed its namespace. `except*`, because under
        # trio the interrupt may be raised in one of the task group's tasks, and then arrives
        # wrapped in an exception group; a bare KeyboardInterrupt (asyncio) matches as well.
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)
