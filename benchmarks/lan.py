"""Beyond one host: dispatch over authenticated TCP against Unix sockets, and LAN propagation.

    .venv/bin/python benchmarks/lan.py [--calls N] [--samples S] [--repeat R]

Per backend, in a fresh child interpreter (this script re-invoked), alternating backends over
``--repeat`` rounds; medians over the repeats. Measurement only: nothing is asserted.

* **Round trip by transport.** Four pools of one spawned worker each, alive together: Unix
  socket, TCP with the shared secret, TCP with mutual TLS (trustme certificates), TCP with
  both. Calls of ``echo(i)`` are interleaved pool by pool, so every transport sees the same
  machine; authentication happens once per connection, so per call the transports differ by
  what their stream costs. Median and p99 per transport, and the ratio to Unix.
* **LAN propagation.** Needs root: the child moves into a private network namespace (as the
  tests do, ``tests/netns.py``) where mDNS stays on loopback. A publisher in another process
  announces one worker at a time; the time from just before its ``publish`` until this
  process's subscription yields ``worker-added``, and from just before the withdrawal until
  ``worker-dropped``, on the system-wide monotonic clock. Median and p99.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRANSPORTS = ("unix", "tcp, secret", "tcp, mutual TLS", "tcp, TLS + secret")
WARMUP = 50

PUBLISHER = """
import sys, time, uuid, anyio, anywool
from anywool.discovery.lan import LanDiscovery

async def main():
    async with LanDiscovery.Publisher(sys.argv[1], interfaces=["127.0.0.1"],
                                      secret=sys.argv[2]) as publisher:
        print("ready", flush=True)
        for line in sys.stdin:
            metadata = anywool.WorkerMetadata(uuid.uuid4(), "10.213.0.1:9", 1, "bench")
            start = time.monotonic_ns()
            await publisher.publish("worker-added", metadata)
            print(metadata.uid, start, flush=True)
            sys.stdin.readline()
            start = time.monotonic_ns()
            await publisher.publish("worker-dropped", metadata)
            print(metadata.uid, start, flush=True)

