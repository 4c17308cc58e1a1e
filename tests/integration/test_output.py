"""Worker output at the caller: what routines log and print, emitted by the caller's logging
and ``on_output`` when the call returns (issue 23, item 1)."""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import anyio.to_thread
import pytest

from anywool import LocalWorker, OutputLine, WorkerPool, WorkerProxy, routine
from anywool.discovery.local import LocalDiscovery
from anywool.lowlevel import WorkerConnection
from anywool.runtime import _output
from anywool.runtime.client._call import drive_stream
from anywool.runtime.wire._frames import Frame, Kind

from ..helpers import Records
from .children import stop
from .test_worker_command import host

pytestmark = pytest.mark.anyio

LOGGER = "tests.output.worker"
log = logging.getLogger(LOGGER)


@pytest.fixture
def records() -> Iterator[Records]:
    """What the caller's ``tests.output.worker`` logger handles (at INFO), and what
    ``anywool.output`` says."""
    handler = Records()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    said = logging.getLogger("anywool.output")
    said.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        said.removeHandler(handler)


@routine
async def chatty(n: int) -> tuple[int, float]:
    started = time.time()
    log.info("hello %d", n)
    log.debug("debug %d", n)
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("it failed")
    return os.getpid(), started


@routine
async def prints() -> int:
    print("one")
    sys.stdout.write("two\nthree")  # the last line is partial: sent as the call ends
    print("err", end="", file=sys.stderr)
    return os.getpid()


@routine
async def from_a_thread() -> None:
    def work() -> None:
        log.warning("from a thread")
        print("printed in a thread")

    await anyio.to_thread.run_sync(work)


@routine
async def inner() -> int:
    log.info("inner logs")
    print("inner prints")
    return os.getpid()


@routine
async def outer() -> tuple[int, int]:
    log.info("outer logs")
    return os.getpid(), await inner()


@routine
async def items(n: int) -> AsyncIterator[int]:
    for i in range(n):
        log.info("item %d", i)
        yield i


@routine
async def flood(lines: int, width: int) -> None:
    for i in range(lines):  # never yields: the forwarder cannot send before the reply
        log.info("%d %s", i, "x" * width)


@routine
async def marked(marker: str) -> None:
    print(f"{marker} printed")
    log.warning("%s warned", marker)
    log.info("%s informed", marker)


@routine
async def logs_then_raises() -> None:
    log.warning("about to fail")
    raise ValueError("failed")


@routine
async def talks_then_waits(text: str, in_a_thread: bool) -> None:
    if in_a_thread:
        await anyio.to_thread.run_sync(print, text)  # the loop is woken from there
    else:
        print(text)
    await anyio.sleep_forever()  # runs until its caller cancels it: the line must come first


@routine
async def huge_line() -> None:
    print("y" * (_output.PENDING_BYTES_AT_MOST + 1000))  # cut: not dropped as too large


class Unprintable:
    """Neither ``str()`` nor ``repr()`` works."""

    def __str__(self) -> str:
        raise RuntimeError("no str()")

    def __repr__(self) -> str:
        raise RuntimeError("no repr()")


@routine
async def logs_the_unprintable() -> str:
    log.warning(Unprintable())  # logging itself never raises here: nor may the capture
    log.warning("%s", Unprintable())
    return "logged"


async def test_a_message_that_cannot_be_formatted_is_said_and_raises_nothing(
        records: Records) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            assert await logs_the_unprintable() == "logged"
    first, second = records.messages()
    assert re.fullmatch(r"<tests\.integration\.test_output\.Unprintable object at 0x[0-9a-f]+> "
                        r"\(formatting it failed: builtins\.RuntimeError\)", first), first
    assert second == "'%s' (formatting its arguments failed: RuntimeError('no str()'))"


class Finalized:
    """Says so when collected, as asyncio's "Task was destroyed but it is pending!" does."""

    def __del__(self) -> None:
        log.warning("finalized")


@routine
async def makes_cyclic_garbage(n: int) -> int:
    import gc

    threshold = gc.get_threshold()
    try:
        for step in (10, 100, 700):  # collections at other allocations each time
            gc.set_threshold(step)
            for i in range(n):
                garbage = Finalized()
                garbage.itself = garbage  # type: ignore[attr-defined]
                del garbage
                print("line", i)
        gc.collect()
    finally:
        gc.set_threshold(*threshold)
    return os.getpid()


