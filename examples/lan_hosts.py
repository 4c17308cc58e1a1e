"""Workers on one host, found over the LAN (mDNS) and called from another.

On the host that runs the workers (it announces them with LanDiscovery and serves them over
TCP until Ctrl-C or SIGTERM):

    python examples/lan_hosts.py serve [--namespace jobs] [--workers 2] [--secret-file PATH]

On any other host of the same LAN (or on the same one, from another terminal):

    python examples/lan_hosts.py call [--namespace jobs] [--calls 6] [--secret-file PATH]

Both sides need the same secret, at least 16 bytes, in a file only its owner may read (default
``~/.anywool-secret``; ``python -c 'import secrets; print(secrets.token_hex(32))'`` makes one,
then ``chmod 600`` it). It authenticates every TCP connection both ways and signs the mDNS
records, so a caller only ever dispatches to workers that hold it. ``--interface ADDR``
(repeatable) restricts mDNS to some of this host's addresses. mDNS uses UDP port 5353 and the
workers listen on ports the system picks: a firewall between the hosts must let both through.

``serve`` prints ``serving 'jobs' on HOST: 2 workers``, one ``worker ADDRESS pid PID`` line each
(an address other hosts can reach), ``ready``; on a signal ``stopping (SIGTERM)`` and, once its
workers are withdrawn from the LAN and stopped, ``stopped``, exit status 0. ``call`` waits until
it has found ``--quorum`` workers (default 1; at most ``--timeout`` seconds), makes its calls all
at once, prints where each ran, and exits 0. Needs ``pip install 'anywool[lan]'``
(``'anywool[lan,trio]'`` for ``--backend trio``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import sys
from functools import partial
from pathlib import Path

import anyio

import anywool


@anywool.routine
async def where(n: int) -> tuple[int, str, str, int]:
    """(n squared, host name, address and pid of the worker that computed it)."""
    worker = anywool.current_worker()
    return n * n, socket.gethostname(), worker.address, worker.pid


async def serve(namespace: str, workers: int, secret: str,
                interfaces: list[str] | None) -> None:
    # A spawning pool listening on TCP: host="0.0.0.0" binds every interface and announces each
    # worker at a routable address of this host. The LanDiscovery signs the records with the
    # pool's secret. Nothing is owned on the LAN: several hosts may serve the same namespace,
    # and callers use the workers of all of them.
    discovery = anywool.LanDiscovery(namespace, interfaces=interfaces)
    async with anywool.WorkerPool(spawn=workers, discovery=discovery, host="0.0.0.0",
                                  secret=secret, lazy=False, quorum=workers) as pool:
        print(f"serving {namespace!r} on {socket.gethostname()}: {workers} workers")
        for worker in pool.workers:
            print(f"worker {worker.address} pid {worker.pid}")
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            print("ready", flush=True)
            async for signum in signals:
                print(f"stopping ({signal.Signals(signum).name})", flush=True)
                break
    # The pool said goodbye for its workers over mDNS (callers drop them within 2 s), let their
    # calls finish, then stopped them.
    print("stopped", flush=True)


async def call(namespace: str, calls: int, secret: str, interfaces: list[str] | None,
               quorum: int, timeout: float) -> None:
    # A pool that spawns nothing: it follows the namespace's records (verified with the
    # secret) and dispatches to the workers they announce, over authenticated TCP.
    subscriber = anywool.LanDiscovery.Subscriber(namespace, interfaces=interfaces)
    async with anywool.WorkerPool(discovery=subscriber, secret=secret, lazy=False,
                                  quorum=quorum, quorum_timeout=timeout):
        results: dict[int, tuple[int, str, str, int]] = {}

        async def one(n: int) -> None:
            results[n] = await where(n)

        async with anyio.create_task_group() as tg:
            for n in range(calls):
                tg.start_soon(one, n)
    for n, (square, host, address, pid) in sorted(results.items()):
        print(f"{n}² = {square} on host {host}, worker {address} pid {pid}")
    workers = sorted({(address, pid) for _, _, address, pid in results.values()})
    print(f"{len(results)} calls answered by {len(workers)} workers: "
          + ", ".join(f"{address} pid {pid}" for address, pid in workers), flush=True)


def read_secret(path: Path) -> str:
    """The secret in ``path``, surrounding whitespace stripped; exits when others may read it."""
    try:
        mode = path.stat().st_mode
        secret = path.read_text().strip()
    except OSError as error:
        sys.exit(f"cannot read the secret: {error}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        sys.exit(f"{path} is accessible to others: chmod 600 {path}")
    if len(secret.encode()) < 16:
        sys.exit(f"the secret in {path} is shorter than 16 bytes")
    return secret


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Serve workers on the LAN (serve), or find and call them (call).")
    parser.add_argument("role", choices=["serve", "call"])
    parser.add_argument("--namespace", "-n", default="jobs")
    parser.add_argument("--secret-file", type=Path,
                        default=Path(os.path.expanduser("~/.anywool-secret")))
    parser.add_argument("--interface", action="append", dest="interfaces", metavar="ADDR",
                        help="an IP address of this host to use for mDNS (repeatable; "
                             "default: every interface)")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--workers", type=int, default=2, help="serve: worker processes")
    parser.add_argument("--calls", type=int, default=6, help="call: calls to make")
    parser.add_argument("--quorum", type=int, default=1,
                        help="call: workers to find before calling")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="call: seconds to wait for them")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_arguments()
    secret = read_secret(arguments.secret_file)
    if arguments.role == "serve":
        job = partial(serve, arguments.namespace, arguments.workers, secret,
                      arguments.interfaces)
    else:
        job = partial(call, arguments.namespace, arguments.calls, secret, arguments.interfaces,
                      arguments.quorum, arguments.timeout)
    status = 0
    try:
        anyio.run(job, backend=arguments.backend)
    except* ImportError as group:  # zeroconf missing: the message names anywool[lan]
        print(group.exceptions[0], file=sys.stderr)
        status = 1
    except* (TimeoutError, anywool.NoWorkersAvailable, anywool.AuthenticationError) as group:
        print(f"no worker to call: {group.exceptions[0]}", file=sys.stderr)
        status = 1
    except* KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)
