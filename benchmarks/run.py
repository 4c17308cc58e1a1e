"""Measure anywool (under asyncio and trio) and, when it is importable, wool (asyncio), side by side.

    .venv/bin/python benchmarks/run.py [--backend asyncio|trio|both] [--calls N] [--repeat R]
                                       [--json PATH]

For each framework/backend pair a fresh child process (this script, re-invoked) runs the
measurements inside ``anyio.run(..., backend=...)`` and writes them as JSON; this process
collects them and prints one table. Everything here is measurement only: nothing is asserted.

Measured, with a pool of 2 spawned workers:

* dispatch round trip: sequential awaits of ``echo(x)`` after a warm-up (median, p99, ms);
* throughput: 64 tasks, each awaiting ``echo`` sequentially, ≥ 5 000 calls in all (calls/s);
* pool start/stop: entering, a first call, and exiting a fresh pool (median of the runs, s);
* streaming: consuming an async generator routine that yields 2 000 ints (µs per item);
* what travels (anywool only): the round trip of ``echo`` with a context variable set, under a
  deadline, with both, and of a routine awaiting ``echo`` on its worker (nested), interleaved
  call by call with plain round trips so that each is a ratio to the plain one measured
  alongside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import _harness

# wool's spawned workers re-import this file (multiprocessing "spawn") and call
# logging.basicConfig(level=INFO) on the root logger; keep its INFO chatter out of the table.
logging.getLogger("wool").setLevel(logging.WARNING)

HERE = Path(__file__).resolve().parent
WARMUP_CALLS = _harness.WARMUP_CALLS
CONCURRENCY = 64
MIN_THROUGHPUT_CALLS = 5_000
STREAM_ITEMS = 2_000
STREAM_RUNS = 5
POOL_RUNS = 5
SPAWN = 2
CHILD_TIMEOUT = 600.0  # seconds for one child run before it is killed (failure path only)


# ---------------------------------------------------------------------------------------------
# Measurements (run in a child process, under one event loop)
# ---------------------------------------------------------------------------------------------


def _framework(name: str) -> tuple[Callable[[], AbstractAsyncContextManager[Any]], Any, Any]:
    """(pool factory, echo routine, stream routine) for ``name``."""
    if name == "anywool":
        import routines

        import anywool

        return (lambda: anywool.WorkerPool(spawn=SPAWN)), routines.echo, routines.stream
    if name == "wool":
        import wool
        import wool_routines

        return (lambda: wool.WorkerPool(spawn=SPAWN)), wool_routines.echo, wool_routines.stream
    raise ValueError(f"unknown framework {name!r}")


async def _streaming(stream: Callable[[int], Any]) -> dict[str, Any]:
    return await _harness.streaming(stream, STREAM_ITEMS, STREAM_RUNS)


async def _pool_cycle(pool_factory: Callable[[], Any], echo: Callable[[int], Awaitable[Any]]) -> dict[str, Any]:
    """Start, first call, stop for ``POOL_RUNS`` fresh pools; medians in seconds."""
    starts: list[float] = []
    firsts: list[float] = []
    stops: list[float] = []
    totals: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(POOL_RUNS):
        pool = pool_factory()
        t0 = clock()
        await pool.__aenter__()
        try:
            t1 = clock()
            await echo(0)
            t2 = clock()
        except BaseException:
            await pool.__aexit__(*sys.exc_info())
            raise
        await pool.__aexit__(None, None, None)
        t3 = clock()
        starts.append((t1 - t0) / 1e9)
        firsts.append((t2 - t1) / 1e9)
        stops.append((t3 - t2) / 1e9)
        totals.append((t3 - t0) / 1e9)
    return {
        "runs": POOL_RUNS,
        "workers": SPAWN,
        "start_s": statistics.median(starts),
        "first_call_s": statistics.median(firsts),
        "stop_s": statistics.median(stops),
        "total_s": statistics.median(totals),
    }


TRAVEL_VARIANTS = ("plain", "context", "deadline", "both", "nested")


async def _travel(calls: int) -> dict[str, Any]:
    """Round trips with what travels with a call, each variant once per round in turn."""
    import anyio
    import routines

    samples: dict[str, list[int]] = {variant: [] for variant in TRAVEL_VARIANTS}
    clock = time.perf_counter_ns

    async def one(variant: str, i: int) -> None:
        token = routines.TAG.set("request-42") if variant in ("context", "both") else None
        far = anyio.current_time() + 600 if variant in ("deadline", "both") else math.inf
        fn = routines.relay if variant == "nested" else routines.echo
        with anyio.CancelScope(deadline=far):
            start = clock()
            await fn(i)
            samples[variant].append(clock() - start)
        if token is not None:
            routines.TAG.reset(token)

    for i in range(WARMUP_CALLS):
        for variant in TRAVEL_VARIANTS:
            await one(variant, i)
    for variant in TRAVEL_VARIANTS:
        samples[variant].clear()
    for i in range(calls):
        for offset in range(len(TRAVEL_VARIANTS)):  # a different order every round
            await one(TRAVEL_VARIANTS[(i + offset) % len(TRAVEL_VARIANTS)], i)
    figures: dict[str, Any] = {"calls": calls}
    for variant, values in samples.items():
        summary = _harness.summary_ms(values)
        figures[f"{variant}_median_ms"] = summary["median_ms"]
        figures[f"{variant}_p99_ms"] = summary["p99_ms"]
    for variant in TRAVEL_VARIANTS:
        figures[f"{variant}_ratio"] = figures[f"{variant}_median_ms"] / figures["plain_median_ms"]
    return figures


async def _measure(framework: str, calls: int, throughput_calls: int) -> dict[str, Any]:
    pool_factory, echo, stream = _framework(framework)
    results: dict[str, Any] = {}
    async with pool_factory():
        results["round_trip"] = await _harness.round_trip(echo, calls)
        results["throughput"] = dict(await _harness.throughput(echo, CONCURRENCY,
                                                               throughput_calls),
                                     concurrency=CONCURRENCY)
        results["streaming"] = await _streaming(stream)
        if framework == "anywool":
            results["travel"] = await _travel(calls)
    results["pool"] = await _pool_cycle(pool_factory, echo)
    return results


def _child(framework: str, backend: str, calls: int, throughput_calls: int, out: str) -> int:
    import anyio

    sys.path.insert(0, str(HERE))
    loadavg = _harness.load_average()
    results = anyio.run(_measure, framework, calls, throughput_calls, backend=backend)
    info = {
        "framework": framework,
        "backend": backend,
        "loadavg": loadavg,
        "results": results,
    }
    if framework == "wool":
        import wool

        info["version"] = getattr(wool, "__version__", "unknown")
    else:
        from importlib.metadata import version

        info["version"] = version("anywool")
    Path(out).write_text(json.dumps(info))
    return 0


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


def _run_child(
    framework: str, backend: str, calls: int, throughput_calls: int, scratch: Path
) -> _harness.ChildResult:
    """Run one measurement child; (its results, None) or (None, why it failed)."""
    out = scratch / f"{framework}-{backend}.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child", framework,
        "--backend", backend,
        "--calls", str(calls),
        "--throughput-calls", str(throughput_calls),
        "--out", str(out),
    ]
    return _harness.run_child(command, out, CHILD_TIMEOUT)


def _combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One child's figures, or with repeats the median of each figure over the repeats."""
    return _harness.combine(results, loadavg=statistics.median, spread=False)


