"""What forwarding the workers' output to the caller costs (issue 23, item 1).

    .venv/bin/python benchmarks/output.py [--calls N] [--lines N] [--repeat R]

Each backend runs in a fresh child process (this script, re-invoked), side by side:

* round trip, nothing logged: ``--calls`` sequential awaits of a trivial routine on one worker,
  with forwarding on (the default) and off (``forward_output=False``), the two pools
  alternating ``--repeat`` times; medians of the rounds' medians;
* a flood: one call logs ``--lines`` INFO records as fast as it can (yielding to its loop every
  10 lines) while another task awaits the trivial routine on the same worker, one call after
  the other; its round trip during the flood against the round trip alone (the 2x target), the
  records the caller emitted (its ``benchmarks.flood`` logger at INFO, a handler counting
  them) and dropped (the ``anywool.output`` warning's count), how long the flood took, and the
  caller's memory: peak RSS growth over the flood, and the peak of ``tracemalloc`` during a
  second flood traced; and, for reference, the same flood with forwarding off (the worker
  still makes its records), and the share of one CPU the caller used during the flood.

Measurement only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records = 0
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "anywool.output":
            found = re.match(r"(\d+) lines", record.getMessage())
            self.dropped += int(found.group(1)) if found else 0
        else:
            self.records += 1


async def _round_trip(echo: Any, calls: int) -> float:
    for i in range(50):
        await echo(i)
    samples = []
    for i in range(calls):
        start = time.perf_counter_ns()
        await echo(i)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e3


async def _child(calls: int, lines: int, repeat: int) -> dict[str, Any]:
    import anyio

    import anywool
    from output_routines import echo, flood

    counter = _Count()
    for name in ("benchmarks.flood", "anywool.output"):
        logger = logging.getLogger(name)
        logger.addHandler(counter)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    on: list[float] = []
    off: list[float] = []
    for _ in range(repeat):
        for forward, samples in ((True, on), (False, off)):
            async with anywool.WorkerPool(spawn=1, forward_output=forward):
                samples.append(await _round_trip(echo, calls))
    figures: dict[str, Any] = {"round_trip_on_us": statistics.median(on),
                               "round_trip_off_us": statistics.median(off)}
    async with anywool.WorkerPool(spawn=1):
        alone = await _round_trip(echo, calls)
        during: list[int] = []
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        done = anyio.Event()

        async def flooding() -> None:
            await flood(lines)
            done.set()

        start, cpu = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(flooding)
            while not done.is_set():
                t = time.perf_counter_ns()
                await echo(1)
                during.append(time.perf_counter_ns() - t)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        records, dropped = counter.records, counter.dropped
        tracemalloc.start()
        await flood(lines)
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    # The same flood with nothing forwarded: what the worker's loop, busy logging, costs the
    # other call by itself (its records are still made: see the README).
    async with anywool.WorkerPool(spawn=1, forward_output=False):
        alone_off = await _round_trip(echo, calls)
        during_off: list[int] = []
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(flooding)
            while not done.is_set():
                t = time.perf_counter_ns()
                await echo(1)
                during_off.append(time.perf_counter_ns() - t)
    during.sort()
    figures.update({
        "alone_us": alone,
        "during_flood_us": statistics.median(during) / 1e3 if during else None,
        "during_flood_p99_us": during[int(len(during) * 0.99)] / 1e3 if during else None,
        "echo_calls_during_flood": len(during),
        "alone_off_us": alone_off,
        "during_flood_off_us": statistics.median(during_off) / 1e3 if during_off else None,
        "flood_seconds": took,
        "caller_cpu_share": cpu / took,
        "records_emitted": records,
        "records_dropped": dropped,
        "peak_rss_growth_mib": (rss_after - rss_before) / 1024,
        "tracemalloc_peak_mib": traced_peak / 2**20,
    })
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=("asyncio", "trio"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        import anyio

        sys.path.insert(0, str(HERE))
        figures = anyio.run(_child, options.calls, options.lines, options.repeat,
                            backend=options.child)
        print(json.dumps(figures))
        return
    results = {}
    for backend in ("asyncio", "trio"):
        out = subprocess.run([sys.executable, __file__, "--child", backend, "--calls",
                              str(options.calls), "--lines", str(options.lines), "--repeat",
                              str(options.repeat)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(HERE), os.environ.get("PYTHONPATH", "")])})
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            raise SystemExit(f"the {backend} child failed")
        results[backend] = json.loads(out.stdout.strip().splitlines()[-1])
    rows = list(results["asyncio"])
    print(f"{'figure':28} {'asyncio':>12} {'trio':>12}")
    for row in rows:
        cells = [results[b][row] for b in ("asyncio", "trio")]
        print(f"{row:28} " + " ".join(f"{c:12.2f}" if isinstance(c, float) else f"{c!s:>12}"
                                      for c in cells))
    for b in ("asyncio", "trio"):
        r = results[b]
        print(f"{b}: forwarding on/off {r['round_trip_on_us'] / r['round_trip_off_us']:.3f}; "
              f"echo during flood / alone {r['during_flood_us'] / r['alone_us']:.2f} "
              f"(not forwarded: {r['during_flood_off_us'] / r['alone_off_us']:.2f})")


if __name__ == "__main__":
    main()
