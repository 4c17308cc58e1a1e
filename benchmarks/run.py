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
* streaming: consuming an async generator routine that yields 2 000 ints (µs per item).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

# wool's spawned workers re-import this file (multiprocessing "spawn") and call
# logging.basicConfig(level=INFO) on the root logger; keep its INFO chatter out of the table.
logging.getLogger("wool").setLevel(logging.WARNING)

HERE = Path(__file__).resolve().parent
WARMUP_CALLS = 50
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


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def _framework(name: str) -> tuple[Callable[[], AbstractAsyncContextManager[Any]], Any, Any]:
    """(pool factory, echo routine, stream routine) for ``name``."""
    if name == "anywool":
        import anywool
        import routines

        return (lambda: anywool.WorkerPool(spawn=SPAWN)), routines.echo, routines.stream
    if name == "wool":
        import wool
        import wool_routines

        return (lambda: wool.WorkerPool(spawn=SPAWN)), wool_routines.echo, wool_routines.stream
    raise ValueError(f"unknown framework {name!r}")


async def _round_trip(echo: Callable[[int], Awaitable[Any]], calls: int) -> dict[str, Any]:
    for i in range(WARMUP_CALLS):
        await echo(i)
    samples: list[int] = []
    clock = time.perf_counter_ns
    for i in range(calls):
        start = clock()
        await echo(i)
        samples.append(clock() - start)
    ms = sorted(ns / 1e6 for ns in samples)
    return {
        "calls": calls,
        "median_ms": statistics.median(ms),
        "p99_ms": _percentile(ms, 0.99),
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


async def _throughput(echo: Callable[[int], Awaitable[Any]], total: int) -> dict[str, Any]:
    import anyio

    per_task = math.ceil(total / CONCURRENCY)

    async def worker(count: int) -> None:
        for i in range(count):
            await echo(i)

    # Warm-up: one call per task, so every connection the proxy opens is open before timing.
    async with anyio.create_task_group() as tg:
        for _ in range(CONCURRENCY):
            tg.start_soon(worker, 1)
    start = time.perf_counter_ns()
    async with anyio.create_task_group() as tg:
        for _ in range(CONCURRENCY):
            tg.start_soon(worker, per_task)
    elapsed = (time.perf_counter_ns() - start) / 1e9
    done = per_task * CONCURRENCY
    return {
        "concurrency": CONCURRENCY,
        "calls": done,
        "seconds": elapsed,
        "calls_per_s": done / elapsed,
    }


async def _streaming(stream: Callable[[int], Any]) -> dict[str, Any]:
    async def consume() -> int:
        count = 0
        async for _ in stream(STREAM_ITEMS):
            count += 1
        return count

    await consume()  # warm-up
    per_item_us: list[float] = []
    for _ in range(STREAM_RUNS):
        start = time.perf_counter_ns()
        count = await consume()
        elapsed = time.perf_counter_ns() - start
        if count != STREAM_ITEMS:
            raise RuntimeError(f"stream yielded {count} items, expected {STREAM_ITEMS}")
        per_item_us.append(elapsed / 1e3 / count)
    return {
        "items": STREAM_ITEMS,
        "runs": STREAM_RUNS,
        "median_us_per_item": statistics.median(per_item_us),
        "min_us_per_item": min(per_item_us),
        "max_us_per_item": max(per_item_us),
    }


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


async def _measure(framework: str, calls: int, throughput_calls: int) -> dict[str, Any]:
    pool_factory, echo, stream = _framework(framework)
    results: dict[str, Any] = {}
    async with pool_factory():
        results["round_trip"] = await _round_trip(echo, calls)
        results["throughput"] = await _throughput(echo, throughput_calls)
        results["streaming"] = await _streaming(stream)
    results["pool"] = await _pool_cycle(pool_factory, echo)
    return results


def _child(framework: str, backend: str, calls: int, throughput_calls: int, out: str) -> int:
    import anyio

    sys.path.insert(0, str(HERE))
    loadavg = os.getloadavg()[0]  # other work on the machine skews everything; recorded, not judged
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
) -> tuple[dict[str, Any] | None, str | None]:
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
    # A session of its own, so that on a hang the child and any worker it spawned can be ended
    # together (the pools reap their workers on every ordinary exit).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return None, f"timed out after {CHILD_TIMEOUT:.0f} s\n{_tail(stderr)}"
    if process.returncode != 0 or not out.exists():
        return None, f"exit status {process.returncode}\n{_tail(stderr or stdout)}"
    return json.loads(out.read_text()), None


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One child's figures, or with repeats the median of each figure over the repeats."""
    first = results[0]
    combined: dict[str, Any] = {
        "framework": first["framework"],
        "backend": first["backend"],
        "version": first["version"],
        "loadavg": statistics.median(r["loadavg"] for r in results),
        "repeats": results,
        "results": {},
    }
    for section, figures in first["results"].items():
        combined["results"][section] = {
            name: statistics.median(r["results"][section][name] for r in results)
            for name in figures
        }
    return combined


