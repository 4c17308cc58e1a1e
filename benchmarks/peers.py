"""Measure anywool's dispatch against what an AnyIO or trio user would pick for plain offload.

    .venv/bin/python benchmarks/peers.py [--backend asyncio|trio|both] [--calls N]
                                         [--throughput-calls N] [--repeat R] [--json PATH]

Side by side, each peer/backend pair in a fresh child process (this script, re-invoked), the
pairs interleaved over ``--repeat`` rounds, medians reported (issue 11, deliverable 1):

* ``anywool``: ``WorkerPool`` awaiting the trivial ``routines.echo`` (asyncio, trio);
* ``to_process``: ``anyio.to_process.run_sync(echo_sync, i)`` (asyncio, trio);
* ``trio_parallel``: ``trio_parallel.run_sync(echo_sync, i)`` (trio only; skipped with a note
  when ``trio_parallel`` does not import);
* ``wool``: ``wool.WorkerPool`` awaiting ``wool_routines.echo`` (asyncio only; skipped with a
  note when ``wool`` does not import: it is never a dependency of this project);
* ``floor``: processes running ``floor_server.py``, a length-prefixed (4-byte big-endian) echo
  of one pickled int per round trip over a Unix socket, the client on anyio streams (one
  connection per caller, spread round robin over the servers).

``echo_sync`` is in ``sync_routines.py``, a module that imports nothing. Figures, each also as a
ratio to ``to_process`` on the same backend and to the floor on the same backend:

* round trip: 1 worker, 50 warm-up calls, then ``--calls`` sequential awaits; median and p99;
* throughput at 1, 16 and 64 concurrent callers, 2 workers (anywool ``spawn=2``; a
  ``CapacityLimiter(2)`` for to_process and trio_parallel; 2 floor servers), one warm-up call per
  caller, then ``--throughput-calls`` calls in all per caller count; calls/s over the wall time;
* CPU time per call in the 64-caller run: user + system time of the calling process and of
  every process under it (workers, servers, sidecars), over the calls made;
* streaming per item: ``async for`` over a remote async generator of 2 000 items, 1 worker, one
  pull per item (anywool and wool; the others cannot stream: their figure is "-", and the
  ratio to the floor is to the floor's round trip, which is what one pull costs at least);
* pool start and stop, 2 workers, 5 times, each in a fresh ``anyio.run``: *start* from inside
  the new event loop until two concurrent first calls are answered (to_process and
  trio_parallel start their workers on demand, so it includes that); *stop* from then until
  ``anyio.run`` returns (anywool's ``__aexit__``, trio_parallel's worker context closing,
  to_process killing its workers as the loop ends, the floor's servers seeing EOF on stdin and
  exiting, each followed by the loop closing).

Measurement only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import _harness

HERE = Path(__file__).resolve().parent
WARMUP_CALLS = _harness.WARMUP_CALLS
CONCURRENCIES = (1, 16, 64)
WORKERS = 2
POOL_RUNS = 5
MIN_CALLS = 500
MIN_THROUGHPUT_CALLS = 1_000
CHILD_TIMEOUT = 300.0  # seconds for one child run before it is killed (failure path only)

STREAM_ITEMS = 2_000
STREAM_RUNS = 5

PEERS = ("anywool", "to_process", "trio_parallel", "wool", "floor")
BACKENDS_OF = {
    "anywool": ("asyncio", "trio"),
    "to_process": ("asyncio", "trio"),
    "trio_parallel": ("trio",),
    "wool": ("asyncio",),
    "floor": ("asyncio", "trio"),
}
#: The optional peers: skipped, with a note, when their module does not import.
OPTIONAL = {"trio_parallel": "trio_parallel", "wool": "wool"}
STREAMING = ("anywool", "wool")
DISTRIBUTION = {"anywool": "anywool", "to_process": "anyio", "trio_parallel": "trio-parallel",
                "wool": "wool"}

Echo = Callable[[int], Awaitable[Any]]

# ---------------------------------------------------------------------------------------------
# The peers (in a child process, under one event loop)
# ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def _anywool(workers: int, fresh: bool) -> AsyncIterator[Echo]:
    import routines

    import anywool

    async with anywool.WorkerPool(spawn=workers):
        yield routines.echo


@asynccontextmanager
async def _wool(workers: int, fresh: bool) -> AsyncIterator[Echo]:
    import wool
    import wool_routines

    async with wool.WorkerPool(spawn=workers):
        yield wool_routines.echo


def _stream_of(peer: str) -> Callable[[int], Any]:
    if peer == "wool":
        import wool_routines

        return wool_routines.stream
    import routines

    return routines.stream


@asynccontextmanager
async def _to_process(workers: int, fresh: bool) -> AsyncIterator[Echo]:
    # No pool object: the workers are the event loop's, started on demand and killed when the
    # loop ends; the limiter bounds how many are used at once.
    import anyio
    from anyio import to_process
    from sync_routines import echo_sync

    limiter = anyio.CapacityLimiter(workers)

    async def echo(i: int) -> Any:
        return await to_process.run_sync(echo_sync, i, limiter=limiter)

    yield echo


@asynccontextmanager
async def _trio_parallel(workers: int, fresh: bool) -> AsyncIterator[Echo]:
    import trio
    import trio_parallel
    from sync_routines import echo_sync

    limiter = trio.CapacityLimiter(workers)
    if not fresh:  # the default worker context, as trio_parallel.run_sync is used

        async def echo(i: int) -> Any:
            return await trio_parallel.run_sync(echo_sync, i, limiter=limiter)

        yield echo
        return
    # A context of its own, so that its workers start here and stop on exit.
    async with trio_parallel.open_worker_context() as context:

        async def echo_in_context(i: int) -> Any:
            return await context.run_sync(echo_sync, i, limiter=limiter)

        yield echo_in_context


@asynccontextmanager
async def _floor(workers: int, fresh: bool) -> AsyncIterator[Echo]:
    import anyio
    from anyio.streams.buffered import BufferedByteReceiveStream

    directory = os.environ.get("ANYWOOL_RUNTIME_DIR") or tempfile.gettempdir()
    paths = [os.path.join(directory, f"floor-{os.getpid()}-{time.monotonic_ns()}-{k}.sock")
             for k in range(workers)]
    servers = []
    connections: list[Any] = []
    idle: list[tuple[Any, BufferedByteReceiveStream]] = []
    opened = 0
    try:
        for path in paths:
            server = await anyio.open_process(
                [sys.executable, str(HERE / "floor_server.py"), path], stderr=None
            )
            servers.append(server)
        for server in servers:
            assert server.stdout is not None
            line = await BufferedByteReceiveStream(server.stdout).receive_until(b"\n", 64)
            if line != b"ready":
                raise RuntimeError(f"floor server said {line!r}")

        async def echo(i: int) -> Any:
            nonlocal opened
            if idle:
                stream, reader = idle.pop()
            else:  # a connection per concurrent caller, round robin over the servers
                stream = await anyio.connect_unix(paths[opened % len(paths)])
                opened += 1
                connections.append(stream)
                reader = BufferedByteReceiveStream(stream)
            payload = pickle.dumps(i)
            await stream.send(len(payload).to_bytes(4, "big") + payload)
            size = int.from_bytes(await reader.receive_exactly(4), "big")
            result = pickle.loads(await reader.receive_exactly(size))
            idle.append((stream, reader))
            return result

        yield echo
    finally:
        with anyio.CancelScope(shield=True):
            for stream in connections:
                await stream.aclose()
            for server in servers:
                assert server.stdin is not None
                await server.stdin.aclose()  # EOF: the server exits
            for server in servers:
                await server.wait()
                await server.aclose()


OPEN = {"anywool": _anywool, "to_process": _to_process, "trio_parallel": _trio_parallel,
        "wool": _wool, "floor": _floor}

# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


async def _measure(peer: str, calls: int, throughput_calls: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with OPEN[peer](1, False) as echo:
        results["round_trip"] = await _harness.round_trip(echo, calls)
        if peer in STREAMING:
            results["streaming"] = await _harness.streaming(_stream_of(peer), STREAM_ITEMS,
                                                            STREAM_RUNS)
    async with OPEN[peer](WORKERS, False) as echo:
        for callers in CONCURRENCIES:
            results[f"throughput_{callers}"] = await _harness.throughput(
                echo, callers, throughput_calls, cpu=callers == CONCURRENCIES[-1])
    return results


async def _pool_cycle(peer: str) -> tuple[int, int]:
    import anyio

    t0 = time.perf_counter_ns()
    async with OPEN[peer](WORKERS, True) as echo:
        async with anyio.create_task_group() as tg:
            for i in range(WORKERS):
                tg.start_soon(echo, i)
        t1 = time.perf_counter_ns()
    return t0, t1


def _pool(peer: str, backend: str) -> dict[str, Any]:
    """Start and stop of ``POOL_RUNS`` fresh pools, each in an event loop of its own (s)."""
    import anyio

    starts: list[float] = []
    stops: list[float] = []
    for _ in range(POOL_RUNS):
        t0, t1 = anyio.run(_pool_cycle, peer, backend=backend)
        t2 = time.perf_counter_ns()
        starts.append((t1 - t0) / 1e9)
        stops.append((t2 - t1) / 1e9)
    return {
        "runs": POOL_RUNS,
        "workers": WORKERS,
        "start_s": statistics.median(starts),
        "stop_s": statistics.median(stops),
        "total_s": statistics.median(a + b for a, b in zip(starts, stops)),
    }


def _version_of(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


def _child(peer: str, backend: str, calls: int, throughput_calls: int, out: str) -> int:
    import anyio

    sys.path.insert(0, str(HERE))
    loadavg = _harness.load_average()
    results = anyio.run(_measure, peer, calls, throughput_calls, backend=backend)
    results["pool"] = _pool(peer, backend)
    info = {"framework": peer, "backend": backend,
            "version": _version_of(DISTRIBUTION[peer]) if peer in DISTRIBUTION else "stdlib",
            "loadavg": loadavg, "results": results}
    Path(out).write_text(json.dumps(info))
    return 0


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


def _run_child(peer: str, backend: str, calls: int, throughput_calls: int,
               scratch: Path) -> _harness.ChildResult:
    out = scratch / f"{peer}-{backend}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()),
        "--child", peer,
        "--backend", backend,
        "--calls", str(calls),
        "--throughput-calls", str(throughput_calls),
        "--out", str(out),
    ]
    return _harness.run_child(command, out, CHILD_TIMEOUT)


# (label, section, key, unit, format)
ROWS: list[tuple[str, str, str, str, str]] = [
    ("round trip median", "round_trip", "median_ms", "ms", "{:.3f}"),
    ("round trip p99", "round_trip", "p99_ms", "ms", "{:.3f}"),
    *[(f"throughput, {c} caller{'s' if c > 1 else ''}", f"throughput_{c}", "calls_per_s",
       "calls/s", "{:,.0f}") for c in CONCURRENCIES],
    (f"CPU per call, {CONCURRENCIES[-1]} callers", f"throughput_{CONCURRENCIES[-1]}",
     "cpu_ms_per_call", "ms", "{:.3f}"),
    ("streaming, per item", "streaming", "median_us_per_item", "µs", "{:.1f}"),
    ("pool start", "pool", "start_s", "s", "{:.3f}"),
    ("pool stop", "pool", "stop_s", "s", "{:.3f}"),
]


def _ratio_columns(runs: dict[str, dict[str, Any]], backend: str) -> list[tuple[str, str]]:
    """(peer key, base key) of every ratio on ``backend``: each peer to to_process and to the
    floor (the floor to to_process is left out: it is the inverse of to_process to the floor)."""
    pairs = []
    for peer in PEERS:
        key = f"{peer}-{backend}"
        if key not in runs:
            continue
        for base in ("to_process", "floor"):
            base_key = f"{base}-{backend}"
            if peer not in (base, "floor") and base_key in runs:
                pairs.append((key, base_key))
    return pairs


def _figure(run: dict[str, Any], section: str, field: str, *,
            as_base: bool = False) -> float | None:
    """A figure of ``run`` (``None``: not measured). As the base of a ratio, a peer that cannot
    stream stands for its round trip in the streaming row: one pull costs one at least."""
    value = run["results"].get(section, {}).get(field)
    if value is None and as_base and section == "streaming":
        return run["results"]["round_trip"]["median_ms"] * 1e3
    return value


def _print_tables(runs: dict[str, dict[str, Any]], backends: list[str],
                  notes: list[str]) -> None:
    from rich.table import Table

    console = _harness.console()
    keys = [f"{p}-{b}" for b in backends for p in PEERS if f"{p}-{b}" in runs]
    figures = Table(title=f"Plain offload of echo(i): round trip on 1 worker, the rest on {WORKERS}",
                    title_justify="left")
    figures.add_column("measure", no_wrap=True)
    figures.add_column("unit", no_wrap=True)
    for key in keys:
        figures.add_column(key.replace("-", "\n"), justify="right", no_wrap=True)
    ratio_tables = []
    for backend in backends:
        pairs = _ratio_columns(runs, backend)
        if not pairs:
            continue
        table = Table(title=f"Ratios, {backend}", title_justify="left")
        table.add_column("measure", no_wrap=True)
        for key, base in pairs:
            table.add_column(f"{key.split('-')[0]}\n÷ {base.split('-')[0]}", justify="right",
                             no_wrap=True)
        ratio_tables.append((table, pairs))
    for label, section, field, unit, fmt in ROWS:
        value = {k: _figure(runs[k], section, field) for k in keys}
        base = {k: _figure(runs[k], section, field, as_base=True) for k in keys}
        figures.add_row(label, unit, *("-" if value[k] is None else fmt.format(value[k])
                                       for k in keys))
        for table, pairs in ratio_tables:
            table.add_row(label, *("-" if value[k] is None or not base[b]
                                   else f"{value[k] / base[b]:.2f}" for k, b in pairs))
    console.print(figures)
    for table, _ in ratio_tables:
        console.print(table)
    if ratio_tables:
        console.print(
            "Ratio = that peer's figure ÷ to_process's, or the floor's, on the same backend. "
            "Times (ms, s): < 1 means faster than the base; calls/s: > 1 means faster."
        )
    for note in notes:
        console.print(note)
    loads = ", ".join(f"{k} {v['loadavg']:.2f}" for k, v in runs.items())
    versions = sorted({f"{DISTRIBUTION[v['framework']]} {v['version']}"
                       for v in runs.values() if v["framework"] in DISTRIBUTION})
    if "trio" in backends:
        versions.append(f"trio {_version_of('trio')}")
    console.print(_harness.machine_line(versions, f"median 1-min load average at start: {loads}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--calls", type=int, default=2000,
                        help=f"timed sequential round trips (>= {MIN_CALLS}; default 2000)")
    parser.add_argument("--throughput-calls", type=int, default=6400,
                        help=f"calls per caller count of the throughput runs "
                             f"(>= {MIN_THROUGHPUT_CALLS}; default 6400)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds over every peer and backend, interleaved; the median of "
                             "each figure is reported (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to PATH as JSON")
    parser.add_argument("--child", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls < MIN_CALLS:
        parser.error(f"--calls must be at least {MIN_CALLS}")
    if args.throughput_calls < MIN_THROUGHPUT_CALLS:
        parser.error(f"--throughput-calls must be at least {MIN_THROUGHPUT_CALLS}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    if args.child:
        return _child(args.child, args.backend, args.calls, args.throughput_calls, args.out)

    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    notes: list[str] = []
    missing: dict[str, str] = {}
    for peer, module in OPTIONAL.items():
        if any(b in backends for b in BACKENDS_OF[peer]):
            error = _harness.wool_status(module)
            if error is not None:
                missing[peer] = error
                notes.append(f"{peer} not importable: skipped ({error})")
    plan = [(peer, backend) for backend in backends for peer in PEERS
            if backend in BACKENDS_OF[peer] and peer not in missing]
    with _harness.private_runtime("awp-", {"ANYWOOL_RUNTIME_DIR": "."}) as runtime:
        samples, failures = _harness.measure_plan(
            plan, args.repeat,
            lambda peer, backend: _run_child(peer, backend, args.calls, args.throughput_calls,
                                             runtime),
        )
    runs = {key: _harness.combine(results, loadavg=statistics.median, spread=args.repeat > 1)
            for key, results in samples.items()}
    for key, failure in failures.items():
        print(f"{key} failed: {failure}", file=sys.stderr)
        notes.append(f"{key} failed: skipped (see above)")
    if runs:
        _print_tables(runs, backends, notes)
    else:
        for note in notes:
            print(note)
    if args.json:
        settings = {
            "calls": args.calls,
            "warmup_calls": WARMUP_CALLS,
            "round_trip_workers": 1,
            "workers": WORKERS,
            "concurrencies": list(CONCURRENCIES),
            "throughput_calls": args.throughput_calls,
            "pool_runs": POOL_RUNS,
            "repeat": args.repeat,
            "trio_parallel": missing.get("trio_parallel", "measured"),
            "stream_items": STREAM_ITEMS,
            "stream_runs": STREAM_RUNS,
            "notes": notes,
        }
        _harness.write_json(args.json, settings, runs, failures, missing.get("wool"))
    return _harness.exit_status(failures)


if __name__ == "__main__":
    sys.exit(main())