# (label, section, key, unit, format)
ROWS: list[tuple[str, str, str, str, str]] = [
    ("round trip median", "round_trip", "median_ms", "ms", "{:.3f}"),
    ("round trip p99", "round_trip", "p99_ms", "ms", "{:.3f}"),
    ("throughput, 64 in flight", "throughput", "calls_per_s", "calls/s", "{:,.0f}"),
    ("pool start", "pool", "start_s", "s", "{:.3f}"),
    ("pool first call", "pool", "first_call_s", "s", "{:.3f}"),
    ("pool stop", "pool", "stop_s", "s", "{:.3f}"),
    ("pool start+call+stop", "pool", "total_s", "s", "{:.3f}"),
    ("stream, per item", "streaming", "median_us_per_item", "µs", "{:.1f}"),
]


def _print_table(runs: dict[str, dict[str, Any]], backends: list[str], wool_note: str | None) -> None:
    console = _harness.console()
    columns, ratio_keys = _harness.columns(runs, backends)
    table = _harness.comparison_table(
        f"WorkerPool(spawn={SPAWN})", columns, ratio_keys, leading=("measure", "unit")
    )
    for label, section, field, unit, fmt in ROWS:
        cells = [label, unit]
        for key in columns:
            cells.append(fmt.format(runs[key]["results"][section][field]))
        for key in ratio_keys:
            ours = runs[key]["results"][section][field]
            theirs = runs["wool-asyncio"]["results"][section][field]
            cells.append(f"{ours / theirs:.2f}" if theirs else "n/a")
        table.add_row(*cells)
    console.print(table)
    if ratio_keys:
        console.print(
            "ratio = anywool ÷ wool. Times (ms, s, µs): < 1 means anywool is faster. "
            "calls/s: > 1 means anywool is faster."
        )
    if wool_note:
        console.print(wool_note)
    _print_travel(console, runs, backends)
    loads = ", ".join(f"{k} {v['loadavg']:.2f}" for k, v in runs.items())
    versions = sorted({f"{v['framework']} {v['version']}" for v in runs.values()})
    console.print(_harness.machine_line(versions, f"median 1-min load average at start: {loads}"))


