"""The asyncio worker's event loop (asyncio only, so these tests run their own loop)."""

from __future__ import annotations

import asyncio
import sys

import anyio
import anyio.lowlevel
import pytest

from anywool.runtime.worker._asyncio_loop import WorkerEventLoop

KINDS = [SystemExit, KeyboardInterrupt]


def run(main, *args):
    return anyio.run(main, *args, backend="asyncio",
                     backend_options={"loop_factory": WorkerEventLoop})


def watchdog(loop: asyncio.AbstractEventLoop, fired: list[bool]) -> None:
    """Stop ``loop`` in 5 s, noting it in ``fired``: a run that only this ends is a hang."""
    def stop() -> None:
        fired.append(True)
        loop.stop()

    loop.call_later(5, stop)


async def checkpoint() -> None:
    """One turn of the loop (asyncio's own idiom): what follows runs in a later step."""
    await asyncio.sleep(0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_child_tasks_exception_reaches_its_task_group_and_the_loop_goes_on(kind) -> None:
    async def child() -> None:
        raise kind

    async def main() -> str:
        with anyio.fail_after(5):
            with pytest.raises(BaseExceptionGroup) as info:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(child)
            assert [type(leaf) for leaf in info.value.exceptions] == [kind]
            await anyio.lowlevel.checkpoint()  # the loop runs on after the task's step
        return "went on"

    assert run(main) == "went on"


@pytest.mark.parametrize("kind", KINDS)
def test_an_awaited_tasks_exception_is_raised_where_it_is_awaited(kind) -> None:
    async def child() -> None:
        raise kind

    async def main() -> str:
        task = asyncio.create_task(child())
        with pytest.raises(kind):
            await asyncio.wait_for(task, 5)
        return "went on"

    assert run(main) == "went on"


def test_a_task_stepping_an_async_generator_keeps_its_exception_too() -> None:
    # The usual "next item, with a timeout": the task's first frame is the generator's own.
    async def items():
        await checkpoint()
        raise SystemExit(5)
        yield

    async def main() -> str:
        with pytest.raises(SystemExit):
            await asyncio.wait_for(items().__anext__(), 5)
        await checkpoint()
        return "went on"

    assert run(main) == "went on"


def test_a_pure_python_tasks_exception_stays_its_own_too() -> None:
    async def child() -> None:
        await checkpoint()
        raise SystemExit(5)

    async def main() -> str:
        asyncio.get_running_loop().set_task_factory(
            lambda loop, coro, **kwargs: asyncio.tasks._PyTask(coro, loop=loop, **kwargs))
        with pytest.raises(SystemExit):
            await asyncio.ensure_future(child())
        await checkpoint()
        return "went on"

    assert run(main) == "went on"


def test_an_abandoned_generators_cleanup_keeps_its_exception() -> None:
    # asyncio closes an async generator that nobody closed in a task of its own.
    async def items(closed: asyncio.Event):
        try:
            yield 1
            yield 2
        finally:
            closed.set()
            raise SystemExit(6)

    async def main() -> str:
        closed = asyncio.Event()
        iterator = items(closed)
        assert await iterator.__anext__() == 1
        del iterator  # (CPython frees it at once, and the loop schedules its aclose)
        await asyncio.wait_for(closed.wait(), 5)
        await checkpoint()  # the closing task's step, with its exit, is over
        return "went on"

    assert run(main) == "went on"
    import gc

    gc.collect()  # now: the closing task's unretrieved outcome is reported here, not later


def test_a_task_nobody_awaits_is_still_reported_as_asyncio_reports_it() -> None:
    # The outcome is read without retrieving it: "never retrieved" is still logged.
    reported: list[dict] = []

    async def child() -> None:
        raise SystemExit(7)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        task = asyncio.create_task(child())
        await asyncio.wait({task}, timeout=5)  # ended, its outcome not retrieved
        assert task.done()

    run(main)
    import gc

    gc.collect()
    assert [type(context.get("exception")) for context in reported] == [SystemExit]
    assert "never retrieved" in reported[0]["message"]


def _exit_from_python() -> None:
    sys.exit(8)


@pytest.mark.parametrize("how", ["sys.exit", "python", "done callback"])
def test_a_plain_callbacks_exit_still_ends_the_loop(how) -> None:
    # No task stored it: kept in the loop, it would be lost.
    code = {"sys.exit": 7, "python": 8, "done callback": 9}[how]

    async def main() -> str:
        loop = asyncio.get_running_loop()
        if how == "sys.exit":
            loop.call_soon(sys.exit, code)
        elif how == "python":
            loop.call_soon(_exit_from_python)
        else:
            future = loop.create_future()
            future.add_done_callback(lambda _: sys.exit(code))
            future.set_result(None)
        # Never set: only the callback's exit ends this (the bound fails the test otherwise).
        await asyncio.wait_for(asyncio.Event().wait(), 5)
        return "not ended"

    with pytest.raises(SystemExit) as info:
        run(main)
    assert info.value.code == code


@pytest.mark.parametrize("kind", KINDS)
def test_the_main_tasks_exception_ends_the_run(kind) -> None:
    # The worker's own start-up errors leave this way (exit status 1). asyncio stops the loop
    # for the main task's SystemExit only by raising it out of the loop: kept there, the run
    # would never end by itself.
    fired: list[bool] = []

    async def main() -> None:
        watchdog(asyncio.get_running_loop(), fired)
        await anyio.lowlevel.checkpoint()  # raised from a later step than the task's first
        raise kind(1)

    with pytest.raises(kind) as info:
        run(main)
    assert info.value.args == (1,)
    assert not fired  # the raise ended the run, not the watchdog


def test_a_coroutine_run_to_completion_directly_ends_it_too() -> None:
    async def main() -> None:
        await checkpoint()
        raise SystemExit(2)

    loop = WorkerEventLoop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda loop, context: reported.append(context))
    fired: list[bool] = []
    watchdog(loop, fired)
    try:
        with pytest.raises(SystemExit) as info:
            loop.run_until_complete(main())
        assert info.value.code == 2
        assert not fired
        del info  # its traceback holds the task
    finally:
        loop.close()
    import gc

    gc.collect()
    # Raised here, so retrieved: the task made for the coroutine is not reported as never
    # retrieved (asyncio's own loop does the same for the task it makes).
    assert reported == []


def test_the_hook_is_where_the_loop_expects_it() -> None:
    # Private to asyncio: on a Python that renamed it, workers fall back to the plain loop, and
    # this fails.
    from anywool.runtime.worker import _asyncio_loop

    assert "_run_once" in vars(asyncio.BaseEventLoop) and "_run" in vars(asyncio.Handle)
    assert "_callback" in asyncio.Handle.__slots__
    assert hasattr(asyncio.Future, "_exception") and hasattr(asyncio.tasks._PyTask, "_exception")
    assert _asyncio_loop.loop_factory is WorkerEventLoop
