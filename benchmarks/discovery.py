"""Measure LocalDiscovery of anywool (under asyncio and trio) and, when importable, of wool (asyncio).

    .venv/bin/python benchmarks/discovery.py [--backend asyncio|trio|both] [--repeat R]
                                             [--json PATH] [--idle SECONDS] [...]

As in ``run.py``, every framework/backend pair runs in a fresh child process (this script,
re-invoked) that measures inside ``anyio.run(..., backend=...)`` and writes JSON; this process
prints one table. Propagation needs a second process: the child owns the namespace and publishes,
and spawns a *helper* (this script again) that subscribes. Measurement only: nothing is asserted.

Measured (latencies as median and p99, nearest rank):

* claim + release: ``async with LocalDiscovery(ns): pass`` on fresh namespaces (wool: ``with``);
* publish: ``await publisher.publish("worker-updated", metadata)`` on an entered publisher;
* propagation: publish in the child, a subscriber in the helper process yields the event; the
  publisher stamps ``CLOCK_MONOTONIC`` (system-wide on Linux) into ``extra["t"]`` just before
  publishing, the helper subtracts it from its own reading on receipt;
* snapshot at N workers: from starting ``async for`` on a new subscriber until all N
  ``worker-added`` events arrived;
* single change at N workers: a live subscriber (same process) holds N workers; from just before
  publishing one ``worker-updated`` until the subscriber yields that event;
* shared subscriptions (anywool only): propagation to 4 and 16 concurrent iterations of one
  namespace in the helper (latency until the last of them has the event), then the helper's CPU
  time, and its source thread's, over ``--idle`` seconds with nothing changing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import _harness

HERE = Path(__file__).resolve().parent
WORKER_COUNTS = (1, 16, 64, 128)
SHARED_CONSUMERS = (4, 16)  # 1 consumer is the propagation measurement itself
WAIT_TIMEOUT = 10.0  # seconds to wait for any one event before the run is failed
CLAIM_WARMUP = 10
PUBLISH_WARMUP = 50
PROPAGATION_WARMUP = 20
SNAPSHOT_WARMUP = 3
CHANGE_WARMUP = 10
CHANGE_SETTLE = 0.002  # untimed pause between change samples: the subscriber finishes its batch
SNAPSHOT_SETTLE = 0.002  # untimed pause between snapshots: the closed subscription is torn down
CHILD_TIMEOUT = 900.0


def _now_ns() -> int:
    """CLOCK_MONOTONIC: one clock for every process on the machine (Linux)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---------------------------------------------------------------------------------------------
# The two frameworks behind one small interface
# ---------------------------------------------------------------------------------------------


class _Anywool:
    name = "anywool"
    #: The script that builds this API again as ``--helper NAME`` (with ``helper_args``) in
    #: the propagation helper (benchmarks/etcd.py brings an API of its own).
    script = str(Path(__file__).resolve())
    helper_args: tuple[str, ...] = ()

    def __init__(self) -> None:
        import anywool

        self._m = anywool
        self.version = anywool.__version__

    def owner(self, namespace: str) -> Any:
        return self._m.LocalDiscovery(namespace)

    def subscriber(self, namespace: str) -> Any:
        return self._m.LocalDiscovery.Subscriber(namespace, poll_interval=None)

    def metadata(self, uid: UUID, i: int, t: int) -> Any:
        return self._m.WorkerMetadata(
            uid=uid, address="unix:/tmp/bench-worker", pid=os.getpid(), version=self.version,
            extra={"i": str(i), "t": str(t)},
        )


