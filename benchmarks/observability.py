"""What seeing the workers costs (issue 23): output forwarding and OpenTelemetry, side by side.

    .venv/bin/python benchmarks/observability.py [--backend asyncio|trio|both] [--calls N]
        [--throughput-calls N] [--lines N] [--repeat R] [--before REV] [--tree NAME=SRC ...]
        [--json PATH]

Every configuration runs in a fresh child process (this script, re-invoked, measuring inside
``anyio.run(..., backend=...)``), the configurations interleaved over ``--repeat`` rounds; the
tables give the median of each figure over the rounds. Measured:

* dispatch, through ``WorkerPool(spawn=2)``: the round trip of sequential ``echo(i)`` calls
  (50 warm-up calls, then ``--calls``; median and p99, and the CPU time per call of the caller
  and its workers together), and the throughput of 64 callers each awaiting ``echo`` in turn
  (``--throughput-calls`` in all; calls/s, CPU per call), with forwarding off
  (``forward_output=False``) and on (the default), nothing logged, times OpenTelemetry
  ``absent`` (its import blocked), ``unconfigured`` (API and SDK imported, no provider),
  ``traced`` (an SDK tracer provider batching every span to an exporter that drops them) and
  ``metered`` (the same and an SDK meter provider): the setup (``observability_setup.py``) runs
  in the caller and, through ``$ANYWOOL_WORKER_IMPORT``, in every worker, so every call makes
  its CLIENT span and its SERVER span; and, forwarding on, ``span``: anywool traces nothing
  and the measurement wraps each call in one span of the caller's own (the SDK's least cost
  per call, the floor under the traced figures);
* the same dispatch figures for older source trees, OpenTelemetry absent and their pool's
  defaults: ``--before REV`` extracts ``src/`` at REV of this repository (``git archive``) into
  a temporary directory, removed at the end, as the tree ``before``; ``--tree NAME=SRC`` names
  any tree (a ``src`` directory) already on disk. The first of them is the base of the ratios
  (without one: this tree with forwarding off and OpenTelemetry absent);
* a flood, through ``WorkerPool(spawn=1)``: a routine logs ``--lines`` INFO records as fast
  as it can (a checkpoint every 10) while another task of the caller awaits ``echo`` on the
  same worker, one call after the other, with forwarding on, off, and off with the records
  made all the same (the routine's own logging: nothing sent), and forwarding on with a
  checkpoint every line; the round trip during the flood against the idle round trip (the
  mean of the medians, and of the p99s, of ``--calls`` calls before and as many after the
  floods: the machine's drift weighs on both sides); the records the
  caller emitted (a counting handler on its ``benchmarks.flood`` logger) and those it was told
  were dropped (the ``anywool.output`` warnings' counts); the caller's peak RSS growth over a
  flood a tenth as long, then over the whole flood; the caller's CPU share. ``--lines 0``
  leaves the flood out.

"this tree" is the anywool that ``import anywool`` finds here (``PYTHONPATH``, else the
installed one); every child records where it imported anywool from. Measurement only: nothing
is asserted; the targets of issue 23 are printed as met or not.
"""

from __future__ import annotations

import argparse
import compileall
import io
import json
import logging
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import _harness

HERE = Path(__file__).resolve().parent
WARMUP_CALLS = _harness.WARMUP_CALLS
SPAWN = 2
FLOOD_SPAWN = 1
CONCURRENCY = 64
SHORT_FLOOD = 10  # the first flood is this many times shorter than --lines
MIN_CALLS = 500
MIN_THROUGHPUT_CALLS = 1_000
CHILD_TIMEOUT = 600.0  # seconds for one child run before it is killed (failure path only)

