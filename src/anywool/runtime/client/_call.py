"""One call to one worker, on the caller's side: its frames, its states, and the steps that
drive it.

A call is a CALL frame (the pickled routine and arguments, the caller's deadline and context
variables, the id of the call it is made from, the proxy its routine may call through: see
:mod:`anywool.runtime.wire._envelope`) and the worker's answers to it, under the call's id on
the connection: ACK (accepted, and how long it waited to start), then RETURN or EXCEPTION for a
coroutine; for an async generator one answer per step (ASEND, ATHROW, ACLOSE): RESULT (an item),
END (exhausted or closed) or EXCEPTION. NACK refuses it before it starts (``BUSY``: the worker
runs its ``max_concurrency`` calls; else it is stopping). OUTPUT frames (what the routine logs
and prints) may come before the last answer; CANCEL goes the other way, and the worker answers
it with CANCELLING once it took it, then with the call's last frame.

A :class:`Call`'s states, as its connection counts them: *waiting* (sent, neither accepted nor
ended: it counts against the connection's window, see
:attr:`~anywool.runtime.client._connection.WorkerConnection.busy`), *accepted* (its ACK came),
*running* (sent, its last answer not read nor the call given up: it counts in
:attr:`~anywool.runtime.client._connection.WorkerConnection.outstanding`), *finished* (nothing
is left to cancel on the worker: it ended, was refused or lost, or its cancellation is done) and
*withdrawn* (given up before the worker started it, and followed by a task of the connection
until the worker says what became of it).

Who drives it: the connection's reader task hands it its frames (:meth:`Call.deliver`, or
:meth:`Call.lose` when the connection goes; under asyncio the event loop routes them itself
while the reader waits); the caller's task sends and waits for them. A coroutine's call is
driven by :meth:`WorkerConnection.call <anywool.runtime.client._connection.WorkerConnection.call>`,
an async generator's by :func:`drive_stream`, the async generator its caller iterates: it never
yields inside a cancel scope (house rule 3), since its frames are queued here by the reader.

Cancellation: a caller cancelled while it waits for a frame cancels the routine on the worker
(:meth:`Call.abort`: shielded and bounded, then the cancellation is re-raised): a call the worker
has not started is withdrawn at once; a started one waits ``cancel_grace`` seconds for the worker
to take the cancellation (or counts the worker as unresponsive and gives the call up), then
``cancel_timeout`` seconds for the routine to unwind. A routine the worker cancelled at the
caller's own deadline lets that deadline cancel the caller, as a local ``await`` would.

What this module must never do: retry a call the worker may have started (only a call the
worker never accepted raises :class:`CallNotDelivered`), or add work to the path every call
takes (a call is one object with slots; its waits are inlined where every call passes).

:class:`Call` and :class:`~anywool.runtime.client._connection.WorkerConnection` are two halves of
one mechanism: a call uses its connection's underscore members (its frame stream, wake-ups and
bookkeeping), which stay private because ``WorkerConnection`` is public API
(:mod:`anywool.lowlevel`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import anyio.lowlevel

from anywool.errors import PayloadTooLarge, RoutineCancelled, SerializationError, WorkerError
from anywool.runtime import _context, _output, _telemetry
from anywool.runtime.client import _ctrl_c
from anywool.runtime.client._wakeup import Wakeup
from anywool.runtime.wire import _envelope as envelope
from anywool.runtime.wire import _exceptions
from anywool.runtime.wire import _serializer as serializer
from anywool.runtime.wire._envelope import Step
from anywool.runtime.wire._frames import Frame, FrameError, Kind, Parts, payload_limit
from anywool.runtime.wire._peer import PEER_GONE
from anywool.runtime.wire._serializer import Pickled

if TYPE_CHECKING:
    from anywool.runtime.client._connection import WorkerConnection

# The frames that end a call.
TERMINAL = frozenset({Kind.RETURN, Kind.END, Kind.EXCEPTION, Kind.NACK})
# What says that a worker took a cancellation: it answered, or the call ended.
_TAKEN = TERMINAL | {Kind.CANCELLING}
# How close (seconds) the caller's deadline must be for a routine the worker cancelled to count
# as cancelled by that deadline (see _own_deadline).
_DEADLINE_SLACK = 0.1


class CallNotDelivered(WorkerError):
    """The worker never accepted the call (refused it, or the connection was already broken),
    so it certainly did not run and may be retried on another worker."""


class WorkerBusy(CallNotDelivered):
    """The worker refused the call because it runs ``max_concurrency`` calls already; it tells
    the connection when it has room again (:attr:`WorkerConnection.busy` turns false)."""


class Call:
    """The client's half of one call: its frames and the steps that drive it.

    The reader task hands it its frames (:meth:`deliver`); a coroutine's call takes its ACK
    silently (``quiet_ack``: only :attr:`accepted` records it), so that its caller wakes once,
    for the result.
    """

    __slots__ = ("connection", "id", "name", "finished", "accepted", "quiet_ack", "waiting",
                 "running", "withdrawn", "sent_at", "not_cancelled", "relay", "telemetry",
                 "_frames", "_arrived", "_lost")

    def __init__(self, connection: WorkerConnection, call_id: int, name: str, *,
                 quiet_ack: bool = False) -> None:
        self.connection = connection
        self.id = call_id
        self.name = name
        self.finished = False
        self.accepted = False
        self.quiet_ack = quiet_ack
        # Counted among the connection's calls waiting to start (see WorkerConnection.busy),
        # since this time.perf_counter().
        self.waiting = False
        self.running = False  # counted in the connection's outstanding calls
        self.withdrawn = False  # given up unstarted, and followed (see watch_withdrawn)
        self.sent_at = 0.0
        # Its caller had no cancellation pending when it was prepared (see
        # WorkerConnection._prepare): its CALL frame is sent without checking again.
        self.not_cancelled = False
        # On a worker: the output sink of the call this one is made from, which its output goes
        # to (runtime._output).
        self.relay: _output.Sink | None = None
        # Its client call (see runtime._telemetry), when traced: its steps carry its span.
        self.telemetry: _telemetry.ClientCall | None = None
        self._frames: deque[Frame] = deque()
        self._arrived: Wakeup | None = None
        self._lost = False

    def deliver(self, frame: Frame) -> None:
        self._frames.append(frame)
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = None

    def lose(self) -> None:
        """The connection is gone: once its frames are read, the call fails."""
        self._lost = True
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = None

    def pushback(self, frame: Frame) -> None:
        self._frames.appendleft(frame)

    async def _wait_frame(self) -> Frame:
        """The next frame (not cancellation-aware: see :meth:`next_frame`).

        :raises _Lost: the connection was lost.
        """
        frames = self._frames
        while not frames:
            if self._lost:
                raise _Lost
            arrived = self._arrived = self.connection._wakeup()
            await arrived.wait()
        return frames.popleft()

    async def next_frame(self) -> Frame:
        """The next frame of this call.

        :raises WorkerError: the connection was lost.
        Cancellation: cancels the routine on the worker (see :meth:`abort`), then re-raises.
        """
        try:
            return await self._wait_frame()
        except _Lost:
            raise self._lost_error() from None
        except anyio.get_cancelled_exc_class():
            await self.abort()
            raise

    def _lost_error(self) -> WorkerError:
        self.finished = True
        return WorkerError(self.connection.address,
                           f"lost while running {self.name}: "
                           f"{self.connection._failure or 'closed'}")

    async def first_frame(self) -> Frame:
        """The worker's answer to the CALL: ``ACK`` (unless ``quiet_ack``), the result, or a
        refusal; a refusal, or a connection lost before the worker accepted the call, raises
        :class:`CallNotDelivered` (the routine never started). Otherwise as
        :meth:`next_frame`."""
        # next_frame and _wait_frame inlined: every call waits here once.
        frames = self._frames
        try:
            while not frames:
                if self._lost:
                    raise _Lost
                arrived = self._arrived = self.connection._wakeup()
                await arrived.wait()
        except _Lost:
            lost = self._lost_error()
            if self.accepted:
                raise lost from None
            # No ACK: the worker writes it before running anything, and a stream delivers
            # what was written before it closed, so the routine never started.
            raise CallNotDelivered(self.connection.address,
                                   f"closed before accepting: {lost.reason}") from None
        except anyio.get_cancelled_exc_class():
            await self.abort()
            raise
        frame = frames.popleft()
        if frame.kind == Kind.NACK:
            self.finished = True
            if frame.payload == envelope.BUSY:
                raise WorkerBusy(self.connection.address, "the worker refused the call: it runs "
                                                          "its max_concurrency calls already")
            raise CallNotDelivered(self.connection.address,
                                   "the worker refused the call (it is stopping)")
        return frame

    def value(self, frame: Frame) -> Any:
        """The value a RESULT frame carries; what the routine changed in its context variables
        is set in the current context (the caller's, as with a local ``await``)."""
        data, changes = envelope.decode_reply(frame.payload)
        self._update(changes)
        return serializer.loads_value(data, self.name, "the value it produced",
                                      f" from worker {self.connection.address}")

    def end(self, frame: Frame) -> None:
        """Take an END frame: set the context variables it carries."""
        self._update(envelope.decode_end(frame.payload))

    def _update(self, changes: Pickled | None) -> None:
        if changes is not None:
            _context.update(serializer.loads_value(
                changes, self.name, "the values of the context variables it set",
                f" from worker {self.connection.address}"))

    def remote_exception(self, frame: Frame) -> BaseException:
        if frame.kind == Kind.EXCEPTION:
            try:
                data, changes = envelope.decode_reply(frame.payload)
                self._update(changes)
            except (FrameError, SerializationError) as exc:
                return exc
            return _exceptions.loads_exception(data.stream())
        if frame.kind == Kind.NACK:
            return CallNotDelivered(self.connection.address, "the worker refused the call")
        return WorkerError(self.connection.address, f"unexpected {frame.kind.name} frame")

    async def send(self, kind: Kind, payload: Parts | None = None) -> None:
        frames = self.connection._frames
        assert frames is not None
        try:
            if payload is None:
                await frames.send(Frame(kind, self.id))
            else:
                await frames.send_parts(kind, self.id, payload)
        except PEER_GONE as exc:
            self.finished = True
            reason = f"connection failed: {exc!r}"
            await self.connection._broken_by_send(reason)
            raise WorkerError(self.connection.address, reason) from exc

    async def abort(self) -> None:
        """Cancel the routine on the worker and wait until it has unwound (shielded, bounded).

        A call the worker has not started is withdrawn at once: the cancel frame follows it,
        and the worker, which looks for one before it starts a call, skips it. Should the
        worker have started it just then (its ACK was on its way), the connection goes on
        watching it: a worker that then does not take the cancellation within
        ``cancel_grace`` is reported (``on_unresponsive``) as for a started call. A started
        call waits up to ``cancel_grace`` seconds for the worker to take the cancellation, then
        up to ``cancel_timeout`` for the routine to unwind; a worker that did not take it in
        time is reported and the call given up.
        """
        if self.finished:
            return
        self.finished = True
        connection = self.connection
        if connection.broken:
            return  # the worker cancelled the routine when the connection went
        with anyio.CancelScope(shield=True):
            taken = False
            # Started, as far as this side can tell: its ACK was routed, or has arrived.
            started = self.accepted
            hurried: list[bool] = []

            def hurry() -> None:
                hurried.append(True)
                grace.cancel()

            try:
                with anyio.move_on_after(connection._cancel_grace) as grace, \
                        _ctrl_c.hurried(hurry):
                    try:
                        await self.send(Kind.CANCEL)
                        started = started or self.accepted or connection._frames_pending(
                            Kind.ACK, self.id)
                        if not started:
                            connection._withdraw(self)
                            return
                        while True:
                            kind = (await self._wait_frame()).kind
                            if kind in TERMINAL:
                                return
                            if kind == Kind.CANCELLING:
                                taken = True
                                break
                    except (WorkerError, _Lost):
                        return
            except BaseException:
                # A KeyboardInterrupt (under trio, a second Ctrl-C lands here): whoever sent it
                # will not wait, so neither does the worker's fate.
                if (started or self.accepted) and not taken:
                    connection._unresponsive(self, "the wait for it was interrupted")
                raise
            if not taken:
                if started or self.accepted:
                    connection._unresponsive(
                        self, "a Ctrl-C cut the wait for it short" if hurried else
                        f"it did not take it within {connection._cancel_grace} s")
                return
            with anyio.move_on_after(connection._cancel_timeout) as unwinding, \
                    _ctrl_c.hurried(unwinding.cancel):
                try:
                    while (await self._wait_frame()).kind not in TERMINAL:
                        pass
                except (WorkerError, _Lost):
                    pass

    async def release(self) -> None:
        """End this call on the client: cancel it remotely if unfinished, drop its stream."""
        try:
            if not self.finished:
                await self.abort()
        finally:
            self.connection._forget(self.id)

    async def watch_withdrawn(self) -> None:
        """Follow a call withdrawn before the worker started it (see :meth:`abort`) until the
        worker says what became of it: skipped, or, should it have started it after all, taken
        the cancellation (or not within ``cancel_grace``: reported as unresponsive)."""
        connection = self.connection
        try:
            while True:
                frame = await self._wait_frame()
                if frame.kind in TERMINAL:
                    return
                if frame.kind == Kind.ACK:
                    with anyio.move_on_after(connection._cancel_grace):
                        while (await self._wait_frame()).kind not in _TAKEN:
                            pass
                        return
                    connection._unresponsive(
                        self, f"it started the call as it was withdrawn, and did not take its "
                              f"cancellation within {connection._cancel_grace} s")
                    return
        except _Lost:
            pass  # the worker and its calls went with the connection
        finally:
            connection._bury(self)

    async def step(self, kind: Kind, value: Pickled = envelope.NOTHING) -> tuple[bool, Any]:
        """Drive a streaming call by one step, carrying the caller's deadline and context
        variables; what the step changed in them is set in the caller's context.

        :param value: the pickled value sent (``ASEND``) or exception thrown (``ATHROW``).
        :returns: ``(False, item)`` for a yielded item, ``(True, None)`` when the remote
            generator is exhausted or closed.
        :raises Exception: what the remote generator raised (a worker that stopped while the
            generator was suspended answers :class:`~anywool.errors.RoutineCancelled`).
        :raises WorkerError: the connection was lost, with nothing from the worker before.
        """
        trace = None if self.telemetry is None else self.telemetry.carry_step()
        payload = envelope.encode_step(Step(value, seconds_left(), dump_context(self.name),
                                            trace))
        limit = payload_limit(self.connection._max_frame_size)
        if payload.nbytes > limit:
            raise PayloadTooLarge(f"a step of {self.name} (the value sent, or the context "
                                  "variables)", payload.nbytes, limit)
        try:
            await self.send(kind, payload)
        except WorkerError:
            # The connection is failed now (see send): what the worker wrote before it went,
            # a stopping worker's RoutineCancelled say, is this step's answer, if anything is.
            pass
        frame = await self.next_frame()
        if frame.kind == Kind.RESULT:
            return False, self.value(frame)
        self.finished = True
        if frame.kind == Kind.END:
            self.end(frame)
            return True, None
        await self.raise_remote(frame)

    async def raise_remote(self, frame: Frame) -> NoReturn:
        """Raise what the worker's EXCEPTION frame says; a routine cancelled at the caller's
        own deadline first lets that deadline cancel the caller, as a local await would."""
        error = self.remote_exception(frame)
        if isinstance(error, RoutineCancelled):
            await _own_deadline()
        raise error


async def drive_stream(
    open_call: Callable[[], Awaitable[Call]], busy: AbstractContextManager[object] = nullcontext()
) -> AsyncGenerator[Any, Any]:
    """An async generator mirroring a remote generator one step per frame.

    ``open_call`` starts the remote call (e.g. :meth:`WorkerConnection.stream` through a load
    balancer); it is awaited at the first step, so nothing is dispatched until then.

    ``asend(v)`` sends ``v`` to the remote generator; ``athrow(exc)`` throws ``exc`` into it;
    ``aclose()`` closes it (its ``finally`` blocks run on the worker before ``aclose`` returns).
    Yields happen outside any cancel scope: the frames come from the connection's reader, queued
    for this call. ``busy`` is entered around every step that awaits
    the worker (not while the generator is suspended at a yield), so an owner can drain them.
    A traced call's span (see :mod:`anywool.runtime._telemetry`) ends with the stream, failed
    by what it raised.
    """
    with busy:
        call = await open_call()
    ended_by: BaseException | None = None
    try:
        kind, payload = Kind.ASEND, _NONE
        while True:
            with busy:
                done, item = await call.step(kind, payload)
            if done:
                return
            try:
                sent = yield item
            except GeneratorExit:
                if not call.finished and not call.connection.broken:
                    # END when the remote generator closed; its RuntimeError if it yielded again.
                    # A connection lost meanwhile took the remote generator with it: nothing
                    # is left to close.
                    with busy:
                        try:
                            await call.step(Kind.ACLOSE)
                        except WorkerError:
                            call.finished = True
                raise
            except BaseException as exc:  # athrow(): forward it into the remote generator
                kind, payload = Kind.ATHROW, Pickled([_exceptions.dumps_exception(exc)])
            else:
                kind, payload = Kind.ASEND, (
                    _NONE if sent is None
                    else serializer.dumps_value(sent, call.name, "the value sent to it"))
    except BaseException as exc:
        ended_by = exc
        raise
    finally:
        if call.telemetry is not None:
            call.telemetry.finish(ended_by)
        await call.release()


_NONE = serializer.dump(None)


class _Lost(Exception):
    """A call's connection was lost (internal to :class:`Call`: its callers get a
    :class:`~anywool.errors.WorkerError`)."""



def seconds_left() -> float | None:
    """The seconds left of the current task's effective deadline (``None``: it has none)."""
    deadline = anyio.current_effective_deadline()
    if deadline == math.inf:
        return None
    return max(0.0, deadline - anyio.current_time())


async def _own_deadline() -> None:
    """The routine was cancelled on the worker: if the caller's own deadline (which the call
    carried, and the worker enforces too) is due, let it cancel the caller as it would a local
    await, rather than raise :class:`RoutineCancelled`. The worker may act on it first: its
    clock started later, but its timer, reply and our wake-up race with ours."""
    deadline = anyio.current_effective_deadline()
    if deadline - anyio.current_time() <= _DEADLINE_SLACK:
        await anyio.sleep_until(deadline)
        await anyio.lowlevel.checkpoint()


def dump_context(routine: str) -> Pickled | None:
    values = _context.capture()
    return None if values is None else serializer.dumps_context(values, routine)

