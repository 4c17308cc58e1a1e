"""``anywool.map``: a function over many items, the items sent to workers in batches.

One call per item pays a call's fixed cost (a frame each way, a task and a cancel scope on the
worker, the caller's bookkeeping) for every item; for items of a few microseconds that cost is
the whole job. A map sends items in batches instead: each batch is one call of a
:class:`~anywool.runtime._batch.Batch` through the dispatcher active where the map was entered,
so a batch has every promise of a call, and the caller's work per item is a slice of a list and
a step of ``async for``.

Batches are sized by the work: the worker reports how long each batch took, and the next ones
hold as many items as take about :data:`TARGET_SECONDS` at the mean time per item measured so
far (one item per batch until the first batch is back: the mean of every item, which a batch
slowed by its worker being descheduled does not sway), and no more than
:data:`MAX_BATCH_BYTES` at the largest pickled item and result seen lately. Small items then go
thousands to a frame; items of a second or more go one by one, and as a batch of a plain
function holds its worker, those spread by work as separate calls do. A batch that runs past
:data:`BUDGET_SECONDS` (its items became slower than the mean says) stops and gives back the
items it did not start, which go again in pieces sized by what that batch measured.

The input is read lazily, one batch at a time, and at most ``max_in_flight`` batches are taken
from it and not yet consumed: that bounds memory whatever the input's length, and however long
one item takes.
"""

from __future__ import annotations

import inspect
import itertools
import pickle
from collections import deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

import anyio
import anyio.abc
import anyio.lowlevel

from anywool import _validate
from anywool._owner import exit_task_group
from anywool.runtime._batch import Batch
from anywool.runtime._routine import RoutineDispatcher, active_dispatcher, routine_body

T = TypeVar("T")
R = TypeVar("R")

#: The worker time (seconds) a batch is sized to take, at the mean time per item so far:
#: long enough that a call's fixed cost (about 0.1 ms) is under 1 % of it, short enough that the
#: last batches of a job end close together.
TARGET_SECONDS = 0.02
#: How long (seconds) a batch runs at most before it gives back the items it has not started.
BUDGET_SECONDS = 4 * TARGET_SECONDS
#: The most items in one batch (and the most ``batch_size`` accepts).
MAX_BATCH = 8192
#: The most bytes a batch is sized to carry each way, at the size of the largest pickled item
#: (or result) seen lately: a quarter of a frame's 64 MiB, for items of uneven size.
MAX_BATCH_BYTES = 16 * 1024 * 1024
#: ``max_in_flight`` by default: batches taken from the input and not yet consumed.
MAX_IN_FLIGHT = 32
#: The most ``max_in_flight`` accepts.
MAX_IN_FLIGHT_LIMIT = 1 << 16
#: The fewest pieces the items a batch gives back go again in (when they are that many).
_PIECES = 8

# What a callback of the user's (the input's iteration, progress) may raise that ends the map
# as its failure; KeyboardInterrupt and cancellation are not its doing and propagate.
_FAILURES = (Exception, SystemExit)


