"""Bounded teardown of LocalDiscovery owners and publishers while another process holds the
registry lock: the exit honours ``teardown_timeout`` and the caller's cancellation, and still
removes what it owns.

Exit times are asserted only as generous upper bounds: the suite runs in parallel on small
machines.
"""

from __future__ import annotations

import logging
import os

import anyio
import pytest

from anywool import LocalDiscovery

from ..helpers import follow, take, worker
from .children import Child, hold_registry_lock, stop

pytestmark = pytest.mark.anyio

# A generous bound on an exit that should take about half a second.
SLACK = 2.0


async def _hold_registry_lock(owner: LocalDiscovery, holders: list[Child]) -> None:
    holders.append(await hold_registry_lock(owner))


def _logged_timeouts(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records
            if record.exc_info is not None and isinstance(record.exc_info[1], TimeoutError)]


def _leases(owner: LocalDiscovery) -> list[str]:
    assert owner.path is not None
    return [name for name in os.listdir(owner.path) if name.startswith("lease-")]


# -- publishers ---------------------------------------------------------------------------------


async def test_contended_publisher_exit_gives_up_after_teardown_timeout_and_the_reaper_drops_its_worker(
        namespace, caplog):
    caplog.set_level(logging.WARNING, logger="anywool.discovery.local")
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace, reap_interval=0.05) as owner, \
                anyio.create_task_group() as tg:
            events = await follow(tg, owner.subscriber)
            metadata = worker()
            publisher = LocalDiscovery.Publisher(namespace, lock_timeout=None,
                                                 teardown_timeout=0.5)
            holders: list[Child] = []
            try:
                async with publisher:
                    await publisher.publish("worker-added", metadata)
                    assert await take(events, 1) == [("worker-added", metadata.uid)]
                    await _hold_registry_lock(owner, holders)
                    started = anyio.current_time()
                elapsed = anyio.current_time() - started
                assert elapsed < SLACK
                assert _logged_timeouts(caplog)
                assert _leases(owner) == []  # the lease is released all the same
            finally:
                await stop(holders)
            # Not withdrawn, but its lease is gone: the reaper drops it once the lock is free.
            assert await take(events, 1) == [("worker-dropped", metadata.uid)]
            tg.cancel_scope.cancel()


async def test_contended_publisher_exit_ends_at_the_callers_deadline(namespace):
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner:
            publisher = LocalDiscovery.Publisher(namespace, lock_timeout=None)
            holders: list[Child] = []
            try:
                with anyio.move_on_after(None) as scope:
                    async with publisher:
                        await publisher.publish("worker-added", worker())
                        await _hold_registry_lock(owner, holders)
                        started = anyio.current_time()
                        scope.deadline = started + 0.5
                elapsed = anyio.current_time() - started
                assert scope.cancelled_caught
                assert elapsed < SLACK
                assert _leases(owner) == []
            finally:
                await stop(holders)


async def test_uncontended_publisher_exit_withdraws_its_workers_at_once(namespace, caplog):
    with anyio.fail_after(10):
        # No reap within the test: only the publisher's own withdrawal can drop the worker.
        async with LocalDiscovery(namespace, reap_interval=3600) as owner, \
                anyio.create_task_group() as tg:
            events = await follow(tg, owner.subscriber)
            metadata = worker()
            async with owner.publisher as publisher:
                await publisher.publish("worker-added", metadata)
                assert await take(events, 1) == [("worker-added", metadata.uid)]
            assert await take(events, 1) == [("worker-dropped", metadata.uid)]
            assert _leases(owner) == []
            assert _logged_timeouts(caplog) == []
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("in_memory", [True, False], ids=["in-loop", "thread"])
async def test_publisher_exit_in_a_cancelled_scope_still_withdraws_its_workers(namespace,
                                                                              in_memory,
                                                                              monkeypatch):
    # In the loop, the exit finishes before the cancellation propagates; on the thread path
    # the graceful phase's thread never starts, and the forceful phase withdraws.
    monkeypatch.setattr("anywool._runtime_dir.in_memory", lambda: in_memory)
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace, reap_interval=3600) as owner, \
                anyio.create_task_group() as tg:
            events = await follow(tg, owner.subscriber)
            metadata = worker()
            with anyio.CancelScope() as scope:
                async with owner.publisher as publisher:
                    await publisher.publish("worker-added", metadata)
                    assert await take(events, 1) == [("worker-added", metadata.uid)]
                    scope.cancel()
            assert scope.cancelled_caught
            assert await take(events, 1) == [("worker-dropped", metadata.uid)]
            assert _leases(owner) == []
            tg.cancel_scope.cancel()


# -- owners -------------------------------------------------------------------------------------


async def test_contended_owner_exit_gives_up_after_teardown_timeout_and_removes_everything(
        namespace, runtime_dir, caplog):
    caplog.set_level(logging.WARNING, logger="anywool.discovery.local")
    with anyio.fail_after(30):
        holders: list[Child] = []
        try:
            async with LocalDiscovery(namespace, teardown_timeout=0.5) as owner:
                await _hold_registry_lock(owner, holders)
                started = anyio.current_time()
            elapsed = anyio.current_time() - started
            assert elapsed < SLACK
            assert _logged_timeouts(caplog)
            assert os.listdir(runtime_dir) == []
            async with LocalDiscovery(namespace):  # a successor claims at once
                pass
        finally:
            await stop(holders)


async def test_contended_owner_exit_ends_at_the_callers_deadline(namespace, runtime_dir):
    with anyio.fail_after(30):
        holders: list[Child] = []
        try:
            with anyio.move_on_after(None) as scope:
                async with LocalDiscovery(namespace) as owner:
                    await _hold_registry_lock(owner, holders)
                    started = anyio.current_time()
                    scope.deadline = started + 0.5
            elapsed = anyio.current_time() - started
            assert scope.cancelled_caught
            assert elapsed < SLACK
            assert os.listdir(runtime_dir) == []
        finally:
            await stop(holders)


async def test_owner_exit_in_a_cancelled_scope_still_removes_everything(namespace, runtime_dir):
    with anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with LocalDiscovery(namespace):
                scope.cancel()
        assert scope.cancelled_caught
        assert os.listdir(runtime_dir) == []
