"""Measure how workers come and go (issue 24): pool start, replacements, recycling, next to
what an AnyIO or trio user would otherwise use.

    .venv/bin/python benchmarks/lifecycle.py [--backend asyncio|trio|both] [--repeat R]
                                             [--json PATH]

Every figure is taken in a fresh child process (this script, re-invoked), rounds interleaved
over every configuration, each round in its own shuffled order; the median over ``--repeat``
rounds is reported. Measurement only:
nothing is asserted.

* **start N** (N = 2, and 4 × the CPUs): from a fresh ``anyio.run`` until N concurrent first
  calls are answered (each peer's modules imported before). Peers: ``anyio.to_process`` and ``trio_parallel`` (trio only), whose
  workers start on demand within that time (a ``CapacityLimiter(N)``); anywool with its warm
  template as released, and with the template turned off (workers started as processes of
  their own, as before issue 24).
* **replacement**: in a running pool, from the start of a worker to its address: forked from
  the warm template, or started as a process of its own (median of 10).
* **recycle**: ``await pool.recycle()`` of a 2-worker pool (a replacement connected before each
  old worker leaves), template warm or off, while 16 callers keep calling; the calls made
  during it and how many failed (must be 0).
* **max_calls**: 16 callers, 4 000 calls on 2 workers, with ``max_calls=500`` (each worker
  replaced 3-4 times over the run) and without; calls/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _harness

HERE = Path(__file__).resolve().parent
CPUS = os.cpu_count() or 1
LARGE = 4 * CPUS
REPLACEMENTS = 10


# -- children ----------------------------------------------------------------------------------


def _no_template() -> None:
    """Turn the warm template off: every worker starts as a process of its own."""
    from anywool.runtime.pool import _supervisor, _template

    class Off:
        def __init__(self, *args: object) -> None:
            pass

        async def __aenter__(self) -> None:
            raise _template.TemplateUnavailable("turned off by the benchmark")

        async def __aexit__(self, *args: object) -> None:
            pass

    _supervisor.Template = Off  # type: ignore[assignment,misc]


async def _start(peer: str, workers: int) -> float:
    import anyio

    sys.path.insert(0, str(HERE))
    began = time.perf_counter()
    if peer.startswith("anywool"):
        import routines

        import anywool

        async with anywool.WorkerPool(spawn=workers):
            async with anyio.create_task_group() as tg:
                for i in range(workers):
                    tg.start_soon(routines.echo, i)
            return time.perf_counter() - began
    from sync_routines import echo_sync

    limiter = anyio.CapacityLimiter(workers)
    if peer == "to_process":
        from anyio import to_process

        async with anyio.create_task_group() as tg:
            for i in range(workers):
                tg.start_soon(lambda i=i: to_process.run_sync(echo_sync, i, limiter=limiter))
        return time.perf_counter() - began
    import trio_parallel

    async with trio_parallel.open_worker_context() as context:
        async with anyio.create_task_group() as tg:
            for i in range(workers):
                tg.start_soon(lambda i=i: context.run_sync(echo_sync, i, limiter=limiter))
        return time.perf_counter() - began


async def _warm(pool: Any) -> None:
    """Have ``pool`` start its template, and wait until it runs (untimed set-up)."""
    import anyio

    await pool.recycle()  # the first worker started again warms the template
    with anyio.fail_after(30):
        while pool._supervisor.template is None:
            await anyio.sleep(0.01)


async def _replacement(warm: bool) -> dict[str, Any]:
    import anywool
    from anywool.runtime.pool._local_worker import LocalWorker

    async with anywool.WorkerPool(spawn=2) as pool:
        if warm:
            await _warm(pool)
        samples = []
        for _ in range(REPLACEMENTS):
            worker = LocalWorker()
            worker._fork_from(pool._supervisor.template if warm else None)
            began = time.perf_counter()
            async with worker:
                samples.append(time.perf_counter() - began)
        return {"median_s": statistics.median(samples), "min_s": min(samples)}


async def _recycle(warm: bool) -> dict[str, Any]:
    import anyio
    import routines

    import anywool

    calls = failures = 0
    async with anywool.WorkerPool(spawn=2) as pool:
        if warm:
            await _warm(pool)
        done = anyio.Event()

        async def caller() -> None:
            nonlocal calls, failures
            while not done.is_set():
                try:
                    await routines.echo(1)
                    calls += 1
                except Exception:
                    failures += 1

        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(caller)
            await anyio.sleep(0.2)
            began = time.perf_counter()
            await pool.recycle()
            took = time.perf_counter() - began
            done.set()
    return {"recycle_s": took, "calls": calls, "failures": failures}


async def _max_calls(bound: int | None) -> dict[str, Any]:
    import anyio
    import routines

    import anywool

    total, callers = 4000, 16
    async with anywool.WorkerPool(spawn=2, max_calls=bound) as pool:
        await pool.recycle()  # warm, as a long-running pool's template is

        async def caller() -> None:
            for _ in range(total // callers):
                await routines.echo(1)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
        return {"calls_per_s": total / (time.perf_counter() - began)}


def _child(kind: str, peer: str, backend: str) -> None:
    import anyio

    sys.path.insert(0, str(HERE))
    # Every peer's modules imported before anything is timed (as in a program that has run
    # for a while): the figures are the workers' start, not the caller's imports.
    if peer.startswith("anywool"):
        import routines  # noqa: F401

        import anywool.runtime.pool._pool  # noqa: F401
    elif peer == "to_process":
        import anyio.to_process  # noqa: F401
        import sync_routines  # noqa: F401
    elif peer == "trio_parallel":
        import sync_routines  # noqa: F401
        import trio_parallel  # noqa: F401
    if peer == "anywool-off":
        _no_template()
    if kind.startswith("start"):
        workers = int(kind.split("-")[1])
        result: dict[str, Any] = {"s": anyio.run(_start, peer, workers, backend=backend)}
    elif kind == "replacement":
        result = anyio.run(_replacement, peer == "anywool", backend=backend)
    elif kind == "recycle":
        result = anyio.run(_recycle, peer == "anywool", backend=backend)
    else:
        result = anyio.run(_max_calls, 500 if peer == "anywool-500" else None, backend=backend)
    print(json.dumps(result))


# -- the plan ----------------------------------------------------------------------------------


def _plan(backends: list[str]) -> list[tuple[str, str, str]]:
    plan = []
    for backend in backends:
        for workers in (2, LARGE):
            peers = ["anywool", "anywool-off", "to_process"]
            if backend == "trio":
                peers.append("trio_parallel")
            plan += [(f"start-{workers}", peer, backend) for peer in peers]
        plan += [(kind, peer, backend) for kind in ("replacement", "recycle")
                 for peer in ("anywool", "anywool-off")]
        plan += [("max_calls", peer, backend) for peer in ("anywool", "anywool-500")]
    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("asyncio", "trio", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "PEER", "BACKEND"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        _child(*options.child)
        return 0
    backends = ["asyncio", "trio"] if options.backend == "both" else [options.backend]
    with _harness.private_runtime("awlc-", {"ANYWOOL_RUNTIME_DIR": "."}):
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # workers start from bytecode, as installed
        runs, loads = _measure(backends, options.repeat, env)
    _report(backends, runs, loads, options)
    return 0


def _measure(backends: list[str], repeat: int, env: dict[str, str]
             ) -> tuple[dict[tuple[str, str, str], list[dict[str, Any]]], list[float]]:
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    loads = []
    for round_ in range(repeat):
        plan = _plan(backends)
        random.Random(round_).shuffle(plan)  # no configuration always after the same one
        for key in plan:
            loads.append(os.getloadavg()[0])
            done = subprocess.run([sys.executable, __file__, "--child", *key], env=env,
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                print(f"{key}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            runs.setdefault(key, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs, loads


def _report(backends: list[str], runs: dict[tuple[str, str, str], list[dict[str, Any]]],
            loads: list[float], options: argparse.Namespace) -> None:
    medians = {key: {name: statistics.median(r[name] for r in results)
                     for name in results[0]} for key, results in runs.items()}
    for backend in backends:
        print(f"\n{backend}")
        for workers in (2, LARGE):
            base = medians.get((f"start-{workers}", "to_process", backend), {}).get("s")
            for peer in ("anywool", "anywool-off", "to_process", "trio_parallel"):
                figure = medians.get((f"start-{workers}", peer, backend))
                if figure is None:
                    continue
                ratio = f"{figure['s'] / base:.2f} × to_process" if base else ""
                print(f"  start {workers:>2} workers  {peer:<14} {figure['s']:.3f} s  {ratio}")
        for peer in ("anywool", "anywool-off"):
            figure = medians.get(("replacement", peer, backend))
            if figure:
                print(f"  replacement ready  {peer:<14} {figure['median_s']:.3f} s "
                      f"(min {figure['min_s']:.3f})")
        for peer in ("anywool", "anywool-off"):
            figure = medians.get(("recycle", peer, backend))
            if figure:
                print(f"  recycle 2 workers  {peer:<14} {figure['recycle_s']:.3f} s, "
                      f"{figure['calls']:.0f} calls during it, {figure['failures']:.0f} failed")
        plain = medians.get(("max_calls", "anywool", backend))
        bounded = medians.get(("max_calls", "anywool-500", backend))
        if plain and bounded:
            print(f"  max_calls=500      {bounded['calls_per_s']:.0f} calls/s against "
                  f"{plain['calls_per_s']:.0f} without ({bounded['calls_per_s'] / plain['calls_per_s']:.2f} ×)")
    print(f"\n{CPUS} CPUs, Python {sys.version.split()[0]}, 1-min load "
          f"{min(loads):.1f}-{max(loads):.1f} during the runs, {options.repeat} rounds")
    if options.json:
        options.json.write_text(json.dumps(
            {" ".join(key): value for key, value in medians.items()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