async def test_a_finalizer_that_logs_during_output_does_not_deadlock(records: Records) -> None:
    # A collection runs finalizers at whatever allocation triggers it, also one made while
    # the capture holds its lock, in the same thread and the call's context: the finalizer's
    # record must not wait for that lock (the worker hung, and was killed as stuck).
    lines: list[OutputLine] = []
    with anyio.fail_after(20):
        async with WorkerPool(spawn=1, on_output=lines.append):
            assert isinstance(await makes_cyclic_garbage(300), int)
    assert [line.text for line in lines] == [f"line {i}" for i in range(300)] * 3
    # Finalizers run where a collection happens: mostly in the call (forwarded), sometimes in
    # another of the worker's threads (its stderr, as any output outside a call).
    assert set(records.messages()) == {"finalized"}


@routine
async def root_level() -> int:
    return logging.getLogger().level


async def test_records_arrive_with_the_worker_and_the_call_at_the_callers_levels(
        records: Records) -> None:
    # Another logger of the caller lets DEBUG through: so do the workers spawned from now on.
    logging.getLogger("tests.output.other").setLevel(logging.DEBUG)
    try:
        await _records_arrive_with_the_worker_and_the_call_at_the_callers_levels(records)
    finally:
        logging.getLogger("tests.output.other").setLevel(logging.NOTSET)


async def _records_arrive_with_the_worker_and_the_call_at_the_callers_levels(
        records: Records) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1) as pool:
            assert await root_level() == _output.lowest_level() <= logging.DEBUG
            pid, started = await chatty(7)
            [worker] = pool.workers
            # Emitted by the time the call returned; DEBUG is below the caller's level.
            assert records.messages() == ["hello 7", "it failed"]
            hello, failed = records.records
            assert (hello.name, hello.levelno, hello.levelname) == (LOGGER, logging.INFO,
                                                                    "INFO")
            assert hello.anywool_worker == str(worker.metadata.uid)  # type: ignore[attr-defined]
            assert hello.anywool_address == worker.address  # type: ignore[attr-defined]
            assert hello.anywool_pid == hello.process == pid  # type: ignore[attr-defined]
            assert hello.anywool_routine == "chatty"  # type: ignore[attr-defined]
            assert isinstance(hello.anywool_task, int)  # type: ignore[attr-defined]
            assert started <= hello.created <= time.time()  # the worker's time
            assert hello.funcName == "chatty" and hello.pathname == __file__
            assert failed.levelno == logging.ERROR
            assert failed.exc_text is not None and failed.exc_text.startswith("Traceback")
            assert "ZeroDivisionError: division by zero" in failed.exc_text
            formatted = logging.Formatter("%(message)s").format(failed)
            assert formatted.startswith("it failed\nTraceback")

            records.records.clear()
            logging.getLogger(LOGGER).setLevel(logging.DEBUG)
            await chatty(1)
            assert records.messages() == ["hello 1", "debug 1", "it failed"]
            records.records.clear()
            logging.getLogger(LOGGER).setLevel(logging.ERROR)
            await chatty(2)
            assert records.messages() == ["it failed"]

            records.records.clear()
            logging.getLogger(LOGGER).setLevel(logging.INFO)
            await from_a_thread()  # anyio.to_thread copies the call's context
            assert records.messages() == ["from a thread"]
            assert records.records[0].anywool_routine == "from_a_thread"  # type: ignore[attr-defined]

            records.records.clear()
            with pytest.raises(ValueError, match="failed"):
                await logs_then_raises()
            assert records.messages() == ["about to fail"]  # sent before the exception

            records.records.clear()
            async for i in items(3):
                assert records.messages()[-1] == f"item {i}"  # sent before the item
            assert records.messages() == ["item 0", "item 1", "item 2"]