class _Wool:
    name = "wool"
    script = str(Path(__file__).resolve())
    helper_args: tuple[str, ...] = ()

    def __init__(self) -> None:
        from types import MappingProxyType

        import wool

        self._m = wool
        self._proxy = MappingProxyType
        self.version = getattr(wool, "__version__", "unknown")

    def owner(self, namespace: str) -> Any:
        # wool's LocalDiscovery is a synchronous context manager (create-or-attach).
        @asynccontextmanager
        async def entered() -> AsyncIterator[Any]:
            with self._m.LocalDiscovery(namespace) as discovery:
                yield discovery

        return entered()

    def subscriber(self, namespace: str) -> Any:
        # poll_interval=None: woken by its watchdog observer only, never by a timer.
        return self._m.LocalDiscovery.Subscriber(namespace, poll_interval=None)

    def metadata(self, uid: UUID, i: int, t: int) -> Any:
        # wool's protobuf carries extra as map<string, string>; anywool gets the same strings.
        return self._m.WorkerMetadata(
            uid=uid, address="unix:/tmp/bench-worker", pid=os.getpid(), version=self.version,
            extra=self._proxy({"i": str(i), "t": str(t)}),
        )


def _api(framework: str) -> Any:
    return _Anywool() if framework == "anywool" else _Wool()


def _namespace(what: str) -> str:
    return f"bench-{what}-{uuid4().hex[:12]}"


async def _close(iterator: Any) -> None:
    import anyio

    with anyio.CancelScope(shield=True):
        await iterator.aclose()


# ---------------------------------------------------------------------------------------------
# Measurements in the child (owner and publisher)
# ---------------------------------------------------------------------------------------------


async def _claim(api: Any, samples: int) -> dict[str, Any]:
    clock = time.perf_counter_ns
    timings: list[int] = []
    for n in range(CLAIM_WARMUP + samples):
        namespace = _namespace("claim")
        start = clock()
        async with api.owner(namespace):
            pass
        elapsed = clock() - start
        if n >= CLAIM_WARMUP:
            timings.append(elapsed)
    return _harness.summary_ms(timings)


async def _publish(api: Any, samples: int) -> dict[str, Any]:
    clock = time.perf_counter_ns
    timings: list[int] = []
    namespace = _namespace("publish")
    uid = uuid4()
    async with api.owner(namespace) as discovery, discovery.publisher as publisher:
        await publisher.publish("worker-added", api.metadata(uid, -1, 0))
        for n in range(PUBLISH_WARMUP + samples):
            metadata = api.metadata(uid, n, 0)
            start = clock()
            await publisher.publish("worker-updated", metadata)
            elapsed = clock() - start
            if n >= PUBLISH_WARMUP:
                timings.append(elapsed)
    return _harness.summary_ms(timings)


async def _propagation(
    api: Any, backend: str, samples: int, consumers: int, idle: float
) -> dict[str, Any]:
    """Publish here, subscribe in a helper process; its figures come back as its last line."""
    import anyio
    from anyio.streams.buffered import BufferedByteReceiveStream

    namespace = _namespace("propagation")
    uid = uuid4()
    command = [
        sys.executable, api.script, "--helper", api.name, *api.helper_args,
        "--backend", backend, "--namespace", namespace,
        "--consumers", str(consumers), "--samples", str(samples), "--idle", str(idle),
    ]
    async with api.owner(namespace) as discovery, discovery.publisher as publisher:
        await publisher.publish("worker-added", api.metadata(uid, -1, 0))
        process = await anyio.open_process(command, stderr=None)
        try:
            assert process.stdout is not None
            lines = BufferedByteReceiveStream(process.stdout)

            async def line(timeout: float = WAIT_TIMEOUT) -> str:
                with anyio.fail_after(timeout):
                    return (await lines.receive_until(b"\n", 1 << 20)).decode()

            ready = await line(60.0)  # the helper imports its framework first
            if ready != "ready":
                raise RuntimeError(f"helper said {ready!r}, expected 'ready'")
            for n in range(PROPAGATION_WARMUP + samples):
                metadata = api.metadata(uid, n, _now_ns())
                await publisher.publish("worker-updated", metadata)
                ack = await line()
                if ack != f"ack {n}":
                    raise RuntimeError(f"helper said {ack!r}, expected 'ack {n}'")
            result = json.loads(await line(idle + 30.0))
            with anyio.fail_after(30.0):
                status = await process.wait()
            if status != 0:
                raise RuntimeError(f"helper exited with status {status}")
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.CancelScope(shield=True):
                    await process.wait()
            await process.aclose()
    return result


