"""The asyncio worker's event loop (asyncio only, so these tests run their own loop)."""

from __future__ import annotations

import asyncio
import sys

import anyio
import pytest

from anywool.runtime._asyncio_loop import WorkerEventLoop

KINDS = [SystemExit, KeyboardInterrupt]


def run(main, *args):
    return anyio.run(main, *args, backend="asyncio",
                     backend_options={"loop_factory": WorkerEventLoop})


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
            await anyio.sleep(0)  # the loop runs on after the task's step
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


def _exit_from_python() -> None:
    sys.exit(8)


@pytest.mark.parametrize("callback, code", [(sys.exit, 7), (_exit_from_python, 8)])
def test_a_plain_callbacks_exit_still_ends_the_loop(callback, code) -> None:
    # No task stored it: kept in the loop, it would be lost.
    async def main() -> str:
        asyncio.get_running_loop().call_soon(callback, *(() if code == 8 else (code,)))
        await asyncio.sleep(5)
        return "not ended"

    with pytest.raises(SystemExit) as info:
        run(main)
    assert info.value.code == code


@pytest.mark.parametrize("kind", KINDS)
def test_the_main_tasks_exception_ends_the_run(kind) -> None:
    # The worker's own start-up errors leave this way (exit status 1). asyncio stops the loop
    # for the main task's SystemExit only by raising it out of the loop: kept there, the run
    # would never end (the suite's timeout would fail this test).
    async def main() -> None:
        await anyio.sleep(0)
        raise kind(1)

    with pytest.raises(kind) as info:
        run(main)
    assert info.value.args == (1,)


def test_a_coroutine_run_to_completion_directly_ends_it_too() -> None:
    async def main() -> None:
        await asyncio.sleep(0)
        raise SystemExit(2)

    loop = WorkerEventLoop()
    try:
        with pytest.raises(SystemExit) as info:
            loop.run_until_complete(main())
        assert info.value.code == 2
    finally:
        loop.close()


def test_the_hook_is_where_the_loop_expects_it() -> None:
    # Private to asyncio: on a Python that renamed it, workers fall back to the plain loop, and
    # this fails.
    from anywool.runtime import _asyncio_loop

    assert "_run_once" in vars(asyncio.BaseEventLoop) and "_run" in vars(asyncio.Handle)
    assert _asyncio_loop.loop_factory is WorkerEventLoop
