"""A lease kept alive from a thread of its own.

An owner and every publisher hold one etcd lease each, renewed every third of its TTL with a
one-shot ``POST /v3/lease/keepalive`` (the gateway answers one result per request body). The
renewals run in a thread with an event loop of its own, not in the holder's: a holder is an
``async with`` block, which cannot own a task of the caller's task group, and a caller whose
loop is busy with CPU-bound work must not lose its namespace for it.

A renewal that answers without a TTL means etcd dropped the lease (it lapsed while nobody
could renew it: a frozen process, a partition): the holder's ``on_lost`` decides what follows
(an owner is displaced; a publisher announces its workers again under a fresh lease). Stopping
is prompt: a pipe wakes the thread, which cancels a renewal in flight, and joining it never
waits on a member.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable

import anyio

from anywool.discovery.etcd._config import Config
from anywool.discovery.etcd._gateway import Gateway
from anywool.discovery.etcd._http import describe
from anywool.errors import DiscoveryError

log = logging.getLogger(__name__)

#: What ``on_lost`` returns: a new lease and its TTL to keep alive instead, or ``None``: stop.
Replacement = tuple[int, int] | None


class LeaseKeeper:
    """Renews ``lease`` every ``ttl / 3`` seconds until :meth:`stop` (see the module).

    :param on_lost: called in the keeper's thread, with its gateway, when etcd no longer knows
        the lease; returns a replacement lease to keep alive, or ``None`` to stop.
    """

    def __init__(self, config: Config, lease: int, ttl: int, what: str,
                 on_lost: Callable[[Gateway], Awaitable[Replacement]]) -> None:
        self.config = config
        self.lease = lease
        self.ttl = ttl
        self.what = what
        self._on_lost = on_lost
        #: Set when the lease was lost and not replaced.
        self.lost = False
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"anywool-etcd-lease-{lease:x}",
                                        daemon=True)

    def start(self) -> None:
        try:
            self._thread.start()
        except BaseException:
            self._close_pipe()
            raise

    def stop(self) -> None:
        """Ask the thread to end (at once: a renewal in flight is abandoned)."""
        if self._stop_w >= 0:
            try:
                os.write(self._stop_w, b"\0")
            except OSError:
                pass

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread, then close the pipe (not before: the
        thread reads it)."""
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_pipe()
        else:  # never seen: the thread ends within milliseconds of stop()
            log.warning("the lease thread of %s did not end within %.1f s", self.what, timeout)

    def _close_pipe(self) -> None:
        for fd in (self._stop_r, self._stop_w):
            if fd >= 0:
                os.close(fd)
        self._stop_r = self._stop_w = -1

    def _run(self) -> None:
        try:
            anyio.run(self._main, backend="asyncio")
        except BaseException:  # never seen; the holder's next write says what is wrong
            log.exception("the lease thread of %s failed", self.what)

    async def _main(self) -> None:
        gateway = Gateway(self.config)
        try:
            async with anyio.create_task_group() as tg:

                async def stop_on_request() -> None:
                    await anyio.wait_readable(self._stop_r)
                    tg.cancel_scope.cancel()

                tg.start_soon(stop_on_request)
                await self._renew(gateway)
                tg.cancel_scope.cancel()
        finally:
            await gateway.aclose()

    async def _renew(self, gateway: Gateway) -> None:
        renewed = time.monotonic()
        failing = False
        while True:
            interval = self.ttl / 3
            await anyio.sleep(interval)
            try:
                answer = await gateway.call("/v3/lease/keepalive", {"ID": str(self.lease)},
                                            timeout=max(interval, 0.2))
                ttl = int(answer.get("result", {}).get("TTL", 0))
            except DiscoveryError as exc:
                if not failing:
                    log.warning("renewing the lease of %s failed (retrying every %.2f s; it "
                                "lapses %d s after the last renewal): %s", self.what, interval,
                                self.ttl, describe(exc))
                failing = True
                if time.monotonic() - renewed < self.ttl:
                    continue
                ttl = 0  # lapsed by now: as etcd would answer once it answers again
            if ttl > 0:
                if failing:
                    log.warning("renewing the lease of %s works again", self.what)
                renewed, failing = time.monotonic(), False
                continue
            replacement = await self._on_lost(gateway)
            if replacement is None:
                self.lost = True
                return
            self.lease, self.ttl = replacement
            renewed, failing = time.monotonic(), False