async def test_a_calls_output_precedes_each_of_its_replies_on_the_stream() -> None:
    # What "emitted by the time the call returns" rests on, seen on the wire: the frames as the
    # connection's reader routes them (a record sent just after the reply could still be
    # emitted before the caller resumes, when both arrive in one read).
    routed: list[Kind] = []
    ends = {Kind.OUTPUT, Kind.RETURN, Kind.EXCEPTION, Kind.RESULT, Kind.END}
    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            connection = WorkerConnection(worker.address, output=_output.Output())
            route = connection._route

            def recording(frame: Frame) -> None:
                if frame.kind in ends:
                    routed.append(frame.kind)
                route(frame)

            connection._route = recording  # type: ignore[method-assign]
            async with connection:
                await connection.call(chatty, (1,), {})
                assert routed == [Kind.OUTPUT, Kind.RETURN]
                routed.clear()
                with pytest.raises(ValueError):
                    await connection.call(logs_then_raises, (), {})
                assert routed == [Kind.OUTPUT, Kind.EXCEPTION]
                routed.clear()
                assert [i async for i in drive_stream(
                    lambda: connection.stream(items, (2,), {}))] == [0, 1]
                assert routed == [Kind.OUTPUT, Kind.RESULT, Kind.OUTPUT, Kind.RESULT, Kind.END]


async def test_lines_arrive_whole_and_the_partial_last_one_at_the_end() -> None:
    lines: list[OutputLine] = []
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, on_output=lines.append) as pool:
            pid = await prints()
            [worker] = pool.workers
            assert [(line.stream, line.text) for line in lines] == [
                ("stdout", "one"), ("stdout", "two"), ("stdout", "three"), ("stderr", "err")]
            line = lines[0]
            assert (line.worker, line.address, line.pid, line.routine) == (
                str(worker.metadata.uid), worker.address, pid, "prints")
            assert line.task == lines[-1].task and isinstance(line.created, float)

            lines.clear()
            await from_a_thread()
            assert [line.text for line in lines] == ["printed in a thread"]

            lines.clear()
            await huge_line()  # cut, and marked
            [line] = lines
            assert line.text == "y" * _output.TEXT_AT_MOST + _output.CUT_MARK.format(
                _output.TEXT_AT_MOST)


async def test_output_arrives_while_the_call_runs() -> None:
    arrived: list[str] = []
    changed = anyio.Event()

    def on_output(line: OutputLine) -> None:
        nonlocal changed
        arrived.append(line.text)
        changed.set()
        changed = anyio.Event()

    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, on_output=on_output):
            # The first call starts the forwarder's task, which finds the line waiting; the
            # others wake it.
            for text, in_a_thread in (("first", False), ("from the loop", False),
                                      ("from a thread", True)):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(talks_then_waits, text, in_a_thread)
                    while text not in arrived:
                        await changed.wait()
                    tg.cancel_scope.cancel()
    assert arrived == ["first", "from the loop", "from a thread"]


async def test_lines_go_to_the_callers_stderr_by_default_and_only_there(
        capfd: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1) as pool:
            pid = await prints()
            await marked("dup1")
            uid = str(pool.workers[0].metadata.uid)
    err = capfd.readouterr().err  # the workers' stderr is this process's too
    prefix = f"[prints {uid[:8]} pid {pid}] "
    for text in ("one", "two", "three", "err"):
        assert f"{prefix}{text}\n" in err
    # Not also on the worker's own stderr: neither the lines nor the records.
    assert err.count("one") == 1 and err.count("dup1 printed") == 1
    assert "dup1 warned" not in err


async def test_forward_output_false_leaves_it_on_the_workers_stderr(
        records: Records, capfd: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, forward_output=False):
            await marked("m4rk")
    assert records.records == []
    err = capfd.readouterr().err
    assert "m4rk printed\n" in err
    assert re.search(r"anywool\.worker\[\d+\] m4rk warned\n", err)
    assert "m4rk informed" not in err  # below the worker's WARNING, as ever


async def test_a_worker_passes_what_the_callers_logging_lets_through_when_it_starts(
        records: Records) -> None:
    # The caller's lowest level (INFO: the records fixture's logger; the root is at WARNING)
    # is the spawned worker's root level: a DEBUG record costs the worker a level check only.
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            assert await root_level() == logging.INFO
            logging.getLogger(LOGGER).setLevel(logging.DEBUG)  # later: not seen by the worker
            await chatty(5)
            assert records.messages() == ["hello 5", "it failed"]
        async with WorkerPool(spawn=1, forward_output=False):
            assert await root_level() == logging.WARNING  # its own: nothing is forwarded


