"""``anywool.map``: a function over many items, the items sent to workers in batches.

One call per item pays a call's fixed cost (a frame each way, a task and a cancel scope on the
worker, the caller's bookkeeping) for every item; for items of a few microseconds that cost is
the whole job. A map sends items in batches instead: each batch is one call of
:func:`anywool.runtime._batch.run_plain` (or ``run_routine``) through the dispatcher active
where the map was entered, so a batch has every promise of a call, and the caller's work per
item is a slice of a list and a step of ``async for``.

Batches are sized by the work: the worker reports how long each batch took, and the next ones
hold as many items as take about :data:`TARGET_SECONDS` at the mean time per item measured so
far (one item per batch until the first batch is back). Small items then go thousands to a
frame; items of a second or more go one by one, and as a batch of a plain function holds its
worker, those spread by work as separate calls do.

The input is read lazily, one batch at a time, and at most ``max_in_flight`` batches are taken
from it and not yet handed to the consumer: that bounds memory whatever the input's length,
and however long one item takes.
"""

from __future__ import annotations

import inspect
import itertools
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
from anywool.runtime import _batch
from anywool.runtime._routine import RoutineDispatcher, active_dispatcher, is_routine

T = TypeVar("T")
R = TypeVar("R")

#: The worker time (seconds) a batch is sized to take, at the mean time per item so far: long
#: enough that a call's fixed cost (about 0.1 ms) is under 1 % of it, short enough that the last
#: batches of a job end close together.
TARGET_SECONDS = 0.02
#: The most items in one batch (and the most ``batch_size`` accepts).
MAX_BATCH = 8192
#: ``max_in_flight`` by default: batches taken from the input and not yet consumed.
MAX_IN_FLIGHT = 32
#: The most ``max_in_flight`` accepts.
MAX_IN_FLIGHT_LIMIT = 1 << 16


