"""The cost of anywool's OpenTelemetry instrumentation (issue 23): round trip and 64-caller
throughput of ``WorkerPool(spawn=1)``, for two source trees side by side (say, the main checkout
before the instrumentation, and this one), in four modes:

* ``absent``: ``import opentelemetry`` fails in the caller (a ``sys.meta_path`` blocker);
* ``unconfigured``: the API and SDK imported in the caller, no provider set;
* ``traced``: an SDK tracer provider in the caller and in the workers (``otel_setup.py``):
  every call traced, spans exported in batches to an exporter that drops them; no metrics;
* ``configured``: the same, and a meter provider too: every call traced and metered.

    python benchmarks/otel.py --tree main=/work/main/src --tree branch=src --repeat 3

Every (tree, mode, backend) runs in a fresh child interpreter, interleaved over repeats;
printed: the medians over repeats of the median round trip (µs) and of the throughput
(calls/s), and the ratio of each to the first tree's figure in the first mode of the same
backend.
Measurement only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("absent", "unconfigured", "traced", "configured")


def child(mode: str, backend: str, calls: int, throughput_calls: int) -> None:
    if mode == "absent":
        class Absent:
            def find_spec(self, name: str, path: object = None, target: object = None) -> None:
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(name)
                return None

        sys.meta_path.insert(0, Absent())  # type: ignore[arg-type]
    elif mode == "unconfigured":
        import opentelemetry.sdk.trace  # noqa: F401
        import opentelemetry.trace  # noqa: F401
    else:
        os.environ["ANYWOOL_WORKER_IMPORT"] = "otel_setup"
        os.environ["ANYWOOL_BENCH_OTEL"] = mode
        import otel_setup  # noqa: F401

    import anyio

    import anywool
    from routines import echo

    async def main() -> dict[str, float]:
        async with anywool.WorkerPool(spawn=1):
            for i in range(50):
                await echo(i)
            samples = []
            for i in range(calls):
                start = time.perf_counter()
                await echo(i)
                samples.append(time.perf_counter() - start)
            each = throughput_calls // 64

            async def caller() -> None:
                for i in range(each):
                    await echo(i)

            async with anyio.create_task_group() as tg:
                for _ in range(64):
                    tg.start_soon(echo, 0)
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(64):
                    tg.start_soon(caller)
            wall = time.perf_counter() - start
        return {"round_trip_us": statistics.median(samples) * 1e6,
                "throughput": each * 64 / wall}

    print(json.dumps(anyio.run(main, backend=backend)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=SRC",
                        help="a source tree to measure (its src directory), repeatable")
    parser.add_argument("--backend", choices=("asyncio", "trio", "both"), default="both")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--throughput-calls", type=int, default=6400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "BACKEND"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(*options.child, options.calls, options.throughput_calls)
        return
    trees = [tuple(spec.split("=", 1)) for spec in options.tree]
    modes = [mode for mode in options.modes.split(",") if mode]
    if not modes or not set(modes) <= set(MODES):
        parser.error(f"--modes takes some of {', '.join(MODES)}")
    backends = ("asyncio", "trio") if options.backend == "both" else (options.backend,)
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for _ in range(options.repeat):
        for backend in backends:
            for mode in modes:
                for name, src in trees:
                    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                        [str(Path(src).resolve()), str(HERE)])}
                    env.pop("ANYWOOL_WORKER_IMPORT", None)
                    out = subprocess.run(
                        [sys.executable, __file__, "--tree", "x=y", "--child", mode, backend,
                         "--calls", str(options.calls),
                         "--throughput-calls", str(options.throughput_calls)],
                        env=env, capture_output=True, text=True, check=True, cwd=HERE)
                    results.setdefault((name, mode, backend), []).append(
                        json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'backend':8} {'mode':13} {'tree':8} {'round trip µs':>14} {'ratio':>6} "
          f"{'calls/s':>9} {'ratio':>6}")
    for backend in backends:
        base = results[(trees[0][0], modes[0], backend)]
        base_rt = statistics.median(r["round_trip_us"] for r in base)
        base_tp = statistics.median(r["throughput"] for r in base)
        for mode in modes:
            for name, _ in trees:
                runs = results[(name, mode, backend)]
                rt = statistics.median(r["round_trip_us"] for r in runs)
                tp = statistics.median(r["throughput"] for r in runs)
                print(f"{backend:8} {mode:13} {name:8} {rt:14.1f} {rt / base_rt:6.3f} "
                      f"{tp:9.0f} {tp / base_tp:6.3f}")


if __name__ == "__main__":
    main()
