"""Edges of dispatch: owned discovery given entered, oversize payloads, workers closing early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import anywool
from anywool import (
    LocalDiscovery,
    LocalWorker,
    PayloadTooLarge,
    WorkerPool,
    routine,
)
from anywool.runtime.client._call import CallNotDelivered
from anywool.runtime.client._connection import WorkerConnection
from anywool.runtime.wire._frames import FrameStream

from ..helpers import (
    call_payload,
    exception_of,
    follow,
    result_of,
    step_payload,
    take,
    wait_until,
    worker_frames,
)

pytestmark = pytest.mark.anyio


@routine
async def double(x: int) -> int:
    return 2 * x


@routine
async def blob(size: int) -> bytes:
    return b"x" * size


@routine
async def size_of(data: bytes) -> int:
    return len(data)


@routine
async def touch_at_once(path: str) -> None:
    Path(path).touch()  # before any checkpoint: it shows whether the routine started at all


async def test_pool_publishes_into_a_discovery_its_caller_already_owns(namespace):
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, anyio.create_task_group() as tg:
            events = await follow(tg, discovery.subscriber)
            async with WorkerPool(spawn=2, discovery=discovery) as pool:
                assert pool.discovery is discovery
                assert await double(21) == 42
                added = await take(events, 2)
                assert sorted(added) == sorted(("worker-added", w.metadata.uid) for w in pool.workers)
            dropped = await take(events, 2)
            assert sorted(dropped) == sorted(("worker-dropped", uid) for _, uid in added)
            assert discovery.claimed  # still the caller's: the pool neither entered nor exited it
            tg.cancel_scope.cancel()


async def test_oversize_arguments_fail_at_once_and_nothing_is_sent(namespace):
    with anyio.fail_after(30):
        async with LocalWorker() as worker, WorkerConnection(
            worker.metadata.address, max_frame_size=4096
        ) as connection:
            with pytest.raises(PayloadTooLarge) as info:
                await connection.call(double.__wrapped__, (b"x" * 10_000,), {})
            assert info.value.size > 10_000 and info.value.limit < 4096
            assert "double" in str(info.value)
            # The connection is intact for the next call.
            assert await connection.call(double.__wrapped__, (4,), {}) == 8


async def test_oversize_result_arrives_as_payload_too_large():
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            with pytest.raises(PayloadTooLarge) as info:
                await blob(65 * 1024 * 1024)
            assert "blob" in str(info.value)
            assert await double(1) == 2


async def test_a_worker_closing_before_accepting_means_not_delivered(runtime_dir):
    # A worker that stops between reading a call and acknowledging it never ran the routine:
    # the caller must be able to retry elsewhere.
    path = runtime_dir / "fake.sock"
    listener = await anyio.create_unix_listener(path)
    with anyio.fail_after(10):
        async with listener, anyio.create_task_group() as tg:

            async def accept_then_close() -> None:
                stream = await listener.accept()
                async with stream:
                    await FrameStream(stream, stream).receive()  # the CALL, then close

            tg.start_soon(accept_then_close)
            async with WorkerConnection(f"unix:{path}") as connection:
                with pytest.raises(CallNotDelivered):
                    await connection.call(double.__wrapped__, (1,), {})
    os.unlink(path)


@routine
async def pid_after_a_moment() -> int:
    await anyio.sleep(0.01)
    return os.getpid()


async def test_a_draining_worker_loses_no_call_under_load():
    # SIGINT asks a worker to drain: calls racing with its shutdown are refused or reported
    # "not delivered", and the balancer sends them to the other worker. None may fail.
    served: dict[int, int] = {}
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2) as pool:
            victim = pool.workers[0].metadata.pid

            halfway = anyio.Event()

            async def caller() -> None:
                for _ in range(100):
                    pid = await pid_after_a_moment()
                    served[pid] = served.get(pid, 0) + 1
                    if served.get(victim, 0) >= 50:
                        halfway.set()

            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(caller)
                await halfway.wait()  # the victim is busy serving: drain it now
                os.kill(victim, signal.SIGINT)
    assert sum(served.values()) == 1600


async def test_a_worker_refuses_to_listen_on_tcp_without_credentials():
    # Frames carry pickled code: an unauthenticated TCP listener would run anyone's code.
    env = {k: v for k, v in os.environ.items() if k != "ANYWOOL_SECRET"}
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, "-m", "anywool.worker", "--address", "127.0.0.1:0"],
            check=False, stdin=subprocess.DEVNULL, env=env,
        )
    assert result.returncode == 2  # a usage error
    assert b"without credentials" in result.stderr and result.stdout == b""


async def test_a_worker_told_to_stop_as_it_starts_exits_cleanly(anyio_backend, runtime_dir):
    # Its stdin is at its end from the start: the listener may close before the accepting task
    # first runs, which once failed the worker (exit 1, EBADF) about half the time.
    with anyio.fail_after(60):
        for _ in range(4):
            result = await anyio.run_process(
                [sys.executable, "-m", "anywool.worker", "--backend", anyio_backend],
                check=False, stdin=subprocess.DEVNULL)
            assert (result.returncode, b"Traceback" in result.stderr) == (0, False), \
                result.stderr.decode()
    assert list(runtime_dir.iterdir()) == []


# -- what a routine raises that is not an Exception ------------------------------------------


@routine
async def leave(kind: str) -> None:
    if kind == "exit":
        raise SystemExit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "group":
        raise BaseExceptionGroup("both", [ValueError("v"), SystemExit(4)])
    raise AssertionError(kind)


@routine
async def stray_cancellation() -> None:
    # Under asyncio: await a future that something else cancels. No cancel scope here asked for
    # it, so the CancelledError is the routine's own failure.
    import asyncio

    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(future.cancel)
    await future


@routine
async def gated_double(x: int, gate: str) -> int:
    # Says it is running, then waits for the test to let it finish: over a Unix socket, so
    # that "in flight" is a fact, not a guess about timing.
    async with await anyio.connect_unix(gate) as stream:
        await stream.send(b"running")
        await stream.receive()
    return 2 * x


@routine
async def never_returns(x: int) -> int:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


class _ExitsWhenPickled:
    def __reduce__(self):
        raise SystemExit("from __reduce__")


@routine
async def unpicklable_exit() -> object:
    return _ExitsWhenPickled()


@routine
async def raises_unpicklable_exit() -> None:
    error = ValueError("with a hostile attribute")
    error.hostile = _ExitsWhenPickled()  # type: ignore[attr-defined]
    raise error


@pytest.mark.parametrize("kind", ["exit", "interrupt", "group"])
async def test_a_base_exception_arrives_as_routine_aborted_and_the_worker_goes_on(kind):
    from anywool import RoutineAborted

    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            with pytest.raises(RoutineAborted) as info:
                await leave(kind)
            expected = {"exit": SystemExit, "interrupt": KeyboardInterrupt,
                        "group": BaseExceptionGroup}[kind]
            assert isinstance(info.value.__cause__, expected)
            assert info.value.kind == expected.__qualname__ and "leave" in info.value.routine
            assert await double(5) == 10  # same worker, same connection


@routine
async def leave_from_a_child(kind: str) -> None:
    async def child() -> None:
        raise SystemExit(5) if kind == "exit" else KeyboardInterrupt

    async with anyio.create_task_group() as tg:
        tg.start_soon(child)


@routine
async def pid() -> int:
    return os.getpid()


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
async def test_a_base_exception_in_a_routines_child_task_fails_only_that_call(kind, worker_pool):
    # asyncio also re-raises such an exception out of its event loop once the task has stored
    # it (CPython gh-102572), which would end the worker and every call on it.
    from anywool import RoutineAborted

    expected = SystemExit if kind == "exit" else KeyboardInterrupt
    with anyio.fail_after(60):
        async with worker_pool(spawn=1) as pool:
            (worker,) = pool.workers
            before = await pid()
            with pytest.raises(RoutineAborted) as info:
                await leave_from_a_child(kind)
            group = info.value.__cause__
            assert isinstance(group, BaseExceptionGroup)
            assert [type(leaf) for leaf in group.exceptions] == [expected]
            assert await pid() == before == worker.metadata.pid  # the same worker goes on
            assert pool.workers == [worker]


@routine
async def exits_when_closed(kind: str, mark: str):
    async def child() -> None:
        raise SystemExit(7)

    try:
        while True:
            yield 1
    finally:
        try:
            if kind == "exit":
                raise SystemExit(6)
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        finally:
            Path(mark).touch()  # in the step that raises on: the server has it next


@pytest.mark.parametrize("kind", ["exit", "child"])
async def test_a_stream_whose_cleanup_exits_when_the_worker_closes_it_fails_only_itself(
        kind, tmp_path, worker_pool):
    # The caller is cancelled between steps, so the worker closes the generator itself, where
    # no caller waits for what the close raises: it is logged, and the connection and the
    # worker go on.
    mark = tmp_path / "closed"
    with anyio.fail_after(60):
        async with worker_pool(spawn=1) as pool:
            before = await pid()
            with anyio.CancelScope() as scope:
                async with aclosing(exits_when_closed(kind, str(mark))) as items:
                    async for _ in items:
                        scope.cancel()
                        await anyio.lowlevel.checkpoint()
            await wait_until(mark.exists, "the worker closing the generator")
            assert [await pid(), await pid()] == [before, before]
            assert [w.metadata.pid for w in pool.workers] == [before]


def _interrupt() -> None:
    raise KeyboardInterrupt


class InterruptsWhenUnpickled:
    def __reduce__(self):
        return (_interrupt, ())


@routine
async def echo_sent():
    value = None
    while True:
        value = yield value


@pytest.mark.parametrize("where", ["argument", "sent value"])
async def test_a_value_whose_unpickling_interrupts_fails_only_its_call(where, worker_pool):
    # A worker takes SIGINT as a drain request: a KeyboardInterrupt there is a value's doing.
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            before = await pid()
            with pytest.raises(anywool.SerializationError, match="KeyboardInterrupt"):
                if where == "argument":
                    await double(InterruptsWhenUnpickled())
                else:
                    async with aclosing(echo_sent()) as stream:
                        assert await stream.__anext__() is None
                        await stream.asend(InterruptsWhenUnpickled())
            assert [await pid(), await double(2)] == [before, 4]


async def test_a_stray_cancellation_fails_only_its_own_call(anyio_backend, tmp_path):
    if anyio_backend != "asyncio":
        pytest.skip("a stray CancelledError is an asyncio matter")
    from anywool import RoutineAborted

    gate = str(tmp_path / "gate.sock")  # (short enough for sun_path under pytest's tmp)
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1), await anyio.create_unix_listener(gate) as listener:
            results: list[object] = []

            async def other() -> None:
                results.append(await gated_double(21, gate))

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                async with await listener.accept() as held:
                    assert await held.receive() == b"running"  # the other call is in flight
                    with pytest.raises(RoutineAborted) as info:
                        await stray_cancellation()
                    await held.send(b"go on")
            assert info.value.kind == "CancelledError"
            assert results == [42]  # the unrelated call on the same worker was not touched
            assert await double(1) == 2


async def test_values_whose_pickling_exits_fail_the_call_and_the_worker_survives():
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            with pytest.raises(TypeError, match="cannot be pickled.*SystemExit"):
                await unpicklable_exit()
            with pytest.warns(Warning):  # a degraded copy of the exception
                with pytest.raises(ValueError, match="hostile"):
                    await raises_unpicklable_exit()
            assert await double(3) == 6


@routine
async def fails_in_a_task_group() -> None:
    async def fail(error: Exception) -> None:
        raise error

    async with anyio.create_task_group() as tg:
        tg.start_soon(fail, ValueError("one"))
        tg.start_soon(fail, KeyError("two"))


@routine
async def fails_with_a_chain() -> None:
    try:
        raise LookupError("the context")
    except LookupError:
        raise RuntimeError("outer") from KeyError("the cause")


async def test_a_task_groups_exception_group_arrives_whole_on_both_backends():
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            with pytest.raises(ExceptionGroup) as info:
                await fails_in_a_task_group()
            leaves = sorted((type(e).__name__, str(e)) for e in info.value.exceptions)
            assert leaves == [("KeyError", "'two'"), ("ValueError", "one")]
            with pytest.raises(RuntimeError, match="outer") as chained:
                await fails_with_a_chain()
            assert repr(chained.value.__cause__) == "KeyError('the cause')"
            assert repr(chained.value.__context__) == "LookupError('the context')"


# -- frames a call cannot use ------------------------------------------------------------------


async def _raw_call(address: str, fn, args: tuple = ()):
    from anywool.runtime.wire._frames import Frame, Kind

    stream = await anyio.connect_unix(address.removeprefix("unix:"))
    frames = await worker_frames(stream)
    await frames.send(Frame(Kind.CALL, 1, call_payload(fn, args)))
    assert (await frames.receive()).kind == Kind.ACK
    return stream, frames


@routine
async def slow_steps(n: int):
    await anyio.sleep_forever()  # the first step never ends: step frames pile up meanwhile
    yield n


@pytest.mark.parametrize("routine_kind", ["coroutine", "generator"])
async def test_step_frames_a_call_cannot_use_end_that_call_only(routine_kind):
    # A coroutine takes no step frames; a generator takes one at a time. Anything more is a
    # protocol error that ends the call (nothing queues up), and the connection goes on.
    from anywool.runtime.wire._frames import Frame, FrameError, Kind

    with anyio.fail_after(30):
        async with LocalWorker() as worker:
            fn = never_returns.__wrapped__ if routine_kind == "coroutine" else slow_steps.__wrapped__
            stream, frames = await _raw_call(worker.metadata.address, fn, (3,))
            async with stream:
                # A generator runs its first step and can hold one more; the rest are errors.
                await frames.send(Frame(Kind.ASEND, 1, step_payload()))
                big = step_payload(b"x" * (1 << 20))
                for _ in range(4):
                    await frames.send(Frame(Kind.ASEND, 1, big))
                replies = []
                while not replies or replies[-1].kind not in (Kind.EXCEPTION, Kind.END):
                    replies.append(await frames.receive())
                error = exception_of(replies[-1].payload)
                assert isinstance(error, FrameError) and "the call was ended" in str(error)
                # The same connection serves the next call.
                await frames.send(Frame(Kind.CALL, 2, call_payload(double.__wrapped__, (4,))))
                kinds = []
                while not kinds or kinds[-1] != Kind.RETURN:
                    frame = await frames.receive()
                    if frame.call_id == 2:
                        kinds.append(frame.kind)
                        if frame.kind == Kind.RETURN:
                            assert result_of(frame.payload) == 8
                assert kinds == [Kind.ACK, Kind.RETURN]


@pytest.mark.parametrize("body", [
    # CALLs whose headers declare ~4 GiB of bytes, or 2^32 - 1 fields, in a few bytes
    b"\x01" + (1 << 36).to_bytes(8, "big") + b"\xc6\xff\xff\xff\xf0" + b"xx",
    b"\x01" + (2).to_bytes(8, "big") + b"\xdd\xff\xff\xff\xff\x01",
    b"\xff" + bytes(8),  # an unknown kind
    b"\x01\x00",  # shorter than a kind and a call id
])
async def test_hostile_frame_bodies_drop_that_connection_only(body):
    import struct

    import psutil

    with anyio.fail_after(30):
        async with LocalWorker() as worker, WorkerConnection(worker.metadata.address) as good:
            process = psutil.Process(worker.metadata.pid)
            before = process.memory_info().rss
            stream = await anyio.connect_unix(worker.metadata.address.removeprefix("unix:"))
            async with stream:
                await stream.send(struct.pack(">I", len(body)) + body)
                # Either the frame is refused (the connection is dropped) or it is a harmless
                # frame for an unknown call (ignored); the worker never grows to fit a length.
                with anyio.move_on_after(1):
                    try:
                        await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        pass
            assert await good.call(double.__wrapped__, (21,), {}) == 42
            assert process.memory_info().rss - before < 64 << 20


_CALLS_IN_A_CHILD = """
import sys, anyio
from anywool import LocalWorker
from anywool.lowlevel import WorkerConnection

