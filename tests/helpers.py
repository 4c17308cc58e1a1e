"""Test helpers shared by the unit and integration suites."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import anyio
import pytest
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from anywool.discovery._protocols import DiscoveryEvent, DiscoverySubscriberLike
from anywool.metadata import WorkerMetadata

if TYPE_CHECKING:
    from anywool.discovery.local._claim import Claim
    from anywool.runtime.wire._frames import FrameStream


def worker(address: str = "unix:/tmp/none.sock", **fields: object) -> WorkerMetadata:
    """A WorkerMetadata with a fresh uid (fields may override anything)."""
    values: dict[str, object] = {
        "uid": uuid.uuid4(),
        "address": address,
        "pid": os.getpid(),
        "version": "test",
    }
    values.update(fields)
    return WorkerMetadata(**values)  # type: ignore[arg-type]


# Receive ends handed out by follow(), closed by the conftest fixture after each test.
OPEN_STREAMS: list[MemoryObjectReceiveStream[DiscoveryEvent]] = []


async def follow(tg: TaskGroup, subscriber: DiscoverySubscriberLike) -> MemoryObjectReceiveStream[DiscoveryEvent]:
    """Iterate ``subscriber`` in a task of ``tg``, forwarding events (and any error) to a stream.

    The returned stream is closed after the test (it is never garbage with an open end)."""
    send, receive = anyio.create_memory_object_stream[DiscoveryEvent](1000)
    OPEN_STREAMS.append(receive)

    async def run() -> None:
        async with send:
            async for event in subscriber:
                await send.send(event)

    tg.start_soon(run)
    return receive


async def take(stream: MemoryObjectReceiveStream[DiscoveryEvent], count: int) -> list[tuple[str, uuid.UUID]]:
    return [(e.type, e.metadata.uid) for e in [await stream.receive() for _ in range(count)]]


async def events_of(subscriber: DiscoverySubscriberLike) -> AsyncIterator[DiscoveryEvent]:
    async for event in subscriber:
        yield event


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], what: str,
                     timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` every ``interval`` seconds until it holds; fail naming ``what`` after
    ``timeout``. ``predicate`` may be a coroutine function (a question asked of a worker, say).

    For conditions that have no event to wait on (a log record, a slot given up)."""

    async def holds() -> bool:
        result = predicate()
        return await result if inspect.isawaitable(result) else result

    with anyio.move_on_after(timeout):
        while not await holds():
            await anyio.sleep(interval)
    assert await holds(), f"timed out after {timeout} s waiting for {what}"


def colliding_names(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Two namespace names whose keys collide, with ``_keys.KEY_BYTES`` shrunk to 1 for the rest
    of the test: 256 keys, so among 257 names two must collide."""
    from anywool.discovery.local import _keys

    monkeypatch.setattr(_keys, "KEY_BYTES", 1)
    seen: dict[str, str] = {}
    for index in range(257):
        name = f"n{index}"
        key = _keys.namespace_key(name)
        if key in seen:
            return seen[key], name
        seen[key] = name
    raise AssertionError(f"257 names gave {len(seen)} distinct keys of 1 byte: KEY_BYTES "
                         "is no longer what namespace_key uses")


class Touch:
    """Unpickling it creates ``path``: what a peer's payload could do if a worker unpickled it
    (pickle it into a CALL frame's arguments)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (Path(self.path).touch, ())


class Signal:
    """A loopback TCP listener that a routine connects to once it has started (see
    ``tests.integration.routines``): :meth:`started` returns when it has."""

    async def __aenter__(self) -> Signal:
        self.listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port: int = self.listener.extra(anyio.abc.SocketAttribute.local_port)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.listener.aclose()

    async def started(self) -> bytes:
        """Wait for the routine's connection; what it sent (``b"started"``, or its pid...)."""
        stream = await self.listener.listeners[0].accept()  # type: ignore[attr-defined]
        async with stream:
            message = await stream.receive()
        assert message, "the routine connected but said nothing"
        return message


class DescriptorTraps:
    """Files opened to take the descriptor numbers something just closed (the lowest free ones
    go first): nothing of anywool may ever write to them. A context manager that closes them.
    """

    def __init__(self, directory: Path, count: int = 8) -> None:
        self._directory = directory
        self._count = count
        self._files: list[BinaryIO] = []

    def __enter__(self) -> DescriptorTraps:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for file in self._files:
            file.close()

    def set(self) -> None:
        for index in range(self._count):
            self._files.append(open(self._directory / f"trap-{index}", "w+b"))

    def assert_untouched(self) -> None:
        assert self._files, "the traps were never set"
        for file in self._files:
            file.seek(0)
            assert file.read() == b"", f"{file.name} was written to"


# -- the wire, spoken by hand (tests that play a misbehaving client) -------------------------


async def worker_frames(stream: object) -> "FrameStream":
    """Frames over a raw connection to a real worker, past the HELLO it sends first."""
    from anywool.runtime.wire._frames import FrameStream, Kind

    frames = FrameStream(stream, stream)  # type: ignore[arg-type]
    hello = await frames.receive()
    assert hello.kind == Kind.HELLO and hello.call_id == 0, hello
    return frames


def call_payload(fn: Callable[..., object], args: tuple = (), kwargs: dict | None = None,
                 **fields: object) -> bytes:
    """A CALL frame's payload for ``fn(*args, **kwargs)`` (``fields``: more of its header)."""
    from anywool.runtime.wire import _envelope, _serializer

    request = _envelope.CallRequest(_serializer.dump((fn, args, kwargs or {})),
                                    getattr(fn, "__qualname__", repr(fn)), **fields)  # type: ignore[arg-type]
    return _envelope.encode_call(request).join()


def step_payload(value: object = None) -> bytes:
    """An ASEND frame's payload sending ``value``."""
    from anywool.runtime.wire import _envelope, _serializer

    return _envelope.encode_step(_envelope.Step(_serializer.dump(value))).join()


def result_of(payload: bytes) -> object:
    """The value a RESULT frame's payload carries."""
    from anywool.runtime.wire import _envelope, _serializer

    value = _envelope.decode_reply(payload)[0]
    return _serializer.loads(value.stream(), value.buffers)


def exception_of(payload: bytes) -> BaseException:
    """The exception an EXCEPTION frame's payload carries."""
    from anywool.runtime.wire import _envelope, _exceptions

    return _exceptions.loads_exception(_envelope.decode_reply(payload)[0].stream())


@contextlib.contextmanager
def owned(namespace: str) -> Iterator[Claim]:
    """Own ``namespace`` in this process, with a small registry, for the block."""
    from anywool.discovery.local import _claim

    claim = _claim.claim(namespace, capacity=4, block_size=256)
    try:
        yield claim
    finally:
        claim.release()


def leftover(runtime_dir: Path, prefix: str, *, age: float = 60.0) -> str:
    """What a killed process leaves in ``runtime_dir``: an unlocked ``prefix`` directory
    (``tmp-``, ``dead-``, ``w-``), last modified ``age`` seconds ago; its name."""
    import secrets
    import time

    path = runtime_dir / f"{prefix}{secrets.token_hex(8)}"
    path.mkdir(mode=0o700)
    then = time.time() - age
    os.utime(path, (then, then))
    return path.name


class Records(logging.Handler):
    """A logging handler that keeps what it is given (records as they are, not formatted)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]
