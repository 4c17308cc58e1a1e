"""A worker that stops answering (issue 24, item 4): another process's worker that does not
take a cancellation in time is left out of a proxy's choice, and chosen again once it answers;
never given up while it is announced. Real workers, both backends."""

from __future__ import annotations

import os

import anyio
import pytest

from anywool import routine
from anywool.discovery.local import LocalDiscovery
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._pool import WorkerPool
from anywool.testing import suspended

from ..helpers import Signal, wait_until
from .routines import whoami

pytestmark = pytest.mark.anyio


@routine
async def hold_saying_pid(port: int) -> None:
    """Tell the test its worker's pid once it runs, then wait until cancelled."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(str(os.getpid()).encode())
    await anyio.sleep_forever()


async def test_an_unresponsive_worker_is_left_out_until_it_answers(namespace: str) -> None:
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher, \
                LocalWorker() as first, LocalWorker() as second, Signal() as signal:
            workers = {first.pid, second.pid}
            for worker in (first, second):
                await publisher.publish("worker-added", worker.metadata)
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum=2,
                                  lazy=False, cancel_grace=0.5) as pool:
                call = anyio.CancelScope()

                async def holding() -> None:
                    with call:
                        await hold_saying_pid(signal.port)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(holding)
                    stuck = int(await signal.started())
                    (healthy,) = workers - {stuck}
                    with suspended(stuck):
                        # Cancelled, the call's worker does not take it within cancel_grace:
                        # the caller moves on, and the worker is left out.
                        call.cancel()
                        await wait_until(lambda: {m.pid for m in pool.proxy.workers}
                                         == {healthy}, "the stopped worker to be left out")
                        # Every call now goes to the healthy worker; none waits.
                        with anyio.fail_after(10):
                            assert {await whoami() for _ in range(10)} == {healthy}
                # Continued: it answers a new connection, and is chosen again.
                await wait_until(lambda: {m.pid for m in pool.proxy.workers} == workers,
                                 "the worker to be chosen again", timeout=20)
                assert {await whoami() for _ in range(8)} == workers