async def twice(x):
    return 2 * x

async def main():
    async with LocalWorker() as worker, WorkerConnection(worker.metadata.address) as connection:
        for i in range(5):
            assert await connection.call(twice, (i,), {}) == 2 * i

anyio.run(main, backend=sys.argv[1])
"""


async def test_calls_leave_no_resource_warning_in_client_or_worker(anyio_backend):
    # The worker inherits the child's stderr and its PYTHONWARNINGS: both ends report there.
    env = {**os.environ, "PYTHONWARNINGS": "always::ResourceWarning"}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, "-c", _CALLS_IN_A_CHILD, anyio_backend], env=env, check=False)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "ResourceWarning" not in stderr and "Traceback" not in stderr, stderr


# -- deadlines that travel -----------------------------------------------------------------------


@routine
async def sleep_and_note(path: str) -> float:
    import pathlib
    import time

    deadline = anyio.current_effective_deadline() - anyio.current_time()
    try:
        await anyio.sleep(30)
    finally:
        pathlib.Path(path).write_text(str(time.monotonic()))
    return deadline


@routine
async def seconds_left() -> float:
    return anyio.current_effective_deadline() - anyio.current_time()


async def test_the_callers_deadline_travels_with_the_call(tmp_path, monkeypatch):
    from anywool.runtime.client._call import Call

    async def cancel_frame_lost(self) -> None:  # as if the CANCEL frame never arrived
        self.finished = True

    marker = tmp_path / "finally-ran"
    with anyio.fail_after(30):
        async with LocalWorker() as worker, WorkerConnection(worker.metadata.address) as connection:
            with anyio.move_on_after(5):
                left = await connection.call(seconds_left.__wrapped__, (), {})
            assert 3 < left <= 5  # the worker sees what remains of the caller's deadline
            with anyio.CancelScope(shield=True):  # no deadline here: none travels
                assert await connection.call(seconds_left.__wrapped__, (), {}) == float("inf")
            monkeypatch.setattr(Call, "abort", cancel_frame_lost)
            with anyio.move_on_after(0.3) as scope:
                await connection.call(sleep_and_note.__wrapped__, (str(marker),), {})
            assert scope.cancelled_caught
            # No cancel frame: the worker ended the routine at the deadline by itself.
            await wait_until(marker.exists, "the routine's finally on the worker", timeout=5)


@routine
async def who_am_i() -> tuple:
    task = anywool.current_task()
    return task.id, task.caller_id, task.name, task.deadline - anyio.current_time()


@routine
async def who_am_i_per_step():
    for _ in range(2):
        yield anywool.current_task().name, anyio.current_effective_deadline() - anyio.current_time()


async def test_current_task_describes_the_call_on_its_worker():
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            first = await who_am_i()
            second = await who_am_i()
            assert first[0] != second[0]  # each call has its own id
            assert first[1] is None and first[2].endswith("who_am_i")
            assert 0 < first[3] <= 60  # the caller's deadline, as the worker's clock has it
            with anyio.CancelScope(shield=True):  # no deadline travels from here
                assert (await who_am_i())[3] == float("inf")
            steps = [step async for step in who_am_i_per_step()]
            names = [name for name, _ in steps]
            assert names == [names[0]] * 2 and names[0].endswith("who_am_i_per_step")
            # Each step runs under the deadline in effect where it is awaited.
            assert all(0 < left <= 60 for _, left in steps), steps
    with pytest.raises(RuntimeError, match="inside a routine"):
        anywool.current_task()


# -- values that cannot cross ----------------------------------------------------------------


class _LoadsOnlyWhereItWasMade:
    """Pickles anywhere; unpickling fails in any process but the one that made it."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __reduce__(self):
        if os.getpid() == self.pid:
            return (_refuse_to_load_elsewhere, (self.pid,))
        return (_LoadsOnlyWhereItWasMade, ())