THIS = "now"  # the name of this tree
MODES = ("absent", "unconfigured", "traced", "metered", "span")
MODE_LABELS = {
    "absent": "absent",
    "unconfigured": "unconfigured",
    "traced": "traced",
    "metered": "traced+metered",
    "span": "one span of its own",
}
FLOOD = "flood"  # a checkpoint every 10 lines
FLOOD_EACH = "flood-each"  # a checkpoint every line
FLOODS = {FLOOD: 10, FLOOD_EACH: 1}
# Flood configurations: (output, what); output "made" is forwarding off with the flood's
# records made all the same (its logger at INFO): the routine's own logging, nothing sent.
FLOOD_RUNS = (("on", FLOOD), ("off", FLOOD), ("made", FLOOD), ("on", FLOOD_EACH))
FLOOD_TITLES = {("on", FLOOD): "forwarding on", ("off", FLOOD): "forwarding off",
                ("made", FLOOD): "off, records made", ("on", FLOOD_EACH): "on, 1 line/checkpoint"}

# Targets of issue 23 (limits on ratios, and on the caller's memory).
TARGET_FORWARDING = 1.03  # forwarding on, OpenTelemetry absent ÷ today's round trip
TARGET_TRACED = 1.25  # every call traced ÷ untraced round trip
TARGET_FLOOD = 2.0  # echo during the flood ÷ idle
# "Bounded": the whole flood (10× the first) raises the caller's peak RSS by at most this
# much beyond what the first flood did: memory does not follow the number of lines.
TARGET_FLOOD_MIB = 4.0


# ---------------------------------------------------------------------------------------------
# Measurements (a child process, under one event loop)
# ---------------------------------------------------------------------------------------------


class _Count(logging.Handler):
    """Counts the flood's records as the caller emits them, and the drops it is told of."""

    _DROPPED = re.compile(r"(\d+) lines of output")

    def __init__(self) -> None:
        super().__init__()
        self.records = 0
        self.dropped = 0
        self.warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "anywool.output":
            self.warnings += 1
            found = self._DROPPED.match(record.getMessage())
            self.dropped += int(found.group(1)) if found else 0
        else:
            self.records += 1


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _spanned(echo: Callable[[int], Awaitable[Any]], tracer: Any
             ) -> Callable[[int], Awaitable[Any]]:
    """``echo`` in one span of the caller's own per call (OpenTelemetry ``span``: the SDK's
    least cost per call, two attributes as anywool's spans have at the least)."""
    attributes = {"rpc.system.name": "anywool", "rpc.method": "echo"}

    async def call(i: int) -> Any:
        span = tracer.start_span("echo", attributes=attributes)
        try:
            return await echo(i)
        finally:
            span.end()

    return call


async def _dispatch(pool_options: dict[str, Any], calls: int,
                    throughput_calls: int) -> dict[str, Any]:
    from observability_routines import echo

    import anywool

    tracer = getattr(sys.modules["observability_setup"], "user_tracer", None)
    call = echo if tracer is None else _spanned(echo, tracer)
    async with anywool.WorkerPool(spawn=SPAWN, **pool_options):
        cpu = _harness.cpu_seconds()
        round_trip = await _harness.round_trip(call, calls)
        round_trip["cpu_us_per_call"] = ((_harness.cpu_seconds() - cpu) * 1e6
                                         / (calls + WARMUP_CALLS))
        throughput = await _harness.throughput(call, CONCURRENCY, throughput_calls, cpu=True)
        throughput["cpu_us_per_call"] = throughput.pop("cpu_ms_per_call") * 1e3
        workers = await _worker_spans()
    results: dict[str, Any] = {"round_trip": round_trip, "throughput": throughput}
    if workers is not None:
        results["spans"] = {"workers": workers}
    return results


async def _worker_spans() -> int | None:
    """The spans the workers' exporters were given, all told (``None``: they trace nothing,
    or a tree without the routine's module setup). Asked until both workers answered."""
    from observability_routines import spans_exported

    seen: dict[int, int | None] = {}
    for _ in range(50):
        pid, count = await spans_exported()
        seen[pid] = count
        if len(seen) == SPAWN:
            break
    counts = [c for c in seen.values() if c is not None]
    return sum(counts) if counts else None


