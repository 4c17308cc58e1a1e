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
from anyio.streams.memory import MemoryObjectReceiveStream
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from anywool._address import Address
from anywool._demo import Tally, hash_file, regular_files, sha256_of
from anywool.runtime._pool import WorkerPool

__all__ = ["demo"]


@click.command()
@click.argument("path", required=False, type=click.Path(exists=True, file_okay=True,
                                                        dir_okay=True, path_type=Path))
@click.option("--workers", "-w", type=click.IntRange(min=1, max=256), default=None,
              help="Worker processes to spawn (default: the number of CPUs).")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True, help="Event loop for the pool and its workers.")
@click.option("--concurrency", type=click.IntRange(min=1, max=4096), default=None,
              help="Calls in flight at once (default: 8 per worker).")
def demo(path: Path | None, workers: int | None, backend: str, concurrency: int | None) -> None:
    """SHA-256 every regular file under PATH on a worker pool and check each result locally.

    PATH defaults to the running Python's standard library directory (without its
    site-packages and bytecode caches).
    """
    root = path or Path(sysconfig.get_paths()["stdlib"])
    # The standard library proper: installed packages and bytecode caches are not part of it.
    skip = frozenset() if path else frozenset({"site-packages", "dist-packages", "__pycache__"})
    count = workers or os.cpu_count() or 1
    in_flight = concurrency or 8 * count
    if not (root.is_dir() or root.is_file()):
        raise click.BadParameter(f"{root} is neither a directory nor a regular file",
                                 param_hint="PATH")
    console = Console()
    files = list(regular_files(root, skip))
    console.print(f"hashing {len(files)} files under [bold]{root}[/] on {count} workers "
                  f"({backend})")
    created: list[Path] = []
    tally, elapsed = anyio.run(partial(_hash_all, files, count, in_flight, console, created),
                               backend=backend)
    _report(console, tally, elapsed)
    # Other programs may use the runtime directory meanwhile: check only what this run made.
    left = [str(path) for path in created if path.exists()]
    if left:
        raise click.ClickException(f"the pool left files behind: {left}")
    if tally.mismatched:
        raise click.ClickException(f"{len(tally.mismatched)} digests did not match")


async def _hash_all(files: list[str], workers: int, in_flight: int, console: Console,
                    created: list[Path]) -> tuple[Tally, float]:
    tally = Tally()
    send, receive = anyio.create_memory_object_stream[str](in_flight)
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                        transient=False)

    async def feed() -> None:
        async with send:
            for path in files:
                await send.send(path)

    async def hash_some(task_id: object, paths: MemoryObjectReceiveStream[str]) -> None:
        async with paths:
            async for path in paths:
                try:
                    result = await hash_file(path)
                    _, expected = await anyio.to_thread.run_sync(sha256_of, path)
                except OSError as exc:
                    tally.unreadable.append((path, f"{type(exc).__name__}: {exc.strerror or exc}"))
                else:
                    tally.record(result, expected)
                progress.advance(task_id)  # type: ignore[arg-type]

    async with WorkerPool(spawn=workers) as pool:
        created.append(Path(pool.discovery.path))
        sockets = (Address.parse(w.metadata.address).path for w in pool.workers)
        created.extend(Path(path) for path in sockets if path is not None)
        started = time.perf_counter()
        with progress:
            task_id = progress.add_task("hashing", total=len(files))
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                for _ in range(in_flight):
                    tg.start_soon(hash_some, task_id, receive.clone())
                receive.close()
        elapsed = time.perf_counter() - started
    return tally, elapsed


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
