"""The harness shared by the benchmark scripts (``run.py``, ``discovery.py``, ``etcd.py``, ...):
what is not a measurement.

The scripts run every framework/backend pair in a fresh child process (the script re-invoked),
interleave ``--repeat`` rounds over the whole plan, report the median of each figure, print rich
tables with an ``anywool ÷ wool`` ratio per backend and a line about the machine, and can write
everything as JSON. The measurements themselves, the command line and the table rows stay in the
scripts; this module holds the plumbing between them.
"""

from __future__ import annotations

import importlib
import json
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
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A measurement child's figures, or None and why it failed.
ChildResult = tuple[dict[str, Any] | None, str | None]

# ---------------------------------------------------------------------------------------------
# Statistics (children and parent)
# ---------------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def summary_ms(samples_ns: list[int], count_key: str = "samples") -> dict[str, Any]:
    """Count, median, p99 (nearest rank), min and max of latencies given in ns, in ms."""
    ms = sorted(ns / 1e6 for ns in samples_ns)
    return {
        count_key: len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 0.99),
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


# ---------------------------------------------------------------------------------------------
# Dispatch measurements shared by run.py and peers.py (children, inside anyio.run)
# ---------------------------------------------------------------------------------------------

WARMUP_CALLS = 50


async def round_trip(echo: Callable[[int], Awaitable[Any]], calls: int) -> dict[str, Any]:
    """Sequential awaits of ``echo(i)`` after :data:`WARMUP_CALLS` untimed ones."""
    for i in range(WARMUP_CALLS):
        await echo(i)
    samples: list[int] = []
    clock = time.perf_counter_ns
    for i in range(calls):
        start = clock()
        await echo(i)
        samples.append(clock() - start)
    return summary_ms(samples, "calls")


