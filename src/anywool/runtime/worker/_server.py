"""The serving side of the worker protocol: one worker's connections, calls and replies.

:class:`Server` handles each connection a worker accepts: it reads frames, runs each call in a
task of that connection's task group, answers as :mod:`anywool.runtime.wire._frames` says (see
:mod:`anywool.runtime.wire._frames` and :mod:`anywool.runtime.wire._envelope`), admits at most
``max_concurrency`` calls, and stops as it is told (:class:`_Stop`). A connection that closes
cancels its calls; a call's failure, whatever a routine or its values do, fails that call only.

A routine cancelled by the stop (or by a client's cancel frame) still answers its call, with
:class:`~anywool.errors.RoutineCancelled`. Then the server half-closes every connection and
waits (up to 2 s) for its clients to hang up, so each side's pending receive ends with
end-of-stream rather than by cancellation.

What this module must never do: let a call's failure end a connection or the worker, or run a
routine it refused.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import math
import os
import platform
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import sniffio
from anyio.abc import ByteStream

from anywool._version import __version__
from anywool.errors import PayloadTooLarge, RoutineAborted, RoutineCancelled, SerializationError
from anywool.runtime import _context, _output, _telemetry
from anywool.runtime._routine import RoutineTask, routine_body, set_active, set_running
from anywool.runtime.wire import _envelope as envelope
from anywool.runtime.wire import _exceptions, _stats
from anywool.runtime.wire import _serializer as serializer
from anywool.runtime.wire._frames import (
    SEND_NOW_AT_MOST,
    Frame,
    FrameError,
    FrameStream,
    Kind,
    Parts,
    encode,
    encode_parts,
    payload_limit,
    shut_down,
)
from anywool.runtime.wire._peer import PEER_GONE, PEER_HUNG_UP
from anywool.runtime.wire._serializer import Pickled
from anywool.runtime.wire._stats import WorkerStats
from anywool.runtime.worker import _interrupt
from anywool.runtime.worker._callgroup import CallGroup, Scope, open_call_group, scope_factory
from anywool.runtime.worker._contract import (
    IDLE_TIMEOUT,
    NOTICE_CALL,
    NOTICE_IDLE,
    NOTICE_RECYCLE,
    REPORT_CALL,
    STOP,
    SUPERVISED,
)
from anywool.runtime.worker._nested import NestedProxies

log = logging.getLogger("anywool.worker")

# How long a cancelled call may take to tell its client it was cancelled.
REPLY_TIMEOUT = 1.0
# Of the stop's tail (STOP_TAIL), what is kept for the connections shut down after the
# linger to end.
_SHUTDOWN_RESERVE = 0.25
# Seconds a call may take from its frame being read to its start before the worker looks in
# the socket for its cancel frame (a call loading that long held the loop, so a cancel frame
# may be waiting unread; one that starts sooner would have had it routed).
_LOOK_AFTER = 0.001


class _Stop:
    """The worker-wide stop state: draining flag, in-flight count, requested grace; and what
    :meth:`Server.stats` reports of the calls (counted here, at their start and end)."""

    def __init__(self) -> None:
        self.requested = anyio.Event()
        self.grace: float | None = None
        self.draining = False
        self.in_flight = 0
        # What stats() reports: calls ended, by outcome; seconds with a call in
        # flight, and since when (time.perf_counter()) the current such stretch runs.
        self.served = self.returned = self.raised = self.cancelled = 0
        self.busy = 0.0
        self.busy_since = 0.0
        # Since when (time.perf_counter()) no call is in flight: what idleness is measured
        # from (see Server.watch_idle).
        self.quiet_since = time.perf_counter()
        self._changed: anyio.Event | None = None  # made only while somebody drains
        self._drain_scope: anyio.CancelScope | None = None
        self.terminated = False
        self._on_terminate: set[anyio.CancelScope] = set()

    def terminate(self) -> None:
        """SIGTERM: stop now (as ``request(0)``), and cancel what :meth:`cancelled_by_sigterm`
        covers (the lifespan's exit), also once it has begun."""
        self.request(0)
        self.terminated = True
        for scope in self._on_terminate:
            scope.cancel()

    def cancelled_by_sigterm(self) -> anyio.CancelScope:
        """A cancel scope that SIGTERM cancels, already cancelled if SIGTERM came."""
        scope = anyio.CancelScope()
        if self.terminated:
            scope.cancel()
        self._on_terminate.add(scope)
        return scope

    def request(self, grace: float) -> None:
        if self.grace is None:
            self.grace = grace
            self.requested.set()
        elif grace == 0 and self.grace != 0:
            self.grace = 0  # escalation: stop draining, cancel now
            if self._drain_scope is not None:
                self._drain_scope.cancel()
        elif grace > 0 and self.grace < 0:
            # A bound for a drain that had none (a retiring worker's, drained for as long as
            # its calls take, when its pool exits; SIGINT's): from now on.
            self.grace = grace
            if self._drain_scope is not None:
                self._drain_scope.deadline = anyio.current_time() + grace

    def started(self, at: float) -> None:
        """A call started; ``at`` is when its frame was read (``time.perf_counter()``)."""
        if not self.in_flight:
            self.busy_since = at
        self.in_flight += 1

    def finished(self) -> None:
        self.in_flight -= 1
        self.served += 1
        if not self.in_flight:
            self.quiet_since = time.perf_counter()
            self.busy += self.quiet_since - self.busy_since
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def drain(self) -> None:
        """Wait until no call is in flight, for at most ``grace`` seconds (< 0: no bound)."""
        assert self.grace is not None
        if self.grace == 0:
            return
        timeout = math.inf if self.grace < 0 else self.grace
        with anyio.CancelScope() as scope:
            self._drain_scope = scope
            await self.drain_for(timeout)
        self._drain_scope = None

    async def drain_for(self, timeout: float) -> None:
        """Wait until no call is in flight, for at most ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            while self.in_flight:
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()


class _NotHere(Exception):
    """A plain function's call that cannot run where its frame was routed (see
    ``Server._run_here``)."""


class _Untracked:
    """No context-variable changes to report: the routine never ran."""


_UNTRACKED = _Untracked()


class _ServerCall:
    __slots__ = ("id", "scope", "frames", "name", "streaming", "protocol_error", "read_at",
                 "deadline", "cancelled", "output", "telemetry", "_step", "_arrived")

    def __init__(self, call_id: int, scope: Scope | None, frames: FrameStream) -> None:
        self.id = call_id
        # Its cancel scope; None for a plain function's call run where its frame was routed
        # (Server._run_here), which has no task to cancel: the interrupter ends it.
        self.scope = scope
        self.frames = frames
        self.read_at = time.perf_counter()  # when its CALL frame was read
        # When the caller's deadline (for this step, of a generator) runs out, in
        # time.monotonic(): the interrupter's clock, read from its thread.
        self.deadline = math.inf
        # Whether its scope was cancelled (what the interrupter's thread reads: a trio scope's
        # cancel_called asks trio's clock, only possible in the event loop's thread).
        self.cancelled = False
        self.name = "<routine>"
        self.streaming: bool | None = None  # known once the routine is loaded
        self.protocol_error: str | None = None
        self.output: _output.Sink | None = None  # what the routine logs and prints, forwarded
        self.telemetry: _telemetry.ServerCall | None = None  # its span and metrics, if any
        # A client drives a generator one step at a time: one step frame can be pending, never
        # more (anything else is a protocol error, not a queue to grow).
        self._step: Frame | None = None
        self._arrived: anyio.Event | None = None

    # -- what the interrupter asks (see worker._interrupt) ---------------------------------

    def must_end(self) -> bool:
        return (self.cancelled or time.monotonic() >= self.deadline
                or self.frames.pending(Kind.CANCEL, self.id))

    def cancel_arrived(self) -> bool:
        return self.frames.pending(Kind.CANCEL, self.id)

    def cancel(self) -> None:
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    def due(self) -> bool | None:
        """Whether it must end now, for a call without a scope (cancelled, or past its
        deadline); ``None``: ask its scope, as its next checkpoint would."""
        if self.scope is not None:
            return None
        return self.cancelled or time.monotonic() >= self.deadline

    def refuse(self, frames_it_cannot_use: str) -> None:
        """A protocol error: end this call (its reply says why); the connection goes on."""
        self.protocol_error = frames_it_cannot_use
        self.cancel()

    @property
    def step_pending(self) -> bool:
        return self._step is not None

    def put_step(self, frame: Frame) -> bool:
        """Hold the client's next step; ``False`` when one is held already."""
        if self._step is not None:
            return False
        self._step = frame
        if self._arrived is not None:
            self._arrived.set()
        return True

    async def next_step(self) -> Frame:
        """The client's next step, once it sent one."""
        while self._step is None:
            arrived = self._arrived = anyio.Event()
            await arrived.wait()
        frame, self._step = self._step, None
        return frame


