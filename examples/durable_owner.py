"""Own a namespace and keep its workers up until told to stop (run borrower.py against it).

    python examples/durable_owner.py [--namespace jobs] [--workers 2] [--backend asyncio|trio]

This process claims the namespace on this host (``LocalDiscovery``: one owner per namespace),
spawns its workers and publishes them there, then waits. Other processes borrow the namespace
meanwhile (``examples/borrower.py``): their pools spawn nothing and send their calls to these
workers; they come and go, and this process keeps serving. It prints

    owner of 'jobs': pid 52310, 2 workers
    worker unix:/dev/shm/anywool-0/w-5a0f.../s pid 52313
    worker unix:/dev/shm/anywool-0/w-c4e1.../s pid 52314
    ready (Ctrl-C or SIGTERM to stop)

and on Ctrl-C (SIGINT) or SIGTERM: ``stopping (SIGTERM)``, then, once its workers have finished
the calls they were running and exited and the namespace's files are removed, ``stopped``; exit
status 0. A second owner of the same namespace is refused (exit status 1). The namespace and the
workers' sockets live in ``$ANYWOOL_RUNTIME_DIR`` (default ``/dev/shm/anywool-<uid>``): the
borrowers must see the same directory. ``--backend trio`` needs ``pip install 'anywool[trio]'``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from functools import partial

import anyio

import anywool


async def own(namespace: str, workers: int) -> None:
    # Entering the pool enters the LocalDiscovery it is given, which claims the namespace
    # (DiscoveryNamespaceInUse if another live process owns it); lazy=False makes entry wait
    # until every worker is started and connected, so "ready" means ready.
    discovery = anywool.LocalDiscovery(namespace)
    async with anywool.WorkerPool(spawn=workers, discovery=discovery, lazy=False,
                                  quorum=workers) as pool:
        print(f"owner of {namespace!r}: pid {os.getpid()}, {workers} workers")
        for worker in pool.workers:
            print(f"worker {worker.address} pid {worker.pid}")
        # Signals become events of this task while the receiver is open (instead of killing the
        # process, or raising KeyboardInterrupt somewhere): so the pool's exit below runs in
        # full, whichever signal came.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            print("ready (Ctrl-C or SIGTERM to stop)", flush=True)
            async for signum in signals:
                print(f"stopping ({signal.Signals(signum).name})", flush=True)
                break
    # The pool has withdrawn its workers, let their calls finish (shutdown_timeout), stopped
    # and reaped them, and its discovery has removed every file of the namespace: borrowers
    # that are still running see the workers dropped, and their later calls fail.
    print("stopped", flush=True)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Own a namespace and keep its workers up until Ctrl-C or SIGTERM.")
    parser.add_argument("--namespace", "-n", default="jobs", help="the namespace to own")
    parser.add_argument("--workers", "-w", type=int, default=2, help="worker processes")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio",
                        help="event loop of this process and of its workers")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_arguments()
    status = 0
    try:
        anyio.run(partial(own, arguments.namespace, arguments.workers),
                  backend=arguments.backend)
    except* anywool.DiscoveryNamespaceInUse as group:
        print(f"cannot own {arguments.namespace!r}: {group.exceptions[0]}", file=sys.stderr)
        status = 1
    except* KeyboardInterrupt:  # Ctrl-C before "ready": the pool's exit has run all the same
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)
