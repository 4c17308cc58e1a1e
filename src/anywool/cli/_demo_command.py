"""``anywool demo``: a real workload on a local worker pool.

Presentation only: argument parsing (click), progress and tables (rich). The work itself is
``anywool._demo`` on a :class:`~anywool.WorkerPool`.
"""

from __future__ import annotations

import os
import sysconfig
import time
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
from anywool.runtime._routine import run_sync
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
    site-packages and bytecode caches). Every file's call is started at once, as a batch job
    would; the pool spreads them over its workers by how busy each is.
    """
    root = path or Path(sysconfig.get_paths()["stdlib"])
    # The standard library proper: installed packages and bytecode caches are not part of it.
    skip = frozenset() if path else frozenset({"site-packages", "dist-packages", "__pycache__"})
    count = workers or os.cpu_count() or 1
    if not (root.is_dir() or root.is_file()):
        raise click.BadParameter(f"{root} is neither a directory nor a regular file",
                                 param_hint="PATH")
    console = Console()
    files = list(regular_files(root, skip))
    console.print(f"hashing {len(files)} files under [bold]{root}[/] on {count} workers "
                  f"({backend})")
    created: list[Path] = []
    tally, elapsed = anyio.run(partial(_hash_all, files, count, console, created),
                               backend=backend)
    _report(console, tally, elapsed)
    # Other programs may use the runtime directory meanwhile: check only what this run made.
    left = [str(path) for path in created if path.exists()]
    if left:
        raise click.ClickException(f"the pool left files behind: {left}")
    if tally.mismatched:
        raise click.ClickException(f"{len(tally.mismatched)} digests did not match")


async def _hash_all(files: list[str], workers: int, console: Console,
                    created: list[Path]) -> tuple[Tally, float]:
    """Hash every file on the pool, all calls at once (timed), then check each digest here
    (untimed: the check is not the job)."""
    results: dict[str, FileDigest] = {}
    unreadable: list[tuple[str, str]] = []
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                        transient=False)

    async def hash_one(task_id: object, path: str) -> None:
        try:
            results[path] = await run_sync(digest, path)
        except OSError as exc:
            unreadable.append((path, f"{type(exc).__name__}: {exc.strerror or exc}"))
        progress.advance(task_id)  # type: ignore[arg-type]

    async with WorkerPool(spawn=workers) as pool:
        created.append(Path(pool.discovery.path))
        sockets = (Address.parse(w.metadata.address).path for w in pool.workers)
        created.extend(Path(path) for path in sockets if path is not None)
        started = time.perf_counter()
        with progress:
            task_id = progress.add_task("hashing", total=len(files))
            async with anyio.create_task_group() as tg:
                for path in files:
                    tg.start_soon(hash_one, task_id, path)
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
    table.add_column("calls served", justify="right")
    table.add_column("bytes hashed", justify="right")
    for pid in sorted(tally.calls):
        table.add_row(str(pid), f"{tally.calls[pid]:,}", f"{tally.bytes[pid]:,}")
    table.add_section()
    table.add_row("total", f"{tally.total_calls:,}", f"{tally.total_bytes:,}")
    console.print(table)
    seconds = max(elapsed, 1e-9)
    console.print(f"wall time {elapsed:.2f} s · {tally.total_calls / seconds:,.0f} calls/s · "
                  f"{tally.total_bytes / seconds / 1e6:,.1f} MB/s")
    console.print(f"verified {tally.verified} digests against a local computation; "
                  f"{len(tally.mismatched)} mismatched")
    for path, reason in tally.unreadable:
        console.print(f"[yellow]skipped unreadable[/] {path}: {reason}")