def _refuse_to_load_elsewhere(pid: int) -> object:
    if os.getpid() != pid:
        raise ValueError("refused to load in another process")
    return _LoadsOnlyWhereItWasMade()


@routine
async def echo(value: object) -> object:
    return value


@routine
async def make_unloadable_here() -> object:
    return _LoadsOnlyWhereItWasMade()


@routine
async def yields_a_lock():
    import threading

    yield 1
    yield threading.Lock()


async def test_values_that_cannot_cross_fail_typed_on_the_side_that_fails() -> None:
    import threading

    from anywool import SerializationError

    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            # An argument that cannot be pickled: the caller fails, nothing is sent.
            with pytest.raises(SerializationError, match="the arguments cannot be pickled") \
                    as info:
                await echo(threading.Lock())
            assert info.value.routine.endswith("echo") and isinstance(info.value, TypeError)
            # One that pickles here but cannot be unpickled on the worker.
            with pytest.raises(SerializationError, match="cannot be unpickled on worker"):
                await echo(_LoadsOnlyWhereItWasMade())
            # A result the worker made that cannot be unpickled here.
            with pytest.raises(SerializationError, match="cannot be unpickled from worker") \
                    as info:
                await make_unloadable_here()
            assert info.value.routine.endswith("make_unloadable_here")
            # A yielded item that cannot be pickled on the worker, after one that can.
            agen = yields_a_lock()
            assert await agen.__anext__() == 1
            with pytest.raises(SerializationError, match="the item it yielded cannot be pickled"):
                await agen.__anext__()
            # A value sent into a generator that cannot be pickled.
            agen = yields_a_lock()
            assert await agen.__anext__() == 1
            with pytest.raises(SerializationError, match="the value sent to it"):
                await agen.asend(threading.Lock())
            await agen.aclose()
            assert await double(8) == 16  # the same worker and connection go on


