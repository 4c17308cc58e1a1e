"""``anywool demo``: a real workload on a local worker pool.

Presentation only: argument parsing (click), progress and tables (rich). The work itself is
``anywool._demo`` on a :class:`~anywool.WorkerPool`.
"""

from __future__ import annotations

import os
import sysconfig
import time
from collections import deque
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from anywool._address import Address
from anywool._demo import FileDigest, Tally, digest, regular_files, sha256_of
from anywool.runtime.pool._pool import WorkerPool

__all__ = ["demo"]


@click.command()
@click.argument("path", required=False, type=click.Path(exists=True, file_okay=True,
                                                        dir_okay=True, path_type=Path))
@click.option("--workers", "-w", type=click.IntRange(min=1, max=256), default=None,
              help="Worker processes to spawn (default: the number of CPUs).")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True, help="Event loop for the pool and its workers. (trio: pip install 'anywool[trio]')")
def demo(path: Path | None, workers: int | None, backend: str) -> None:
    """SHA-256 every regular file under PATH on a worker pool and check each result locally.

    PATH defaults to the running Python's standard library directory (without its
    site-packages and bytecode caches). The files go to the workers in batches as the tree is
    walked (anywool.map), so the work starts at once on a tree of any size; batches are sized
    by the work and spread over the workers by how busy each is. Ctrl-C stops it promptly.
    """
    root = path or Path(sysconfig.get_paths()["stdlib"])
    # The standard library proper: installed packages and bytecode caches are not part of it.
    skip = frozenset() if path else frozenset({"site-packages", "dist-packages", "__pycache__"})
    count = workers or os.cpu_count() or 1
    if not (root.is_dir() or root.is_file()):
        raise click.BadParameter(f"{root} is neither a directory nor a regular file",
                                 param_hint="PATH")
    console = Console()
    console.print(f"hashing the files under [bold]{root}[/] on {count} workers ({backend})")
    created: list[Path] = []
    tally, elapsed = anyio.run(partial(_hash_all, root, skip, count, console, created),
                               backend=backend)
    _report(console, tally, elapsed)
    # Other programs may use the runtime directory meanwhile: check only what this run made.
    left = [str(path) for path in created if path.exists()]
    if left:
        raise click.ClickException(f"the pool left files behind: {left}")
    if tally.mismatched:
        raise click.ClickException(f"{len(tally.mismatched)} digests did not match")


async def _hash_all(root: Path, skip: frozenset[str], workers: int, console: Console,
                    created: list[Path]) -> tuple[Tally, float]:
    """Hash every file on the pool as the tree is walked (timed), then check each digest here
    (untimed: the check is not the job)."""
    results: dict[str, FileDigest] = {}
    unreadable: list[tuple[str, str]] = []
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                        transient=False)
    task_id = progress.add_task("hashing", total=None)  # the total, once the walk is done
    # The paths sent, in order: results come back in the same order.
    sent: deque[str] = deque()

    def walk() -> Iterator[str]:
        walked = 0
        for found in regular_files(root, skip):
            sent.append(found)
            walked += 1
            yield found
        progress.update(task_id, total=walked)

    async with WorkerPool(spawn=workers) as pool:
        created.append(Path(pool.discovery.path))
        sockets = (Address.parse(w.metadata.address).path for w in pool.workers)
        created.extend(Path(path) for path in sockets if path is not None)
        started = time.perf_counter()
        with progress:
            async with pool.map(digest, walk(),
                                progress=partial(progress.advance, task_id)) as hashed:
                async for result in hashed:
                    path = sent.popleft()
                    if isinstance(result, FileDigest):
                        results[path] = result
                    else:
                        unreadable.append((path, result.reason))
        elapsed = time.perf_counter() - started
    with console.status("checking every digest locally"):
        tally = await anyio.to_thread.run_sync(_check, results, unreadable)
    return tally, elapsed


def _check(results: dict[str, FileDigest], unreadable: list[tuple[str, str]]) -> Tally:
    """The tally of ``results``, each digest checked against one computed here (blocking)."""
    tally = Tally(unreadable=unreadable)
    for path, result in results.items():
        try:
            _, expected = sha256_of(path)
        except OSError as exc:
            tally.unreadable.append((path, f"{type(exc).__name__}: {exc.strerror or exc}"))
            continue
        tally.record(result, expected)
    return tally


def _report(console: Console, tally: Tally, elapsed: float) -> None:
    table = Table(title="work per worker")
    table.add_column("worker pid", justify="right")
    table.add_column("files hashed", justify="right")
    table.add_column("bytes hashed", justify="right")
    for pid in sorted(tally.files):
        table.add_row(str(pid), f"{tally.files[pid]:,}", f"{tally.bytes[pid]:,}")
    table.add_section()
    table.add_row("total", f"{tally.total_files:,}", f"{tally.total_bytes:,}")
    console.print(table)
    seconds = max(elapsed, 1e-9)
    console.print(f"wall time {elapsed:.2f} s · {tally.total_files / seconds:,.0f} files/s · "
                  f"{tally.total_bytes / seconds / 1e6:,.1f} MB/s")
    console.print(f"verified {tally.verified} digests against a local computation; "
                  f"{len(tally.mismatched)} mismatched")
    for path, reason in tally.unreadable:
        console.print(f"[yellow]skipped unreadable[/] {path}: {reason}")