anyio.run(main, backend=sys.argv[3])
"""


def _certificates(where: str) -> Any:
    import trustme

    from anywool import MutualTLS

    ca = trustme.CA()
    ca.cert_pem.write_to_path(os.path.join(where, "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        os.path.join(where, "cert.pem"))
    return MutualTLS(os.path.join(where, "cert.pem"), cafile=os.path.join(where, "ca.pem"))


async def _round_trips(calls: int) -> dict[str, list[int]]:
    from contextlib import AsyncExitStack

    import routines

    import anywool

    secret = secrets.token_bytes(32)
    with tempfile.TemporaryDirectory() as where:
        tls = _certificates(where)
        settings: dict[str, dict[str, Any]] = {
            "unix": {},
            "tcp, secret": {"host": "127.0.0.1", "secret": secret},
            "tcp, mutual TLS": {"host": "127.0.0.1", "tls": tls},
            "tcp, TLS + secret": {"host": "127.0.0.1", "tls": tls, "secret": secret},
        }
        samples: dict[str, list[int]] = {name: [] for name in TRANSPORTS}
        async with AsyncExitStack() as stack:
            proxies = {}
            for name in TRANSPORTS:
                pool = await stack.enter_async_context(
                    anywool.WorkerPool(spawn=1, lazy=False, **settings[name]))
                proxies[name] = pool.proxy
            clock = time.perf_counter_ns
            for i in range(WARMUP + calls):
                for name in TRANSPORTS:
                    start = clock()
                    await proxies[name].dispatch(routines.echo, (i,), {})
                    if i >= WARMUP:
                        samples[name].append(clock() - start)
        return samples


async def _propagation(backend: str, samples: int) -> dict[str, Any]:
    from tests import netns

    reason = netns.lan_unavailable()
    if reason is not None:
        return {"skipped": reason}
    import anyio

    from anywool.discovery.lan import LanDiscovery

    namespace, secret = f"bench-{uuid.uuid4().hex[:8]}", secrets.token_hex(16)
    added: list[int] = []
    dropped: list[int] = []
    process = await anyio.open_process([sys.executable, "-c", PUBLISHER, namespace, secret,
                                        backend], stderr=None)
    assert process.stdin is not None and process.stdout is not None
    from anyio.streams.text import TextReceiveStream

    lines = TextReceiveStream(process.stdout)
    buffer = ""

    async def line() -> str:
        nonlocal buffer
        while "\n" not in buffer:
            buffer += await lines.receive()
        text, buffer = buffer.split("\n", 1)
        return text

    try:
        assert await line() == "ready"
        subscriber = LanDiscovery.Subscriber(namespace, interfaces=["127.0.0.1"], secret=secret)
        events = subscriber.__aiter__()
        for _ in range(samples):
            await process.stdin.send(b"add\n")
            event = await events.__anext__()
            seen = time.monotonic_ns()
            uid, start = (await line()).split()
            assert event.type == "worker-added" and str(event.metadata.uid) == uid
            added.append(seen - int(start))
            await process.stdin.send(b"drop\n")
            event = await events.__anext__()
            seen = time.monotonic_ns()
            uid, start = (await line()).split()
            assert event.type == "worker-dropped" and str(event.metadata.uid) == uid
            dropped.append(seen - int(start))
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await process.stdin.aclose()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    return {"added": added, "dropped": dropped}


def child(backend: str, calls: int, samples: int) -> None:
    sys.path[:0] = [str(HERE), str(REPO)]
    from tests import netns

    # First of all, before any thread exists: a thread keeps the network namespace it was
    # started in, and zeroconf's must be in the private one.
    netns.enter()
    import anyio

    async def main() -> dict[str, Any]:
        return {"round_trip": await _round_trips(calls),
                "propagation": await _propagation(backend, samples)}

    print(json.dumps(anyio.run(main, backend=backend)))


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def _cell(runs: list[list[int]]) -> tuple[float, float]:
    """(median, p99) in ms: per run, then the median over runs."""
    medians = [statistics.median(r) / 1e6 for r in runs]
    p99s = [percentile([v / 1e6 for v in r], 0.99) for r in runs]
    return statistics.median(medians), statistics.median(p99s)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write every run's figures to PATH")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.calls, args.samples)
        return
    backends = ("asyncio", "trio")
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    for round_ in range(args.repeat):
        for backend in backends:
            print(f"round {round_ + 1}/{args.repeat}: {backend}", file=sys.stderr, flush=True)
            out = subprocess.run([sys.executable, __file__, "--child", backend,
                                  "--calls", str(args.calls), "--samples", str(args.samples)],
                                 check=True, stdout=subprocess.PIPE, text=True, timeout=900)
            runs[backend].append(json.loads(out.stdout))
    print(f"\nround trip by transport: {args.calls} calls each, interleaved; median (p99) ms, "
          f"÷ unix; {args.repeat} repeats")
    print(f"{'transport':<20}" + "".join(f"{b:>26}" for b in backends))
    for name in TRANSPORTS:
        cells = []
        for backend in backends:
            median, p99 = _cell([r["round_trip"][name] for r in runs[backend]])
            unix, _ = _cell([r["round_trip"]["unix"] for r in runs[backend]])
            cells.append(f"{median:.3f} ({p99:.3f}) ×{median / unix:.2f}")
        print(f"{name:<20}" + "".join(f"{c:>26}" for c in cells))
    print(f"\nLAN propagation to another process: {args.samples} samples per repeat; "
          "median (p99) ms")
    for kind in ("added", "dropped"):
        cells = []
        for backend in backends:
            found = [r["propagation"] for r in runs[backend]]
            if any("skipped" in f for f in found):
                cells.append("skipped: " + found[0].get("skipped", "?"))
                continue
            median, p99 = _cell([f[kind] for f in found])
            cells.append(f"{median:.1f} ({p99:.1f})")
        print(f"{'worker-' + kind:<20}" + "".join(f"{c:>26}" for c in cells))
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load "
          f"{os.getloadavg()[0]:.2f}")
    if args.json:
        summary: dict[str, Any] = {}
        for backend in backends:
            unix, _ = _cell([r["round_trip"]["unix"] for r in runs[backend]])
            figures: dict[str, Any] = {}
            for name in TRANSPORTS:
                median, p99 = _cell([r["round_trip"][name] for r in runs[backend]])
                figures[name] = {"median_ms": median, "p99_ms": p99, "ratio_to_unix": median / unix}
            found = [r["propagation"] for r in runs[backend]]
            propagation: dict[str, Any] = {}
            for kind in ("added", "dropped"):
                if any("skipped" in f for f in found):
                    propagation[kind] = {"skipped": found[0].get("skipped", "?")}
                else:
                    median, p99 = _cell([f[kind] for f in found])
                    propagation[kind] = {"median_ms": median, "p99_ms": p99}
            summary[backend] = {"round_trip": figures, "propagation": propagation}
        document = {"settings": {"calls": args.calls, "samples": args.samples,
                                 "repeat": args.repeat},
                    "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                "loadavg": os.getloadavg()[0]},
                    "results": summary}
        with open(args.json, "w") as out:
            json.dump(document, out, indent=2)


if __name__ == "__main__":
    main()