def _wool_status() -> str | None:
    """None when ``import wool`` (and so our wool routines) succeeds here, else why not."""
    sys.path.insert(0, str(HERE))
    try:
        import wool_routines  # noqa: F401
    except ImportError as error:
        return str(error)
    except Exception as error:  # a broken install is reported as a skip, not raised
        return f"{type(error).__name__}: {error}"
    return None


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
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    table = Table(
        title=f"WorkerPool(spawn={SPAWN})",
        title_justify="left",
    )
    table.add_column("measure", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    columns = [key for key in [f"anywool-{b}" for b in backends] + ["wool-asyncio"] if key in runs]
    for key in columns:
        table.add_column(key.replace("-", " "), justify="right", no_wrap=True)
    ratio_keys = [k for k in columns if k.startswith("anywool-")] if "wool-asyncio" in runs else []
    for key in ratio_keys:
        table.add_column(f"{key.split('-')[1]}÷wool", justify="right", no_wrap=True)
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
    loads = ", ".join(f"{k} {v['loadavg']:.2f}" for k, v in runs.items())
    console.print(
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} "
        f"{platform.machine()}; "
        + ", ".join(sorted({f"{v['framework']} {v['version']}" for v in runs.values()}))
        + f"; median 1-min load average at start: {loads}"
    )


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

    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    # A private runtime directory for this run: the pools' namespaces and sockets live there,
    # not in the user's /dev/shm/anywool-<uid>. Short, under /tmp: it holds AF_UNIX sockets.
    runtime = Path(tempfile.mkdtemp(prefix="awb-", dir="/tmp" if os.path.isdir("/tmp") else None))
    previous = os.environ.get("ANYWOOL_RUNTIME_DIR")
    os.environ["ANYWOOL_RUNTIME_DIR"] = str(runtime)
    samples: dict[str, list[dict[str, Any]]] = {}
    failures: dict[str, str] = {}
    try:
        wool_error = _wool_status()
        plan = [("anywool", b) for b in backends]
        if wool_error is None:
            plan.append(("wool", "asyncio"))
        # Repeats go round the whole plan, so that a burst of other load on the machine does
        # not land on one framework's figures only.
        for repeat in range(args.repeat):
            for framework, backend in plan:
                key = f"{framework}-{backend}"
                if key in failures:
                    continue
                print(f"measuring {key} ({repeat + 1}/{args.repeat}) ...", file=sys.stderr, flush=True)
                result, failure = _run_child(
                    framework, backend, args.calls, args.throughput_calls, runtime
                )
                if result is not None:
                    samples.setdefault(key, []).append(result)
                else:
                    failures[key] = failure or "unknown failure"
                    samples.pop(key, None)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
        if previous is None:
            os.environ.pop("ANYWOOL_RUNTIME_DIR", None)
        else:
            os.environ["ANYWOOL_RUNTIME_DIR"] = previous

    runs = {key: _combine(results) for key, results in samples.items()}
    if wool_error is not None:
        wool_note = f"wool not importable: skipped ({wool_error})"
    elif "wool-asyncio" in failures:
        wool_note = "wool failed: skipped (see above)"
    else:
        wool_note = None
    for key, failure in failures.items():
        print(f"{key} failed: {failure}", file=sys.stderr)
    if runs:
        _print_table(runs, backends, wool_note)
    elif wool_note:
        print(wool_note)
    if args.json:
        document = {
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "settings": {
                "spawn": SPAWN,
                "calls": args.calls,
                "warmup_calls": WARMUP_CALLS,
                "concurrency": CONCURRENCY,
                "throughput_calls": args.throughput_calls,
                "stream_items": STREAM_ITEMS,
                "stream_runs": STREAM_RUNS,
                "pool_runs": POOL_RUNS,
                "repeat": args.repeat,
            },
            "runs": runs,
            "failures": failures,
            "wool": "measured" if "wool-asyncio" in runs else (wool_note or "skipped"),
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    return 1 if any(k.startswith("anywool-") for k in failures) else 0


if __name__ == "__main__":
    sys.exit(main())