async def _flood_with_echo(lines: int, made: bool, every: int
                           ) -> tuple[list[int], float, float]:
    """The flood of ``lines`` and, meanwhile, ``echo`` after ``echo`` on the same worker:
    (the echoes' round trips in ns, the flood's wall time in s, the caller's CPU time in s)."""
    import anyio
    from observability_routines import echo, flood

    done = anyio.Event()
    samples: list[int] = []

    async def flooding() -> None:
        await flood(lines, made=made, every=every)
        done.set()

    clock = time.perf_counter_ns
    start, cpu = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(flooding)
        while not done.is_set():
            sent = clock()
            await echo(1)
            samples.append(clock() - sent)
    return samples, time.perf_counter() - start, time.process_time() - cpu


async def _flood(pool_options: dict[str, Any], calls: int, lines: int, made: bool,
                 every: int) -> dict[str, Any]:
    from observability_routines import FLOOD_LOGGER, echo

    import anywool

    counter = _Count()
    for name, level in ((FLOOD_LOGGER, logging.INFO), ("anywool.output", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.addHandler(counter)
        logger.setLevel(level)
        logger.propagate = False
    async with anywool.WorkerPool(spawn=FLOOD_SPAWN, **pool_options):
        before = await _harness.round_trip(echo, calls)
        rss_start = _peak_rss_mib()
        await _flood_with_echo(max(1, lines // SHORT_FLOOD), made, every)
        rss_short = _peak_rss_mib()
        counter.records = counter.dropped = counter.warnings = 0
        samples, seconds, cpu = await _flood_with_echo(lines, made, every)
        rss_end = _peak_rss_mib()
        after = await _harness.round_trip(echo, calls)
    during = _harness.summary_ms(samples, "calls")
    # Idle: the mean of the round trips before and after the floods, so that the machine's
    # drift over the run (other jobs on a shared machine) weighs on both sides of the ratio.
    idle = {key: (before[key] + after[key]) / 2 for key in ("median_ms", "p99_ms")}
    return {
        "idle": {**idle, "before": before, "after": after},
        "during": during,
        "flood": {
            "lines": lines,
            "seconds": seconds,
            "lines_per_s": lines / seconds,
            "caller_cpu_share": cpu / seconds,
            "records_emitted": counter.records,
            "records_dropped": counter.dropped,
            "drop_warnings": counter.warnings,
            "echo_ratio": during["median_ms"] / idle["median_ms"],
            "echo_p99_ratio": during["p99_ms"] / idle["p99_ms"],
            "rss_start_mib": rss_start,
            "rss_growth_short_mib": rss_short - rss_start,
            "rss_growth_mib": rss_end - rss_start,
            "rss_growth_beyond_short_mib": rss_end - rss_short,
        },
    }


def _spans_exported() -> int | None:
    """The spans the caller's exporter saw (``None``: nothing traced here)."""
    setup = sys.modules["observability_setup"]
    provider = getattr(setup, "provider", None)
    if provider is None:
        return None
    provider.force_flush()
    return setup.exported


def _child(label: str, backend: str, calls: int, throughput_calls: int, lines: int,
           out: str) -> int:
    # First of all: OpenTelemetry as $ANYWOOL_BENCH_OTEL says (blocked, imported, configured).
    import anyio
    import observability_setup  # noqa: F401

    import anywool

    loadavg = _harness.load_average()
    _tree, forwarding, what = label.split("/")
    options: dict[str, Any] = {}
    if forwarding in ("on", "off", "made"):
        options["forward_output"] = forwarding == "on"
    if what in FLOODS:
        results = anyio.run(_flood, options, calls, lines, forwarding == "made", FLOODS[what],
                            backend=backend)
    else:
        results = anyio.run(_dispatch, options, calls, throughput_calls, backend=backend)
        spans = _spans_exported()
        if spans is not None:
            results.setdefault("spans", {})["caller"] = spans
    from importlib.metadata import version

    info = {
        "framework": label,
        "backend": backend,
        "version": getattr(anywool, "__version__", None) or version("anywool"),
        "source": str(Path(anywool.__file__).resolve().parent.parent),
        "opentelemetry": "imported" if "opentelemetry" in sys.modules else "not imported",
        "loadavg": loadavg,
        "results": results,
    }
    Path(out).write_text(json.dumps(info))
    return 0


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


@contextmanager
def _extracted(rev: str) -> Iterator[Path]:
    """``src/`` of this repository at ``rev``, compiled to bytecode, in a temporary directory
    removed on exit (``git archive``: nothing is added to the repository, not even a worktree).

    :raises SystemExit: git cannot produce it (not a repository, an unknown revision).
    """
    repo = HERE.parent
    found = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "src"],
                           capture_output=True)
    if found.returncode != 0:
        raise SystemExit(f"--before {rev}: git archive failed: "
                         f"{found.stderr.decode(errors='replace').strip()}")
    where = Path(tempfile.mkdtemp(prefix="awo-before-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(found.stdout)) as archive:
            archive.extractall(where, filter="data")
        compileall.compile_dir(where / "src", quiet=1)
        yield where / "src"
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _labels(references: list[str], lines: int) -> list[str]:
    """Every configuration, as ``tree/forwarding/what``, in the order they run in a round."""
    labels = [f"{name}/default/absent" for name in references]
    labels += [f"{THIS}/{forwarding}/{mode}" for mode in MODES for forwarding in ("off", "on")
               if mode != "span" or forwarding == "on"]
    if lines:
        labels += [f"{THIS}/{output}/{what}" for output, what in FLOOD_RUNS]
    return labels


def _child_env(label: str, trees: dict[str, str]) -> dict[str, str]:
    tree, _forwarding, what = label.split("/")
    env = dict(os.environ)
    paths = [trees[tree]] if tree in trees else []
    paths.append(str(HERE))
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["ANYWOOL_BENCH_OTEL"] = what if what in MODES else "absent"
    # The workers set OpenTelemetry up as the caller does (trees before issue 23 ignore it).
    env["ANYWOOL_WORKER_IMPORT"] = "observability_setup"
    return env


def _run_child(label: str, backend: str, args: argparse.Namespace, trees: dict[str, str],
               scratch: Path) -> _harness.ChildResult:
    out = scratch / f"{label.replace('/', '_')}-{backend}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()),
        "--child", label,
        "--backend", backend,
        "--calls", str(args.calls),
        "--throughput-calls", str(args.throughput_calls),
        "--lines", str(args.lines),
        "--out", str(out),
    ]
    return _harness.run_child(command, out, CHILD_TIMEOUT, env=_child_env(label, trees))


def _figure(runs: dict[str, Any], label: str, backend: str, section: str,
            field: str) -> float | None:
    run = runs.get(f"{label}-{backend}")
    if run is None:
        return None
    return run["results"].get(section, {}).get(field)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _targets(runs: dict[str, Any], backends: list[str], base: str | None) -> list[dict[str, Any]]:
    """The targets of issue 23, each with its figure per backend and whether it is met."""
    rows: list[dict[str, Any]] = []

    def row(name: str, limit: float | None, unit: str, values: dict[str, float | None]) -> None:
        known = [v for v in values.values() if v is not None]
        met = None if limit is None or not known else all(v <= limit for v in known)
        rows.append({"target": name, "limit": limit, "unit": unit, "values": values,
                     "met": met})

    def rt(label: str, backend: str) -> float | None:
        return _figure(runs, label, backend, "round_trip", "median_ms")

    on_absent = f"{THIS}/on/absent"
    if base is not None:
        row(f"forwarding on, OpenTelemetry absent ÷ {base.split('/')[0]}: round trip",
            TARGET_FORWARDING, "ratio", {b: _ratio(rt(on_absent, b), rt(base, b))
                                         for b in backends})
    row("forwarding on ÷ off, OpenTelemetry absent: round trip", None, "ratio",
        {b: _ratio(rt(on_absent, b), rt(f"{THIS}/off/absent", b)) for b in backends})
    for mode in ("unconfigured", "traced", "metered", "span"):
        row(f"{MODE_LABELS[mode]} ÷ absent, forwarding on: round trip",
            TARGET_TRACED if mode in ("traced", "metered") else None, "ratio",
            {b: _ratio(rt(f"{THIS}/on/{mode}", b), rt(on_absent, b)) for b in backends})
    flood = f"{THIS}/on/{FLOOD}"
    if any(f"{flood}-{b}" in runs for b in backends):
        for output, what in FLOOD_RUNS:
            row(f"flood, {FLOOD_TITLES[output, what]}: echo round trip during ÷ idle",
                TARGET_FLOOD if output == "on" else None, "ratio",
                {b: _figure(runs, f"{THIS}/{output}/{what}", b, "flood", "echo_ratio")
                 for b in backends})
        row("flood, forwarding on: caller's peak RSS growth, whole flood", None, "MiB",
            {b: _figure(runs, flood, b, "flood", "rss_growth_mib") for b in backends})
        row(f"flood, forwarding on: of which beyond a flood {SHORT_FLOOD}× shorter",
            TARGET_FLOOD_MIB, "MiB",
            {b: _figure(runs, flood, b, "flood", "rss_growth_beyond_short_mib")
             for b in backends})
    return rows


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _print_tables(runs: dict[str, Any], backends: list[str], labels: list[str],
                  base: str | None, targets: list[dict[str, Any]], lines: int) -> None:
    from rich.table import Table

    console = _harness.console()
    dispatch = [label for label in labels if label.split("/")[2] not in FLOODS]
    base_label = base or f"{THIS}/off/absent"
    for backend in backends:
        table = Table(title=f"Round trip (sequential) and throughput ({CONCURRENCY} callers), "
                            f"WorkerPool(spawn={SPAWN}), {backend}", title_justify="left")
        for name in ("tree", "output", "OpenTelemetry"):
            table.add_column(name, no_wrap=True)
        for name in ("round trip\nmedian ms", "\np99 ms", "\n÷ base", "\nCPU µs",
                     f"{CONCURRENCY} callers\ncalls/s", "\n÷ base", "\nCPU µs"):
            table.add_column(name, justify="right", no_wrap=True)
        for label in dispatch:
            if f"{label}-{backend}" not in runs:
                continue
            tree, forwarding, mode = label.split("/")

            def get(section: str, field: str, of: str = label) -> float | None:
                return _figure(runs, of, backend, section, field)

            table.add_row(
                tree, forwarding, MODE_LABELS[mode],
                _cell(get("round_trip", "median_ms"), "{:.3f}"),
                _cell(get("round_trip", "p99_ms"), "{:.3f}"),
                _cell(_ratio(get("round_trip", "median_ms"),
                             get("round_trip", "median_ms", base_label)), "{:.3f}"),
                _cell(get("round_trip", "cpu_us_per_call"), "{:.0f}"),
                _cell(get("throughput", "calls_per_s"), "{:,.0f}"),
                _cell(_ratio(get("throughput", "calls_per_s"),
                             get("throughput", "calls_per_s", base_label)), "{:.3f}"),
                _cell(get("throughput", "cpu_us_per_call"), "{:.0f}"),
                end_section=label == base_label,
            )
        console.print(table)
    traced = [v for v in runs.values() if "spans" in v["results"]
              and v["framework"].split("/")[2] in ("traced", "metered")]
    if traced:
        caller = [v["results"]["spans"].get("caller", 0) for v in traced]
        workers = [v["results"]["spans"].get("workers", 0) for v in traced]
        console.print(f"Traced runs: the caller's exporter got {min(caller):,.0f}-"
                      f"{max(caller):,.0f} spans, the workers' {min(workers):,.0f}-"
                      f"{max(workers):,.0f}, for {_calls_made(traced[0]):,} calls (and the "
                      "few asking the workers; medians over the repeats).")
    tree, forwarding, mode = base_label.split("/")
    console.print(f"output: forwarding on or off (default: the tree's pool default). "
                  f"÷ base: to {tree}, output {forwarding}, OpenTelemetry {mode} (calls/s: "
                  "> 1 is faster). CPU µs: user + system time of the caller and its workers, "
                  "per call.")

    flood_keys = [(b, f, w) for b in backends for f, w in FLOOD_RUNS
                  if f"{THIS}/{f}/{w}-{b}" in runs]
    if flood_keys:
        table = Table(title=f"A flood of {lines:,} log lines on WorkerPool(spawn={FLOOD_SPAWN}), "
                            "an echo caller on the same worker", title_justify="left")
        table.add_column("measure", no_wrap=True)
        table.add_column("unit", no_wrap=True)
        for backend, forwarding, what in flood_keys:
            table.add_column(f"{backend}\n{FLOOD_TITLES[forwarding, what]}", justify="right",
                             no_wrap=True)
        rows = [
            ("echo idle, median", "idle", "median_ms", "ms", "{:.3f}"),
            ("echo during the flood, median", "during", "median_ms", "ms", "{:.3f}"),
            ("  ÷ idle", "flood", "echo_ratio", "", "{:.2f}"),
            ("echo idle, p99", "idle", "p99_ms", "ms", "{:.3f}"),
            ("echo during the flood, p99", "during", "p99_ms", "ms", "{:.3f}"),
            ("echo calls during the flood", "during", "calls", "", "{:,.0f}"),
            ("flood", "flood", "seconds", "s", "{:.2f}"),
            ("flood rate", "flood", "lines_per_s", "lines/s", "{:,.0f}"),
            ("records emitted at the caller", "flood", "records_emitted", "", "{:,.0f}"),
            ("records dropped (said)", "flood", "records_dropped", "", "{:,.0f}"),
            ("caller's CPU share", "flood", "caller_cpu_share", "of a CPU", "{:.2f}"),
            ("caller's peak RSS at the start", "flood", "rss_start_mib", "MiB", "{:.1f}"),
            (f"  growth, flood of 1/{SHORT_FLOOD}", "flood", "rss_growth_short_mib", "MiB",
             "{:.1f}"),
            ("  growth, whole flood", "flood", "rss_growth_mib", "MiB", "{:.1f}"),
        ]
        for name, section, field, unit, fmt in rows:
            table.add_row(name, unit, *(_cell(_figure(runs, f"{THIS}/{f}/{w}", b, section,
                                                      field), fmt) for b, f, w in flood_keys))
        console.print(table)
        console.print("A checkpoint every 10 lines, except where it says 1 line. Forwarding "
                      "off: the worker keeps its own level (WARNING), so its INFO records are "
                      "never made; off, records made: its flood logger at INFO, so they are "
                      "made and handled there (the routine's own logging, nothing sent); "
                      "forwarding on, its root logger passes the lowest level this process's "
                      "logging lets through (INFO here).")

    table = Table(title="Targets of issue 23", title_justify="left")
    table.add_column("target", no_wrap=True)
    table.add_column("limit", justify="right", no_wrap=True)
    for backend in backends:
        table.add_column(backend, justify="right", no_wrap=True)
    table.add_column("met", no_wrap=True)
    for target in targets:
        fmt = "{:.3f}" if target["unit"] == "ratio" else "{:.1f} MiB"
        met = {None: "-", True: "yes", False: "no"}[target["met"]]
        limit = "-" if target["limit"] is None else f"≤ {fmt.format(target['limit'])}"
        table.add_row(target["target"], limit,
                      *(_cell(target["values"].get(b), fmt) for b in backends), met)
    console.print(table)
    if base is None:
        console.print("No older tree given (--before REV or --tree NAME=SRC): the 3 % target "
                      "of forwarding against today's round trip is not measured.")
    starts = [r["loadavg"] for v in runs.values() for r in v["repeats"]]
    loads = f"{min(starts):.1f}-{max(starts):.1f}" if starts else "-"
    sources = sorted({f"{v['framework'].split('/')[0]} = {v['source']}" for v in runs.values()})
    console.print("trees: " + "; ".join(sources))
    console.print(_harness.machine_line(_versions(runs),
                                        f"1-min load average at the children's starts: {loads}"))


def _calls_made(run: dict[str, Any]) -> int:
    """The echo calls of one dispatch run: warm-ups, timed, one per caller, the callers'."""
    figures = run["results"]
    return (WARMUP_CALLS + figures["round_trip"]["calls"] + CONCURRENCY
            + figures["throughput"]["calls"])


def _versions(runs: dict[str, Any]) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    found = sorted({f"anywool {v['version']}" for v in runs.values()})
    for name in ("anyio", "trio", "opentelemetry-sdk"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--calls", type=int, default=2000,
                        help=f"timed sequential round trips (>= {MIN_CALLS}; default 2000)")
    parser.add_argument("--throughput-calls", type=int, default=6400,
                        help=f"calls of the {CONCURRENCY}-caller run "
                             f"(>= {MIN_THROUGHPUT_CALLS}; default 6400)")
    parser.add_argument("--lines", type=int, default=100_000,
                        help="lines of the flood (0: no flood; default 100000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds over every configuration, interleaved; the median of "
                             "each figure is reported (default 3)")
    parser.add_argument("--before", metavar="REV",
                        help="also measure src/ at REV of this repository, as the tree "
                             "'before' (e.g. 161be73, the tree before issue 23)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC",
                        help="also measure the anywool of SRC (a src directory), repeatable")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to PATH as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls < MIN_CALLS:
        parser.error(f"--calls must be at least {MIN_CALLS}")
    if args.throughput_calls < MIN_THROUGHPUT_CALLS:
        parser.error(f"--throughput-calls must be at least {MIN_THROUGHPUT_CALLS}")
    if args.lines < 0:
        parser.error("--lines must be at least 0")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.child:
        return _child(args.child, args.backend, args.calls, args.throughput_calls, args.lines,
                      args.out)

    trees: dict[str, str] = {}
    for spec in args.tree:
        name, _, src = spec.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", name) or name in (THIS, "before") or not src:
            parser.error(f"--tree takes NAME=SRC, NAME of letters, digits, '_' and '.', not "
                         f"{THIS!r} or 'before': {spec!r}")
        if name in trees:
            parser.error(f"--tree {name} given twice")
        if not (Path(src) / "anywool" / "__init__.py").is_file():
            parser.error(f"--tree {spec}: no anywool package in {src}")
        trees[name] = str(Path(src).resolve())

    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    checkout = nullcontext() if args.before is None else _extracted(args.before)
    with checkout as before:
        if before is not None:
            trees = {"before": str(before), **trees}
        labels = _labels(list(trees), args.lines)
        plan = [(label, backend) for backend in backends for label in labels]
        with _harness.private_runtime("awo-", {"ANYWOOL_RUNTIME_DIR": "."}) as runtime:
            samples, failures = _harness.measure_plan(
                plan, args.repeat,
                lambda label, backend: _run_child(label, backend, args, trees, runtime))
    runs = {key: _harness.combine(results, loadavg=statistics.median, spread=args.repeat > 1)
            for key, results in samples.items()}
    for key, failure in failures.items():
        print(f"{key} failed: {failure}", file=sys.stderr)
    for key, results in samples.items():  # the runs keep their source: say where it was
        runs[key]["source"] = results[0]["source"]
    if args.before is not None:
        for run in runs.values():
            if run["framework"].startswith("before/"):
                run["source"] = f"src at {args.before} (extracted)"
    base = next((f"{name}/default/absent" for name in trees), None)
    targets = _targets(runs, backends, base)
    if runs:
        _print_tables(runs, backends, labels, base, targets, args.lines)
    if args.json:
        settings = {
            "spawn": SPAWN,
            "calls": args.calls,
            "warmup_calls": WARMUP_CALLS,
            "concurrency": CONCURRENCY,
            "throughput_calls": args.throughput_calls,
            "flood_spawn": FLOOD_SPAWN,
            "lines": args.lines,
            "repeat": args.repeat,
            "before": args.before,
            "trees": trees if args.before is None else {
                **{k: v for k, v in trees.items() if k != "before"},
                "before": f"src at {args.before}"},
            "base": base,
            "targets": targets,
        }
        _harness.write_json(args.json, settings, runs, failures, "not part of this benchmark")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
