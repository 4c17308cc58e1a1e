"""Context variables travel with calls, to nested calls and back, and per generator step."""

from __future__ import annotations

import threading

import anyio
import pytest

import anywool
from anywool import SerializationError, routine
from anywool.lowlevel import WorkerConnection
from anywool.testing import WorkerPoolFactory

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
async def _unset_afterwards():
    # Under asyncio every test of a module runs in one runner task, so in one context: what a
    # test set would still be set in the next.
    yield
    from anywool.runtime import _context

    _context.apply(None)


REQUEST = anywool.ContextVar("tests.integration.context.request", default="none")
TRAIL = anywool.ContextVar("tests.integration.context.trail", default=())


@routine
async def read_request() -> str:
    return REQUEST.get()


@routine
async def read_request_below() -> tuple[str, str]:
    return REQUEST.get(), await read_request()


@routine
async def mark(step: str) -> str:
    TRAIL.set((*TRAIL.get(), step))
    return REQUEST.get()


@routine
async def mark_below(step: str) -> None:
    await mark(step)  # the nested call's change comes back here, then to the caller


@routine
async def mark_then_fail(step: str) -> None:
    TRAIL.set((*TRAIL.get(), step))
    raise LookupError("after marking")


@routine
async def stepwise(count: int):
    for index in range(count):
        TRAIL.set((*TRAIL.get(), f"step {index}"))
        yield REQUEST.get()


@routine
async def leak_a_lock() -> None:
    TRAIL.set(threading.Lock())  # cannot travel back


async def test_the_callers_values_reach_the_routine_and_its_nested_calls(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            assert await read_request() == "none"  # nothing set: the default
            token = REQUEST.set("r-17")
            assert await read_request() == "r-17"
            assert await read_request_below() == ("r-17", "r-17")
            REQUEST.reset(token)
            assert await read_request() == "none"


async def test_what_the_routine_sets_is_set_in_the_caller_after_the_await(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=2):
            assert TRAIL.get() == ()
            await mark("first")
            await mark("second")
            assert TRAIL.get() == ("first", "second")
            await mark_below("nested")
            assert TRAIL.get() == ("first", "second", "nested")
            with pytest.raises(LookupError):
                await mark_then_fail("failing")
            assert TRAIL.get()[-1] == "failing"  # as after a local await that raised


async def test_values_travel_at_every_step_of_an_async_generator(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            REQUEST.set("before")
            agen = stepwise(3)
            assert await agen.__anext__() == "before"
            assert TRAIL.get() == ("step 0",)  # the step's change is back
            REQUEST.set("between")
            assert await agen.__anext__() == "between"  # the caller's change went forth
            TRAIL.set(("reset by the caller",))
            assert await agen.__anext__() == "between"
            assert TRAIL.get() == ("reset by the caller", "step 2")
            await agen.aclose()


async def test_a_value_that_cannot_be_pickled_fails_the_call_naming_the_variable(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            token = REQUEST.set(threading.Lock())  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="context variable 'tests.integration.context."
                                                "request'") as info:
                await read_request()
            assert isinstance(info.value, SerializationError)
            assert "read_request" in str(info.value)
            REQUEST.reset(token)
            assert await read_request() == "none"  # nothing was sent; the pool goes on


async def test_a_change_that_cannot_travel_back_fails_the_call_naming_the_variable(worker_pool: WorkerPoolFactory) -> None:
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.raises(SerializationError, match="trail") as info:
                await leak_a_lock()
            assert "on worker" in str(info.value)
            assert TRAIL.get() == ()
            assert await read_request() == "none"


async def test_values_travel_over_a_bare_connection_too() -> None:
    with anyio.fail_after(30):
        async with anywool.LocalWorker() as worker, WorkerConnection(
            worker.metadata.address
        ) as connection:
            REQUEST.set("direct")
            assert await connection.call(mark.__wrapped__, ("direct",), {}) == "direct"
            assert TRAIL.get() == ("direct",)
