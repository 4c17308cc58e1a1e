"""Data-heavy calls (issue 20): large arguments, results, yielded items and context values
cross byte for byte, the frame size limit holds on both sides of its edge, and a large frame
neither corrupts a connection when its sender is cancelled nor hides a cancel behind it."""

from __future__ import annotations

import hashlib
import pickle
import random
import socket
import time

import anyio
import pytest

import anywool
from anywool import routine
from anywool.errors import PayloadTooLarge
from anywool.lowlevel import WorkerConnection
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._pool import WorkerPool
from anywool.runtime.wire import _envelope, _serializer
from anywool.runtime.wire._frames import payload_limit

from ..helpers import Signal, wait_until

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
DATA = anywool.ContextVar("tests.integration.payloads.data", default=b"")


@pytest.fixture(autouse=True)
async def _unset_afterwards():
    yield
    from anywool.runtime import _context

    _context.apply(None)


class Blob:
    """A holder of bytes that pickles them as a PickleBuffer (out of band), as NumPy does."""

    def __init__(self, data: object) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: int) -> tuple[object, ...]:
        if protocol >= 5:
            return _blob_from, (pickle.PickleBuffer(self.data),)  # type: ignore[arg-type]
        return _blob_from, (bytes(self.data),)  # type: ignore[call-overload]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and bytes(self.data) == bytes(other.data)  # type: ignore[call-overload]


def _blob_from(buffer: object) -> Blob:
    return Blob(buffer)


def _random(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def _digest(value: object) -> tuple[str, str]:
    data = value.data if isinstance(value, Blob) else value
    return type(value).__name__, hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]


@routine
async def echo(value: object) -> object:
    return value


@routine
async def seen(value: object) -> tuple[str, str]:
    """What the worker received: its type and the digest of its bytes."""
    return _digest(value)


@routine
async def made(kind: str, size: int, seed: int) -> object:
    return _VALUES[kind](_random(size, seed))


@routine
async def twice(value: object):
    yield value
    yield value


@routine
async def reverse_data() -> tuple[str, str]:
    """Digest of the context value it got; sets it back reversed."""
    got = DATA.get()
    DATA.set(got[::-1])
    return _digest(got)


def size_of(data: bytes) -> int:
    return len(data)


def sized(size: int) -> bytes:
    return bytes(size)