class MapResults(Generic[R]):
    """The results of :func:`anywool.map` (or :meth:`WorkerPool.map
    <anywool.WorkerPool.map>`, :meth:`WorkerProxy.map <anywool.WorkerProxy.map>`): an async
    context manager whose value is an async iterator of the results.

    Entering it starts sending batches; ``async for`` yields each result, in the input's order
    (``ordered=True``) or as batches finish. Leaving the block cancels whatever is still running
    on the workers and waits (bounded, as a cancelled call does) until it has unwound.
    A map is entered once.

    :ivar completed: items whose results have come back so far (an ``int``; it counts whole
        batches, in any order).
    :ivar taken: items read from the input so far.
    """

    def __init__(self, resolve: Callable[[], RoutineDispatcher],
                 fn: Callable[[Any], Any], items: Iterable[Any] | AsyncIterable[Any], /, *,
                 ordered: bool = True, batch_size: int | None = None,
                 max_in_flight: int = MAX_IN_FLIGHT,
                 progress: Callable[[int], object] | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"map needs a callable for fn, got {fn!r}")
        body = fn.__wrapped__ if is_routine(fn) else fn  # type: ignore[attr-defined]
        if inspect.isasyncgenfunction(body):
            raise TypeError(f"map runs a coroutine routine or a plain function on each item; "
                            f"{fn!r} is an async generator function")
        if not isinstance(items, (Iterable, AsyncIterable)):
            raise TypeError(f"map needs an iterable or async iterable for items, got {items!r}")
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be a bool, got {ordered!r}")
        if batch_size is not None:
            batch_size = _validate.count("batch_size", batch_size, upper=MAX_BATCH)
        max_in_flight = _validate.count("max_in_flight", max_in_flight,
                                        upper=MAX_IN_FLIGHT_LIMIT)
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be a callable or None, got {progress!r}")
        self._resolve = resolve
        self._fn = fn
        self._items = items
        self._routine = inspect.iscoroutinefunction(body)
        self._ordered = ordered
        self._batch_size = batch_size
        self._max_in_flight = max_in_flight
        self._progress = progress
        self.completed = 0
        self.taken = 0
        self._entered = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._batches: anyio.abc.TaskGroup | None = None
        self._slots: anyio.Semaphore | None = None
        self._measured_items = 0
        self._measured_seconds = 0.0
        self._started = 0  # batches started, which numbers the next
        self._running = 0  # batches started and not back
        self._fed = False  # the input is exhausted (or failed): no batch will start
        self._done: dict[int, list[Any]] = {}  # ordered: results by batch number
        self._ready: deque[list[Any]] = deque()  # unordered: results as they came
        self._next = 0  # ordered: the batch number yielded next
        self._current: Iterator[Any] = iter(())
        self._holding = False  # the batch in _current holds a slot
        self._failure: BaseException | None = None
        self._raised = False
        self._waiter: anyio.Event | None = None

    def __repr__(self) -> str:
        return (f"<MapResults of {getattr(self._fn, '__qualname__', self._fn)!r}: "
                f"{self.completed} of {self.taken} items taken done>")

    # -- entry and exit ----------------------------------------------------------------------

    async def __aenter__(self) -> MapResults[R]:
        if self._entered:
            raise RuntimeError("a map is entered once; call map() again for another")
        dispatcher = self._resolve()  # RuntimeError when no pool or proxy is active
        self._entered = True
        self._slots = anyio.Semaphore(self._max_in_flight)
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
        await exit_task_group(task_group)
        if exc is None and self._failure is not None and not self._raised:
            self._raised = True
            raise self._failure
        return None

    # -- the batches ---------------------------------------------------------------------------

    def _size(self) -> int:
        if self._batch_size is not None:
            return self._batch_size
        if not self._measured_items:
            return 1
        per_item = self._measured_seconds / self._measured_items
        if per_item * MAX_BATCH <= TARGET_SECONDS:
            return MAX_BATCH
        return max(1, int(TARGET_SECONDS / per_item))

    async def _take(self, source: Iterator[Any] | AsyncIterator[Any], size: int) -> list[Any]:
        if isinstance(source, Iterator):
            return list(itertools.islice(source, size))
        taken: list[Any] = []
        async for item in source:
            taken.append(item)
            if len(taken) == size:
                break
        return taken

    async def _feed(self, dispatcher: RoutineDispatcher,
                    source: Iterator[Any] | AsyncIterator[Any]) -> None:
        fn = self._fn
        loop = _batch.run_routine if self._routine else _batch.run_plain
        plain = not self._routine
        slots = self._slots
        assert slots is not None
        try:
            async with anyio.create_task_group() as batches:
                self._batches = batches
                while True:
                    await slots.acquire()
                    size = self._size()
                    try:
                        items = await self._take(source, size)
                    except Exception as exc:  # the input's own: its iteration raised
                        self._fail(exc)
                        break
                    if not items:
                        break
                    start = self.taken
                    self.taken += len(items)
                    number = self._started
                    self._started += 1
                    self._running += 1
                    batches.start_soon(self._run, dispatcher, loop, plain, fn, items, start,
                                       number)
                    if len(items) < size and isinstance(source, Iterator):
                        break  # islice stopped early: the iterator is exhausted
        finally:
            self._fed = True
            self._wake()

    async def _run(self, dispatcher: RoutineDispatcher, loop: Callable[..., Any], plain: bool,
                   fn: Callable[[Any], Any], items: list[Any], start: int,
                   number: int) -> None:
        try:
            results, seconds = await dispatcher.dispatch(loop, (fn, items, start), {},
                                                         plain=plain)
        except Exception as exc:
            self._fail(exc)
            return
        self._running -= 1
        self._measured_items += len(items)
        self._measured_seconds += seconds
        self.completed += len(items)
        if self._ordered:
            self._done[number] = results
        else:
            self._ready.append(results)
        self._wake()
        if self._progress is not None:
            try:
                self._progress(len(items))
            except Exception as exc:
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """The first failure ends the map: the batches still running are cancelled, nothing more
        is read, and the consumer is woken to raise it."""
        if self._failure is None:
            self._failure = exc
            if self._batches is not None:
                self._batches.cancel_scope.cancel()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set()

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
        if self._holding:  # the batch just consumed: its slot is free
            self._holding = False
            self._slots.release()  # type: ignore[union-attr]
        await anyio.lowlevel.checkpoint()
        while True:
            if self._failure is not None:
                self._raised = True
                raise self._failure
            if self._ordered:
                results = self._done.pop(self._next, None)
                if results is not None:
                    self._next += 1
            else:
                results = self._ready.popleft() if self._ready else None
            if results is not None:
                self._holding = True
                self._current = iter(results)
                for result in self._current:
                    return result  # type: ignore[no-any-return]
                continue
            if self._fed and not self._running:
                raise StopAsyncIteration
            self._waiter = waiter = anyio.Event()
            await waiter.wait()


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
        20 ms of the worker's time per batch.
    :param max_in_flight: batches read from the input and not yet consumed (1 to 65536,
        default 32): the most that run at once, and the bound on memory (an item that never
        ends holds back at most this many batches behind it).
    :param progress: called in this task with the number of items of each batch as it comes
        back (for a progress bar: ``bar.update``); what it raises ends the map.
    :returns: a :class:`MapResults`, to enter with ``async with``.
    :raises TypeError: ``fn`` is not callable or is an async generator function, ``items`` is
        not iterable; ``ordered``, ``batch_size``, ``max_in_flight`` or ``progress`` of the
        wrong type.
    :raises ValueError: ``batch_size`` or ``max_in_flight`` out of range.

    Entering raises :class:`RuntimeError` when no pool or proxy is active. The ``async for``
    raises the first exception of the map, with its own type, as soon as it is known: one that
    ``fn`` raised (a note names the item's index in the input), one the input's iteration
    raised, :class:`~anywool.errors.WorkerError` for a batch whose worker was lost (its items
    are not sent again: they may have run), or what ``progress`` raised. The batches still
    running are then cancelled on their workers, the items not yet sent are never sent, and
    the results not yet yielded are dropped. An exception the block did not take from the
    ``async for`` is raised when the block is left.

    Cancellation: cancelling the block, or leaving it early, cancels every batch still running
    on the workers (an item that never awaits is interrupted, as with :func:`run_sync`), and
    waits until they have unwound, as long as a cancelled call waits (``cancel_grace``).
    """
    return MapResults(active_dispatcher, fn, items, ordered=ordered, batch_size=batch_size,
                      max_in_flight=max_in_flight, progress=progress)