def _pickled_size(value: object) -> int:
    """About the size of ``value`` pickled (bytes and str by their length, not copied), or 0
    when it cannot be pickled (the call says why)."""
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    try:
        return len(pickle.dumps(value, 5))
    except Exception:
        return 0


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` function (also under
    ``functools.partial``), or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or (
        not inspect.isroutine(fn) and inspect.iscoroutinefunction(getattr(fn, "__call__", None)))


class MapResults(Generic[R]):
    """The results of :func:`anywool.map` (or :meth:`WorkerPool.map
    <anywool.WorkerPool.map>`, :meth:`WorkerProxy.map <anywool.WorkerProxy.map>`): an async
    context manager whose value is an async iterator of the results.

    Entering it starts sending batches; ``async for`` yields each result, in the input's order
    (``ordered=True``) or as batches finish. Several tasks may iterate it: each result goes to
    one of them. Leaving the block cancels whatever is still running on the workers and waits
    (bounded, as a cancelled call does) until it has unwound. A map is entered once.

    :ivar completed: items whose results have come back so far (an ``int``, counted as each
        batch comes back, in any order).
    :ivar taken: items read from the input so far.
    """

    def __init__(self, resolve: Callable[[], RoutineDispatcher],
                 fn: Callable[[Any], Any], items: Iterable[Any] | AsyncIterable[Any], /, *,
                 ordered: bool = True, batch_size: int | None = None,
                 max_in_flight: int = MAX_IN_FLIGHT,
                 progress: Callable[[int], object] | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"map needs a callable for fn, got {fn!r}")
        body = routine_body(fn)
        if inspect.isasyncgenfunction(body):
            raise TypeError(f"map runs a coroutine routine or a plain function on each item; "
                            f"{fn!r} is an async generator function")
        if not isinstance(items, AsyncIterable):
            try:
                iter(items)  # what ``for`` accepts: __iter__, or __getitem__ from 0
            except TypeError:
                raise TypeError(f"map needs an iterable or async iterable for items, "
                                f"got {items!r}") from None
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be a bool, got {ordered!r}")
        if batch_size is not None:
            batch_size = _validate.count("batch_size", batch_size, upper=MAX_BATCH)
        max_in_flight = _validate.count("max_in_flight", max_in_flight,
                                        upper=MAX_IN_FLIGHT_LIMIT)
        if progress is not None and (not callable(progress)
                                     or _is_coroutine_function(progress)):
            raise TypeError(f"progress must be a plain callable or None (it is called, not "
                            f"awaited), got {progress!r}")
        self._resolve = resolve
        self._fn = fn
        self._items = items
        self._routine = _is_coroutine_function(body)
        self._ordered = ordered
        self._batch_size = batch_size
        self._max_in_flight = max_in_flight
        self._progress = progress
        self.completed = 0
        self.taken = 0
        self._entered = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._batches: anyio.abc.TaskGroup | None = None
        self._free = max_in_flight  # batches that may still be read from the input
        self._unconsumed: dict[int, int] = {}  # by batch read: its items not yet consumed
        self._measured_items = 0  # items whose batches came back, and the seconds they took
        self._measured_seconds = 0.0
        self._item_bytes = 0  # the largest pickled item or result seen
        self._running = 0  # batches started and not back
        self._exhausted = False  # the input has no more items (or failed)
        self._fed = False  # nothing more will be sent: no batch will come back after those
        # Items given back, to send again: (the batch read they belong to, index, items).
        self._again: deque[tuple[int, int, list[Any]]] = deque()
        # Results back and not consumed, with the batch read they belong to: ordered, by the
        # index of their first item; unordered, as they came.
        self._done: dict[int, tuple[int, list[Any]]] = {}
        self._ready: deque[tuple[int, list[Any]]] = deque()
        self._next = 0  # ordered: the index of the result yielded next
        self._current: Iterator[Any] = iter(())
        self._consuming: tuple[int, int] | None = None  # in _current: (batch read, items)
        self._failure: BaseException | None = None
        self._raised = False
        self._changed: anyio.Event | None = None  # set when a batch comes back or ends

    def __repr__(self) -> str:
        return (f"<MapResults of {getattr(self._fn, '__qualname__', self._fn)!r}: "
                f"{self.completed} of {self.taken} items taken done>")

    # -- entry and exit ----------------------------------------------------------------------

    async def __aenter__(self) -> MapResults[R]:
        if self._entered:
            raise RuntimeError("a map is entered once; call map() again for another")
        dispatcher = self._resolve()  # RuntimeError when no pool or proxy is active
        self._entered = True
        items = self._items
        source: Iterator[Any] | AsyncIterator[Any]
        source = aiter(items) if isinstance(items, AsyncIterable) else iter(items)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._feed, dispatcher, source)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        # Whatever still runs is not wanted any more: the consumer has left. The block's own
        # exception (or cancellation: this task group's scope is cancelled only here) goes on
        # unchanged, not wrapped in a group by the task group.
        task_group, self._task_group = self._task_group, None
        self._current = iter(())
        await exit_task_group(task_group)
        if exc is None and self._failure is not None and not self._raised:
            self._raise_failure()
        return None

    # -- the batches ---------------------------------------------------------------------------

    def _size(self) -> int:
        if self._batch_size is not None:
            return self._batch_size
        if not self._measured_items:
            return 1
        per_item = self._measured_seconds / self._measured_items
        size = MAX_BATCH if per_item * MAX_BATCH <= TARGET_SECONDS \
            else max(1, int(TARGET_SECONDS / per_item))
        if self._item_bytes * size > MAX_BATCH_BYTES:
            size = max(1, MAX_BATCH_BYTES // self._item_bytes)
        return size

    async def _read(self, source: Iterator[Any] | AsyncIterator[Any], size: int) -> list[Any]:
        """Up to ``size`` items of the input (fewer: it is exhausted)."""
        if isinstance(source, Iterator):
            items = list(itertools.islice(source, size))
            self._exhausted = len(items) < size
            return items
        items = []
        async for item in source:
            items.append(item)
            if len(items) == size:
                break
        else:
            self._exhausted = True
        return items

    async def _feed(self, dispatcher: RoutineDispatcher,
                    source: Iterator[Any] | AsyncIterator[Any]) -> None:
        """Send batches: items given back first (they belong to batches read already, and one
        of them may be what the consumer waits for), then new ones from the input while fewer
        than ``max_in_flight`` batches read are not yet consumed."""
        batch = Batch(self._fn, self._routine)
        number = 0  # of the next batch read
        try:
            async with anyio.create_task_group() as batches:
                self._batches = batches
                while True:
                    size = self._size()
                    if self._again:
                        origin, start, items = self._again.popleft()
                        if len(items) > size:
                            self._again.appendleft((origin, start + size, items[size:]))
                            items = items[:size]
                    elif self._exhausted:
                        if not self._running:
                            break
                        await self._wait_for_change()  # a batch may give items back
                        continue
                    elif not self._free:
                        await self._wait_for_change()  # for a batch to be consumed
                        continue
                    else:
                        try:
                            items = await self._read(source, size)
                        except _FAILURES as exc:  # the input's own: its iteration raised
                            self._exhausted = True
                            self._fail(exc)
                            break
                        if not items:
                            continue
                        origin, start = number, self.taken
                        number += 1
                        self._free -= 1
                        self._unconsumed[origin] = len(items)
                        self.taken += len(items)
                    self._running += 1
                    batches.start_soon(self._run, dispatcher, batch, origin, start, items)
                    await anyio.lowlevel.checkpoint()
        finally:
            self._fed = True
            self._wake()

    async def _run(self, dispatcher: RoutineDispatcher, batch: Batch, origin: int,
                   start: int, items: list[Any]) -> None:
        try:
            results, seconds = await dispatcher.dispatch(
                batch, (items, start, BUDGET_SECONDS), {}, plain=not self._routine)
        except Exception as exc:
            self._fail(exc)
            return
        done = len(results)
        if done < len(items):
            self._give_back(origin, start + done, items[done:], seconds / done)
        self._running -= 1
        self._measured_items += done
        self._measured_seconds += seconds
        if self._batch_size is None:  # an item seen large weighs less with each batch after it
            self._item_bytes = max(self._item_bytes // 2, _pickled_size(items[0]),
                                   _pickled_size(results[0]))
        self.completed += done
        if self._ordered:
            self._done[start] = (origin, results)
        else:
            self._ready.append((origin, results))
        self._wake()
        if self._progress is not None:
            try:
                self._progress(done)
            except _FAILURES as exc:
                self._fail(exc)

    def _give_back(self, origin: int, start: int, rest: list[Any], per_item: float) -> None:
        """Items a batch did not start (it ran past its budget): they go again, before any
        new item, in pieces sized by the time per item that batch measured (the best word on
        items that became slower than the mean says), and at least an eighth of them each,
        so that a batch cut short by the worker being descheduled does not come back as
        thousands of calls of one item."""
        piece = max(1, int(TARGET_SECONDS / per_item), -(-len(rest) // _PIECES))
        for offset in range(0, len(rest), piece):
            self._again.append((origin, start + offset, rest[offset:offset + piece]))

    def _fail(self, exc: BaseException) -> None:
        """The first failure ends the map: the batches still running are cancelled, nothing more
        is read, and the consumer is woken to raise it."""
        if self._failure is None:
            self._failure = exc
            if self._batches is not None:
                self._batches.cancel_scope.cancel()
        self._wake()

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    async def _wait_for_change(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _raise_failure(self) -> None:
        self._raised = True
        failure = self._failure
        assert failure is not None
        if isinstance(failure, (StopIteration, StopAsyncIteration)):
            # Raised from __anext__ as it is, it would end the iteration as if the map were done.
            raise RuntimeError(f"anywool.map: {type(failure).__name__} was raised") from failure
        raise failure

    # -- the consumer --------------------------------------------------------------------------

    def __aiter__(self) -> MapResults[R]:
        return self

    async def __anext__(self) -> R:
        # The results of a batch already here are yielded without a turn of the event loop: a
        # step of async for then costs about what a step of a plain for does.
        if self._failure is None:
            for result in self._current:
                return result  # type: ignore[no-any-return]
        return await self._next_batch()

    async def _next_batch(self) -> R:
        if self._task_group is None:
            raise RuntimeError("iterate a map inside its async with block")
        if self._consuming is not None:  # the results just consumed
            origin, count = self._consuming
            self._consuming = None
            left = self._unconsumed[origin] - count
            if left:
                self._unconsumed[origin] = left
            else:  # the whole batch read: another may be read
                del self._unconsumed[origin]
                self._free += 1
                self._wake()
        await anyio.lowlevel.checkpoint()
        while True:
            if self._failure is not None:
                self._raise_failure()
            for result in self._current:  # another task took results meanwhile: their rest
                return result  # type: ignore[no-any-return]
            if self._ordered:
                part = self._done.pop(self._next, None)
            else:
                part = self._ready.popleft() if self._ready else None
            if part is not None:
                origin, results = part
                self._next += len(results)
                self._consuming = (origin, len(results))
                self._current = iter(results)
                for result in self._current:
                    return result  # type: ignore[no-any-return]
            if self._fed and not self._running and not self._ready and not self._done:
                raise StopAsyncIteration
            await self._wait_for_change()


@overload
def map(fn: Callable[[T], Awaitable[R]], items: Iterable[T] | AsyncIterable[T], /, *,
        ordered: bool = ..., batch_size: int | None = ..., max_in_flight: int = ...,
        progress: Callable[[int], object] | None = ...) -> MapResults[R]: ...


@overload
def map(fn: Callable[[T], R], items: Iterable[T] | AsyncIterable[T], /, *,
        ordered: bool = ..., batch_size: int | None = ..., max_in_flight: int = ...,
        progress: Callable[[int], object] | None = ...) -> MapResults[R]: ...


def map(fn: Callable[[Any], Any], items: Iterable[Any] | AsyncIterable[Any], /, *,
        ordered: bool = True, batch_size: int | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        progress: Callable[[int], object] | None = None) -> MapResults[Any]:
    """Run ``fn`` on every item of ``items`` on the workers of the active pool, the items sent
    in batches; the results come from ``async for`` in the block::

        async with anywool.map(fn, items) as results:
            async for result in results:
                ...

    :param fn: a plain function of one argument (run as :func:`run_sync` runs it: it holds its
        worker's event loop), or a coroutine routine of one argument (``@routine``). The items of
        a batch run one after another. Pickled as :func:`run_sync`'s ``fn`` is.
    :param items: an iterable or an async iterable, read lazily in this task (a slow ``next``
        holds this event loop), one batch at a time.
    :param ordered: yield results in the input's order (default), or as batches finish.
    :param batch_size: items per batch (1 to 8192); by default sized by the work, to about
        20 ms of the worker's time per batch and at most 16 MiB of pickled items (or results).
        A batch that runs over 80 ms gives back the items it has not started, which go again.
    :param max_in_flight: batches read from the input and not yet consumed (1 to 65536,
        default 32): the most that run at once, and the bound on memory (an item that never
        ends holds back at most this many batches behind it).
    :param progress: a plain callable, called in this task with the number of items of each
        batch as it comes back (for a progress bar: ``bar.update``); what it raises ends the
        map.
    :returns: a :class:`MapResults`, to enter with ``async with``.
    :raises TypeError: ``fn`` is not callable or is an async generator function, ``items`` is
        not iterable; ``ordered``, ``batch_size``, ``max_in_flight`` or ``progress`` of the
        wrong type.
    :raises ValueError: ``batch_size`` or ``max_in_flight`` out of range.

    Entering raises :class:`RuntimeError` when no pool or proxy is active. The ``async for``
    raises the first exception of the map, with its own type, as soon as it is known: one that
    ``fn`` raised (a note names the item's index in the input; ``StopIteration`` and
    ``StopAsyncIteration`` come as the cause of a :class:`RuntimeError`, as from a generator,
    since raised as they are they would end the ``async for``), one the input's iteration
    raised, what ``progress`` raised, or what a call raises for the batch: a batch is a call
    named ``map(fn)``, so :class:`~anywool.errors.WorkerError` when its worker was lost,
    :class:`~anywool.errors.RoutineCancelled` when the worker was stopped,
    :class:`~anywool.errors.SerializationError` for an item or result that cannot be pickled
    (its items are not sent again: they may have run). The batches still running are then
    cancelled on their workers, the items not yet sent are never sent, and the results not yet
    yielded are dropped. An exception the block did not take from the ``async for`` is raised
    when the block is left.

    Cancellation: cancelling the block, or leaving it early, cancels every batch still running
    on the workers (an item that never awaits is interrupted, as with :func:`run_sync`), and
    waits until they have unwound, as long as a cancelled call waits (``cancel_grace``).
    """
    return MapResults(active_dispatcher, fn, items, ordered=ordered, batch_size=batch_size,
                      max_in_flight=max_in_flight, progress=progress)
