"""A worker's lifespan: what a pool (or an ``anywool worker`` host) asks each of its workers to
set up before it takes calls and to tear down after its last one, and what routines reach of it.

A lifespan is a factory of async context managers, called with no arguments in the worker:
``worker_lifespan=open_database`` where ``open_database`` is an
``@contextlib.asynccontextmanager`` function, say. The parent sends it to the worker pickled
(cloudpickle: by reference when it is importable there, by value otherwise, as routines go) in
``$ANYWOOL_WORKER_LIFESPAN`` (base64); the worker enters it in its main task, inside its task
group, after its listener is open and before it says its address (so a pool's start waits for
it, within ``startup_timeout``), and exits it once its last call has ended and its connections
are closed. What it yields is :attr:`WorkerInfo.state`, for routines through
:func:`current_worker`.

A lifespan that raises on entry fails the worker's start: the worker says why on the line its
parent waits for (the pool's :class:`~anywool.errors.WorkerError` carries it) and exits 1. One
that raises on exit is logged by the worker (``anywool.worker``), which still exits as it would.
The worker is stopped as ever: a stop request lets its calls drain, then the lifespan exits;
SIGTERM cancels the calls and the lifespan's exit runs cancelled (shield what must finish).

A feature with one end in each process, like :mod:`anywool.runtime._output`: the parent checks
and encodes a lifespan (:func:`check`, :func:`encode`), the worker decodes and runs it
(:func:`decode`, :class:`Running`), routines read it (:func:`current_worker`). So it sits below
both, not in :mod:`anywool.runtime.worker`: a pool's process imports this small module (no
event loop, cloudpickle only once a lifespan is encoded), not the worker's machinery.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    nullcontext,
)
from dataclasses import dataclass
from typing import Any
from uuid import UUID

log = logging.getLogger("anywool.worker")

# A pickled lifespan larger than this does not fit an environment variable on Linux (128 KiB a
# string); it must be importable by reference instead.
_ENCODED_AT_MOST = 96 * 1024

Lifespan = Callable[[], AbstractAsyncContextManager[Any]]


@dataclass(frozen=True)
class WorkerInfo:
    """The worker process a routine runs in (see :func:`current_worker`).

    :ivar uid: the worker's uid, as its metadata announces it (``None``: started by hand,
        without one).
    :ivar namespace: the namespace it was started for (``None``: none known).
    :ivar address: the address it listens on.
    :ivar pid: its process id.
    :ivar state: what its lifespan yielded (``None``: no lifespan, or it yielded nothing).
    """

    uid: UUID | None
    namespace: str | None
    address: str
    pid: int
    state: Any = None


_current: WorkerInfo | None = None


def current_worker() -> WorkerInfo:
    """The worker this routine runs in: its uid, namespace, address, pid, and the ``state``
    its lifespan yielded (``WorkerPool(worker_lifespan=...)``).

    Process-wide: a routine's tasks and threads see the same. Set before the worker takes
    calls (its lifespan entered) and kept until the process ends.

    :raises RuntimeError: not in an anywool worker (in the caller's process, say).
    """
    if _current is None:
        raise RuntimeError("current_worker() is only known in an anywool worker process: "
                           "call it from a routine that runs on one")
    return _current


def check(value: object, name: str = "worker_lifespan") -> Lifespan | None:
    """``value`` as a lifespan: ``None``, a callable, or a ``"module:name"`` string naming one
    (imported here, so a typo fails where it is written).

    :raises TypeError: anything else, or a string that names something not callable.
    :raises ValueError: a string not of the form ``module:name``, or whose module or name
        cannot be imported.
    """
    if value is None:
        return None
    if isinstance(value, str):
        module, colon, attribute = value.partition(":")
        if not (module and colon and attribute):
            raise ValueError(f"{name} must be 'module:name' (an async context manager "
                             f"factory importable there), got {value!r}")
        try:
            found: Any = importlib.import_module(module)
            for part in attribute.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"{name}={value!r} cannot be imported: {exc}") from None
        value = found
    if not callable(value):
        raise TypeError(f"{name} must be a callable returning an async context manager (an "
                        f"@asynccontextmanager function, say), or 'module:name'; got {value!r}")
    return value  # type: ignore[return-value]


def encode(factory: Lifespan, name: str = "worker_lifespan") -> str:
    """``factory`` as the worker's environment carries it (the variable is the worker
    contract's ``LIFESPAN_ENV``); :func:`decode` reads it back.

    :raises TypeError: it cannot be pickled, or pickles too large to hand over this way.
    """
    from anywool.runtime.wire import _serializer

    try:
        data = _serializer.dumps(factory)
    except Exception as exc:
        raise TypeError(f"{name} {factory!r} cannot be sent to the workers: {exc}") from exc
    text = base64.b64encode(data).decode("ascii")
    if len(text) > _ENCODED_AT_MOST:
        raise TypeError(f"{name} {factory!r} pickles to {len(data)} bytes, too large to hand "
                        "to a worker: define it in a module the workers can import")
    return text


def decode(text: str | None, variable: str) -> Lifespan | None:
    """The lifespan this worker's parent handed it, from ``text`` as :func:`encode` made it
    (``None`` or empty: none).

    :raises ValueError: it cannot be loaded (the message says why, naming ``$variable`` when
        ``text`` is malformed).
    """
    if not text:
        return None
    from anywool.runtime.wire import _serializer

    try:
        factory = _serializer.loads(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"${variable} is malformed: {exc}") from None
    except Exception as exc:
        raise ValueError(f"the lifespan could not be loaded here: {exc!r}") from None
    if not callable(factory):
        raise ValueError(f"the lifespan is not callable: {factory!r}")
    return factory  # type: ignore[no-any-return]


class Running:
    """Enter ``factory()`` (if any), then publish :func:`current_worker` with what it yields;
    :meth:`entered` exits it. An exception its exit raises is logged, not raised (the worker
    stops as it would).

    Entering raises what the lifespan's entry raises, and ``TypeError`` when ``factory()``
    is not an async context manager.
    """

    def __init__(self, factory: Lifespan | None, info: WorkerInfo,
                 exit_scope: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        self._factory = factory
        self._info = info
        self._manager: Any = None
        self._exit_scope = exit_scope  # what the exit runs in (SIGTERM cancels it)

    async def __aenter__(self) -> WorkerInfo:
        global _current
        info = self._info
        if self._factory is not None:
            manager = self._factory()
            if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):
                raise TypeError(f"the lifespan {self._factory!r} returned {manager!r}, not an "
                                "async context manager")
            state = await manager.__aenter__()
            self._manager = manager
            info = WorkerInfo(info.uid, info.namespace, info.address, info.pid, state)
        _current = info
        return info

    @asynccontextmanager
    async def entered(self) -> AsyncIterator[WorkerInfo]:
        """The block the lifespan lasts for, once entered (its exit at the block's end)."""
        assert _current is not None, "enter first"
        try:
            yield _current
        except BaseException as exc:
            await self._exit(type(exc), exc, exc.__traceback__)
            raise
        else:
            await self._exit(None, None, None)

    async def _exit(self, *exc_info: Any) -> None:
        manager, self._manager = self._manager, None
        if manager is None:
            return
        try:
            with self._exit_scope():
                await manager.__aexit__(*exc_info)
        except Exception:
            log.exception("the worker's lifespan failed as it exited")
