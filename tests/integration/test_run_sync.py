"""``anywool.run_sync``: a plain function on a worker of the active pool.

What it promises besides what ``test_interrupt.py`` pins about its cancellation: the function's
value comes back; lambdas, closures and ``functools.partial`` travel (cloudpickle); an exception
keeps its type, message and traceback; what is not a plain callable is refused before anything
is sent; it works inside a routine (the nested call goes through the pool); context variables
travel both ways, and ``anywool.current_task()`` describes the call, as for a routine.
"""

from __future__ import annotations

import contextvars
import functools
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

import anywool
from anywool import RoutineTask, routine
from anywool.testing import WorkerPoolFactory

from .routines import countdown, whoami

pytestmark = pytest.mark.anyio

REQUEST = anywool.ContextVar("tests.integration.run_sync.request", default="none")
ANSWER = anywool.ContextVar("tests.integration.run_sync.answer", default="none")


@pytest.fixture(autouse=True)
async def _unset_afterwards():
    # Under asyncio every test of a module runs in one runner task, so in one context: what a
    # test set would still be set in the next.
    yield
    from anywool.runtime import _context

    _context.apply(None)


# -- what runs on the workers ----------------------------------------------------------------


def scaled(value: int, *, by: int = 1) -> tuple[int, int]:
    """``value * by``, and the pid of the process that computed it."""
    return value * by, os.getpid()


def fail_deep(message: str) -> None:
    _fail_deeper(message)


def _fail_deeper(message: str) -> None:
    raise LookupError(message)


def answer_request() -> tuple[str, str]:
    """Reads REQUEST, sets ANSWER from it; returns what it read and ANSWER's value before."""
    seen = REQUEST.get()
    before = ANSWER.get()
    ANSWER.set(f"answered {seen}")
    return seen, before


def describe_task() -> RoutineTask:
    return anywool.current_task()


#: A plain context variable (not an anywool.ContextVar: it does not travel).
LOCAL = contextvars.ContextVar("tests.integration.run_sync.local", default="unset")


def set_local(value: str) -> str:
    """Sets LOCAL; returns what it was before."""
    before = LOCAL.get()
    LOCAL.set(value)
    return before


def hold_for(seconds: float) -> None:
    time.sleep(seconds)  # holds the worker's event loop: frames queue up in its socket


def touch(path: str) -> None:
    Path(path).touch()


def library_and_clock() -> tuple[str, float]:
    """What sniffio says runs here, and AnyIO's clock: both must work in a plain function."""
    return sniffio.current_async_library(), anyio.current_time()


@routine
async def pid_and_nested_pid() -> tuple[int, int, int, int | None]:
    """This worker's pid; the pid that computed a nested run_sync, and that call's caller id
    and this routine's own call id."""
    value, there = await anywool.run_sync(scaled, 21)
    task = await anywool.run_sync(describe_task)
    assert value == 21
    return os.getpid(), there, anywool.current_task().id, task.caller_id


async def an_async_function() -> None:
    raise AssertionError("never run")


async def an_async_generator_function():
    yield "never run"


# -- values and callables --------------------------------------------------------------------


