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
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from zeroconf import InterfaceChoice, RecordUpdateListener, Zeroconf
from zeroconf._dns import DNSText
from zeroconf._utils.time import current_time_millis
from zeroconf.const import _CLASS_IN, _CLASS_UNIQUE, _TYPE_PTR, _TYPE_TXT

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


class GoodbyeListener(RecordUpdateListener):
    """Collects, in zeroconf's loop, the goodbyes (TTL 0) of TXT records of one service type's
    instances, as ``(instance name in lower case, TXT data)``, for :func:`txt_records` to hand
    over; ``on_goodbye`` (which must not block) is called after a packet that brought any.

    A goodbye is the only way a publisher withdraws a record before its TTL, and its TXT data
    must be the withdrawn record's own: zeroconf removes a cached record on a goodbye of the
    same data at once, and delivers the goodbye to listeners only while it caches that record.
    """

    #: Goodbyes kept between two reads; a flood beyond it is dropped (the records withdrawn
    #: then leave at their TTL).
    LIMIT = 10_000

    def __init__(self, type_: str, on_goodbye: Callable[[], None]) -> None:
        self._suffix = "." + type_.lower()
        self._on_goodbye = on_goodbye
        self.goodbyes: list[tuple[str, bytes]] = []
        self._fresh = False

    def async_update_records(self, zc: Zeroconf, now: float, records: list[Any]) -> None:
        for update in records:
            record = update.new
            if (record.type == _TYPE_TXT and record.ttl == 0
                    and record.name.lower().endswith(self._suffix)
                    and len(self.goodbyes) < self.LIMIT):
                self.goodbyes.append((record.name.lower(), record.text))
                self._fresh = True

    def async_update_records_complete(self) -> None:
        if self._fresh:
            self._fresh = False
            self._on_goodbye()


#: One TXT record as :func:`txt_records` reports it: ``(created, ttl, data)``, ``created`` in
#: milliseconds of zeroconf's monotonic clock, ``ttl`` in seconds.
TxtRecord = tuple[float, int, bytes]


def txt_records(zc: Zeroconf, type_: str, listener: GoodbyeListener, names: Iterable[str]
                ) -> tuple[float, list[tuple[str, bytes]], list[tuple[str, list[TxtRecord]]]]:
    """In ``zc``'s loop (see :func:`call`): the time, the goodbyes ``listener`` collected since
    the last call, and the TXT records the cache holds (expired ones included) of every
    instance of ``type_`` it holds an unexpired PTR for and of every one of ``names`` (names in
    lower case; a name with no record comes with an empty list).

    Expiry is left to the caller, against each record's own TTL, rather than to zeroconf's
    cache cleanup, which runs only every 10 s.
    """
    cache = zc.cache
    now = current_time_millis()
    goodbyes, listener.goodbyes = listener.goodbyes, []
    wanted = dict.fromkeys(name.lower() for name in names)
    for pointer in cache.async_all_by_details(type_, _TYPE_PTR, _CLASS_IN):
        if not pointer.is_expired(now):
            wanted.setdefault(pointer.alias.lower())  # type: ignore[attr-defined]
    found = [(name, [(record.created, record.ttl, record.text)  # type: ignore[attr-defined]
                     for record in cache.async_all_by_details(name, _TYPE_TXT, _CLASS_IN)])
             for name in wanted]
    return now, goodbyes, found


def restore_txt(zc: Zeroconf, listener: GoodbyeListener,
                records: Iterable[tuple[str, TxtRecord]]) -> None:
    """In ``zc``'s loop: put back with its own lifetime each TXT record ``(name, (created, ttl,
    data))`` that the cache still holds with an earlier expiry, unless a goodbye for it is
    waiting in ``listener``.

    Another record of the name arriving with the cache-flush bit makes zeroconf mark the
    cached one to expire within a second (RFC 6762 §10.2). For a record a subscriber holds
    verified that other record is a forgery, or an older record replayed: putting it back
    keeps the cache's TTL the record's own, and keeps the record cached so that zeroconf still
    delivers its publisher's goodbye (it delivers a goodbye only for a record it caches).
    """
    cache = zc.cache
    pending = set(listener.goodbyes)
    for name, (created, ttl, data) in records:
        if (name, data) in pending:
            continue
        for record in cache.async_all_by_details(name, _TYPE_TXT, _CLASS_IN):
            if (record.text == data  # type: ignore[attr-defined]
                    and record.created + record.ttl * 1000 < created + ttl * 1000):
                cache.async_add_records([DNSText(record.name, _TYPE_TXT,
                                                 _CLASS_IN | _CLASS_UNIQUE, ttl, data,
                                                 created=created)])
