"""Borrow a namespace another process owns: run calls on its workers, spawn none, own nothing.

    python examples/durable_owner.py --namespace jobs &     # the owner, kept running
    python examples/borrower.py [--namespace jobs] [--calls 8] [--backend asyncio|trio]

The pool here is given a bare subscriber, ``LocalDiscovery.Subscriber(namespace)``: it follows
the workers the owner published and dispatches to them, and it creates nothing, so when it
exits the owner and its workers go on serving the next borrower. It prints one line per call
and a summary:

    borrower pid 52400 (spawned 0 workers): 8 calls on the workers of 'jobs'
    call 0: 1229 primes below 10000, worker pid 52313
    call 1: 2262 primes below 20000, worker pid 52314
    ...
    8 calls answered by worker pids 52313 52314

Exit status 0; 1 (with a line on stderr) when no live process owns the namespace. The routine
lives in this script's ``__main__``: it travels to the owner's workers by value, so they need
not be able to import this file. ``--backend trio`` needs ``pip install 'anywool[trio]'``.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import anyio

import anywool


@anywool.routine
async def count_primes(limit: int) -> tuple[int, int]:
    """(number of primes below ``limit``, pid of the worker that counted them)."""
    sieve = bytearray([1]) * limit
    sieve[:2] = b"\0\0"
    for n in range(2, int(limit**0.5) + 1):
        if sieve[n]:
            sieve[n * n::n] = bytes(len(range(n * n, limit, n)))
    return sum(sieve), os.getpid()


def limit_of(index: int) -> int:
    return 10_000 * (index + 1)


async def borrow(namespace: str, calls: int) -> None:
    # A bare subscriber: the pool borrows the namespace. lazy=False makes entry wait for a
    # first worker, and raise DiscoveryNamespaceNotFound at once when nobody owns it.
    subscriber = anywool.LocalDiscovery.Subscriber(namespace)
    async with anywool.WorkerPool(discovery=subscriber, lazy=False) as pool:
        print(f"borrower pid {os.getpid()} (spawned {len(pool.workers)} workers): "
              f"{calls} calls on the workers of {namespace!r}", flush=True)
        results: dict[int, tuple[int, int]] = {}

        async def one(index: int) -> None:
            results[index] = await count_primes(limit_of(index))

        async with anyio.create_task_group() as tg:  # every call at once
            for index in range(calls):
                tg.start_soon(one, index)
    for index, (primes, pid) in sorted(results.items()):
        print(f"call {index}: {primes} primes below {limit_of(index)}, worker pid {pid}")
    pids = sorted({pid for _, pid in results.values()})
    print(f"{len(results)} calls answered by worker pids {' '.join(map(str, pids))}",
          flush=True)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Borrow a namespace another process owns and run calls on its workers.")
    parser.add_argument("--namespace", "-n", default="jobs", help="the namespace to borrow")
    parser.add_argument("--calls", type=int, default=8, help="calls to make, all at once")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio",
                        help="event loop of this process (the owner's workers keep theirs)")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_arguments()
    status = 0
    try:
        anyio.run(partial(borrow, arguments.namespace, arguments.calls),
                  backend=arguments.backend)
    except* anywool.DiscoveryNamespaceNotFound:
        print(f"no live process owns {arguments.namespace!r}: start "
              "examples/durable_owner.py first", file=sys.stderr)
        status = 1
    except* KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)
