"""Measure whole jobs as users run them: every call of a job started at once, 2 workers.

    .venv/bin/python benchmarks/workloads.py [--backend asyncio|trio|both] [--repeat R]
                                             [--jobs hash,heavy_tail,...] [--quick]
                                             [--cancel-samples N] [--json PATH]

Side by side, each peer/backend pair in a fresh child process (this script, re-invoked), the
pairs interleaved over ``--repeat`` rounds (default 3), medians reported. Each peer with its
defaults and 2 workers:

* ``anywool`` (asyncio, trio): ``async with anywool.WorkerPool(spawn=2)``, nothing else set. A
  CPU-bound job runs in the *routine* form: an ``@anywool.routine`` whose body calls the plain
  function; and, when ``anywool.run_sync`` exists, also in the *run_sync* form:
  ``await anywool.run_sync(fn, *args)`` (same pool, right after the routine form);
* ``to_process`` (asyncio, trio): ``anyio.to_process.run_sync(fn, *args,
  limiter=anyio.CapacityLimiter(2))``;
* ``trio_parallel`` (trio only; skipped with a note when it does not import):
  ``run_sync(fn, *args, limiter=trio.CapacityLimiter(2))`` of its own
  ``trio_parallel.open_worker_context()``, so that its workers start and stop in the child.
* ``stdlib`` (the ``items`` job only, in an asyncio child whose loop waits in a thread):
  ``ProcessPoolExecutor(2).map(fn, items, chunksize=STDLIB_CHUNKSIZE)`` and
  ``multiprocessing.Pool(2).imap(fn, items, chunksize=STDLIB_CHUNKSIZE)``.

The functions and routines are in ``workload_jobs.py``, imported by reference by every worker.
Before the jobs, each form is warmed up: rounds of two concurrent calls that each sleep 50 ms in
the worker (``time.sleep``), until two distinct worker pids have answered (both workers started,
connected and holding ``workload_jobs``). The jobs, in this order; each of 1, 2, 4 and 5 is one
task group starting every call at once, timed from before the first call is started until the
group has the last result:

1. ``hash``: one call per regular file (no symlinks) under the standard library's directory
   (``os.path.dirname(os.__file__)``; a sorted walk that skips ``site-packages`` and
   ``__pycache__``): read the file, ``zlib.compress`` it, ``hashlib.sha256`` the compressed
   bytes. Sizes span 0 bytes to tens of MB, so calls are very uneven. Every digest is checked,
   untimed, against the digests the parent computed itself before measuring; the mismatches are
   reported (they should be 0).
2. ``heavy_tail``: 2 000 calls of ``spin(n)``, a pure-Python loop of ``n`` rounds of integer
   arithmetic, ``n`` drawn from a Pareto distribution (alpha 1.16, ``random.Random(20)``) and
   scaled so that all calls together take about 4 s of CPU on one core.
3. ``items``: many small items of ``small(x)``, about 7 µs of pure Python each. *calls*:
   20 000 separate calls, 256 in flight (256 tasks, each a call at a time), for every form
   but the standard library's; *map*: 100 000 items through the form's map, the results
   collected in order (anywool: ``anywool.map`` of the plain function in the run_sync column,
   of the ``small_routine`` routine in the routine column; the stdlib pools' map and imap).
   Wall, CPU of every process and of the caller, items/s; every result checked, untimed.
   Ratio rows: calls' items/s and CPU ÷ to_process's (and trio_parallel's); map's items/s ÷
   the better of the two stdlib pools'.
4. ``await`` (anywool routine only; "-" for the peers, which run one plain function per process
   at a time): 4 000 calls of a routine awaiting ``anyio.sleep(0.05)``.
5. ``mixed`` (anywool routine only): 2 000 calls started in order; even ``i`` awaits
   ``anyio.sleep(0.02)``, odd ``i`` spins about 2 ms of CPU: about 1.02 s at best on 2
   workers (the spins ÷ 2, plus one sleep).
6. ``payload``: sequential round trips echoing one ``bytes`` value of 1 KiB, 64 KiB, 1 MiB and
   16 MiB (anywool: the ``echo_bytes`` routine, and ``run_sync`` of the plain echo when it
   exists; the peers: the plain echo): 3 warm-up round trips, then ``max(12, min(300, 48 MiB /
   size))`` timed ones per size (300, 300, 48, 12); the median in ms, and GB/s counting both
   directions (``2 * size / median``). Every echo is compared with what was sent, untimed.
7. ``cancel``: how long a cancelled call of a long CPU-bound function holds its caller. The call
   is awaited in ``anyio.move_on_after(0.5)``; the figure is from that deadline until the
   caller runs again. Variants: the pure-Python loop, ``time.sleep``, and a regular expression
   that backtracks catastrophically in one C call holding the GIL (``re.fullmatch(r"(a+)+$",
   "a" * L + "b")``, ``L`` chosen by the parent so that it would run at least as long as the
   others). anywool as a routine (and by ``run_sync`` when it exists), to_process with
   ``cancellable=True``, trio_parallel with ``kill_on_cancel=True``. Then, still in the same
   pool: one trivial call (did it succeed, how long did it take), and rounds of two concurrent
   50 ms calls until two distinct pids answer: the time from the caller resuming until both
   workers answer again. Each of these three steps is bounded by ``anyio.fail_after(60)``; a
   timeout or an error fails that figure only.

For jobs 1, 2, 4 and 5: the wall time; the CPU time (user + system) of the calling process and of every
live process under it (workers, their helpers; ``_harness.cpu_seconds()``, read before the pool
stops), and of the caller alone; each call returns its pid and the CPU seconds spent in the
function (``time.process_time()`` deltas), from which come the busy CPU per worker (max, min,
and max ÷ mean as the imbalance), the calls per worker (max, min) and a bound no schedule on 2
workers can beat: max(all busy CPU ÷ 2, the longest call).

The functions would run 30 s (the regular expression at least that), the length the issue's
target names. Every peer stops them, so none keeps its worker busy for that long: anywool
interrupts the loop and the sleep on the worker and ends a worker held in C after its
``cancel_grace``; to_process and trio_parallel kill theirs. If one did not, its next sample
would wait for the function to end, which ``anyio.fail_after(60)`` bounds. Each child takes one
sample per variant (``--cancel-samples``), so that the default ``--repeat 3`` gives the median
of three; each anywool form is measured in the same child, so ``run_sync`` adds its own cancel
samples to the anywool children.

The parent, not each child, calibrates the CPU work once (the fastest of 5 runs of ``spin(1
000 000)``, and the regular expression at two lengths), so that every peer and repeat runs the
same work; each child also times ``spin`` itself and records it (``child_ns_per_iteration``).

Tables: one per job family, with a column per peer, backend and anywool form, and ratio rows:
each anywool column's figure ÷ to_process's on the same backend, and ÷ trio_parallel's on trio.
A line about the machine. ``--json PATH``: every figure of every repeat, the settings (counts,
file sizes, calibration) and the machine (``_harness.write_json``).

``--quick`` (a smoke test): about 200 files (every k-th of the walk), 200 heavy-tail calls of 1 s of
CPU in all, 400 awaits, 200 mixed calls, payloads up to 1 MiB (at most 100 round trips each),
and only the loop variant of cancel, which would run 3 s.

Measurement only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import _harness

HERE = Path(__file__).resolve().parent
WORKERS = 2
CHILD_TIMEOUT = 600.0  # seconds for one child run before it is killed (failure path only)
JOB_TIMEOUT = 180.0  # seconds for one job of one form before it is given up (a failed figure)

JOBS = ("hash", "heavy_tail", "items", "await", "mixed", "payload", "cancel")
AWAITING = ("await", "mixed")  # anywool routines only
PEERS = ("anywool", "to_process", "trio_parallel", "stdlib")
BACKENDS_OF = {
    "anywool": ("asyncio", "trio"),
    "to_process": ("asyncio", "trio"),
    "trio_parallel": ("trio",),
    "stdlib": ("asyncio",),  # its pools are synchronous: the event loop only waits for them
}
#: The peers that run some jobs only (the others are "-" in their columns).
ONLY = {"stdlib": ("items",)}
OPTIONAL = {"trio_parallel": "trio_parallel"}
DISTRIBUTION = {"anywool": "anywool", "to_process": "anyio", "trio_parallel": "trio-parallel",
                "stdlib": "python"}

# Calibration (parent)
CALIBRATION_N = 1_000_000
CALIBRATION_RUNS = 5
REGEX_PROBES = (20, 22)

# Job sizes: (full, quick)
HASH_FILES_QUICK = 200
HEAVY_TAIL = {"calls": (2_000, 200), "cpu_s": (4.0, 1.0)}
PARETO_ALPHA = 1.16
PARETO_SEED = 20
ITEMS_CALLS = (20_000, 2_000)  # separate calls of small(i), ITEMS_IN_FLIGHT at a time
ITEMS_IN_FLIGHT = 256
ITEMS_MAP = (100_000, 10_000)  # items of small(i) through a map
#: The stdlib pools' chunksize: the best of 100, 1 000 and 12 500 (Pool.map's own default for
#: 100 000 items on 2 workers) measured here for 100 000 items of small().
STDLIB_CHUNKSIZE = 12_500
AWAIT_CALLS = (4_000, 400)
AWAIT_SLEEP = 0.05
MIXED_CALLS = (2_000, 200)
MIXED_SLEEP = 0.02
MIXED_SPIN_S = 0.002
KIB, MIB = 1 << 10, 1 << 20
PAYLOAD_SIZES = ((KIB, 64 * KIB, MIB, 16 * MIB), (KIB, 64 * KIB, MIB))
PAYLOAD_WARMUP = 3
CANCEL_VARIANTS = (("loop", "sleep", "regex"), ("loop",))
CANCEL_SECONDS = (30.0, 3.0)
CANCEL_AFTER = 0.5
CANCEL_BOUND = 60.0
WARM_SLEEP = 0.05
WARM_ROUNDS = 40


def _payload_reps(size: int, quick: bool) -> int:
    if quick:
        return max(5, min(100, (8 * MIB) // size))
    return max(12, min(300, (48 * MIB) // size))


def _size_label(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def _size_key(size: int) -> str:
    return _size_label(size).replace(" ", "")


# ---------------------------------------------------------------------------------------------
# The peers (in a child process, under one event loop)
# ---------------------------------------------------------------------------------------------


@dataclass
class Form:
    """One way of running the plain functions of ``workload_jobs`` on a peer's workers."""

    #: ``run(fn, *args)``: run the plain function ``fn`` on a worker, return its result.
    run: Callable[..., Awaitable[Any]]
    #: the same, as the peer cancels a running call (kill, or the routine's own cancellation).
    cancellable: Callable[..., Awaitable[Any]]
    #: whether the awaiting jobs apply (anywool's routine form).
    awaits: bool = False
    #: ``map(fn, items)``: run the plain function ``fn`` on every item, return the results in
    #: order (``None``: the peer has no such thing; its items are separate calls).
    map: Callable[[Callable[..., Any], list[Any]], Awaitable[list[Any]]] | None = None
    #: whether the items job makes separate calls too (the standard library's pools: no,
    #: their map is what they are measured for).
    calls: bool = True