BIG = anywool.ContextVar("tests.integration.dispatch_edges.big", default=b"")


@routine
async def sets_big_then_ends(size: int):
    yield 1
    BIG.set(b"c" * size)


@routine
async def sets_big_then_raises(size: int) -> None:
    BIG.set(b"c" * size)
    raise KeyError("small")


@routine
async def takes_a_step():
    while True:
        yield (yield)


async def test_replies_and_steps_too_large_for_a_frame_fail_that_call_only() -> None:
    size = 65 * 1024 * 1024
    with anyio.fail_after(120):
        async with WorkerPool(spawn=1):
            # A generator's end carrying context changes too large for a frame.
            agen = sets_big_then_ends(size)
            assert await agen.__anext__() == 1
            with pytest.raises(PayloadTooLarge, match="context-variable values"):
                await agen.__anext__()
            assert BIG.get() == b""
            # An exception carrying them keeps its type; the changes are dropped, with a note.
            with pytest.raises(KeyError, match="small") as info:
                await sets_big_then_raises(size)
            assert any("do not fit one frame" in note for note in info.value.__notes__)
            # A value sent into a generator that is too large for a frame: refused here.
            agen = takes_a_step()
            await agen.__anext__()
            with pytest.raises(PayloadTooLarge, match="takes_a_step"):
                await agen.asend(b"s" * size)
            assert await double(2) == 4  # the worker survived every one


