"""The one place that touches zeroconf: its instances, its event loop, its cache and registry.

zeroconf is asyncio inside: a ``Zeroconf`` constructed in a thread without a running asyncio
loop starts its own loop in a thread of its own, and its cache, registry and sockets may only be
touched from that loop. So everything here is called from worker threads (``to_thread`` or a
source's thread), never from an event loop's thread: constructed on an asyncio loop's thread a
``Zeroconf`` would attach to that loop and its blocking calls would fail, and under trio there is
no loop to attach to at all. What must run in zeroconf's loop is handed to it with :func:`call`,
which waits for the result with a timeout. The asyncio import below is for that hand-off only:
this module is the backend shim of zeroconf's loop, and nothing of anywool's own concurrency
runs on asyncio here.

What this module must never do: construct a ``Zeroconf`` in a thread that runs an event loop,
or leave an instance unclosed on any error path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from zeroconf import InterfaceChoice, Zeroconf
from zeroconf._utils.time import current_time_millis
from zeroconf.const import _CLASS_IN, _TYPE_PTR, _TYPE_TXT

T = TypeVar("T")

#: Seconds a hand-off to zeroconf's loop may take before it counts as wedged.
CALL_TIMEOUT = 5.0


def open_zeroconf(interfaces: Sequence[str | int] | None) -> Zeroconf:
    """A started ``Zeroconf`` on ``interfaces`` (``None``: zeroconf's default, every interface).

    Call from a worker thread. Blocks until zeroconf's sockets are up (milliseconds).

    :raises RuntimeError: called in a thread that runs an asyncio event loop.
    :raises OSError: an interface cannot be used (no such address, multicast unavailable).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("zeroconf must be started from a worker thread, not an event loop")
    try:
        zc = Zeroconf(interfaces=InterfaceChoice.All if interfaces is None else list(interfaces))
    except RuntimeError as exc:  # ifaddr's "No adapter found for index ..."
        raise OSError(f"zeroconf cannot use interfaces {list(interfaces or [])!r}: {exc}") \
            from None
    except OSError as exc:  # an address no interface has: "[Errno 19] No such device"
        where = "every interface" if interfaces is None else f"interfaces {list(interfaces)!r}"
        raise OSError(exc.errno, f"zeroconf cannot use {where}: {exc.strerror or exc}") \
            from None
    try:
        run(zc, zc.async_wait_for_start())
    except BaseException:
        zc.close()
        raise
    return zc


def call(zc: Zeroconf, fn: Callable[..., T], *args: Any, timeout: float = CALL_TIMEOUT) -> T:
    """``fn(*args)`` run in ``zc``'s event loop; its result (or exception) here.

    :raises TimeoutError: the loop did not run it within ``timeout`` seconds (it then never
        runs).
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run_it() -> None:
        if not future.set_running_or_notify_cancel():
            return  # given up on already
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    assert zc.loop is not None
    zc.loop.call_soon_threadsafe(run_it)
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


def run(zc: Zeroconf, coroutine: Coroutine[Any, Any, T], *,
        timeout: float = CALL_TIMEOUT) -> T:
    """Run a coroutine of zeroconf's in its event loop and wait for its result.

    :raises TimeoutError: it did not finish within ``timeout`` seconds (it is cancelled).
    """
    assert zc.loop is not None
    future = asyncio.run_coroutine_threadsafe(coroutine, zc.loop)
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


def close(zc: Zeroconf) -> None:
    """Send goodbyes for what ``zc`` still has registered, close its sockets and join its
    loop's thread. Call from a worker thread; bounded by zeroconf's own timeouts (about a
    second at worst)."""
    zc.close()


def txt_records(zc: Zeroconf, type_: str) -> list[tuple[str, list[tuple[float, bytes]]]]:
    """In ``zc``'s loop (see :func:`call`): every instance of ``type_`` that the cache holds an
    unexpired PTR for, with its unexpired TXT records as ``(created, data)`` pairs.

    Expiry is checked here, against each record's own TTL, rather than left to zeroconf's cache
    cleanup, which runs only every 10 s.
    """
    cache = zc.cache
    now = current_time_millis()
    found = []
    for pointer in cache.async_all_by_details(type_, _TYPE_PTR, _CLASS_IN):
        if pointer.is_expired(now):
            continue
        name = pointer.alias  # type: ignore[attr-defined]
        texts = [(record.created, record.text)  # type: ignore[attr-defined]
                 for record in cache.async_all_by_details(name, _TYPE_TXT, _CLASS_IN)
                 if not record.is_expired(now)]
        if texts:
            found.append((name, texts))
    return found
