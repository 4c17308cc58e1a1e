"""What a worker runs for one batch of :func:`anywool.map`: a function over a list of items.

A batch is one call of a :class:`Batch`: the caller sends ``(items, start, budget)``, the worker
runs ``fn`` on the items in order and answers ``(results, seconds)``, where ``seconds`` is how
long the loop took on the worker (``time.perf_counter``), which the caller sizes its next
batches by. A loop that has run ``budget`` seconds stops after the item it is on and answers
with fewer results than items: the items after them never ran, and the caller sends them
again. So a batch sized by a mean that no longer holds (the items became slower) holds its
worker for about ``budget``, not for as long as its items take.

Everything a call promises (cancellation, interruption of code that never awaits, deadlines,
context variables, output forwarding, at-most-once) holds for the batch as a whole. The loops'
own frames count as the routine's for the interrupter (see
:mod:`anywool.runtime.worker._interrupt`): a batch of a C function (``math.sqrt``) has no other
Python frame to be interrupted in.

No event loop state here: both sides import this module, the caller to name the batch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from anywool.runtime._routine import is_routine, routine_body


def _body(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """What runs for ``fn`` here: a routine's body, also under ``functools.partial`` (else the
    partial would call the routine, which dispatches it again, from this worker)."""
    if isinstance(fn, functools.partial) and is_routine(fn.func):
        return functools.partial(routine_body(fn.func), *fn.args, **fn.keywords)
    return routine_body(fn)


def _note(exc: BaseException, index: int) -> None:
    exc.add_note(f"(raised for item {index} of the input of anywool.map)")


def run_plain(fn: Callable[[Any], Any], items: Sequence[Any], start: int, budget: float,
              ) -> tuple[list[Any], float]:
    """``fn`` on each item in order, until ``budget`` seconds have passed: (the results, the
    seconds it took). ``start`` is the index of ``items[0]`` in the whole input, which the
    note of an exception names.

    :raises Exception: the first exception ``fn`` raised, with a note naming its item.
    """
    clock = time.perf_counter
    began = clock()
    until = began + budget
    results: list[Any] = []
    append = results.append
    index = start
    try:
        for item in items:
            append(fn(item))
            index += 1
            if clock() >= until:
                break
    except Exception as exc:
        _note(exc, index)
        raise
    return results, clock() - began


async def run_routine(fn: Callable[[Any], Any], items: Sequence[Any], start: int,
                      budget: float) -> tuple[list[Any], float]:
    """:func:`run_plain` for a coroutine routine: its body awaited on each item in turn."""
    body = _body(fn)
    clock = time.perf_counter
    began = clock()
    until = began + budget
    results: list[Any] = []
    append = results.append
    index = start
    try:
        for item in items:
            append(await body(item))
            index += 1
            if clock() >= until:
                break
    except Exception as exc:
        _note(exc, index)
        raise
    return results, clock() - began


#: The code objects of the loops, which the interrupter counts as a routine's own code.
LOOPS = frozenset({run_plain.__code__, run_routine.__code__})


class Batch:
    """``fn`` over a batch of items: what a map dispatches, named after ``fn`` (``map(fn)``) in
    what the call reports (errors, ``current_task().name``, spans). Pickled as ``fn`` is,
    with this class by reference.

    A coroutine when ``routine`` (its call returns :func:`run_routine`'s coroutine), else a
    plain function (:func:`run_plain`).
    """

    def __init__(self, fn: Callable[[Any], Any], routine: bool) -> None:
        self.fn = fn
        self.routine = routine
        self.__qualname__ = f"map({getattr(fn, '__qualname__', None) or repr(fn)})"

    def __call__(self, items: Sequence[Any], start: int, budget: float) -> Any:
        if self.routine:
            return run_routine(self.fn, items, start, budget)
        return run_plain(self.fn, items, start, budget)

    def __repr__(self) -> str:
        return f"<anywool {self.__qualname__}>"