async def _snapshot(api: Any, workers: int, samples: int) -> dict[str, Any]:
    import anyio

    clock = time.perf_counter_ns
    timings: list[int] = []
    threads = threading.active_count()  # the most seen between samples: a leak would show
    namespace = _namespace("snapshot")
    async with api.owner(namespace) as discovery, discovery.publisher as publisher:
        for _ in range(workers):
            await publisher.publish("worker-added", api.metadata(uuid4(), -1, 0))
        for n in range(SNAPSHOT_WARMUP + samples):
            subscriber = api.subscriber(namespace)
            start = clock()
            iterator = aiter(subscriber)
            try:
                added = 0
                with anyio.fail_after(WAIT_TIMEOUT):
                    while added < workers:
                        event = await anext(iterator)
                        if event.type == "worker-added":
                            added += 1
                elapsed = clock() - start
            finally:
                await _close(iterator)  # untimed: the source stops, so the next one is fresh
            # Untimed: let the loop run. wool closes its raw subscription (watchdog observer
            # thread and inotify instance) in a task of asyncio's async-generator finalizer;
            # without a pass of the loop here, 100 samples hold 100 observers and reach the
            # per-user inotify limit (128 by default).
            await anyio.sleep(SNAPSHOT_SETTLE)
            threads = max(threads, threading.active_count())
            if n >= SNAPSHOT_WARMUP:
                timings.append(elapsed)
    return {**_harness.summary_ms(timings), "threads_max": threads}


async def _change(api: Any, workers: int, samples: int) -> dict[str, Any]:
    import anyio

    namespace = _namespace("change")
    uids = [uuid4() for _ in range(workers)]
    latencies: list[int] = []
    state: dict[str, Any] = {"expect": None, "latency": None, "done": anyio.Event()}
    ready = anyio.Event()

    async def subscribe() -> None:
        iterator = aiter(api.subscriber(namespace))
        seen = 0
        try:
            while True:
                event = await anext(iterator)
                received = _now_ns()
                if event.type == "worker-added":
                    seen += 1
                    if seen == workers:
                        ready.set()
                elif event.type == "worker-updated":
                    extra = event.metadata.extra
                    if int(extra["i"]) == state["expect"] and not state["done"].is_set():
                        state["latency"] = received - int(extra["t"])
                        state["done"].set()
        finally:
            await _close(iterator)

    async with api.owner(namespace) as discovery, discovery.publisher as publisher:
        for uid in uids:
            await publisher.publish("worker-added", api.metadata(uid, -1, 0))
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe)
            with anyio.fail_after(WAIT_TIMEOUT):
                await ready.wait()
            for n in range(CHANGE_WARMUP + samples):
                state["expect"], state["done"] = n, anyio.Event()
                # Rotate over the workers: wool yields its scan in set order, so the changed
                # worker's position in the batch varies as it would in use.
                metadata = api.metadata(uids[n % workers], n, _now_ns())
                await publisher.publish("worker-updated", metadata)
                with anyio.fail_after(WAIT_TIMEOUT):
                    await state["done"].wait()
                if n >= CHANGE_WARMUP:
                    latencies.append(state["latency"])
                await anyio.sleep(CHANGE_SETTLE)
            tg.cancel_scope.cancel()
    return _harness.summary_ms(latencies)