class Server:
    def __init__(self, address: str, nested: NestedProxies,
                 max_concurrency: int | None = None, control: int = 0, *,
                 max_calls: int | None = None,
                 on_retire: Callable[[str], object] | None = None,
                 notify: Callable[[str], object] | None = None) -> None:
        self.address = address
        # What the worker tells the pool that spawned it, one line each on its notices pipe
        # (see _contract): NOTICE_RECYCLE when a client asks for a rolling restart,
        # NOTICE_IDLE every idle_timeout seconds without a call, NOTICE_CALL at the first call
        # taken once the pool asked for it. Only once the pool said it supervises the worker
        # (SUPERVISED on the control pipe): a worker run by hand, or by a bare LocalWorker,
        # refuses recycle requests, since nobody would act on them.
        self._notify = notify
        self.supervised = False
        self.idle_timeout: float | None = None
        self._idle_changed = anyio.Event()
        self.report_call = False
        # Recycling: after max_calls calls admitted, or when told to (its memory),
        # the worker retires: it refuses new calls as busy, for good (its callers try another
        # worker, or wait for room, which a change of workers brings), finishes those it runs,
        # and says so once through on_retire (to its parent, which replaces it, then stops
        # it).
        self.max_calls = max_calls
        self.admitted = 0
        self.retiring: str | None = None
        self._on_retire = on_retire
        self.control = control
        self.nested = nested
        self.max_concurrency = max_concurrency
        self.stop = _Stop()
        self.connections: set[FrameStream] = set()
        self.calls: set[_ServerCall] = set()
        # The generators being closed by the worker itself (see _run_generator), and when they
        # must be closed by once the stop has cancelled the calls.
        self._closing: set[anyio.CancelScope] = set()
        self._close_by = math.inf
        self._connections_changed = anyio.Event()
        # Connections refused a call as busy since they last heard of room, each with its task
        # group: each gets a ROOM frame when a call ends below the bound (its proxy then lets
        # one waiting call try), and is forgotten until refused again.
        self._waiting_for_room: dict[FrameStream, CallGroup] = {}
        # Each connection's output forwarder (runtime._output), for the calls that forward.
        self._forwarders: dict[FrameStream, _output.Forwarder] = {}
        self._on = f" on worker {address}"
        self._hello = envelope.encode_hello(max_concurrency)
        self._library = "asyncio"
        self._started_at = time.perf_counter()  # for the stats' uptime

    # -- connections ---------------------------------------------------------------------------

    async def close_connections(self, deadline: float) -> None:
        """Half-close every connection, then wait until ``deadline`` (``anyio.current_time()``
        seconds) for clients to go.

        A client reads end-of-stream, so calls it sent that were never acknowledged fail as
        "not delivered" (safe to retry elsewhere); meanwhile this side keeps reading, so it
        never closes with unread data, which would reset the stream and could destroy replies
        the client has not read yet. Each half-close waits for the reply being written on its
        connection, if any (a half-close under a write raises ``BusyResourceError``). The
        connections still open a moment before ``deadline`` are shut down, so that their
        handlers' pending receives end with end-of-stream rather than by cancellation.
        """
        with anyio.move_on_at(deadline - _SHUTDOWN_RESERVE):
            async with anyio.create_task_group() as tg:
                for frames in list(self.connections):
                    tg.start_soon(_half_close, frames)
            await self._until_no_connection()
        if self.connections:
            for frames in list(self.connections):
                shut_down(frames.stream)
            with anyio.move_on_at(max(deadline, anyio.current_time() + 0.05)):
                await self._until_no_connection()

    async def _until_no_connection(self) -> None:
        while self.connections:
            await self._connections_changed.wait()

    async def cancel_calls(self, timeout: float) -> None:
        """Cancel every call still running; wait up to ``timeout`` seconds for them to answer
        (each answers :class:`~anywool.errors.RoutineCancelled`). A generator the worker is
        closing itself gets no longer than that either."""
        self._close_by = anyio.current_time() + timeout
        for closing in self._closing:
            closing.deadline = min(closing.deadline, self._close_by)
        for call in list(self.calls):
            call.cancel()
        await self.stop.drain_for(timeout)

    async def handle(self, stream: ByteStream) -> None:
        self._library = _backend()  # what a call run outside a task is told (see _call_here)
        frames = FrameStream(stream, stream)
        self.connections.add(frames)
        try:
            await self._handle(stream, frames)
        finally:
            self.connections.discard(frames)
            self._connections_changed.set()
            self._connections_changed = anyio.Event()

    async def _handle(self, stream: ByteStream, frames: FrameStream) -> None:
        calls: dict[int, _ServerCall] = {}
        origins = envelope.Origins()
        new_scope = scope_factory()
        async with stream, open_call_group() as tg:
            try:
                await frames.send(Frame(Kind.HELLO, 0, self._hello))
            except PEER_GONE:
                return
            self._forwarders[frames] = _output.Forwarder(
                frames, tg.start_soon, _interrupt.Interrupter.call_soon_here())
            # Under asyncio the event loop routes the frames that arrive while this task
            # waits (a call's task is started from there: _callgroup's tasks need no parent
            # task), saving this task a wake-up per frame.
            frames.deliver_while_waiting(
                lambda frame: self._route(frame, frames, calls, origins, tg, new_scope))
            try:
                while True:
                    frame = await frames.receive()
                    self._route(frame, frames, calls, origins, tg, new_scope)
            except PEER_HUNG_UP:
                pass
            except (FrameError, OSError) as exc:
                log.warning("dropping a connection: %s", exc)
            except Exception:
                log.exception("dropping a connection after an unexpected error")
            self._waiting_for_room.pop(frames, None)
            self._forwarders.pop(frames, None)
            tg.cancel_scope.cancel()  # the client is gone: cancel its calls

    def _route(
        self, frame: Frame, frames: FrameStream, calls: dict[int, _ServerCall],
        origins: envelope.Origins, tg: CallGroup, new_scope: Callable[[], Scope]
    ) -> None:
        if frame.kind == Kind.CALL:
            # Decoded here, in the order the calls came, refused or not: a call's origin
            # travels whole only until the connection delivered it once.
            request: envelope.CallRequest | FrameError
            try:
                request = envelope.decode_call(frame.payload, origins)
            except FrameError as exc:
                request = exc
            if self.stop.draining or frame.call_id in calls:
                tg.start_soon(_refuse, frames, frame.call_id)
                return
            if not self._has_room():
                tg.start_soon(self._refuse_busy, frames, frame.call_id, tg)
                return
            # A plain function never suspends: with nothing to wait for (its ACK written at
            # once, no tracing), it runs right here, without a task or a cancel scope.
            here = (not isinstance(request, FrameError) and request.plain
                    and frames.can_send_now() and _telemetry.current() is None)
            call = _ServerCall(frame.call_id, None if here else new_scope(), frames)
            calls[call.id] = call
            self.calls.add(call)
            self.stop.started(call.read_at)
            self.admitted += 1
            if self.report_call:
                self.report_call = False
                self._say(NOTICE_CALL)
            if self.max_calls is not None and self.admitted >= self.max_calls:
                self.retire(f"it took its max_calls={self.max_calls} calls")
            if here:
                self._run_here(frames, call, request, calls, tg, new_scope)  # type: ignore[arg-type]
            else:
                tg.start_soon(self._run, frames, call, calls, self._execute(frames, call, request))
            return
        call = calls.get(frame.call_id)
        if call is None:
            if frame.kind == Kind.STATS:  # not a call: never refused, never counted
                tg.start_soon(self._send_stats, frames, frame.call_id)
            elif frame.kind == Kind.RECYCLE:  # nor is this
                tg.start_soon(self._answer_recycle, frames, frame.call_id)
            return  # late frame for a call that ended
        if frame.kind == Kind.CANCEL:
            call.cancel()
            if call.telemetry is not None:
                call.telemetry.cancel()
            tg.start_soon(_send_quietly, frames, Frame(Kind.CANCELLING, call.id))
        elif frame.kind in (Kind.ASEND, Kind.ATHROW, Kind.ACLOSE):
            if call.streaming is False:
                call.refuse(f"a {frame.kind.name} frame for a coroutine call")
                return
            if not call.put_step(frame):
                call.refuse(f"a {frame.kind.name} frame while the previous step is pending")

    # -- admission -----------------------------------------------------------------------------

    def retire(self, reason: str) -> None:
        """Take no new call from now on (each is refused as busy, and no room is ever offered
        again) and say ``reason`` once through ``on_retire``; the calls running go on."""
        if self.retiring is not None:
            return
        self.retiring = reason
        if self._on_retire is not None:
            self._on_retire(reason)

    def _has_room(self) -> bool:
        if self.retiring is not None:
            return False
        return self.max_concurrency is None or self.stop.in_flight < self.max_concurrency

    async def _refuse_busy(self, frames: FrameStream, call_id: int, tg: CallGroup) -> None:
        # The ROOM that answers this refusal must follow it on the stream: a client that read
        # ROOM first would then wait for one that never comes.
        try:
            await frames.send(Frame(Kind.NACK, call_id, envelope.BUSY))
            if self._has_room():
                await frames.send(Frame(Kind.ROOM, 0))
            else:
                self._waiting_for_room[frames] = tg
        except PEER_GONE:
            pass

    def _offer_room(self) -> None:
        """A call ended: tell every connection refused since it last heard of room. (Owing one
        ROOM per refusal instead loses wake-ups: a refused call that then ran elsewhere leaves
        a ROOM that wakes nobody, while other connections wait for one.)"""
        if self._waiting_for_room and self._has_room():
            waiting, self._waiting_for_room = self._waiting_for_room, {}
            for frames, tg in waiting.items():
                tg.start_soon(_send_room, frames)

    # -- calls ---------------------------------------------------------------------------------

    async def _run(self, frames: FrameStream, call: _ServerCall, calls: dict[int, _ServerCall],
                   work: Awaitable[object]) -> None:
        """Await ``work``, the call's run or the rest of it (its reply); whatever ends it, the
        call's client is told, and the call is counted as ended."""
        try:
            await work
        except PEER_GONE:
            pass  # the client is gone; its connection handler cancels the rest
        except anyio.get_cancelled_exc_class():
            # The worker is stopping or the connection closed: tell the client, then unwind.
            with anyio.CancelScope(shield=True), anyio.move_on_after(REPLY_TIMEOUT):
                await self._reply_cancelled(frames, call)
            raise
        except Exception as exc:  # a reply that could not be made: only this call fails
            log.exception("call %s (%s) failed while replying", call.id, call.name)
            try:
                await self._reply_exception(frames, call, RuntimeError(
                    f"worker {self.address} failed to reply for {call.name}: {exc!r}"))
            except (*PEER_GONE, FrameError):
                pass
        finally:
            self._ended(call, calls)

    def _ended(self, call: _ServerCall, calls: dict[int, _ServerCall]) -> None:
        if call.output is not None:
            call.output.close()
        if call.telemetry is not None:
            call.telemetry.finish()
        calls.pop(call.id, None)
        self.calls.discard(call)
        self.stop.finished()
        self._offer_room()

    def _run_here(self, frames: FrameStream, call: _ServerCall, request: envelope.CallRequest,
                  calls: dict[int, _ServerCall], tg: CallGroup,
                  new_scope: Callable[[], Scope]) -> None:
        """Run a plain function's call where its frame was routed (the connection's task under
        trio, the reader's callback under asyncio), without a task or a cancel scope: a plain
        function never suspends, so neither would serve it. The interrupter ends it as it
        would in a task (``_ServerCall.due``). Its ACK is written whole before it runs, or it
        runs in a task after all; what must wait once it ran (output to forward first, an
        exception or a large value to send, a full socket) goes on in a task."""
        try:
            fn, args, kwargs = serializer.loads_value(request.call, request.name,
                                                      "the arguments", self._on)
            values = self._load_context(request.context, request.name)
            body = routine_body(fn)
            waited = time.perf_counter() - call.read_at
            # Withdrawn already: its cancel frame came in the same read (still buffered, not
            # routed yet), or, after a long load, may wait in the socket.
            if frames.pending(Kind.CANCEL, call.id, look_in_socket=waited > _LOOK_AFTER) \
                    or not frames.send_now(encode(Frame(Kind.ACK, call.id,
                                                        envelope.encode_ack(waited)))):
                raise _NotHere
        except BaseException:  # PEER_GONE too: the task finds the connection gone
            # As any call, in a task: it loads the call again (and says why it cannot), sees
            # its cancel frame, or waits to write its ACK. (Nothing of the routine ran.)
            call.scope = new_scope()
            tg.start_soon(self._run, frames, call, calls, self._execute(frames, call, request))
            return
        call.name = request.name
        call.streaming = False
        if request.timeout is not None:
            call.deadline = time.monotonic() + request.timeout
        try:
            # In a context of its own, as a task's: what it sets is its own, and what it
            # changed goes back to its caller.
            contextvars.copy_context().run(self._call_here, frames, call, request, calls, tg,
                                           body, args, kwargs, values)
        except Exception as exc:  # a failure of ours, not the function's: only this call fails
            if calls.get(call.id) is call:
                log.exception("call %s (%s) failed", call.id, call.name)
                tg.start_soon(self._run, frames, call, calls, self._reply_exception(
                    frames, call, RuntimeError(
                        f"worker {self.address} failed to reply for {call.name}: {exc!r}")))

    def _call_here(self, frames: FrameStream, call: _ServerCall, request: envelope.CallRequest,
                   calls: dict[int, _ServerCall], tg: CallGroup, body: Callable[..., Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any],
                   values: dict[str, Any] | None) -> None:
        # (In the call's context: a task started from here gets a copy of it. No dispatcher
        # for nested calls: a plain function makes none.) Outside any task under asyncio:
        # sniffio, and so AnyIO, are told which library runs.
        sniffio.current_async_library_cvar.set(self._library)
        forwarder = self._forwarders.get(frames) if request.forward else None
        if forwarder is not None:
            call.output = forwarder.sink(call.id)
            call.output.open()
        set_running(RoutineTask(call.id, request.caller, call.name, math.inf
                                if request.timeout is None
                                else anyio.current_time() + request.timeout))
        _context.apply(values)
        # The call to interrupt from here on, and only here: an interruption is caught below
        # (RoutineTask's __init__ above, made by dataclasses, is nobody's machinery).
        _interrupt.current.set(call)
        work: Awaitable[object] | None
        try:
            value = _interrupt.invoke(body, args, kwargs)
        except BaseException as exc:
            work = self._reply_raised(frames, call, exc, values)
        else:
            try:
                work = self._reply_here(frames, call, calls, value, values)
            except SerializationError as error:  # whatever a value's __reduce__ did
                work = self._reply_exception(frames, call, error)
            except BaseException as exc:  # an interruption in a value's __reduce__
                work = self._reply_raised(frames, call, exc, values)
        if work is not None:
            tg.start_soon(self._run, frames, call, calls, work)

    def _reply_here(self, frames: FrameStream, call: _ServerCall,
                    calls: dict[int, _ServerCall], value: object,
                    values: dict[str, Any] | None) -> Awaitable[object] | None:
        """Send a plain function's value at once, and end its call (``None``), or say what
        sends it."""
        if call.output is not None and call.output.dirty:  # the output goes first
            return self._reply_returned(frames, call, value, values)
        data = serializer.dumps_value(value, call.name, "the value it returned", self._on)
        changes = self._changes(call, values)
        payload = envelope.encode_reply(data, changes)
        if payload.nbytes <= SEND_NOW_AT_MOST:
            try:
                sent = frames.send_now(encode_parts(Kind.RETURN, call.id, payload,
                                                    frames.max_frame_size))
            except FrameError:  # larger than this connection's frames
                sent = False
            except PEER_GONE:  # the client is gone: nobody to tell
                sent = True
            if sent:
                self.stop.returned += 1
                self._ended(call, calls)
                return None
        return self._send_return(frames, call, data, changes)

    async def _reply_raised(self, frames: FrameStream, call: _ServerCall, exc: BaseException,
                            values: dict[str, Any] | None) -> None:
        """A plain function's call run where its frame was routed raised ``exc``: reply."""
        if _interrupt.interrupted(exc) and call.due():  # ended for its caller or deadline
            await self._reply_cancelled(frames, call)
        else:
            await self._reply_exception(frames, call, self._reportable(call, exc), values)

    async def _reply_returned(self, frames: FrameStream, call: _ServerCall, value: object,
                              values: dict[str, Any] | None) -> None:
        if await self._reply_value(frames, call, value, "the value it returned", values,
                                   Kind.RETURN):
            self.stop.returned += 1

    async def _send_return(self, frames: FrameStream, call: _ServerCall, data: Pickled,
                           changes: Pickled | None) -> None:
        """The rest of :meth:`_reply_value`, for a value pickled already."""
        payload = envelope.encode_reply(data, changes)
        limit = payload_limit(frames.max_frame_size)
        if payload.nbytes <= limit:
            await frames.send_parts(Kind.RETURN, call.id, payload)
            self.stop.returned += 1
        else:
            await self._reply_exception(frames, call, _too_large(call, data, payload, limit))

    async def _execute(self, frames: FrameStream, call: _ServerCall,
                       request: envelope.CallRequest | FrameError) -> None:
        scope = call.scope
        assert scope is not None  # a call run in a task has one
        with scope:
            try:
                if isinstance(request, FrameError):
                    raise request
                call.name = request.name
                fn, args, kwargs = serializer.loads_value(request.call, call.name,
                                                          "the arguments", self._on)
                values = self._load_context(request.context, call.name)
                body = routine_body(fn)
                call.streaming = not request.plain and inspect.isasyncgenfunction(body)
                if request.timeout is not None and not call.streaming:
                    scope.deadline = anyio.current_time() + request.timeout
                    call.deadline = time.monotonic() + request.timeout
            except Exception as exc:
                await self._reply_exception(frames, call, exc)
                return
            waited = time.perf_counter() - call.read_at
            if call.cancelled or (waited > _LOOK_AFTER and call.cancel_arrived()):
                # Its caller gave it up before it started (while it loaded, say): it must not
                # start now. Its caller withdrew it and waits for nothing; the reply is for
                # the record. (A cancel frame that came sooner was routed already: the loop
                # was free to.)
                call.cancel()
                await anyio.lowlevel.checkpoint()
            await frames.send(Frame(Kind.ACK, call.id, envelope.encode_ack(waited)))
            # Set in this call's own task: the routine (and tasks it starts) see them, nothing
            # else does. From here on, what runs is the routine's (loading its arguments is
            # not: an interruption there would cut an import halfway).
            set_active(self.nested.dispatcher(request.origin, call.name))
            _interrupt.current.set(call)
            forwarder = self._forwarders.get(frames) if request.forward else None
            if forwarder is not None:  # what the routine logs and prints goes to its caller
                # (none: the connection ended since the ACK went; the call is being cancelled)
                call.output = forwarder.sink(call.id)
                call.output.open()
            telemetry = _telemetry.current()
            if telemetry is not None:  # its span, current in this task until the call ends
                call.telemetry = telemetry.server(
                    call.name, "generator" if call.streaming else "function" if request.plain
                    else "coroutine", request.trace)
            if call.streaming:
                await self._run_generator(frames, call, request.caller, body, args, kwargs)
            else:
                if call.step_pending:  # sent before it loaded
                    call.refuse("a step frame for a coroutine call")
                set_running(RoutineTask(call.id, request.caller, call.name, scope.deadline))
                _context.apply(values)
                await self._run_coroutine(frames, call, values, body, args, kwargs,
                                          plain=request.plain)
        if scope.cancelled_caught:
            if call.protocol_error is not None:
                await self._reply_exception(frames, call, FrameError(
                    f"{call.protocol_error} ({call.name}); the call was ended"))
            else:
                await self._reply_cancelled(frames, call)

    def _load_context(self, data: Pickled | None, name: str) -> dict[str, Any] | None:
        if data is None:
            return None
        values = serializer.loads_value(data, name, "the values of its context variables",
                                        self._on)
        if not isinstance(values, dict) or not all(isinstance(key, str) for key in values):
            raise SerializationError(name, "the values of its context variables",
                                     f"are not a dict by variable name{self._on}")
        return values

    async def _run_coroutine(
        self,
        frames: FrameStream,
        call: _ServerCall,
        values: dict[str, Any] | None,
        body: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        plain: bool = False,
    ) -> None:
        """Run a coroutine routine, or (``plain``) a plain function, right here in the call's
        task: a plain function holds the event loop until it returns (see worker._interrupt
        for how it is cancelled meanwhile)."""
        try:
            if plain:
                value = _interrupt.invoke(body, args, kwargs)
            else:
                value = await body(*args, **kwargs)
        except BaseException as exc:
            if _interrupt.interrupted(exc):
                await _ended_by_its_scope()
            await self._reply_exception(frames, call, self._reportable(call, exc), values)
            return
        if await self._reply_value(frames, call, value, "the value it returned", values,
                                   Kind.RETURN):
            self.stop.returned += 1

    async def _run_generator(
        self,
        frames: FrameStream,
        call: _ServerCall,
        caller: int | None,
        body: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        agen = body(*args, **kwargs)
        try:
            while True:
                frame = await call.next_step()
                sent: Any = None
                thrown: BaseException | None = None
                try:
                    step = envelope.decode_step(frame.payload)
                    values = self._load_context(step.context, call.name)
                    if frame.kind == Kind.ASEND:
                        sent = serializer.loads_value(step.value, call.name,
                                                      "the value sent to it", self._on)
                    elif frame.kind == Kind.ATHROW:
                        thrown = _exceptions.loads_exception(step.value.stream())
                except Exception as exc:
                    await self._reply_exception(frames, call, exc)
                    return
                # Each step runs as a local one would: in the caller's context variables, under
                # the caller's deadline at that step (none between steps).
                _context.apply(values)
                traced = None if call.telemetry is None else call.telemetry.step(step.trace)
                item: Any = None
                ended = False
                error: BaseException | None = None
                with anyio.CancelScope() as step_scope:
                    if step.timeout is not None:
                        step_scope.deadline = anyio.current_time() + step.timeout
                        call.deadline = time.monotonic() + step.timeout
                    set_running(RoutineTask(call.id, caller, call.name, step_scope.deadline))
                    try:
                        if thrown is not None:
                            item = await agen.athrow(thrown)
                        elif frame.kind == Kind.ASEND:
                            item = await agen.asend(sent)
                        else:
                            await agen.aclose()
                            ended = True
                    except StopAsyncIteration:
                        ended = True
                    except BaseException as exc:
                        if _interrupt.interrupted(exc):
                            await _ended_by_its_scope()
                        error = self._reportable(call, exc)
                    finally:
                        call.deadline = math.inf  # none between steps
                        if traced is not None:
                            call.telemetry.step_done(traced)  # type: ignore[union-attr]
                if step_scope.cancelled_caught:  # the caller's deadline for this step passed
                    await self._reply_cancelled(frames, call)
                elif error is not None:
                    await self._reply_exception(frames, call, error, values)
                elif ended:
                    await self._reply_end(frames, call, values)
                elif await self._reply_value(frames, call, item, "the item it yielded", values):
                    continue
                return
        finally:
            # Cancelled between steps, or the client vanished: run the generator's finally now,
            # within the stop's bound if the worker is stopping (see cancel_calls).
            deadline = min(anyio.current_time() + REPLY_TIMEOUT * 5, self._close_by)
            with anyio.CancelScope(shield=True, deadline=deadline) as closing:
                self._closing.add(closing)
                try:
                    await agen.aclose()
                except anyio.get_cancelled_exc_class():
                    raise
                except BaseException:  # SystemExit too: nobody waits for this, so it is logged
                    log.exception("closing async generator %s failed", call.name)
                finally:
                    self._closing.discard(closing)

    def _reportable(self, call: _ServerCall, exc: BaseException) -> BaseException:
        """What to send the caller for ``exc``, which the routine raised; re-raises a
        cancellation that a cancel scope here asked for (this call's, its connection's, the
        worker's), which ends the call as cancelled.

        An ``Exception`` goes as it is. Any other ``BaseException`` (``SystemExit``, a stray
        cancellation nobody here asked for, ...) becomes :class:`RoutineAborted` with it as the
        cause: re-raised in the caller, it would exit, interrupt or cancel it.
        """
        if isinstance(exc, Exception):
            return exc
        if isinstance(exc, anyio.get_cancelled_exc_class()) and (
                (call.scope is not None and call.scope.cancel_called)
                or anyio.current_effective_deadline() == -math.inf):
            raise exc
        aborted = RoutineAborted(call.name, self.address, type(exc).__qualname__)
        aborted.__cause__ = exc
        return aborted

    # -- replies -------------------------------------------------------------------------------

    def _changes(self, call: _ServerCall, before: dict[str, Any] | None) -> Pickled | None:
        """What the routine changed in its context variables since ``before``, pickled.

        :raises SerializationError: a changed value cannot be pickled.
        """
        changed = _context.changes(before)
        return None if changed is None else serializer.dumps_context(changed, call.name,
                                                                     self._on)

    async def _reply_value(self, frames: FrameStream, call: _ServerCall, value: object,
                           what: str, before: dict[str, Any] | None,
                           kind: Kind = Kind.RESULT) -> bool:
        """Send ``value`` as a ``RESULT`` (a generator's item) or ``RETURN`` (a coroutine's
        value, which ends the call); ``False`` when it failed the call instead."""
        if call.output is not None and call.output.dirty:
            await call.output.flush()  # the output first: the caller has it when it returns
        try:
            data = serializer.dumps_value(value, call.name, what, self._on)
            changes = self._changes(call, before)
        except SerializationError as error:  # whatever a value's __reduce__ did
            await self._reply_exception(frames, call, error)
            return False
        payload = envelope.encode_reply(data, changes)
        limit = payload_limit(frames.max_frame_size)
        if payload.nbytes <= limit:
            await frames.send_parts(kind, call.id, payload)
            return True
        await self._reply_exception(frames, call, _too_large(call, data, payload, limit))
        return False

    async def _reply_end(self, frames: FrameStream, call: _ServerCall,
                         before: dict[str, Any] | None) -> None:
        if call.output is not None and call.output.dirty:
            await call.output.flush()
        try:
            changes = self._changes(call, before)
        except SerializationError as error:
            await self._reply_exception(frames, call, error)
            return
        payload = envelope.encode_end(changes)
        limit = payload_limit(frames.max_frame_size)
        if payload.nbytes <= limit:
            await frames.send_parts(Kind.END, call.id, payload)
            self.stop.returned += 1
            return
        await self._reply_exception(frames, call, PayloadTooLarge(
            f"the context-variable values {call.name} set", payload.nbytes, limit))

    async def _reply_exception(self, frames: FrameStream, call: _ServerCall, exc: BaseException,
                               before: dict[str, Any] | None | _Untracked = _UNTRACKED
                               ) -> None:
        """Send ``exc`` as the call's end, with the context variables the routine changed
        since ``before`` (when it ran at all: a call that failed before running has none).

        What does not fit one frame is dropped, the least first: the changes (a note on the
        exception says so), then the exception itself (a ``RuntimeError`` naming it instead).
        """
        if call.output is not None and call.output.dirty:
            await call.output.flush()
        if call.telemetry is not None:
            call.telemetry.failed(exc)
        changes = None
        if not isinstance(before, _Untracked):
            try:
                changes = self._changes(call, before)
            except SerializationError as error:
                exc.add_note(f"(its context-variable changes were lost: {error})")
        limit = payload_limit(frames.max_frame_size)
        data = Pickled([_exceptions.dumps_exception(exc)])
        if changes is not None and envelope.encode_reply(data, changes).nbytes > limit:
            exc.add_note(f"(its context-variable changes were lost: {sum(changes.sizes())} "
                         "bytes do not fit one frame)")
            data, changes = Pickled([_exceptions.dumps_exception(exc)]), None
        if envelope.encode_reply(data).nbytes > limit:
            data = Pickled([_exceptions.dumps_exception(RuntimeError(
                f"{type(exc).__name__}: {str(exc)[:1000]} (too large to send)"))])
        await frames.send_parts(Kind.EXCEPTION, call.id, envelope.encode_reply(data, changes))
        if isinstance(exc, RoutineCancelled):
            self.stop.cancelled += 1
        else:
            self.stop.raised += 1

    async def _reply_cancelled(self, frames: FrameStream, call: _ServerCall) -> None:
        try:
            await self._reply_exception(frames, call, RoutineCancelled(call.name, self.address))
        except PEER_GONE:
            pass  # the client is gone; nobody to tell

    # -- stats: what the worker says of itself -----------------------------------------------

    def stats(self) -> WorkerStats:
        """What this worker says of itself when asked (see :class:`WorkerStats`)."""
        stop = self.stop
        now = time.perf_counter()
        busy = stop.busy + (now - stop.busy_since if stop.in_flight else 0.0)
        rss, peak = _stats.memory()
        return WorkerStats(os.getpid(), _backend(), platform.python_version(),
                           __version__,
                           self.max_concurrency, stop.in_flight, stop.served, stop.returned,
                           stop.raised, stop.cancelled, busy, now - self._started_at, rss, peak)

    async def _send_stats(self, frames: FrameStream, request_id: int) -> None:
        await _send_quietly(frames, Frame(Kind.STATS, request_id,
                                          envelope.encode_stats(self.stats())))

    # -- the pool that spawned this worker: notices and recycle requests ----------------------

    def _say(self, notice: str) -> None:
        if self._notify is not None:
            self._notify(notice)

    def recycle_refusal(self) -> str | None:
        """Why a ``RECYCLE`` request is refused now (``None``: it is passed on)."""
        if not self.supervised or self._notify is None:
            return "not run by a pool: nobody would replace this worker"
        if self.stop.draining or self.stop.requested.is_set():
            return "the worker is stopping"
        if self.retiring is not None:
            return f"the worker is retiring ({self.retiring}): ask another of its pool"
        return None

    async def _answer_recycle(self, frames: FrameStream, request_id: int) -> None:
        refusal = self.recycle_refusal()
        if refusal is None:
            self._say(NOTICE_RECYCLE)  # before the answer: "accepted" means the pool has it
        await _send_quietly(frames, Frame(Kind.RECYCLE, request_id,
                                          envelope.encode_recycle_answer(refusal)))

    async def watch_idle(self) -> None:
        """Say :data:`NOTICE_IDLE` each time ``idle_timeout`` seconds pass without a call in
        flight (counted from the last call's end, or the start), again every ``idle_timeout``
        seconds while none comes, until the worker stops or retires. Does nothing until the
        pool sets ``idle_timeout`` (a control line)."""
        said_at = -math.inf
        while not (self.stop.requested.is_set() or self.retiring is not None):
            timeout = self.idle_timeout
            if timeout is None:
                await self._idle_changed.wait()
                continue
            if self.stop.in_flight:
                await anyio.sleep(timeout)
                continue
            now = time.perf_counter()
            left = max(self.stop.quiet_since, said_at) + timeout - now
            if left <= 0:
                said_at = now
                self._say(NOTICE_IDLE)
            else:
                await anyio.sleep(left)

    def _control(self, words: list[str]) -> bool:
        """Apply one control line from the pool, other than a stop request; whether it was
        one."""
        if words == [SUPERVISED]:
            self.supervised = True
        elif words == [REPORT_CALL]:
            self.report_call = True
        elif len(words) == 2 and words[0] == IDLE_TIMEOUT:
            try:
                timeout = float(words[1])
            except ValueError:
                return False
            if not (timeout > 0 and math.isfinite(timeout)):
                return False
            self.idle_timeout = timeout
            self._idle_changed.set()
        else:
            return False
        return True

    # -- control -------------------------------------------------------------------------------

    async def watch_stdin(self) -> None:
        """Read stop requests from the parent's pipe (:attr:`control`); at EOF, stop now."""
        buffer = b""
        while True:
            try:
                await anyio.wait_readable(self.control)
            except OSError:  # not pollable (a file, /dev/null: run by hand); reads never block
                await anyio.lowlevel.checkpoint()
            chunk = os.read(self.control, 4096)
            if not chunk:
                self.stop.request(0)
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                words = line.decode(errors="replace").split()
                if len(words) == 2 and words[0] == STOP:
                    try:
                        self.stop.request(float(words[1]))
                    except ValueError:
                        log.warning("ignoring malformed control line %r", line)
                elif words and not self._control(words):
                    log.warning("ignoring unknown control line %r", line)

    async def watch_parent(self, pidfd: int) -> None:
        """Stop now, as at EOF on stdin, once the parent's pidfd says it has exited: also
        when another process holds the write end of our stdin, which then never hangs up."""
        await anyio.wait_readable(pidfd)
        self.stop.request(0)

    def interrupter(self, parent: int | None = None) -> _interrupt.Interrupter:
        """The interrupter of this worker's calls (see :mod:`anywool.runtime.worker._interrupt`),
        made in the event loop: SIGTERM stops now, SIGINT drains forever; both are seen, and
        the calls that must end are interrupted, also while a routine holds the loop. With
        ``parent`` (a pidfd on the parent), the parent's exit stops now too (as
        :meth:`watch_parent` does, once the loop turns)."""

        def on_signal(signum: int) -> None:
            if signum == signal.SIGTERM:
                self.stop.terminate()
            else:
                self.stop.request(-1)

        return _interrupt.Interrupter(lambda: list(self.calls), lambda: self.stop.grace == 0,
                                      _interrupt.Interrupter.call_soon_here(), on_signal,
                                      parent=parent)


def _backend() -> str:
    return sniffio.current_async_library()


async def _ended_by_its_scope() -> None:
    """A routine was interrupted (worker._interrupt) because its scope is cancelled or past
    its deadline: raise that cancellation here, as the routine's next checkpoint would have,
    so that the call ends as any cancelled call does.

    One checkpoint is not enough under asyncio: a deadline's timer that came due while the
    routine held the loop runs only in a later pass of the loop than this task's next step,
    and its cancellation reaches the task one pass after that; meanwhile the interruption
    would be reported as the routine's own exception (``RoutineAborted``). So this waits for
    the cancellation, at most REPLY_TIMEOUT seconds (it is due: it comes within a pass or
    two); should none come, the interruption is reported as before.
    """
    with anyio.move_on_after(REPLY_TIMEOUT):
        await anyio.sleep_forever()


def _too_large(call: _ServerCall, data: Pickled, payload: Parts, limit: int) -> PayloadTooLarge:
    """Why a reply of ``data`` (``payload`` with the context changes) does not fit a frame."""
    what = (f"the value produced by {call.name}" if envelope.encode_reply(data).nbytes > limit
            else f"the context-variable values {call.name} set")
    return PayloadTooLarge(what, payload.nbytes, limit)


async def _half_close(frames: FrameStream) -> None:
    try:
        await frames.send_eof()
    except PEER_GONE:
        pass  # the client is gone already


async def _refuse(frames: FrameStream, call_id: int) -> None:
    try:
        await frames.send(Frame(Kind.NACK, call_id))
    except PEER_GONE:
        pass  # half-closed or gone: the client reads end-of-stream, "not delivered", instead


async def _send_room(frames: FrameStream) -> None:
    await _send_quietly(frames, Frame(Kind.ROOM, 0))


async def _send_quietly(frames: FrameStream, frame: Frame) -> None:
    try:
        await frames.send(frame)
    except PEER_GONE:
        pass  # the client is gone: nobody to tell