def hold(port: int, seconds: float) -> None:
    """Say "started" on ``port``, then hold the worker's event loop ``seconds`` long."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(b"started")
    time.sleep(seconds)


_VALUES = {"bytes": bytes, "bytearray": bytearray, "blob": Blob}


@pytest.mark.parametrize("size", [100, 8 * MIB], ids=["small", "8MiB"])
async def test_large_values_cross_both_ways_byte_for_byte(size: int) -> None:
    data = _random(size, seed=size)
    values = [data, bytearray(data), Blob(data), Blob(bytearray(data))]
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            for value in values:
                assert await seen(value) == _digest(value)
                assert await echo(value) == value
                assert type(await echo(value)) is type(value)
                for kind in _VALUES:
                    assert _digest(await made(kind, size, 7)) == _digest(
                        _VALUES[kind](_random(size, 7)))
                assert [item async for item in twice(value)] == [value, value]
            # A memoryview arrives as bytes, as cloudpickle delivers it.
            view = memoryview(bytearray(data))[1:]
            assert await seen(view) == ("bytes", hashlib.sha256(view).hexdigest())
            assert await echo(view) == bytes(view)


async def test_large_context_values_travel_to_the_worker_and_back() -> None:
    data = _random(8 * MIB, seed=3)
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1):
            DATA.set(data)
            assert await reverse_data() == _digest(data)
            assert DATA.get() == data[::-1]


def _call_overhead(fn: object) -> int:
    """What a call of ``fn`` on one bytes argument adds to the argument's size, as a connection
    without an origin or context variables sends it under a deadline."""
    size = MIB
    request = _envelope.CallRequest(_serializer.dump((fn, (bytes(size),), {})),
                                    getattr(fn, "__qualname__"), 1.0)
    return _envelope.encode_call(request).nbytes - size


def _reply_overhead() -> int:
    size = MIB
    return _envelope.encode_reply(_serializer.dump(bytes(size))).nbytes - size


async def test_a_call_and_a_result_just_under_the_frame_limit_pass_and_just_over_do_not(
        ) -> None:
    limit = payload_limit()
    largest_argument = limit - _call_overhead(size_of)
    largest_result = limit - _reply_overhead()
    with anyio.fail_after(120):
        async with LocalWorker() as worker, WorkerConnection(worker.address) as connection:
            assert await connection.call(size_of, (bytes(largest_argument),), {},
                                         plain=True) == largest_argument
            with pytest.raises(PayloadTooLarge) as info:
                await connection.call(size_of, (bytes(largest_argument + 1),), {}, plain=True)
            assert (info.value.size, info.value.limit) == (limit + 1, limit)
            assert len(await connection.call(sized, (largest_result,), {}, plain=True)) \
                == largest_result
            with pytest.raises(PayloadTooLarge, match="the value produced by sized") as info:
                await connection.call(sized, (largest_result + 1,), {}, plain=True)
            assert (info.value.size, info.value.limit) == (limit + 1, limit)
            assert await connection.call(size_of, (b"after",), {}, plain=True) == 5


async def test_a_caller_cancelled_while_its_large_frame_is_written_leaves_the_stream_whole(
        ) -> None:
    big = _random(48 * MIB, seed=5)
    with anyio.fail_after(60):
        async with LocalWorker() as worker, WorkerConnection(worker.address) as connection:
            results: list[int] = []

            async def small_calls() -> None:
                for i in range(20):
                    results.append(await connection.call(size_of, (b"x" * i,), {},
                                                         plain=True))

            async with anyio.create_task_group() as tg:
                tg.start_soon(small_calls)
                for delay in (0.001, 0.005, 0.02):
                    with anyio.move_on_after(delay):
                        await connection.call(size_of, (big,), {}, plain=True)
            assert results == list(range(20))
            assert not connection.broken
            assert await connection.call(size_of, (big,), {}, plain=True) == len(big)


async def test_a_cancel_behind_a_large_call_still_reaches_a_routine_that_holds_the_loop(
        ) -> None:
    # The worker's loop is held by a plain function; a large call, then the cancel of the
    # held one, wait in its socket. Its interrupter finds the cancel past the large frame.
    unresponsive: list[bool] = []
    big = _random(MIB, seed=6)
    with anyio.fail_after(60):
        async with LocalWorker() as worker, WorkerConnection(
                worker.address, cancel_grace=10,
                on_unresponsive=lambda: unresponsive.append(True)) as connection, \
                Signal() as held:
            sizes: list[int] = []

            async def held_call() -> None:
                await connection.call(hold, (held.port, 30.0), {}, plain=True)

            async def large_call() -> None:
                sizes.append(await connection.call(size_of, (big,), {}, plain=True))

            frames = connection._frames
            assert frames is not None
            async with anyio.create_task_group() as tg:
                async with anyio.create_task_group() as inner:
                    inner.start_soon(held_call)
                    assert await held.started() == b"started"  # its loop is held from here
                    tg.start_soon(large_call)
                    # The large call is written whole (the sockets' buffers hold it): its
                    # frame waits in the worker's socket, and the cancel goes behind it.
                    await wait_until(lambda: len(connection._calls) == 2
                                     and not frames._send_lock.locked(), "the large call sent")
                    # Cancelled, not timed out: the call's deadline (the test's) is far off,
                    # so only the cancel frame can end it.
                    started = anyio.current_time()
                    inner.cancel_scope.cancel()
                # Without the cancel, the held call would be given up after cancel_grace.
                assert anyio.current_time() - started < 5
            assert sizes == [len(big)]
            assert not unresponsive