async def test_run_sync_returns_the_functions_value_computed_on_a_worker(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        async with worker_pool() as pool:
            (worker,) = pool.workers
            assert await anywool.run_sync(scaled, 6) == (6, worker.pid)
            assert await anywool.run_sync(divmod, 17, 5) == (3, 2)  # a builtin too


async def test_lambdas_and_closures_defined_in_the_test_travel(
        worker_pool: WorkerPoolFactory) -> None:
    offset = 100

    def add_offset(value: int) -> tuple[int, int]:
        return value + offset, os.getpid()

    with anyio.fail_after(30):
        async with worker_pool() as pool:
            (worker,) = pool.workers
            assert await anywool.run_sync(lambda a, b: (a * b + offset, os.getpid()), 6, 7) \
                == (142, worker.pid)
            assert await anywool.run_sync(add_offset, 1) == (101, worker.pid)


async def test_functools_partial_carries_keyword_arguments(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        async with worker_pool() as pool:
            (worker,) = pool.workers
            assert await anywool.run_sync(functools.partial(scaled, by=3), 5) == (15, worker.pid)
            assert await anywool.run_sync(functools.partial(int, base=2), "101") == 5


async def test_an_exception_keeps_its_type_message_and_traceback(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        async with worker_pool():
            with pytest.raises(LookupError) as info:
                await anywool.run_sync(fail_deep, "no such key: 7")
    assert type(info.value) is LookupError
    assert str(info.value) == "no such key: 7"
    names = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    # The worker's frames, innermost last, after ours.
    assert names[-2:] == ["fail_deep", "_fail_deeper"]
    assert "test_an_exception_keeps_its_type_message_and_traceback" in names


# -- refusals --------------------------------------------------------------------------------


async def test_run_sync_with_no_pool_active_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="no WorkerPool or WorkerProxy is active"):
        await anywool.run_sync(scaled, 1)


@pytest.mark.parametrize("fn", [an_async_function, an_async_generator_function, whoami,
                                countdown],
                         ids=["async-function", "async-generator-function", "routine",
                              "generator-routine"])
@pytest.mark.parametrize("pool_active", [False, True], ids=["no-pool", "pool"])
async def test_an_async_function_or_routine_is_refused_with_type_error_before_anything_is_sent(
        fn: Any, pool_active: bool, worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        if not pool_active:
            # Checked first: a TypeError, not the RuntimeError of a missing pool.
            with pytest.raises(TypeError, match="run_sync runs plain functions"):
                await anywool.run_sync(fn)
            return
        async with worker_pool():
            # Refused here (sent, it would fail on the worker, as a SerializationError of the
            # coroutine or generator it returned).
            with pytest.raises(TypeError, match="run_sync runs plain functions"):
                await anywool.run_sync(fn)


@pytest.mark.parametrize("thing", [42, "scaled", None], ids=["int", "str", "none"])
async def test_what_is_not_callable_is_refused_with_type_error(
        thing: object, worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        with pytest.raises(TypeError, match="run_sync needs a callable"):
            await anywool.run_sync(thing)  # type: ignore[arg-type]
        async with worker_pool():
            with pytest.raises(TypeError, match="run_sync needs a callable"):
                await anywool.run_sync(thing)  # type: ignore[arg-type]


# -- inside routines, context ----------------------------------------------------------------


async def test_a_routine_runs_a_plain_function_through_its_pool(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        async with worker_pool(spawn=2) as pool:
            pids = {w.pid for w in pool.workers}
            here, there, call_id, caller_id = await pid_and_nested_pid()
            assert {here, there} <= pids  # the nested call went to one of the pool's workers
            assert caller_id == call_id  # and counts as called from the routine's call


async def test_context_variables_travel_to_the_function_and_back(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        async with worker_pool():
            REQUEST.set("r-17")
            ANSWER.set("unanswered")
            assert await anywool.run_sync(answer_request) == ("r-17", "unanswered")
            # What the function set is set here after the await, as for a routine.
            assert ANSWER.get() == "answered r-17"
            assert REQUEST.get() == "r-17"


async def test_current_task_describes_the_call_inside_the_function(
        worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(30):
        async with worker_pool():
            task = await anywool.run_sync(describe_task)
            assert isinstance(task, RoutineTask)
            assert task.name == describe_task.__qualname__
            assert task.caller_id is None  # called from outside any routine
            assert isinstance(task.id, int) and task.id >= 0
            assert math.isfinite(task.deadline)  # the fail_after above travelled with it
            again = await anywool.run_sync(describe_task)
            assert again.id != task.id  # each call its own


async def test_each_call_runs_in_a_context_of_its_own(worker_pool: WorkerPoolFactory) -> None:
    # A worker runs a plain function where it routed its call, without a task: what one call
    # sets, even in a variable that does not travel, must not be seen by the next.
    with anyio.fail_after(30):
        async with worker_pool(spawn=1):
            assert [await anywool.run_sync(set_local, f"call {n}") for n in range(5)] \
                == ["unset"] * 5


async def test_the_function_sees_the_workers_async_library(
        anyio_backend: str, worker_pool: WorkerPoolFactory) -> None:
    # Outside any task, sniffio (and so AnyIO) would find no library under asyncio.
    with anyio.fail_after(30):
        async with worker_pool(spawn=1, backend=anyio_backend):
            library, clock = await anywool.run_sync(library_and_clock)
    assert library == anyio_backend
    assert clock > 0


async def test_a_call_withdrawn_before_the_worker_read_it_never_runs(
        worker_pool: WorkerPoolFactory, tmp_path: Path) -> None:
    # While the worker is held, a call is sent and then withdrawn: its CALL and CANCEL frames
    # reach the worker in one read. Routing the CALL must not run the function before the
    # CANCEL behind it is seen.
    marker = tmp_path / "ran"
    with anyio.fail_after(30):
        async with worker_pool(spawn=1), anyio.create_task_group() as tg:
            tg.start_soon(anywool.run_sync, hold_for, 1.0)
            # Every task blocked: the holder's CALL frame is written, so the withdrawn call's
            # two frames go after it and wait behind it, unread, until it returns.
            await anyio.wait_all_tasks_blocked()
            with anyio.move_on_after(0.2) as withdrawn:
                await anywool.run_sync(touch, str(marker))
            assert withdrawn.cancelled_caught
    assert not marker.exists()
