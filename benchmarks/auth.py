"""What authenticating a TCP worker connection costs, on loopback, under asyncio and trio.

    .venv/bin/python benchmarks/auth.py [--connections N] [--repeat R]

Per backend, in a fresh child interpreter (this script re-invoked), four listeners on
127.0.0.1: no authentication (connect only, the floor), the shared-secret handshake, mutual
TLS (trustme certificates), and TLS with the secret's handshake inside it. Each sample is one
connection, timed at the client from ``connect_tcp`` until ``authenticate_client`` returned
(the worker has then verified our proof, and we its); the connections of the four modes are
interleaved, after 20 warm-up connections of each. ``--repeat`` runs the children R times,
alternating backends, and reports the median of each figure over the repeats. Measurement
only: nothing is asserted.
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
from pathlib import Path

MODES = ("connect only", "secret (HMAC)", "mutual TLS", "TLS + secret")


def child(backend: str, connections: int) -> None:
    import anyio
    import trustme
    from anyio.abc import SocketAttribute, SocketStream

    from anywool._tls import MutualTLS
    from anywool.runtime.wire._auth import Credentials, authenticate_client, authenticate_server

    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        files = []
        for side in ("worker", "client"):
            cert = ca.issue_cert("127.0.0.1")
            paths = [Path(tmp, f"{side}-{name}.pem") for name in ("cert", "key")]
            cert.cert_chain_pems[0].write_to_path(str(paths[0]))
            cert.private_key_pem.write_to_path(str(paths[1]))
            files.append(paths)
        ca.cert_pem.write_to_path(str(Path(tmp, "ca.pem")))
        cafile = str(Path(tmp, "ca.pem"))
        worker_tls = MutualTLS(*files[0], cafile=cafile)
        client_tls = MutualTLS(*files[1], cafile=cafile)
        secret = secrets.token_bytes(32)
        creds: dict[str, tuple[Credentials, Credentials] | None] = {
            "connect only": None,
            "secret (HMAC)": (Credentials(secret), Credentials(secret)),
            "mutual TLS": (Credentials(tls=client_tls), Credentials(tls=worker_tls)),
            "TLS + secret": (Credentials(secret, client_tls), Credentials(secret, worker_tls)),
        }

        async def main() -> dict[str, list[int]]:
            samples: dict[str, list[int]] = {mode: [] for mode in MODES}
            async with anyio.create_task_group() as tg:
                ports: dict[str, int] = {}
                for mode in MODES:
                    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
                    ports[mode] = listener.extra(SocketAttribute.local_port)

                    async def handle(stream: SocketStream, mode: str = mode) -> None:
                        pair = creds[mode]
                        channel = stream if pair is None else await authenticate_server(
                            stream, pair[1], address=f"127.0.0.1:{ports[mode]}")
                        async with channel:
                            try:
                                await channel.receive()
                            except (anyio.EndOfStream, anyio.BrokenResourceError):
                                pass

                    tg.start_soon(listener.serve, handle)

                async def one(mode: str) -> int:
                    pair = creds[mode]
                    start = time.perf_counter_ns()
                    stream = await anyio.connect_tcp("127.0.0.1", ports[mode])
                    channel = stream if pair is None else await authenticate_client(
                        stream, pair[0], address=f"127.0.0.1:{ports[mode]}",
                        server_hostname="127.0.0.1")
                    elapsed = time.perf_counter_ns() - start
                    await channel.aclose()
                    return elapsed

                for _ in range(20):
                    for mode in MODES:
                        await one(mode)
                for _ in range(connections):
                    for mode in MODES:
                        samples[mode].append(await one(mode))
                tg.cancel_scope.cancel()
            return samples

        samples = anyio.run(main, backend=backend)
    print(json.dumps(samples))


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.connections)
        return
    backends = ("asyncio", "trio")
    runs: dict[str, list[dict[str, list[int]]]] = {b: [] for b in backends}
    for _ in range(args.repeat):
        for backend in backends:
            out = subprocess.run([sys.executable, __file__, "--child", backend,
                                  "--connections", str(args.connections)],
                                 check=True, capture_output=True, text=True, timeout=600)
            runs[backend].append(json.loads(out.stdout))
    print(f"{args.connections} connections per mode and repeat, {args.repeat} repeats; "
          "client-side, connect until authenticated; median (p99) over connections, median "
          "over repeats, ms")
    print(f"{'mode':<16}" + "".join(f"{b:>22}" for b in backends))
    for mode in MODES:
        cells = []
        for backend in backends:
            medians = [statistics.median(r[mode]) / 1e6 for r in runs[backend]]
            p99s = [percentile([v / 1e6 for v in r[mode]], 0.99) for r in runs[backend]]
            cells.append(f"{statistics.median(medians):.3f} ({statistics.median(p99s):.3f})")
        print(f"{mode:<16}" + "".join(f"{c:>22}" for c in cells))
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