def cpu_seconds() -> float:
    """CPU time (user + system, s) used so far by this process and every live process under it
    (workers, their sidecars): what a call costs the machine, wherever it runs."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += times.user + times.system
    return total


async def throughput(echo: Callable[[int], Awaitable[Any]], callers: int,
                     total: int, *, cpu: bool = False) -> dict[str, Any]:
    """``callers`` tasks awaiting ``echo`` sequentially, about ``total`` calls in all, after one
    untimed call per task (so that every worker and connection they need is up). With ``cpu``,
    also the CPU time per call of this process and its children (:func:`cpu_seconds`)."""
    import anyio

    per_caller = math.ceil(total / callers)

    async def caller(count: int) -> None:
        for i in range(count):
            await echo(i)

    async def run(count: int) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller, count)

    await run(1)
    cpu_start = cpu_seconds() if cpu else 0.0
    start = time.perf_counter_ns()
    await run(per_caller)
    elapsed = (time.perf_counter_ns() - start) / 1e9
    done = per_caller * callers
    result = {"callers": callers, "calls": done, "seconds": elapsed, "calls_per_s": done / elapsed}
    if cpu:
        result["cpu_ms_per_call"] = (cpu_seconds() - cpu_start) * 1e3 / done
    return result


async def streaming(stream: Callable[[int], Any], items: int, runs: int) -> dict[str, Any]:
    """``runs`` full iterations of ``stream(items)`` after one untimed; time per item (µs)."""

    async def consume() -> int:
        count = 0
        async for _ in stream(items):
            count += 1
        return count

    await consume()  # warm-up
    per_item_us: list[float] = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        count = await consume()
        elapsed = time.perf_counter_ns() - start
        if count != items:
            raise RuntimeError(f"stream yielded {count} items, expected {items}")
        per_item_us.append(elapsed / 1e3 / count)
    return {
        "items": items,
        "runs": runs,
        "median_us_per_item": statistics.median(per_item_us),
        "min_us_per_item": min(per_item_us),
        "max_us_per_item": max(per_item_us),
    }


def load_average() -> float:
    """The 1-min load average: other work on the machine skews everything; recorded, not judged."""
    return os.getloadavg()[0]


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_child(command: list[str], out: Path, timeout: float,
              env: Mapping[str, str] | None = None) -> ChildResult:
    """Run one measurement child that writes its figures as JSON to ``out``; its environment
    is ``env`` (default: this process's)."""
    out.unlink(missing_ok=True)
    # A session of its own, so that on a hang the child and any process it started (workers,
    # a helper) can be ended together; on every ordinary exit they are reaped by the child.
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=None if env is None else dict(env),
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return None, f"timed out after {timeout:.0f} s\n{tail(stderr)}"
    if process.returncode != 0 or not out.exists():
        return None, f"exit status {process.returncode}\n{tail(stderr or stdout)}"
    return json.loads(out.read_text()), None


def wool_status(module: str = "wool") -> str | None:
    """None when ``import module`` succeeds here, else why not."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        return str(error)
    except Exception as error:  # a broken install is reported as a skip, not raised
        return f"{type(error).__name__}: {error}"
    return None


@contextmanager
def private_runtime(prefix: str, env: Mapping[str, str], make: Iterable[str] = (),
                    on_disk: Iterable[str] = ()) -> Iterator[Path]:
    """A fresh directory under /dev/shm (else /tmp), removed on exit, with ``env`` pointing into
    it meanwhile.

    ``env`` maps a variable to a path relative to the directory (``"."`` for the directory
    itself); the directories in ``make`` are created first. Its path is short: it holds
    AF_UNIX sockets. The variables named in ``on_disk`` point into a second fresh directory
    under /tmp instead, removed on exit too. The variables are restored on exit.

    Each framework's files go where they go by default: anywool's runtime directory is on
    /dev/shm (``/dev/shm/anywool-<uid>``), wool's lock and notification files in ``TMPDIR``
    (``/tmp``, a disk here); wool's shared memory is on /dev/shm whatever is set.
    """
    base = next((d for d in ("/dev/shm", "/tmp") if os.path.isdir(d)), None)
    runtime = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    on_disk = set(on_disk)
    disk = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) if on_disk else None
    saved = {name: os.environ.get(name) for name in env}
    try:
        for name, relative in env.items():
            where = disk if name in on_disk and disk is not None else runtime
            if relative in make:
                (where / relative).mkdir(exist_ok=True)
            os.environ[name] = str(where / relative)
        yield runtime
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
        if disk is not None:
            shutil.rmtree(disk, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def measure_plan(
    plan: list[tuple[str, str]], repeat: int, run_one: Callable[[str, str], ChildResult]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Every (framework, backend) of ``plan``, ``repeat`` times; (samples, failures) by key.

    Repeats go round the whole plan, so that a burst of other load on the machine does not land
    on one framework's figures only. A pair that fails once is dropped from later rounds.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    samples: dict[str, list[dict[str, Any]]] = {}
    failures: dict[str, str] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        bar = progress.add_task("measuring", total=repeat * len(plan))
        for round_ in range(repeat):
            for framework, backend in plan:
                key = f"{framework}-{backend}"
                progress.update(bar, description=f"measuring {key} ({round_ + 1}/{repeat})")
                if key not in failures:
                    result, failure = run_one(framework, backend)
                    if result is not None:
                        samples.setdefault(key, []).append(result)
                    else:
                        failures[key] = failure or "unknown failure"
                        samples.pop(key, None)
                progress.advance(bar)
    return samples, failures


def combine(
    results: list[dict[str, Any]], *, loadavg: Callable[[list[float]], Any], spread: bool
) -> dict[str, Any]:
    """One pair's repeats as one run: the median of each numeric figure over the repeats.

    ``loadavg`` turns the repeats' load averages into the run's; with ``spread`` the run also
    holds ``[min, max]`` of every figure.
    """
    first = results[0]
    combined: dict[str, Any] = {
        key: first[key] for key in ("framework", "backend", "version", "watchdog") if key in first
    }
    combined["loadavg"] = loadavg([r["loadavg"] for r in results])
    combined["repeats"] = results
    combined["results"] = {}
    if spread:
        combined["spread"] = {}
    for section, figures in first["results"].items():
        combined["results"][section] = {}
        if spread:
            combined["spread"][section] = {}
        for name, value in figures.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            values = [r["results"][section][name] for r in results]
            combined["results"][section][name] = statistics.median(values)
            if spread:
                combined["spread"][section][name] = [min(values), max(values)]
    return combined


def wool_note(wool_error: str | None, failures: Mapping[str, str]) -> str | None:
    """The line printed under the tables about wool, None when it was measured."""
    if wool_error is not None:
        return f"wool not importable: skipped ({wool_error})"
    if "wool-asyncio" in failures:
        return "wool failed: skipped (see above)"
    return None


def run_all(
    backend: str,
    repeat: int,
    *,
    wool_module: str,
    runtime_prefix: str,
    runtime_env: Mapping[str, str],
    runtime_make: Iterable[str] = (),
    runtime_on_disk: Iterable[str] = (),
    run_one: Callable[[str, str, Path], ChildResult],
    combine_runs: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, str], str | None]:
    """The parent's whole measuring: (backends, runs by key, failures by key, wool note).

    anywool on every backend of ``--backend``, then wool on asyncio when ``wool_module``
    imports; each child by ``run_one(framework, backend, runtime directory)``, inside a private
    runtime directory; failures are printed to stderr.
    """
    backends = ["asyncio", "trio"] if backend == "both" else [backend]
    wool_error = wool_status(wool_module)
    plan = [("anywool", b) for b in backends]
    if wool_error is None:
        plan.append(("wool", "asyncio"))
    with private_runtime(runtime_prefix, runtime_env, runtime_make, runtime_on_disk) as runtime:
        samples, failures = measure_plan(
            plan, repeat, lambda framework, backend: run_one(framework, backend, runtime)
        )
    runs = {key: combine_runs(results) for key, results in samples.items()}
    for key, failure in failures.items():
        print(f"{key} failed: {failure}", file=sys.stderr)
    return backends, runs, failures, wool_note(wool_error, failures)


def exit_status(failures: Mapping[str, str]) -> int:
    """1 when an anywool run failed (a failed wool run is only reported), else 0."""
    return 1 if any(k.startswith("anywool-") for k in failures) else 0


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def console() -> Any:
    from rich.console import Console

    return Console(width=max(120, Console().width))


def columns(runs: Mapping[str, Any], backends: list[str]) -> tuple[list[str], list[str]]:
    """(run keys in table order, the anywool keys that get a ratio to wool)."""
    keys = [k for k in [f"anywool-{b}" for b in backends] + ["wool-asyncio"] if k in runs]
    ratio_keys = [k for k in keys if k.startswith("anywool-")] if "wool-asyncio" in runs else []
    return keys, ratio_keys


def comparison_table(
    title: str, keys: list[str], ratio_keys: list[str], leading: Iterable[str] = ("measure",),
    versus: str = "wool",
) -> Any:
    """A table with the ``leading`` columns, one per run and one ``<backend>÷<versus>`` per
    ratio."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name in leading:
        table.add_column(name, no_wrap=True)
    for key in keys:
        table.add_column(key.replace("-", " "), justify="right", no_wrap=True)
    for key in ratio_keys:
        table.add_column(f"{key.split('-')[1]}÷{versus}", justify="right", no_wrap=True)
    return table


def machine_line(versions: Iterable[str], loads: str) -> str:
    """CPUs, Python, system; the versions measured; then ``loads`` (the load average note)."""
    return (
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} "
        f"{platform.machine()}; " + ", ".join(versions) + f"; {loads}"
    )


def write_json(
    path: str,
    settings: dict[str, Any],
    runs: dict[str, dict[str, Any]],
    failures: dict[str, str],
    note: str | None,
) -> None:
    document = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": settings,
        "runs": runs,
        "failures": failures,
        "wool": "measured" if "wool-asyncio" in runs else (note or "skipped"),
    }
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