TRAVEL_LABELS = {
    "plain": "plain round trip",
    "context": "with a ContextVar set",
    "deadline": "under a deadline",
    "both": "with both",
    "nested": "nested: a routine awaiting echo",
}


def _print_travel(console: Any, runs: dict[str, dict[str, Any]], backends: list[str]) -> None:
    from rich.table import Table

    keys = [f"anywool-{b}" for b in backends if "travel" in runs.get(f"anywool-{b}", {}).get(
        "results", {})]
    if not keys:
        return
    table = Table(title="What travels with a call (anywool)", title_justify="left")
    table.add_column("round trip", no_wrap=True)
    for key in keys:
        backend = key.split("-")[1]
        table.add_column(f"{backend} median ms", justify="right")
        table.add_column(f"{backend} p99 ms", justify="right")
        table.add_column(f"{backend} ÷ plain", justify="right")
    for variant in TRAVEL_VARIANTS:
        cells = [TRAVEL_LABELS[variant]]
        for key in keys:
            figures = runs[key]["results"]["travel"]
            cells += [f"{figures[f'{variant}_median_ms']:.3f}",
                      f"{figures[f'{variant}_p99_ms']:.3f}", f"{figures[f'{variant}_ratio']:.2f}"]
        table.add_row(*cells)
    console.print(table)
    console.print("÷ plain: the median of that variant over the median of plain round trips "
                  "interleaved with it, call by call (target for ContextVar and deadline: "
                  "≤ 1.10).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument(
        "--calls", type=int, default=1000, help="timed sequential round trips (>= 500; default 1000)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write all figures to PATH as JSON")
    parser.add_argument(
        "--throughput-calls",
        type=int,
        default=6400,
        help=f"total calls of the throughput run (>= {MIN_THROUGHPUT_CALLS}; default 6400)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement child this many times, interleaved; report the median (default 1)",
    )
    parser.add_argument("--child", choices=["anywool", "wool"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls < 500:
        parser.error("--calls must be at least 500")
    if args.throughput_calls < MIN_THROUGHPUT_CALLS:
        parser.error(f"--throughput-calls must be at least {MIN_THROUGHPUT_CALLS}")

    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    if args.child:
        return _child(args.child, args.backend, args.calls, args.throughput_calls, args.out)

    # wool_routines (importable when wool is) sits next to this script.
    sys.path.insert(0, str(HERE))
    # A private runtime directory for this run: the pools' namespaces and sockets live there,
    # not in the user's /dev/shm/anywool-<uid>.
    backends, runs, failures, wool_note = _harness.run_all(
        args.backend,
        args.repeat,
        wool_module="wool_routines",
        runtime_prefix="awb-",
        runtime_env={"ANYWOOL_RUNTIME_DIR": "."},
        run_one=lambda framework, backend, runtime: _run_child(
            framework, backend, args.calls, args.throughput_calls, runtime
        ),
        combine_runs=_combine,
    )
    if runs:
        _print_table(runs, backends, wool_note)
    elif wool_note:
        print(wool_note)
    if args.json:
        settings = {
            "spawn": SPAWN,
            "calls": args.calls,
            "warmup_calls": WARMUP_CALLS,
            "concurrency": CONCURRENCY,
            "throughput_calls": args.throughput_calls,
            "stream_items": STREAM_ITEMS,
            "stream_runs": STREAM_RUNS,
            "pool_runs": POOL_RUNS,
            "repeat": args.repeat,
        }
        _harness.write_json(args.json, settings, runs, failures, wool_note)
    return _harness.exit_status(failures)

if __name__ == "__main__":
    sys.exit(main())