@asynccontextmanager
async def _anywool() -> AsyncIterator[dict[str, Form]]:
    import workload_jobs as jobs

    import anywool

    routine_of = {
        jobs.hash_file: jobs.hash_file_routine,
        jobs.spin: jobs.spin_routine,
        jobs.echo_bytes_sync: jobs.echo_bytes,
        jobs.sleep_sync: jobs.sleep_routine,
        jobs.backtrack: jobs.backtrack_routine,
        jobs.pid: jobs.pid_routine,
    }

    def via_routine(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return routine_of[fn](*args)

    def mapper(routines: bool) -> Callable[..., Awaitable[list[Any]]] | None:
        if not hasattr(anywool, "map"):
            return None

        async def run_map(fn: Callable[..., Any], items: list[Any]) -> list[Any]:
            async with anywool.map(routine_of[fn] if routines else fn, items) as results:
                return [result async for result in results]

        return run_map

    routine_of[jobs.small] = jobs.small_routine
    async with anywool.WorkerPool(spawn=WORKERS):
        forms = {"routine": Form(via_routine, via_routine, awaits=True, map=mapper(True))}
        if hasattr(anywool, "run_sync"):
            run_sync = anywool.run_sync
            forms["run_sync"] = Form(run_sync, run_sync, map=mapper(False))
        yield forms


@asynccontextmanager
async def _to_process() -> AsyncIterator[dict[str, Form]]:
    # No pool object: the workers are the event loop's, started on demand and killed when the
    # loop ends; the limiter bounds how many are used at once.
    import anyio
    from anyio import to_process

    limiter = anyio.CapacityLimiter(WORKERS)

    def run(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return to_process.run_sync(fn, *args, limiter=limiter)

    def cancellable(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return to_process.run_sync(fn, *args, cancellable=True, limiter=limiter)

    yield {"sync": Form(run, cancellable)}


@asynccontextmanager
async def _trio_parallel() -> AsyncIterator[dict[str, Form]]:
    import trio
    import trio_parallel

    limiter = trio.CapacityLimiter(WORKERS)
    # A context of its own, so that its workers start here and stop on exit.
    async with trio_parallel.open_worker_context() as context:

        def run(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
            return context.run_sync(fn, *args, limiter=limiter)

        def cancellable(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
            return context.run_sync(fn, *args, kill_on_cancel=True, limiter=limiter)

        yield {"sync": Form(run, cancellable)}


@asynccontextmanager
async def _stdlib() -> AsyncIterator[dict[str, Form]]:
    # The standard library's process pools, with WORKERS processes each and a good chunksize:
    # their map blocks, so it runs in a thread (the loop has nothing else to do meanwhile).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import anyio.to_thread

    with ProcessPoolExecutor(WORKERS) as executor, multiprocessing.Pool(WORKERS) as pool:

        def on_executor(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
            return anyio.to_thread.run_sync(lambda: executor.submit(fn, *args).result())

        def on_pool(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
            return anyio.to_thread.run_sync(pool.apply, fn, args)

        async def executor_map(fn: Callable[..., Any], items: list[Any]) -> list[Any]:
            return await anyio.to_thread.run_sync(
                lambda: list(executor.map(fn, items, chunksize=STDLIB_CHUNKSIZE)))

        async def pool_imap(fn: Callable[..., Any], items: list[Any]) -> list[Any]:
            return await anyio.to_thread.run_sync(
                lambda: list(pool.imap(fn, items, chunksize=STDLIB_CHUNKSIZE)))

        yield {"ProcessPoolExecutor.map": Form(on_executor, on_executor, map=executor_map,
                                               calls=False),
               "Pool.imap": Form(on_pool, on_pool, map=pool_imap, calls=False)}


OPEN = {"anywool": _anywool, "to_process": _to_process, "trio_parallel": _trio_parallel,
        "stdlib": _stdlib}

# ---------------------------------------------------------------------------------------------
# Measurements (children)
# ---------------------------------------------------------------------------------------------


async def _until_both_answer(form: Form) -> int:
    """Rounds of :data:`WORKERS` concurrent 50 ms calls until that many distinct pids answered
    (at most :data:`WARM_ROUNDS`); the rounds it took."""
    import anyio
    import workload_jobs as jobs

    pids: set[int] = set()

    async def one() -> None:
        pids.add(await form.run(jobs.sleep_sync, WARM_SLEEP))

    for rounds in range(1, WARM_ROUNDS + 1):
        async with anyio.create_task_group() as tg:
            for _ in range(WORKERS):
                tg.start_soon(one)
        if len(pids) >= WORKERS:
            return rounds
    raise RuntimeError(f"only {len(pids)} distinct worker(s) answered in {WARM_ROUNDS} rounds")


async def _all_at_once(call: Callable[..., Awaitable[Any]],
                       arguments: list[tuple[Any, ...]]) -> tuple[list[Any], dict[str, float]]:
    """Every ``call(*args)`` started at once from one task group: (results in order, times)."""
    import anyio

    results: list[Any] = [None] * len(arguments)

    async def one(i: int, args: tuple[Any, ...]) -> None:
        results[i] = await call(*args)

    cpu_before = _harness.cpu_seconds()
    caller_before = time.process_time()
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, args in enumerate(arguments):
            tg.start_soon(one, i, args)
    wall = time.perf_counter() - start
    caller = time.process_time() - caller_before
    cpu = _harness.cpu_seconds() - cpu_before
    return results, {"calls": len(arguments), "wall_s": wall, "cpu_s": cpu, "caller_cpu_s": caller}


def _spread(pid_cpu: list[tuple[int, float]], wall: float, *, busy: bool = True) -> dict[str, Any]:
    """How the calls (pid, CPU seconds in the function) were spread over the workers."""
    per_worker: dict[int, dict[str, float]] = {}
    for pid, cpu in pid_cpu:
        entry = per_worker.setdefault(pid, {"calls": 0, "busy_s": 0.0})
        entry["calls"] += 1
        entry["busy_s"] += cpu
    # A worker that got no call at all counts as an idle one (to_process may replace workers).
    slots = max(WORKERS, len(per_worker))
    calls = sorted(e["calls"] for e in per_worker.values()) + [0] * (slots - len(per_worker))
    figures: dict[str, Any] = {
        "workers_used": len(per_worker),
        "calls_max": max(calls),
        "calls_min": min(calls),
        "per_worker": {str(pid): entry for pid, entry in sorted(per_worker.items())},
    }
    if busy:
        loads = sorted(e["busy_s"] for e in per_worker.values()) + [0.0] * (slots - len(per_worker))
        total = sum(loads)
        mean = total / slots
        longest = max((cpu for _, cpu in pid_cpu), default=0.0)
        bound = max(total / WORKERS, longest)
        figures.update({
            "busy_total_s": total,
            "busy_max_s": max(loads),
            "busy_min_s": min(loads),
            "imbalance": max(loads) / mean if mean > 0 else None,
            "longest_call_s": longest,
            "bound_s": bound,
            "wall_over_bound": wall / bound if bound > 0 else None,
        })
    return figures


async def _job_hash(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    import workload_jobs as jobs

    files = plan["hash"]["files"]
    results, figures = await _all_at_once(
        lambda path: form.run(jobs.hash_file, path), [(path,) for path, _, _ in files]
    )
    mismatches = sum(1 for (_, size, digest), (read, got, _, _) in zip(files, results)
                     if got != digest or read != size)
    figures["bytes"] = sum(read for read, _, _, _ in results)
    figures["mismatches"] = mismatches
    figures.update(_spread([(pid, cpu) for _, _, pid, cpu in results], figures["wall_s"]))
    return figures


async def _job_heavy_tail(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    import workload_jobs as jobs

    results, figures = await _all_at_once(
        lambda n: form.run(jobs.spin, n), [(n,) for n in plan["heavy_tail"]["n"]]
    )
    figures.update(_spread(results, figures["wall_s"]))
    return figures


async def _job_items(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    """Many small items: separate calls, ITEMS_IN_FLIGHT at a time (for a form that has no
    map), and all of them through the form's map (for one that has)."""
    import anyio
    import workload_jobs as jobs

    figures: dict[str, Any] = {}
    expected = plan["items"]["expected"]

    async def timed(run: Callable[[], Awaitable[list[Any]]], key: str) -> None:
        cpu_before = _harness.cpu_seconds()
        caller_before = time.process_time()
        start = time.perf_counter()
        results = await run()
        wall = time.perf_counter() - start
        figures.update({
            f"{key}_wall_s": wall,
            f"{key}_cpu_s": _harness.cpu_seconds() - cpu_before,
            f"{key}_caller_cpu_s": time.process_time() - caller_before,
            f"{key}_items_per_s": len(results) / wall,
            f"{key}_mismatches": sum(r != expected[i % len(expected)]
                                     for i, r in enumerate(results)),
        })

    if form.calls:
        count = plan["items"]["calls"]

        async def calls() -> list[Any]:
            results: list[Any] = [None] * count
            indices = iter(range(count))

            async def caller() -> None:  # one of ITEMS_IN_FLIGHT, each a call at a time
                for i in indices:
                    results[i] = await form.run(jobs.small, i % len(expected))

            async with anyio.create_task_group() as tg:
                for _ in range(ITEMS_IN_FLIGHT):
                    tg.start_soon(caller)
            return results

        await timed(calls, "calls")
    if form.map is not None:
        items = [i % len(expected) for i in range(plan["items"]["map"])]
        await timed(lambda: form.map(jobs.small, items), "map")  # type: ignore[misc]
    return figures


async def _job_await(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    import workload_jobs as jobs

    calls = plan["await"]["calls"]
    results, figures = await _all_at_once(jobs.nap, [(AWAIT_SLEEP,)] * calls)
    figures.update(_spread(results, figures["wall_s"], busy=False))
    return figures


async def _job_mixed(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    import workload_jobs as jobs

    n = plan["mixed"]["spin_n"]

    def call(i: int) -> Awaitable[Any]:
        return jobs.nap(MIXED_SLEEP) if i % 2 == 0 else jobs.spin_routine(n)

    results, figures = await _all_at_once(call, [(i,) for i in range(plan["mixed"]["calls"])])
    # Busy CPU from the spins alone; calls per worker (and per_worker) count every call.
    figures.update(_spread([r for i, r in enumerate(results) if i % 2 == 1], figures["wall_s"]))
    figures.update(_spread(results, figures["wall_s"], busy=False))
    return figures


async def _job_payload(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    import workload_jobs as jobs

    figures: dict[str, Any] = {"mismatches": 0}
    clock = time.perf_counter_ns
    for size, reps in plan["payload"]["sizes"]:
        data = random.Random(size).randbytes(size)
        for _ in range(PAYLOAD_WARMUP):
            await form.run(jobs.echo_bytes_sync, data)
        samples: list[int] = []
        for _ in range(reps):
            start = clock()
            echoed = await form.run(jobs.echo_bytes_sync, data)
            samples.append(clock() - start)
            if echoed != data:
                figures["mismatches"] += 1
        median_s = statistics.median(samples) / 1e9
        key = _size_key(size)
        figures[f"{key}_reps"] = reps
        figures[f"{key}_ms"] = median_s * 1e3
        figures[f"{key}_min_ms"] = min(samples) / 1e6
        figures[f"{key}_GBps"] = 2 * size / median_s / 1e9
    return figures


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, BaseExceptionGroup):
        text += " [" + "; ".join(_error(e) for e in exc.exceptions) + "]"
    return text[:500]


async def _cancel_sample(form: Form, call: tuple[Any, ...]) -> dict[str, Any]:
    """One cancelled call, then one trivial call, then until both workers answer again."""
    import anyio
    import workload_jobs as jobs

    sample: dict[str, Any] = {"held_s": None, "after_ok": False, "after_ms": None, "back_s": None}
    resumed: float | None = None
    try:
        with anyio.fail_after(CANCEL_BOUND):
            with anyio.move_on_after(CANCEL_AFTER) as scope:
                await form.cancellable(*call)
            resumed = anyio.current_time()
        if scope.cancelled_caught:
            sample["held_s"] = resumed - scope.deadline
        else:
            sample["held_error"] = "the call returned before the deadline"
    except Exception as exc:  # a timeout or the peer's own error: this figure fails
        sample["held_error"] = _error(exc)
    if resumed is None:
        resumed = anyio.current_time()
    try:
        with anyio.fail_after(CANCEL_BOUND):
            start = anyio.current_time()
            await form.run(jobs.pid)
            sample["after_ms"] = (anyio.current_time() - start) * 1e3
            sample["after_ok"] = True
    except Exception as exc:
        sample["after_error"] = _error(exc)
    try:
        with anyio.fail_after(CANCEL_BOUND):
            await _until_both_answer(form)
            sample["back_s"] = anyio.current_time() - resumed
    except Exception as exc:
        sample["back_error"] = _error(exc)
    return sample


async def _job_cancel(form: Form, plan: dict[str, Any]) -> dict[str, Any]:
    import workload_jobs as jobs

    settings = plan["cancel"]
    calls = {
        "loop": (jobs.spin, settings["loop_n"]),
        "sleep": (jobs.sleep_sync, settings["seconds"]),
        "regex": (jobs.backtrack, settings.get("regex_length", 0)),
    }
    figures: dict[str, Any] = {}
    for variant in settings["variants"]:
        samples = [await _cancel_sample(form, calls[variant])
                   for _ in range(plan["cancel_samples"])]
        # A figure is the median of the samples, None (failed) if any sample failed it.
        for figure in ("held_s", "after_ms", "back_s"):
            values = [s[figure] for s in samples]
            figures[f"{variant}_{figure}"] = (None if None in values
                                              else statistics.median(values))
        figures[f"{variant}_after_ok"] = sum(1 for s in samples if s["after_ok"])
        figures[f"{variant}_samples"] = len(samples)
        figures[f"{variant}_each"] = samples
    return figures


MEASURE = {"hash": _job_hash, "heavy_tail": _job_heavy_tail, "items": _job_items,
           "await": _job_await,
           "mixed": _job_mixed, "payload": _job_payload, "cancel": _job_cancel}


async def _measure(peer: str, plan: dict[str, Any],
                   jobs: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    import anyio

    results: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    start = time.perf_counter()
    async with OPEN[peer]() as forms:
        for name, form in forms.items():
            rounds = await _until_both_answer(form)
            results[f"warmup/{name}"] = {"seconds": time.perf_counter() - start, "rounds": rounds}
            start = time.perf_counter()
        for job in jobs:
            for name, form in forms.items():
                if job in AWAITING and not form.awaits or job not in ONLY.get(peer, JOBS):
                    continue
                section = f"{job}/{name}"
                try:
                    with anyio.fail_after(JOB_TIMEOUT):
                        results[section] = await MEASURE[job](form, plan)
                except Exception as exc:  # this job fails; the others are still measured
                    results[section] = {"error": _error(exc)}
                    errors.append(f"{section}: {_error(exc)}")
        names = list(forms)
    return results, errors, names


def _version_of(distribution: str) -> str:
    if distribution == "python":
        import platform

        return platform.python_version()
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


def _spin_ns_per_iteration(runs: int) -> float:
    import workload_jobs as jobs

    return min(jobs.spin(CALIBRATION_N)[1] for _ in range(runs)) / CALIBRATION_N * 1e9


def _child(peer: str, backend: str, plan_path: str, jobs: list[str], out: str) -> int:
    import anyio

    sys.path.insert(0, str(HERE))
    plan = json.loads(Path(plan_path).read_text())
    loadavg = _harness.load_average()
    child_ns = _spin_ns_per_iteration(3)
    results, errors, forms = anyio.run(_measure, peer, plan, jobs, backend=backend)
    info = {"framework": peer, "backend": backend, "version": _version_of(DISTRIBUTION[peer]),
            "loadavg": loadavg, "forms": forms, "child_ns_per_iteration": child_ns,
            "errors": errors, "results": results}
    Path(out).write_text(json.dumps(info))
    return 0


# ---------------------------------------------------------------------------------------------
# Preparation (the parent, before measuring): the files, the calibration, every call's size
# ---------------------------------------------------------------------------------------------


def _stdlib_files() -> list[str]:
    root = os.path.dirname(os.__file__)
    found: list[str] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories
                                   if d not in ("site-packages", "__pycache__"))
        for name in sorted(names):
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
    return found


def _reference_digest(path: str) -> tuple[int, str]:
    with open(path, "rb") as file:
        data = file.read()
    return len(data), hashlib.sha256(zlib.compress(data)).hexdigest()


def _regex_length(target_s: float) -> dict[str, Any]:
    """The shortest length of :func:`workload_jobs.backtrack` predicted to run ``target_s``,
    from timing two shorter ones (each character about doubles the time)."""
    import workload_jobs as jobs

    times = {}
    for length in REGEX_PROBES:
        start = time.process_time()
        jobs.backtrack(length)
        times[length] = time.process_time() - start
    low, high = REGEX_PROBES
    growth = max(1.5, (times[high] / times[low]) ** (1 / (high - low)))
    extra = max(0, math.ceil(math.log(target_s / times[high]) / math.log(growth)))
    return {"regex_length": high + extra, "regex_probe_s": {str(k): v for k, v in times.items()},
            "regex_growth_per_char": growth,
            "regex_predicted_s": times[high] * growth ** extra}


def _prepare(jobs: list[str], quick: bool, cancel_samples: int) -> tuple[dict, dict]:
    """(the plan every child reads, the settings reported)."""
    sys.path.insert(0, str(HERE))
    q = 1 if quick else 0
    plan: dict[str, Any] = {"quick": quick, "cancel_samples": cancel_samples}
    settings: dict[str, Any] = {"quick": quick, "jobs": jobs, "workers": WORKERS}
    ns = math.nan  # ns per iteration of spin, for the jobs that spin
    if any(j in jobs for j in ("heavy_tail", "mixed", "cancel")):
        ns = _spin_ns_per_iteration(CALIBRATION_RUNS)
        settings["calibration"] = {"spin_n": CALIBRATION_N, "runs": CALIBRATION_RUNS,
                                   "ns_per_iteration": ns, "where": "parent, fastest run"}
    if "hash" in jobs:
        files = _stdlib_files()
        walked = len(files)
        if quick:
            files = files[::math.ceil(walked / HASH_FILES_QUICK)]
        entries = [(path, *_reference_digest(path)) for path in files]
        sizes = [size for _, size, _ in entries]
        plan["hash"] = {"files": entries}
        settings["hash"] = {"root": os.path.dirname(os.__file__), "files_walked": walked,
                            "files": len(entries), "bytes": sum(sizes), "largest": max(sizes),
                            "smallest": min(sizes), "median_size": statistics.median(sizes)}
    if "heavy_tail" in jobs:
        calls, cpu_s = HEAVY_TAIL["calls"][q], HEAVY_TAIL["cpu_s"][q]
        rng = random.Random(PARETO_SEED)
        weights = [rng.paretovariate(PARETO_ALPHA) for _ in range(calls)]
        scale = cpu_s / (ns / 1e9) / sum(weights)
        ns_list = [max(1, round(w * scale)) for w in weights]
        plan["heavy_tail"] = {"n": ns_list}
        settings["heavy_tail"] = {
            "calls": calls, "target_cpu_s": cpu_s, "pareto_alpha": PARETO_ALPHA,
            "seed": PARETO_SEED, "total_n": sum(ns_list), "min_n": min(ns_list),
            "max_n": max(ns_list), "median_n": statistics.median(ns_list),
            "largest_share": max(ns_list) / sum(ns_list),
        }
    if "items" in jobs:
        import workload_jobs

        expected = [workload_jobs.small(i) for i in range(1000)]
        plan["items"] = {"calls": ITEMS_CALLS[q], "map": ITEMS_MAP[q], "expected": expected}
        start = time.perf_counter()
        for i in range(10_000):
            workload_jobs.small(i)
        settings["items"] = {"calls": ITEMS_CALLS[q], "in_flight": ITEMS_IN_FLIGHT,
                             "map": ITEMS_MAP[q], "stdlib_chunksize": STDLIB_CHUNKSIZE,
                             "small_us": (time.perf_counter() - start) / 10_000 * 1e6}
    if "await" in jobs:
        plan["await"] = {"calls": AWAIT_CALLS[q]}
        settings["await"] = {"calls": AWAIT_CALLS[q], "sleep_s": AWAIT_SLEEP}
    if "mixed" in jobs:
        spin_n = round(MIXED_SPIN_S / (ns / 1e9))
        plan["mixed"] = {"calls": MIXED_CALLS[q], "spin_n": spin_n}
        settings["mixed"] = {"calls": MIXED_CALLS[q], "sleep_s": MIXED_SLEEP,
                             "spin_s": MIXED_SPIN_S, "spin_n": spin_n,
                             "ideal_s": (MIXED_CALLS[q] // 2) * MIXED_SPIN_S / WORKERS
                             + MIXED_SLEEP}
    if "payload" in jobs:
        sizes = [(size, _payload_reps(size, quick)) for size in PAYLOAD_SIZES[q]]
        plan["payload"] = {"sizes": sizes}
        settings["payload"] = {"sizes": [s for s, _ in sizes], "reps": [r for _, r in sizes],
                               "warmup": PAYLOAD_WARMUP}
    if "cancel" in jobs:
        seconds = CANCEL_SECONDS[q]
        cancel: dict[str, Any] = {"variants": list(CANCEL_VARIANTS[q]), "seconds": seconds,
                                  "loop_n": round(seconds / (ns / 1e9))}
        if "regex" in cancel["variants"]:
            cancel.update(_regex_length(seconds))
        plan["cancel"] = cancel
        settings["cancel"] = {**cancel, "deadline_s": CANCEL_AFTER, "bound_s": CANCEL_BOUND,
                              "samples_per_child": cancel_samples}
    return plan, settings


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


def _run_child(peer: str, backend: str, plan_path: Path, jobs: list[str],
               scratch: Path) -> _harness.ChildResult:
    out = scratch / f"{peer}-{backend}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()),
        "--child", peer,
        "--backend", backend,
        "--plan", str(plan_path),
        "--jobs", ",".join(jobs),
        "--out", str(out),
    ]
    return _harness.run_child(command, out, CHILD_TIMEOUT)


def _combine(results: list[dict[str, Any]], spread: bool) -> dict[str, Any]:
    """:func:`_harness.combine` over the repeats, keeping only the figures that are numbers in
    every repeat (a figure that failed in one repeat has no median); every repeat stays whole
    under ``repeats``."""
    sections = {s for r in results for s in r["results"]}
    views = []
    for r in results:
        view = copy.copy(r)
        view["results"] = {}
        for section in sections:
            keep = {}
            for name, value in r["results"].get(section, {}).items():
                numeric = [o["results"].get(section, {}).get(name) for o in results]
                if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numeric):
                    keep[name] = value
            view["results"][section] = keep
        views.append(view)
    combined = _harness.combine(views, loadavg=statistics.median, spread=spread)
    combined["repeats"] = results
    combined["forms"] = results[0]["forms"]
    return combined


NA, FAILED = object(), object()
Column = tuple[str, str, str]  # (run key, form, header)


def _columns(runs: dict[str, dict[str, Any]], backends: list[str]) -> list[Column]:
    """One column per peer, backend and form: anywool's forms side by side."""
    columns = []
    for backend in backends:
        for peer in PEERS:
            key = f"{peer}-{backend}"
            if key not in runs:
                continue
            for form in runs[key]["forms"]:
                header = (f"{peer}\n{form}\n{backend}" if peer in ("anywool", "stdlib")
                          else f"{peer}\n{backend}")
                columns.append((key, form, header))
    return columns


def _value(runs: dict[str, dict[str, Any]], key: str, form: str, job: str, field: str) -> Any:
    """A figure; :data:`NA` when the job was not run for that column, :data:`FAILED` when it
    was but the figure has no median (it failed in a repeat, or the job did)."""
    section = runs[key]["results"].get(f"{job}/{form}")
    if section is None:
        return NA
    value = section.get(field)
    if value is not None:
        return value
    # Measured in no repeat, and the job did not fail: a figure this form does not have.
    repeats = [r["results"].get(f"{job}/{form}", {}) for r in runs[key]["repeats"]]
    if not any(field in r or "error" in r for r in repeats):
        return NA
    return FAILED


def _cell(value: Any, fmt: str) -> str:
    if value is NA:
        return "-"
    if value is FAILED:
        return "failed"
    return fmt.format(value)


class _Sheet:
    """One rich table: a measure and a unit column, then one column per peer, backend, form."""

    def __init__(self, title: str, runs: dict[str, dict[str, Any]],
                 columns: list[Column]) -> None:
        from rich.table import Table

        self.runs = runs
        self.columns = columns
        self.table = Table(title=title, title_justify="left")
        self.table.add_column("measure", no_wrap=True)
        for _, _, header in columns:
            self.table.add_column(header, justify="right", no_wrap=True)

    def cells(self, label: str, cells: list[str], end: bool = False) -> None:
        self.table.add_row(label, *cells, end_section=end)

    def figure(self, label: str, job: str, field: str, fmt: str, end: bool = False) -> None:
        self.cells(label, [_cell(_value(self.runs, key, form, job, field), fmt)
                           for key, form, _ in self.columns], end)

    def ratios(self, rows: list[tuple[str, str, str]]) -> None:
        """For each base peer present, one row per (label, job, field): every anywool column's
        figure ÷ the base's on the same backend."""
        bases = [b for b in ("to_process", "trio_parallel")
                 if any(key.startswith(f"{b}-") for key, _, _ in self.columns)]
        if self.table.rows and bases:
            self.table.rows[-1].end_section = True
        for base in bases:
            for n, (label, job, field) in enumerate(rows):
                cells = []
                for key, form, _ in self.columns:
                    peer, backend = key.split("-")
                    base_key = f"{base}-{backend}"
                    if peer != "anywool" or base_key not in self.runs:
                        cells.append("")
                        continue
                    value = _value(self.runs, key, form, job, field)
                    base_value = _value(self.runs, base_key, "sync", job, field)
                    if value in (NA, FAILED) or base_value in (NA, FAILED) or not base_value:
                        cells.append("-")
                    else:
                        cells.append(f"{value / base_value:.2f}")
                self.cells(f"{label} ÷ {base}", cells,
                           end=n == len(rows) - 1 and base != bases[-1])


def _spread_rows(sheet: _Sheet, job: str, prefix: str = "", busy: bool = True) -> None:
    """The rows of one all-at-once job."""
    sheet.figure(f"{prefix}wall, s", job, "wall_s", "{:.3f}")
    if busy:
        sheet.figure(f"{prefix}bound, s", job, "bound_s", "{:.3f}")
        sheet.figure(f"{prefix}wall ÷ bound", job, "wall_over_bound", "{:.2f}")
    sheet.figure(f"{prefix}CPU all processes, s", job, "cpu_s", "{:.3f}")
    sheet.figure(f"{prefix}CPU caller, s", job, "caller_cpu_s", "{:.3f}")
    if busy:
        sheet.figure(f"{prefix}busy/worker max, s", job, "busy_max_s", "{:.3f}")
        sheet.figure(f"{prefix}busy/worker min, s", job, "busy_min_s", "{:.3f}")
        sheet.figure(f"{prefix}imbalance", job, "imbalance", "{:.2f}")
    sheet.figure(f"{prefix}calls/worker max", job, "calls_max", "{:,.0f}")
    sheet.figure(f"{prefix}calls/worker min", job, "calls_min", "{:,.0f}")


def _cancel_ok(runs: dict[str, dict[str, Any]], key: str, form: str, variant: str) -> str:
    """The trivial calls that succeeded right after a cancel, over every repeat: "ok/samples"."""
    sections = [r["results"].get(f"cancel/{form}") for r in runs[key]["repeats"]]
    if not any(s is not None for s in sections):
        return "-"
    ok = sum(s.get(f"{variant}_after_ok", 0) for s in sections if s)
    samples = sum(s.get(f"{variant}_samples", 0) for s in sections if s)
    return f"{ok}/{samples}" if samples else "failed"


def _print_tables(runs: dict[str, dict[str, Any]], backends: list[str], jobs: list[str],
                  settings: dict[str, Any], notes: list[str]) -> None:
    console = _harness.console()
    columns = _columns(runs, backends)
    if "hash" in jobs:
        h = settings["hash"]
        sheet = _Sheet(f"hash: {h['files']:,} stdlib files ({h['bytes'] / 1e6:.1f} MB, "
                       f"{h['smallest']:,} B to {h['largest'] / 1e6:.1f} MB), read + zlib + "
                       f"sha256, a call per file, all at once, {WORKERS} workers", runs, columns)
        _spread_rows(sheet, "hash")
        sheet.figure("digest mismatches", "hash", "mismatches", "{:.0f}")
        sheet.ratios([("wall", "hash", "wall_s"), ("CPU", "hash", "cpu_s")])
        console.print(sheet.table)
    if "heavy_tail" in jobs:
        t = settings["heavy_tail"]
        sheet = _Sheet(f"heavy_tail: {t['calls']:,} pure-Python loops, Pareto-sized (alpha "
                       f"{PARETO_ALPHA}), ~{t['target_cpu_s']:.0f} s of CPU in all (the largest "
                       f"call {t['largest_share']:.1%}), all at once, {WORKERS} workers",
                       runs, columns)
        _spread_rows(sheet, "heavy_tail")
        sheet.ratios([("wall", "heavy_tail", "wall_s"), ("CPU", "heavy_tail", "cpu_s")])
        console.print(sheet.table)
    if "items" in jobs:
        i = settings["items"]
        sheet = _Sheet(f"items: small(x), ~{i['small_us']:.0f} µs of pure Python each: "
                       f"{i['calls']:,} separate calls, {i['in_flight']} in flight; "
                       f"{i['map']:,} items through a map (stdlib: chunksize "
                       f"{i['stdlib_chunksize']:,}); {WORKERS} workers", runs, columns)
        for key, label in (("calls", "calls"), ("map", "map")):
            sheet.figure(f"{label}: wall, s", "items", f"{key}_wall_s", "{:.3f}")
            sheet.figure(f"{label}: items/s", "items", f"{key}_items_per_s", "{:,.0f}")
            sheet.figure(f"{label}: CPU all processes, s", "items", f"{key}_cpu_s", "{:.3f}")
            sheet.figure(f"{label}: CPU caller, s", "items", f"{key}_caller_cpu_s", "{:.3f}")
            sheet.figure(f"{label}: mismatches", "items", f"{key}_mismatches", "{:.0f}",
                         end=key == "calls")
        sheet.ratios([("calls: items/s", "items", "calls_items_per_s"),
                      ("calls: CPU", "items", "calls_cpu_s")])
        best = max((_value(runs, "stdlib-asyncio", form, "items", "map_items_per_s")
                    for form in runs.get("stdlib-asyncio", {}).get("forms", ())),
                   key=lambda v: v if isinstance(v, float) else -1.0, default=NA)
        if isinstance(best, float):
            cells = []
            for key, form, _ in columns:
                value = _value(runs, key, form, "items", "map_items_per_s")
                cells.append(f"{value / best:.2f}" if key.startswith("anywool-")
                             and isinstance(value, float) else "")
            sheet.table.rows[-1].end_section = True
            sheet.cells("map: items/s ÷ best stdlib", cells)
        console.print(sheet.table)
    if "await" in jobs or "mixed" in jobs:
        what = ", ".join(f"{job} {settings[job]['calls']:,} calls" for job in AWAITING
                         if job in jobs)
        sheet = _Sheet(f"await / mixed ({what}), all at once, {WORKERS} workers; anywool "
                       f"routines only", runs, columns)
        if "await" in jobs:
            _spread_rows(sheet, "await", "await: ", busy=False)
            sheet.table.rows[-1].end_section = True
        if "mixed" in jobs:
            ideal = f"{settings['mixed']['ideal_s']:.3f}"
            sheet.cells("mixed: ideal, s", ["-" if _value(runs, key, form, "mixed", "wall_s") is NA
                                            else ideal for key, form, _ in columns])
            _spread_rows(sheet, "mixed", "mixed: ")
        console.print(sheet.table)
    if "payload" in jobs:
        p = settings["payload"]
        reps = ", ".join(f"{_size_label(s)} × {r}" for s, r in zip(p["sizes"], p["reps"]))
        sheet = _Sheet(f"payload: echo of one bytes value, sequential round trips after "
                       f"{PAYLOAD_WARMUP} warm-up ones ({reps})", runs, columns)
        for size in p["sizes"]:
            key, label = _size_key(size), _size_label(size)
            sheet.figure(f"{label} round trip, ms", "payload", f"{key}_ms", "{:.3f}")
            sheet.figure(f"{label} both ways, GB/s", "payload", f"{key}_GBps", "{:.3f}")
        sheet.figure("echo mismatches", "payload", "mismatches", "{:.0f}")
        sheet.ratios([(_size_label(s), "payload", f"{_size_key(s)}_ms") for s in p["sizes"]])
        console.print(sheet.table)
    if "cancel" in jobs:
        c = settings["cancel"]
        sheet = _Sheet(f"cancel: a call that would run {c['seconds']:.0f} s, cancelled after "
                       f"{CANCEL_AFTER} s; {c['samples_per_child']} sample(s) per variant per "
                       f"child", runs, columns)
        for n, variant in enumerate(c["variants"]):
            sheet.figure(f"{variant}: held, s", "cancel", f"{variant}_held_s", "{:.3f}")
            sheet.cells(f"{variant}: next call ok",
                        [_cancel_ok(runs, key, form, variant) for key, form, _ in columns])
            sheet.figure(f"{variant}: next call, ms", "cancel", f"{variant}_after_ms", "{:.1f}")
            sheet.figure(f"{variant}: both back, s", "cancel", f"{variant}_back_s", "{:.3f}",
                         end=n < len(c["variants"]) - 1)
        sheet.ratios([(f"{v} held", "cancel", f"{v}_held_s") for v in c["variants"]])
        console.print(sheet.table)
    console.print(
        "Ratio rows: an anywool column's figure ÷ that of to_process (or trio_parallel) on the "
        "same backend; < 1: anywool took less. \"-\": not applicable; \"failed\": the figure "
        "failed in a repeat (a timeout or an error: see the notes)."
    )
    if any(job in jobs for job in ("hash", "heavy_tail", "mixed")):
        console.print(
            "bound: max(busy CPU of all calls ÷ 2, the longest call), which no schedule on 2 "
            "workers beats. busy: the CPU seconds the calls spent in the function, summed per "
            "worker; imbalance: the busiest worker's ÷ the mean over the workers. CPU all "
            "processes: the caller and every live process under it (workers, their helpers)."
        )
    if "mixed" in jobs:
        console.print("mixed: ideal = the spins' CPU ÷ 2 + one 20 ms sleep; its busy, bound "
                      "and imbalance count the spins only, its calls/worker every call.")
    if "cancel" in jobs:
        c = settings["cancel"]
        regex = (f" regex: \"a\" × {c['regex_length']} + \"b\", predicted to run "
                 f"{c['regex_predicted_s']:.0f} s." if "regex_length" in c else "")
        console.print(
            "cancel: held = from the deadline until the caller runs again; next call = one "
            "trivial call right after (ok: succeeded, over all repeats); both back = from the "
            "caller resuming until two concurrent 50 ms calls are answered by two distinct pids "
            "(a worker that is still running the cancelled function, or must be replaced, "
            f"delays it). to_process and trio_parallel kill the worker.{regex}"
        )
    if "calibration" in settings:
        console.print(f"Calibration (parent): spin costs "
                      f"{settings['calibration']['ns_per_iteration']:.1f} ns per iteration.")
    for note in notes:
        console.print(note)
    loads = ", ".join(f"{k} {v['loadavg']:.2f}" for k, v in runs.items())
    versions = sorted({f"{DISTRIBUTION[v['framework']]} {v['version']}" for v in runs.values()})
    if "trio" in backends:
        versions.append(f"trio {_version_of('trio')}")
    console.print(_harness.machine_line(versions, f"median 1-min load average at start: {loads}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds over every peer and backend, interleaved; the median of "
                             "each figure is reported (default 3)")
    parser.add_argument("--jobs", default=",".join(JOBS),
                        help=f"comma-separated jobs to run, in this order (default: "
                             f"{','.join(JOBS)})")
    parser.add_argument("--quick", action="store_true",
                        help="much smaller jobs, for a smoke test")
    parser.add_argument("--cancel-samples", type=int, default=1,
                        help="cancel samples per variant in each child (default 1; the median "
                             "over --repeat rounds gives the reported figure)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to PATH as JSON")
    parser.add_argument("--child", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown or not jobs:
        parser.error(f"--jobs: unknown job(s) {', '.join(unknown) or '(none given)'}; "
                     f"choose from {', '.join(JOBS)}")
    jobs = [j for j in JOBS if j in jobs]
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.cancel_samples < 1:
        parser.error("--cancel-samples must be at least 1")

    if args.child:
        return _child(args.child, args.backend, args.plan, jobs, args.out)

    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    notes: list[str] = []
    missing: dict[str, str] = {}
    for peer, module in OPTIONAL.items():
        if any(b in backends for b in BACKENDS_OF[peer]):
            error = _harness.wool_status(module)
            if error is not None:
                missing[peer] = error
                notes.append(f"{peer} not importable: skipped ({error})")
    # The peers run plain functions only: with only the awaiting jobs, only anywool is measured.
    sync_jobs = [j for j in jobs if j not in AWAITING]
    pairs = [(peer, backend) for backend in backends for peer in PEERS
             if backend in BACKENDS_OF[peer] and peer not in missing
             and (peer == "anywool" or sync_jobs)
             and any(job in ONLY.get(peer, JOBS) for job in jobs)]
    print("preparing: the stdlib files' reference digests, the calibration ...", file=sys.stderr)
    plan, settings = _prepare(jobs, args.quick, args.cancel_samples)
    import anywool

    settings.update({
        "repeat": args.repeat,
        "backends": backends,
        "anywool_run_sync": hasattr(anywool, "run_sync"),
        "trio_parallel": missing.get("trio_parallel", "measured"),
        "child_timeout_s": CHILD_TIMEOUT,
        "job_timeout_s": JOB_TIMEOUT,
        "warmup": f"rounds of {WORKERS} concurrent time.sleep({WARM_SLEEP}) calls until "
                  f"{WORKERS} distinct pids answered",
    })
    with _harness.private_runtime("aww-", {"ANYWOOL_RUNTIME_DIR": "."}) as runtime:
        plan_path = runtime / "plan.json"
        plan_path.write_text(json.dumps(plan))
        samples, failures = _harness.measure_plan(
            pairs, args.repeat,
            lambda peer, backend: _run_child(peer, backend, plan_path, jobs, runtime),
        )
    runs = {key: _combine(results, spread=args.repeat > 1) for key, results in samples.items()}
    for key, failure in failures.items():
        print(f"{key} failed: {failure}", file=sys.stderr)
        notes.append(f"{key} failed: skipped (see above)")
    for key, run in runs.items():
        for index, repeat in enumerate(run["repeats"], 1):
            for error in repeat.get("errors", []):
                notes.append(f"{key}, repeat {index}: {error}")
            for section, figures in repeat["results"].items():
                for name, value in figures.items():
                    if name.endswith("_each"):
                        for sample in value:
                            for what, text in sample.items():
                                if what.endswith("_error"):
                                    notes.append(f"{key}, repeat {index}, {section} "
                                                 f"{name[:-5]} {what[:-6]}: {text}")
    settings["notes"] = notes
    if runs:
        _print_tables(runs, backends, jobs, settings, notes)
    else:
        for note in notes:
            print(note)
    if args.json:
        _harness.write_json(args.json, settings, runs, failures, "not a peer of workloads.py")
    return _harness.exit_status(failures)


if __name__ == "__main__":
    sys.exit(main())