async def test_what_fits_a_frame_does_not_depend_on_the_origin_having_travelled():
    # The origin's pickle travels with a connection's first calls only; the size limit is
    # judged as if it always did, so a call fits or not whatever connection it is sent on.
    from anywool.errors import PayloadTooLarge

    origin = (b"k" * 16, b"p" * 600)
    limit = 4096
    with anyio.fail_after(30):
        async with anywool.LocalWorker() as worker, WorkerConnection(
                worker.address, max_frame_size=limit, origin=lambda: origin) as connection:
            assert await connection.call(double.__wrapped__, (2,), {}) == 4  # origin delivered
            outcomes = []
            for _ in range(2):
                for size in (limit - 2000, limit - 1000):  # fits with the origin; only without
                    try:
                        await connection.call(size_of.__wrapped__, (b"x" * size,), {})
                        outcomes.append((size, "sent"))
                    except PayloadTooLarge:
                        outcomes.append((size, "too large"))
    assert outcomes == [(limit - 2000, "sent"), (limit - 1000, "too large")] * 2


async def test_a_call_made_in_a_cancelled_scope_writes_nothing(tmp_path):
    # A frame the socket takes at once is written without waiting, but never by a cancelled
    # caller: the call raises its cancellation first, and its routine never starts.
    with anyio.fail_after(30):
        async with anywool.LocalWorker() as worker, \
                WorkerConnection(worker.address) as connection:
            for index in range(50):
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await connection.call(touch_at_once.__wrapped__,
                                          (str(tmp_path / str(index)),), {})
                assert scope.cancelled_caught
            assert (await connection.stats()).served == 0  # never admitted, let alone started
            await connection.call(touch_at_once.__wrapped__, (str(tmp_path / "after"),), {})
    assert [p.name for p in tmp_path.iterdir()] == ["after"]  # the connection still works


@routine
async def count_up(n: int):
    for i in range(n):
        yield i


async def test_a_generator_opened_in_a_cancelled_scope_writes_nothing():
    # As a coroutine's call, but a generator's first frame waits for the worker's answer: a
    # CALL frame written by a cancelled caller would be admitted (and counted) on the worker.
    with anyio.fail_after(30):
        async with anywool.LocalWorker() as worker, \
                WorkerConnection(worker.address) as connection:
            for _ in range(20):
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await connection.stream(count_up.__wrapped__, (3,), {})
                assert scope.cancelled_caught
            stats = await connection.stats()
    assert stats.served == 0 and stats.in_flight == 0