async def _measure(framework: str, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    api = _api(framework)
    results: dict[str, Any] = {}
    results["claim"] = await _claim(api, args.claims)
    results["publish"] = await _publish(api, args.publishes)
    results["propagation"] = await _propagation(api, backend, args.propagations, 1, 0.0)
    if framework == "anywool":
        for consumers in SHARED_CONSUMERS:
            idle = args.idle if consumers == SHARED_CONSUMERS[-1] else 0.0
            shared = await _propagation(api, backend, args.propagations, consumers, idle)
            results[f"shared_{consumers}"] = shared
            if idle:
                results["idle"] = shared.pop("idle")
    for workers in WORKER_COUNTS:
        results[f"snapshot_{workers}"] = await _snapshot(api, workers, args.snapshots)
    for workers in WORKER_COUNTS:
        results[f"change_{workers}"] = await _change(api, workers, args.changes)
    return results


def _child(args: argparse.Namespace) -> int:
    import anyio

    loadavg = _harness.load_average()
    results = anyio.run(_measure, args.child, args.backend, args, backend=args.backend)
    info: dict[str, Any] = {
        "framework": args.child,
        "backend": args.backend,
        "loadavg": loadavg,
        "version": _api(args.child).version,
        "results": results,
    }
    if args.child == "wool":
        from importlib.metadata import version

        info["watchdog"] = version("watchdog")
    Path(args.out).write_text(json.dumps(info))
    return 0


# ---------------------------------------------------------------------------------------------
# The helper process: subscribers for propagation
# ---------------------------------------------------------------------------------------------


def _thread_cpu_s(native_id: int) -> float:
    """CPU time of one thread of this process: schedstat (ns) if present, else stat (ticks)."""
    task = Path(f"/proc/self/task/{native_id}")
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _helper_main(args: argparse.Namespace, api: Any) -> None:
    import anyio

    consumers = args.consumers
    total = PROPAGATION_WARMUP + args.samples
    arrivals: dict[int, dict[int, int]] = {}
    latencies: list[int] = []
    ready_count = 0
    all_ready = anyio.Event()
    finished = anyio.Event()
    late_events = 0  # events seen while idle (there should be none)
    idling = False

    def say(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    async def consume(k: int) -> None:
        nonlocal ready_count, late_events
        iterator = aiter(api.subscriber(args.namespace))
        announced = False
        try:
            while True:
                event = await anext(iterator)
                received = _now_ns()
                if idling:
                    late_events += 1
                if event.type == "worker-added" and not announced:
                    announced = True
                    ready_count += 1
                    if ready_count == consumers:
                        all_ready.set()
                elif event.type == "worker-updated":
                    extra = event.metadata.extra
                    n = int(extra["i"])
                    if n < 0:
                        continue
                    seen = arrivals.setdefault(n, {})
                    if k in seen:
                        continue  # a repeated scan (wool re-yields unchanged workers)
                    seen[k] = received
                    if len(seen) == consumers:
                        if n >= PROPAGATION_WARMUP:
                            latencies.append(max(seen.values()) - int(extra["t"]))
                        del arrivals[n]
                        say(f"ack {n}")
                        if n == total - 1:
                            finished.set()
        finally:
            await _close(iterator)

    async with anyio.create_task_group() as tg:
        for k in range(consumers):
            tg.start_soon(consume, k)
        await all_ready.wait()
        say("ready")
        await finished.wait()
        result: dict[str, Any] = {"consumers": consumers, **_harness.summary_ms(latencies)}
        if args.idle > 0:
            sources = [t for t in threading.enumerate() if t.name.startswith("anywool-source-")]
            idling = True
            cpu0 = time.process_time()
            src0 = [_thread_cpu_s(t.native_id) for t in sources if t.native_id]
            wall0 = time.monotonic()
            await anyio.sleep(args.idle)
            wall = time.monotonic() - wall0
            cpu = time.process_time() - cpu0
            src = [_thread_cpu_s(t.native_id) for t in sources if t.native_id]
            result["idle"] = {
                "seconds": wall,
                "consumers": consumers,
                "process_cpu_ms": cpu * 1e3,
                "source_threads": len(sources),
                "source_cpu_ms": sum(src) * 1e3 - sum(src0) * 1e3 if sources else None,
                "events": late_events,
            }
        tg.cancel_scope.cancel()
    say(json.dumps(result))


def _helper(args: argparse.Namespace, api: Any = None) -> int:
    """Run the propagation helper with ``api`` (default: the one ``--helper`` names here)."""
    import anyio

    anyio.run(_helper_main, args, api or _api(args.helper), backend=args.backend)
    return 0


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


def _run_child(
    framework: str, backend: str, args: argparse.Namespace, scratch: Path
) -> _harness.ChildResult:
    out = scratch / f"{framework}-{backend}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()),
        "--child", framework, "--backend", backend, "--out", str(out),
        "--claims", str(args.claims), "--publishes", str(args.publishes),
        "--propagations", str(args.propagations), "--snapshots", str(args.snapshots),
        "--changes", str(args.changes), "--idle", str(args.idle),
    ]
    return _harness.run_child(command, out, CHILD_TIMEOUT)


def _combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the repeats, with its min and max."""
    return _harness.combine(results, loadavg=list, spread=True)


def _rows() -> list[tuple[str, str, str]]:
    """(label, section, field) of every table row; all in ms except the idle CPU."""
    rows = [
        ("claim + release median", "claim", "median_ms"),
        ("claim + release p99", "claim", "p99_ms"),
        ("publish median", "publish", "median_ms"),
        ("publish p99", "publish", "p99_ms"),
        ("propagation median", "propagation", "median_ms"),
        ("propagation p99", "propagation", "p99_ms"),
    ]
    for n in WORKER_COUNTS:
        rows += [(f"snapshot {n} median", f"snapshot_{n}", "median_ms"),
                 (f"snapshot {n} p99", f"snapshot_{n}", "p99_ms")]
    for n in WORKER_COUNTS:
        rows += [(f"change @{n} median", f"change_{n}", "median_ms"),
                 (f"change @{n} p99", f"change_{n}", "p99_ms")]
    for k in SHARED_CONSUMERS:
        rows += [(f"shared ×{k} median", f"shared_{k}", "median_ms"),
                 (f"shared ×{k} p99", f"shared_{k}", "p99_ms")]
    rows += [("idle CPU, process", "idle", "process_cpu_ms"),
             ("idle CPU, source thread", "idle", "source_cpu_ms")]
    return rows


# (label, section, field, the largest anywool ÷ wool ratio the project aims for)
# The project's targets (issue 8), as anywool ÷ wool on medians, for each backend.
TARGETS = [
    ("claim + release median", "claim", "median_ms", 1.0),
    ("propagation median", "propagation", "median_ms", 0.5),
    ("single change @128 median", "change_128", "median_ms", 0.1),
    ("snapshot 128 median", "snapshot_128", "median_ms", 0.1),
]


def _figure(run: dict[str, Any], section: str, field: str, where: str = "results") -> Any:
    return run.get(where, {}).get(section, {}).get(field)


def _print_tables(runs: dict[str, dict[str, Any]], backends: list[str], args: argparse.Namespace,
                  wool_note: str | None) -> None:
    console = _harness.console()
    columns, ratio_keys = _harness.columns(runs, backends)
    table = _harness.comparison_table("LocalDiscovery, ms", columns, ratio_keys)
    for label, section, field in _rows():
        if not any(_figure(runs[k], section, field) is not None for k in columns):
            continue
        cells = [label]
        for key in columns:
            value = _figure(runs[key], section, field)
            cells.append("–" if value is None else f"{value:.3f}")
        for key in ratio_keys:
            ours = _figure(runs[key], section, field)
            theirs = _figure(runs["wool-asyncio"], section, field)
            cells.append(f"{ours / theirs:.2f}" if ours is not None and theirs else "–")
        table.add_row(*cells)
    console.print(table)

    if args.repeat > 1:
        spread = _harness.comparison_table(
            f"Spread over {args.repeat} interleaved repeats (min–max, ms)", columns, []
        )
        for label, section, field in _rows():
            if not any(_figure(runs[k], section, field) is not None for k in columns):
                continue
            cells = [label]
            for key in columns:
                value = _figure(runs[key], section, field, "spread")
                cells.append("–" if value is None else f"{value[0]:.3f}–{value[1]:.3f}")
            spread.add_row(*cells)
        console.print(spread)

    if ratio_keys:
        targets = _harness.comparison_table(
            "Targets (anywool ÷ wool, medians)", ratio_keys, [], leading=("target",)
        )
        for label, section, field, limit in TARGETS:
            cells = [f"{label} ≤ {limit:g}×"]
            for key in ratio_keys:
                ours = _figure(runs[key], section, field)
                theirs = _figure(runs["wool-asyncio"], section, field)
                if ours is None or not theirs:
                    cells.append("–")
                else:
                    ratio = ours / theirs
                    cells.append(f"{ratio:.2f} {'met' if ratio <= limit else 'MISSED'}")
            targets.add_row(*cells)
        console.print(targets)
        console.print("ratio = anywool ÷ wool: below 1 means anywool is faster.")
    if any(_figure(runs[k], "idle", "process_cpu_ms") is not None for k in columns):
        idle = next(runs[k]["results"]["idle"] for k in columns if "idle" in runs[k]["results"])
        console.print(f"idle CPU: ms of CPU time used over {idle['seconds']:.0f} s with "
                      f"{idle['consumers']:.0f} consumers attached and nothing changing")
    if wool_note:
        console.print(wool_note)
    versions = sorted({f"{v['framework']} {v['version']}" for v in runs.values()})
    if "wool-asyncio" in runs and "watchdog" in runs["wool-asyncio"]:
        versions.append(f"watchdog {runs['wool-asyncio']['watchdog']}")
    loads = ", ".join(f"{k} " + "/".join(f"{x:.1f}" for x in v["loadavg"]) for k, v in runs.items())
    console.print(_harness.machine_line(versions, f"1-min load average at start: {loads}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every child this many times, interleaved; report medians (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to PATH as JSON")
    parser.add_argument("--claims", type=int, default=300, help="claim + release samples (>= 200)")
    parser.add_argument("--publishes", type=int, default=1000, help="publish samples (>= 1000)")
    parser.add_argument("--propagations", type=int, default=300,
                        help="propagation samples per consumer count (>= 300)")
    parser.add_argument("--snapshots", type=int, default=100,
                        help="fresh-subscriber snapshots per worker count (default 100)")
    parser.add_argument("--changes", type=int, default=200,
                        help="single changes per worker count (default 200)")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds of idle CPU measurement, anywool only (default 10; 0 skips)")
    parser.add_argument("--child", choices=["anywool", "wool"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--helper", choices=["anywool", "wool"], help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--consumers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=0, help=argparse.SUPPRESS)
    # `make bench` passes one ARGS to run.py and to this script: ignore run.py's own options.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"discovery.py: ignoring options it does not take: {' '.join(unknown)}",
              file=sys.stderr)

    if args.helper:
        return _helper(args)
    if args.child:
        return _child(args)
    for name, least in (("claims", 200), ("publishes", 1000), ("propagations", 300),
                        ("snapshots", 10), ("changes", 10), ("repeat", 1)):
        if getattr(args, name) < least:
            parser.error(f"--{name} must be at least {least}")
    if args.idle < 0:
        parser.error("--idle must not be negative")

    # Private directories for this run, each framework's where its default is: anywool's
    # namespaces (ANYWOOL_RUNTIME_DIR) under /dev/shm, wool's lock and notification files
    # (TMPDIR) under /tmp. wool's shared memory lives in /dev/shm; its owners and publishers
    # unlink what they created on exit.
    backends, runs, failures, wool_note = _harness.run_all(
        args.backend,
        args.repeat,
        wool_module="wool",
        runtime_prefix="awd-",
        runtime_env={"ANYWOOL_RUNTIME_DIR": "ns", "TMPDIR": "tmp"},
        runtime_make=("tmp",),
        runtime_on_disk=("TMPDIR",),
        run_one=lambda framework, backend, runtime: _run_child(framework, backend, args, runtime),
        combine_runs=_combine,
    )
    if runs:
        _print_tables(runs, backends, args, wool_note)
    elif wool_note:
        print(wool_note)
    if args.json:
        settings = {
            name: getattr(args, name)
            for name in ("claims", "publishes", "propagations", "snapshots", "changes",
                         "idle", "repeat")
        } | {"worker_counts": list(WORKER_COUNTS), "shared_consumers": list(SHARED_CONSUMERS),
             "change_settle_s": CHANGE_SETTLE}
        _harness.write_json(args.json, settings, runs, failures, wool_note)
    return _harness.exit_status(failures)

if __name__ == "__main__":
    sys.exit(main())
