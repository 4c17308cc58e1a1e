"""Publishing: a pool's spawned workers announced in its discovery namespace, and withdrawn.

The pool's other parts decide *when* a worker is announced or withdrawn (supervision when one
starts or dies, recycling when one retires); this part decides *whether* an announcement may go
out at all, keeps them in order, and bounds them: the first workers are announced together once
the publisher is entered, each later change one at a time, and the exit withdraws every worker
still running within ``announce_timeout`` whatever the namespace does.

What this module must never do: let an announcement that fails or hangs stop a worker from
starting or stopping (it is logged instead), or announce anything once the pool's exit began.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack

import anyio

from anywool._duration import seconds
from anywool._teardown import Budget, ExitWithin
from anywool.discovery import DiscoveryLike, DiscoveryPublisherLike
from anywool.runtime.client._resolve import resolved
from anywool.runtime.pool._local_worker import LocalWorker

# The pool's logger: users configure logging by this name.
log = logging.getLogger("anywool.runtime._pool")


class Publishing:
    """Announces one pool's spawned workers through its discovery's publisher.

    Job: publish ``worker-added`` for the pool's first workers together, then each later
    ``worker-added`` (a replacement, a worker grown back) and ``worker-dropped`` (a dead or a
    retiring worker) as it happens, and at the pool's exit ``worker-dropped`` for every worker
    still running.

    Owns: the publisher (resolved from ``discovery.publisher`` and entered on the pool's exit
    stack, its exit bounded by the announce budget), whether the first announcement was made,
    and the announcements under way.

    Invariants: one announcement at a time (a lock), so a subscriber sees a worker's changes in
    the order they were made; nothing is announced before the first workers were (each of them
    is in that announcement) nor after :meth:`withdraw_all` began; each announcement takes at
    most ``timeout`` seconds, and one that fails or times out is logged, never raised.

    Cancellation: :meth:`announce` may be cancelled at any point (the publisher's own guarantee
    says whether the change was made); :meth:`withdraw_all` abandons the announcements under
    way at once, and spends at most what is left of the budget, then gives up (logged).
    """

    def __init__(self, owner: object, timeout: float, budget: Budget) -> None:
        """:param owner: the pool, named (by its ``repr``) in what is logged.
        :param timeout: seconds (≥ 0) each announcement may take (``announce_timeout``);
            ``0``: the exit withdraws nothing.
        :param budget: the pool's announce budget, which the publisher's exit and the final
            withdrawal spend."""
        self._owner = owner
        self._timeout = timeout
        self._budget = budget
        self._publisher: DiscoveryPublisherLike | None = None
        self._published = False
        self._closed = False
        self._lock = anyio.Lock()
        self._announcing: set[anyio.CancelScope] = set()

    async def open(self, stack: AsyncExitStack, owned: DiscoveryLike,
                   workers: Callable[[], Iterable[LocalWorker]]) -> None:
        """Enter ``owned``'s publisher on ``stack`` and announce ``workers()`` (read once the
        lock is held, so a worker that starts meanwhile is announced once, here or by itself).

        :raises TypeError: ``owned.publisher`` resolves to no ``DiscoveryPublisherLike``.
        :raises Exception: whatever entering the publisher or publishing raises (the pool's
            entry fails with it).
        """
        publisher = self._publisher = await stack.enter_async_context(ExitWithin(
            resolved(owned.publisher, expect=DiscoveryPublisherLike,
                     name="discovery.publisher"), self._budget))
        async with self._lock:
            for worker in list(workers()):
                await publisher.publish("worker-added", worker.metadata)
            self._published = True

    async def announce(self, worker: LocalWorker, kind: str) -> None:
        """Publish one worker's change, once the initial announcement has been made."""
        async with self._lock:
            if not self._published or self._publisher is None or self._closed:
                return
            # The exit abandons an announcement under way (it announces every drop itself).
            with anyio.CancelScope() as scope:
                self._announcing.add(scope)
                try:
                    with anyio.fail_after(self._timeout):
                        await self._publisher.publish(kind, worker.metadata)  # type: ignore[arg-type]
                except Exception:
                    log.warning("announcing %s for %s failed", kind, worker.metadata,
                                exc_info=True)
                finally:
                    self._announcing.discard(scope)

    async def withdraw_all(self, workers: Callable[[], Iterable[LocalWorker]]) -> None:
        """At the pool's exit: announce nothing more (abandoning what is under way), then
        ``worker-dropped`` for each of ``workers()`` within the announce budget. A failure or
        the budget's end is logged, and the workers are stopped anyway."""
        self._closed = True
        for scope in self._announcing:
            scope.cancel()
        if self._publisher is None or self._timeout <= 0:
            return
        try:
            with self._budget.scope(fail=True):
                async with self._lock:
                    publisher, self._published = self._publisher, False
                    for worker in list(workers()):
                        await publisher.publish("worker-dropped", worker.metadata)
        except TimeoutError:
            log.warning("announcing the dropped workers of %r gave up after %s; "
                        "stopping them anyway", self._owner, seconds(self._timeout),
                        exc_info=True)
        except Exception:
            log.warning("announcing the dropped workers of %r failed; stopping them anyway",
                        self._owner, exc_info=True)