async def test_nested_calls_reach_the_outermost_caller_with_the_innermost_worker(
        records: Records) -> None:
    lines: list[OutputLine] = []
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2, on_output=lines.append) as pool:
            outer_pid, inner_pid = await outer()
            uids = {worker.pid: str(worker.metadata.uid) for worker in pool.workers}
    assert records.messages() == ["outer logs", "inner logs"]
    first, second = records.records
    assert (first.anywool_routine, first.anywool_pid) == ("outer", outer_pid)  # type: ignore[attr-defined]
    assert (second.anywool_routine, second.anywool_pid) == ("inner", inner_pid)  # type: ignore[attr-defined]
    assert second.anywool_worker == uids[inner_pid]  # type: ignore[attr-defined]
    [line] = lines
    assert (line.text, line.routine, line.pid, line.worker) == (
        "inner prints", "inner", inner_pid, uids[inner_pid])


async def test_a_flood_is_bounded_and_its_drops_said_once(records: Records) -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            # By count: 4096 entries wait at most.
            await flood(_output.PENDING_AT_MOST + 1000, 1)
            assert len([r for r in records.records if r.name == LOGGER]) == \
                _output.PENDING_AT_MOST
            [said] = [r for r in records.records if r.name == "anywool.output"]
            assert said.levelno == logging.WARNING
            assert said.getMessage().startswith("1000 lines of output of flood (task ")
            records.records.clear()
            # By bytes: 1 MiB waits at most (a record's text and 64 bytes).
            await flood(2000, 1000)
            kept = total = 0
            for i in range(2000):  # a record counts its message and _ENTRY_COST bytes
                size = len(f"{i} ") + 1000 + _output._ENTRY_COST
                if total + size > _output.PENDING_BYTES_AT_MOST:
                    break
                kept, total = kept + 1, total + size
            assert len([r for r in records.records if r.name == LOGGER]) == kept < 2000
            [said] = [r for r in records.records if r.name == "anywool.output"]
            assert said.getMessage().startswith(f"{2000 - kept} lines of output of flood")


async def test_a_failing_on_output_is_logged_once_and_fails_no_call(records: Records) -> None:
    def broken(line: OutputLine) -> None:
        raise RuntimeError("no")

    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, on_output=broken):
            assert isinstance(await prints(), int)
            await prints()
    [said] = records.records
    assert said.levelno == logging.ERROR and "said once" in said.getMessage()


async def test_an_anywool_worker_host_forwards_to_the_calling_pool(
        records: Records, namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--workers", "1", "--backend", anyio_backend)
        try:
            [hosted] = [re.fullmatch(r"worker (unix:/\S+) pid (\d+)", line) for line in lines]
            assert hosted is not None
            async with WorkerProxy(LocalDiscovery.Subscriber(namespace)):
                pid, _ = await chatty(3)
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])
    assert pid == int(hosted[2])
    assert records.messages() == ["hello 3", "it failed"]
    assert records.records[0].anywool_pid == pid  # type: ignore[attr-defined]
    assert records.records[0].anywool_address == hosted[1]  # type: ignore[attr-defined]


def test_the_options_are_checked() -> None:
    with pytest.raises(TypeError, match="forward_output must be a bool"):
        WorkerPool(spawn=1, forward_output=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_output must be a callable"):
        WorkerPool(spawn=1, on_output="stderr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_output is never called"):
        WorkerPool(spawn=1, forward_output=False, on_output=print)

    async def shows(line: OutputLine) -> None:  # its coroutines would never be awaited
        pass

    with pytest.raises(TypeError, match="must be a plain function, got the coroutine"):
        WorkerPool(spawn=1, on_output=shows)
    with pytest.raises(TypeError, match="must be a plain function, got the coroutine"):
        WorkerProxy("ns", on_output=functools.partial(shows))
    with pytest.raises(TypeError, match="forward_output must be a bool"):
        WorkerProxy("ns", forward_output=None)  # type: ignore[arg-type]
