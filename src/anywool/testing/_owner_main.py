"""The child interpreter of :func:`anywool.testing.owner_process`: a namespace owner.

``python -m anywool.testing._owner_main NAMESPACE_JSON SPAWN BACKEND``

Owns the namespace (``async with LocalDiscovery(namespace)``), and with ``SPAWN`` > 0 also
runs a pool spawning that many workers published there. It then prints one JSON line on
stdout, ``{"pid": ..., "workers": [pids]}``, or, if owning failed with an anywool error,
``{"error": class name, "args": [...]}`` (which the parent raises again); anything else it
raises goes to stderr. It runs until its stdin reaches end of file (the parent closed it, or
died) or it receives SIGTERM or SIGINT, then exits its scopes, which removes the namespace's
files and stops its workers, and exits 0 (1 after reporting an error).

The namespace travels as JSON so that any string, NUL and lone surrogates included, survives
the command line. What this module must never do: write to stdout after that one line (nobody
reads it any more).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import anyio

from anywool.discovery import LocalDiscovery
from anywool.errors import WoolError


async def _until_told_to_stop(signals: AsyncIterator[int]) -> None:
    """Return at end of file on stdin, or at the first of ``signals``."""
    async with anyio.create_task_group() as tg:

        async def stdin_closes() -> None:
            fd = sys.stdin.fileno()
            while True:
                await anyio.wait_readable(fd)
                if not os.read(fd, 4096):  # nobody writes to it: readable means EOF
                    break
            tg.cancel_scope.cancel()

        async def signalled() -> None:
            async for _ in signals:
                break
            tg.cancel_scope.cancel()

        tg.start_soon(stdin_closes)
        tg.start_soon(signalled)


def _report(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message, default=repr) + "\n")
    sys.stdout.flush()


async def main(namespace: str, spawn: int) -> int:
    # Handled from the start: a SIGTERM that comes while it starts up is acted on once it is
    # ready, never by dying with the namespace's files left behind.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with AsyncExitStack() as stack:
            try:
                discovery = await stack.enter_async_context(LocalDiscovery(namespace))
                workers: list[int] = []
                if spawn:
                    from anywool.runtime.pool._pool import WorkerPool

                    pool = await stack.enter_async_context(
                        WorkerPool(spawn=spawn, discovery=discovery, shutdown_timeout=2.0))
                    workers = [worker.pid for worker in pool.workers]
            except WoolError as exc:
                _report({"error": type(exc).__name__, "args": list(exc.args)})
                return 1
            _report({"pid": os.getpid(), "workers": workers})
            await _until_told_to_stop(signals)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, json.loads(sys.argv[1]), int(sys.argv[2]), backend=sys.argv[3]))
