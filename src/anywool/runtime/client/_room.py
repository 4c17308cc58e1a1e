"""The calls waiting for room: a proxy's queue of the calls that no worker can take now.

A worker runs at most its ``max_concurrency`` calls and refuses more
(:class:`~anywool.runtime.client._call.WorkerBusy`), and its connection then counts as busy
until the worker says it has room again. A call that every worker refused waits here, without
polling, until a connection announces room; the proxy then tries it again.

Invariants, which :class:`RoomQueue` keeps and the proxy's dispatch relies on:

* **Who waits.** A call that every worker refused as busy (and that found no spare room), and a
  new call that finds calls queued already: it joins behind them instead of overtaking them.
  Each waits on a wake-up of its own (:mod:`anywool.runtime.client._wakeup`).
* **Who is woken, in what order.** Each announcement of room (:meth:`RoomQueue.announce`: a
  connection stopped being busy, or a worker that refused one of our calls sent ROOM) wakes
  one waiter: first those woken before that found the room gone again
  (:attr:`~RoomQueue.front`), then the others (:attr:`~RoomQueue.back`), each longest waiting
  first. A change of workers (:meth:`RoomQueue.workers_changed`) wakes them all. A room
  announced while nobody waits is kept as a *spare* (at most one per worker: more would only
  send calls to be refused again), which one call refused meanwhile takes instead of waiting
  (not all of them: a burst of refusals would all try again at once).
* **Promises.** A woken waiter owns the room it was woken for until it runs
  (:attr:`~RoomQueue.promised` counts them): a new call queues behind it rather than take that
  room, else each woken waiter would mostly find its room gone and wait again.
  :attr:`~RoomQueue.queued` is ``len(front) + len(back) + promised``; while it is zero a call
  goes straight to a worker.
* **Chaining.** Any call about to be sent (a woken waiter's among them) wakes the next waiter
  while some worker still has room (:meth:`RoomQueue.sent`). A call that a worker accepts after
  its ROOM (until it refuses one again) wakes the next too (:meth:`RoomQueue.accepted`), which
  tries: refused, it makes that worker owe its connection a ROOM again, so room freed later is
  never missed.
* **Cancellation.** A waiter cancelled before it is woken leaves its place; one cancelled after
  it was woken passes its room to the next (as an announcement would). A woken call that leaves
  without sending its call, when nobody else holds a promise, wakes the next if some worker has
  room (the proxy calls :meth:`RoomQueue.sent` for it). No wake-up is ever owed to nobody.

What this module must never do: make a call that finds room pay for the queue. The proxy reads
:attr:`~RoomQueue.queued`, :attr:`~RoomQueue.generation`, :attr:`~RoomQueue.announced` and
:attr:`~RoomQueue.spare` as plain attributes, and the connections' callbacks are the queue's
bound methods: a call that does not wait costs exactly the Python calls it cost before the
queue had a class of its own. Everything here is synchronous but :meth:`RoomQueue.wait`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from anywool.runtime.client import _wakeup
from anywool.runtime.client._wakeup import Wakeup

if TYPE_CHECKING:
    from anywool.metadata import WorkerMetadata
    from anywool.runtime.client._connection import WorkerConnection


class RoomQueue:
    """The calls of one proxy waiting for a worker with room (see the module docstring).

    Attributes the proxy reads: :attr:`queued`, :attr:`promised`, :attr:`generation` (changes of
    workers, counted), :attr:`announced` (rooms announced, counted: a call compares it before and
    after trying, so that room that came meanwhile is not missed) and :attr:`spare` (rooms
    announced while nobody waited; a refused call takes one by decrementing it).
    """

    __slots__ = ("back", "front", "queued", "promised", "spare", "announced", "generation",
                 "_workers", "_wakeup")

    def __init__(self) -> None:
        self.back: dict[Wakeup, None] = {}  # waiting, in the order they began to
        self.front: dict[Wakeup, None] = {}  # woken, found no room: served first
        self.queued = 0  # len(front) + len(back) + promised
        # Waiters woken that have not run yet: the room they were woken for is theirs.
        self.promised = 0
        self.spare = 0
        self.announced = 0
        self.generation = 0
        self._workers: Sequence[tuple[WorkerMetadata, WorkerConnection]] = ()
        self._wakeup: Callable[[], Wakeup] | None = None  # native to the backend, on first use

    def workers_changed(self, workers: Sequence[tuple[WorkerMetadata, WorkerConnection]]
                        ) -> None:
        """The proxy's choice of workers is now ``workers`` (kept, not copied: the proxy
        replaces its list rather than change it): wake every waiter to try them."""
        self._workers = workers
        self.generation += 1
        front, self.front = self.front, {}
        back, self.back = self.back, {}
        self.promised += len(front) + len(back)
        for room in (*front, *back):
            room.set()

    async def wait(self, front: bool, *, kick: bool = False) -> None:
        """Wait for room: at the front (``front``: woken before, and the room was gone), else
        behind every other waiter.

        :param kick: the caller is a new call that found calls queued: when none of them holds
            a promise, the first of them goes now if some worker has room (room may be there
            already, and nobody may be about to announce it).

        Cancellation: leaves the queue; a wake-up received already goes to the next waiter.
        """
        if self._wakeup is None:
            self._wakeup = _wakeup.factory()
        room = self._wakeup()
        (self.front if front else self.back)[room] = None
        self.queued += 1
        if kick and not self.promised:
            # Room there already: whoever is first goes (never a lost wake-up). A waiter woken
            # already wakes the next itself once its call is sent, if room is left.
            self.sent()
        try:
            await room.wait()
        except BaseException:
            if room.is_set():
                self.promised -= 1
                self.announce()  # woken, but leaving: the place goes to the next waiter
            else:
                self.front.pop(room, None)
                self.back.pop(room, None)
            raise
        finally:
            self.queued -= 1
        self.promised -= 1

    def accepted(self) -> None:
        """A worker accepted a call after it announced room (it may have room for more): the
        next waiter, if any, tries."""
        if self.front or self.back:
            self.announce()

    def sent(self) -> None:
        """A call is about to be sent: if calls wait and some worker has room left, the next
        of them tries."""
        if (self.front or self.back) and self._has_room():
            self.announce()

    def _has_room(self) -> bool:
        for _, connection in self._workers:
            if not connection.busy and not connection.broken:
                return True
        return False

    def announce(self) -> None:
        """Room was announced (a worker has room again, or a connection stopped being busy):
        wake the next waiter, or keep the room as a spare when nobody waits."""
        self.announced += 1
        for waiters in (self.front, self.back):
            room = next(iter(waiters), None)
            if room is not None:
                del waiters[room]
                self.promised += 1
                room.set()
                return
        # At most one per worker: more would only send calls to be refused again.
        self.spare = min(self.spare + 1, len(self._workers))
