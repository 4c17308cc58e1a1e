"""The change hint: inotify wakes subscribers; polling backs it up when the hint is missing."""

from __future__ import annotations

import os

import anyio
import pytest

from anywool import LocalDiscovery
from anywool.discovery import _hub
from anywool.discovery.local import _watch

from ..helpers import follow, take, worker

pytestmark = pytest.mark.anyio


async def test_attribute_change_counts_as_a_hint(namespace, monkeypatch):
    # Some writers only touch the hint (mtime): inotify reports IN_ATTRIB, not IN_MODIFY.
    def touch(notify_fd: int, dir_fd: int) -> None:
        os.utime("notify", dir_fd=dir_fd)

    monkeypatch.setattr(_watch, "touch_hint", touch)
    with anyio.fail_after(10):  # the poll interval is 60 s: only the hint can deliver
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LocalDiscovery.Subscriber(namespace, poll_interval=60))
                assert await take(events, 1) == [("worker-added", first.uid)]
                second = worker()
                await publisher.publish("worker-added", second)
                assert await take(events, 1) == [("worker-added", second.uid)]
                tg.cancel_scope.cancel()


async def test_without_the_hint_subscribers_converge_by_polling(namespace, monkeypatch):
    monkeypatch.setattr(_watch, "inotify_simple", None)
    monkeypatch.setattr(_watch, "touch_hint", lambda notify_fd, dir_fd: None)
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LocalDiscovery.Subscriber(namespace, poll_interval=0.1))
                assert await take(events, 1) == [("worker-added", first.uid)]
                changed = worker(uid=first.uid, pid=5)
                await publisher.publish("worker-updated", changed)
                event = await events.receive()
                assert event.type == "worker-updated" and event.metadata.same_as(changed)
                tg.cancel_scope.cancel()


async def test_default_poll_interval_converges_within_a_second_or_so(namespace, monkeypatch):
    monkeypatch.setattr(_watch, "inotify_simple", None)
    monkeypatch.setattr(_watch, "touch_hint", lambda notify_fd, dir_fd: None)
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            first = worker()
            await publisher.publish("worker-added", first)
            async with anyio.create_task_group() as tg:
                events = await follow(tg, owner.subscriber)
                assert await take(events, 1) == [("worker-added", first.uid)]
                second = worker()
                await publisher.publish("worker-added", second)
                with anyio.fail_after(3 * _hub.DEFAULT_POLL_INTERVAL):
                    assert await take(events, 1) == [("worker-added", second.uid)]
                tg.cancel_scope.cancel()
