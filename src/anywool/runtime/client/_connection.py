"""The client side of one worker connection: many concurrent calls over one stream.

:class:`WorkerConnection` is an owner: entering it connects and starts its reader task in its own
task group; the reader demultiplexes frames by call id to the calls
(:class:`~anywool.runtime.client._call.Call`: a queue and an event each; under asyncio the event
loop routes them itself while the reader waits, see ``FrameStream.deliver_while_waiting``).
Callers never touch the task group: a call sends frames (under the frame stream's send lock) and
waits for its own, so any task may call, and the async generator returned for a streaming
routine never yields inside a cancel scope (house rule 3). What one call is, and how it is
driven and cancelled, is :mod:`anywool.runtime.client._call`'s.

What this module must never do: retry a call the worker may have started (only undelivered calls
are reported as :class:`CallNotDelivered`, which a load balancer may retry elsewhere).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import ByteStream, TaskGroup

from anywool import _secret
from anywool._address import Address
from anywool._owner import SingleUse, exit_task_group
from anywool.errors import AuthenticationError, PayloadTooLarge, WorkerError
from anywool.runtime import _output, _telemetry
from anywool.runtime._routine import running_task
from anywool.runtime.client import _wakeup
from anywool.runtime.client._call import (
    TERMINAL,
    Call,
    CallNotDelivered,
    dump_context,
    seconds_left,
)
from anywool.runtime.client._wakeup import Wakeup
from anywool.runtime.wire import _auth, _socket
from anywool.runtime.wire import _envelope as envelope
from anywool.runtime.wire import _serializer as serializer
from anywool.runtime.wire._envelope import CallRequest, Origin
from anywool.runtime.wire._frames import (
    DEFAULT_MAX_FRAME_SIZE,
    Frame,
    FrameError,
    FrameStream,
    Kind,
    Parts,
    payload_limit,
    shut_down,
)
from anywool.runtime.wire._peer import PEER_GONE
from anywool.runtime.wire._serializer import Buffer
from anywool.runtime.wire._stats import WorkerStats

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._connection")

# Seconds a closing connection waits for the worker's end-of-stream, then for the close itself.
_CLOSE_TIMEOUT = 1.0
# Calls sent to a worker that has not started them yet are committed to it: no other worker can
# take them. So a connection takes more only while its calls start promptly (see
# WorkerConnection.busy): its window of calls waiting to start grows by one for each call that
# started within START_WITHIN seconds of the worker reading it (the worker says, in its ACK),
# and shrinks in proportion (by HELD_OVER / the wait) when one waited over HELD_OVER (a
# worker whose event loop runs CPU-bound work starts the next call only when the current one
# ends). In between it stays: a worker starting a burst of quick calls starts the last of
# them a few milliseconds after reading it, and a window cut for that would leave the worker
# idle while the caller waits to learn it has room. Up to WINDOW_MAX calls may wait; a call
# once started no longer counts.
START_WITHIN = 0.002
HELD_OVER = 0.02
WINDOW_MAX = 64
INITIAL_WINDOW = 1


class WorkerConnection(SingleUse):
    """One connection to one worker, shared by any number of concurrent calls.

    :param address: the worker's address, ``"unix:/path"`` or ``"host:port"``.
    :param connect_timeout: seconds allowed to connect (> 0).
    :param cancel_timeout: seconds a cancelled call waits for the worker to confirm that the
        routine finished unwinding, before giving up on the confirmation (> 0).
    :param cancel_grace: seconds a cancelled call that the worker had started waits for the
        worker to take the cancellation (answer it, or end the call) before it counts the worker
        as stuck (its event loop held by C code that cannot be interrupted, or by a routine
        that ignores the interruption), calls ``on_unresponsive`` and gives the call up (> 0).
    :param on_unresponsive: called (synchronously, from the cancelled call's task) when the
        worker did not take a cancellation within ``cancel_grace``.
    :param max_frame_size: the largest frame body accepted or sent, in bytes.
    :param on_lost: called (synchronously, from the reader task) once when the connection fails
        or the worker closes it.
    :param on_room: called (synchronously, from the reader task) when the worker, having
        refused a call of this connection as busy, has room again (a call ended there).
    :param on_free: called (synchronously) when the connection stops being :attr:`busy`
        because a call waiting to start on it started, ended or was given up.
    :param on_accepted: called (synchronously, from the reader task) whenever the worker
        accepts a call after it said it had room (``on_room``), until it refuses one as busy
        again: it may have room for more.
    :param on_sent: called (synchronously, from the calling task) whenever a call is about to
        be sent, once it counts among the calls waiting to start (see :attr:`busy`).
    :param origin: returns what calls made here carry as their origin: the key and pickle of
        the proxy that routines running for them dispatch their own calls through (``None``:
        no proxy; such routines cannot call routines).
    :param credentials: what to authenticate with to a TCP worker (see
        :mod:`anywool.runtime.wire._auth`); unused for a Unix socket.
    :param output: where what routines log and print goes (see :mod:`anywool.runtime._output`);
        ``None``: calls ask the worker to keep it. A call made from a routine on a worker
        forwards as the call it is made from does, and relays what it gets to that call.
    :param identity: the worker's uid and pid, which its output is tagged with (``None``: not
        known).
    :param attributes: what the spans and metrics of this connection's calls say about the
        worker (a proxy's: ``anywool.worker.uid``, ``anywool.namespace``; default:
        ``anywool.worker.address``; see :mod:`anywool.runtime._telemetry`).

    Entering raises :class:`~anywool.errors.WorkerError` when the worker cannot be reached within
    ``connect_timeout``, :class:`~anywool.errors.AuthenticationError` when a TCP worker and
    this side do not authenticate each other (or there are no credentials to do it with), and
    ``RuntimeError`` on a second entry. Exiting closes the stream and fails
    every pending call with :class:`~anywool.errors.WorkerError`; it is shielded, bounded and
    never raises.
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout: float = 10.0,
        cancel_timeout: float = 5.0,
        cancel_grace: float = 1.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        on_lost: Callable[[], object] | None = None,
        on_room: Callable[[], object] | None = None,
        on_free: Callable[[], object] | None = None,
        on_accepted: Callable[[], object] | None = None,
        on_sent: Callable[[], object] | None = None,
        on_unresponsive: Callable[[], object] | None = None,
        origin: Callable[[], Origin | None] | None = None,
        credentials: _auth.Credentials | None = None,
        output: _output.Output | None = None,
        identity: tuple[str | None, int | None] = (None, None),
        attributes: dict[str, str] | None = None,
    ) -> None:
        self.address = address
        self._output = output
        self._identity = identity
        self.attributes = attributes or {"anywool.worker.address": address}
        self._credentials = credentials
        self._connect_timeout = connect_timeout
        self._cancel_timeout = cancel_timeout
        self._cancel_grace = cancel_grace
        self._on_unresponsive = on_unresponsive
        self._max_frame_size = max_frame_size
        self._on_lost = on_lost
        self._on_room = on_room
        self._on_free = on_free
        self._on_accepted = on_accepted
        self._on_sent = on_sent
        self._origin = origin
        self._refused = False  # the worker refused a call as busy and has not had room since
        # Since the worker's last ROOM, and until it refuses a call again: every call it
        # accepts may leave it room for one more (see on_accepted).
        self._roomy = False
        self._unstarted = 0  # calls sent that the worker has neither accepted nor answered
        self._window = INITIAL_WINDOW  # how many calls may wait to start (see START_WITHIN)
        self._limit: int | None = None  # the worker's max_concurrency, from its HELLO
        self._running = 0  # calls sent whose end the worker has not sent (see outstanding)
        self._stream: ByteStream | None = None
        self._frames: FrameStream | None = None
        self._task_group: TaskGroup | None = None
        self._calls: dict[int, Call] = {}
        # Statistics and recycle requests waiting for their answer, by request id (see stats,
        # recycle).
        self._stats_waiters: dict[int, _StatsWaiter] = {}
        # The origin key this connection delivered whole (see _envelope): later calls carry
        # the key alone.
        self._origin_delivered: bytes | None = None
        self._ids = itertools.count(1)
        self._failure: str | None = None
        self._wakeup: Callable[[], Wakeup] = anyio.Event  # native to the backend once entered
        self._reader_done: anyio.Event | None = None
        self._idle: anyio.Event | None = None
        self._lost = anyio.Event()

    @property
    def broken(self) -> bool:
        """Whether the connection failed or was closed; a broken connection takes no calls."""
        return self._failure is not None

    @property
    def busy(self) -> bool:
        """Whether this connection should take no call now, which a load balancer should
        respect: the worker refused a call of it as busy (it runs its ``max_concurrency``
        calls) and has not said since that it has room, or as many calls as its window allows
        wait to start on it (the worker has not begun them yet: its event loop is running
        other work), or it has as many calls open as the worker's ``max_concurrency``. A call
        sent anyway is delivered; it may wait there, or be refused."""
        return (self._refused or self._unstarted >= self._window
                or (self._limit is not None and self._running >= self._limit))

    @property
    def outstanding(self) -> int:
        """The calls of this connection the worker may be running: sent, and neither ended
        (the worker's last answer to them read) nor given up."""
        return self._running

    async def __aenter__(self) -> WorkerConnection:
        self._enter_once()
        try:
            address = Address.parse(self.address)
            with anyio.fail_after(self._connect_timeout):
                stream = await _socket.connect(address)
            if not address.is_unix:
                stream = await self._authenticate(stream, address)
            self._stream = stream
        except TimeoutError:
            raise WorkerError(
                self.address, f"could not connect within {self._connect_timeout} seconds"
            ) from None
        except (OSError, ValueError) as exc:  # ValueError: malformed, or a host IDNA refuses
            raise WorkerError(self.address, f"could not connect: {exc!r}") from exc
        self._frames = FrameStream(self._stream, self._stream, max_frame_size=self._max_frame_size)
        task_group = self._task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._reader_done = anyio.Event()
        self._wakeup = _wakeup.factory()
        task_group.start_soon(self._read, name=f"anywool-reader-{self.address}")
        return self

    async def _authenticate(self, stream: ByteStream, address: Address) -> ByteStream:
        """The stream to frame over, once this side and the worker authenticated each other
        (closed on any failure)."""
        if self._credentials is None:
            await anyio.aclose_forcefully(stream)
            raise AuthenticationError(
                self.address, "no credentials: a TCP worker accepts only peers that "
                f"authenticate; pass secret= (or set ${_secret.ENV}) or tls= to the pool or "
                "proxy")
        return await _auth.authenticate_client(stream, self._credentials, address=self.address,
                                               server_hostname=address.host)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._fail("the connection was closed")
        task_group, self._task_group = self._task_group, None
        try:
            with anyio.CancelScope(shield=True):
                await self._close_stream()
        finally:
            await exit_task_group(task_group)

    async def _close_stream(self) -> None:
        """End the stream so that the reader ends by itself (see :meth:`_read`) and no send is
        pending when it is closed (bounded).

        Half-close once the frame being written, if any, is written whole (a caller's send is
        shielded and may outlive this exit), also when the reader is done already; let the
        worker answer with end-of-stream; then close. If the worker reads or answers nothing
        in time, shut the socket down first, so that the pending receive and send end by the
        socket turning ready: closing under them can make asyncio report ``InvalidStateError``
        (or ``EBADF``) through the loop.
        """
        stream, frames, reader_done = self._stream, self._frames, self._reader_done
        if stream is None or frames is None or reader_done is None:
            return
        with anyio.move_on_after(_CLOSE_TIMEOUT):
            try:
                await frames.send_eof()  # once the frame being written, if any, is written
            except PEER_GONE:
                pass
            else:
                await reader_done.wait()
        if not reader_done.is_set() or frames.writing:
            shut_down(stream)
            with anyio.move_on_after(_CLOSE_TIMEOUT):
                await reader_done.wait()
                await frames.wait_written()
        with anyio.move_on_after(_CLOSE_TIMEOUT):
            await stream.aclose()

    async def _read(self) -> None:
        reason = "the worker closed the connection"
        # The reader is never interrupted in a receive: it ends when the worker ends the stream
        # (the exit half-closes first, and the worker answers with end-of-stream). Under
        # asyncio, anyio's Unix socket receive reports InvalidStateError through the loop when
        # its pending receive is resolved by a cancellation or a close in the same loop
        # iteration as the socket becomes readable; end-of-stream resolves it normally.
        try:
            with anyio.CancelScope(shield=True):
                await self._read_frames()
        except anyio.EndOfStream:
            pass
        except FrameError as exc:
            reason = str(exc)
        except anyio.ClosedResourceError:
            reason = "the connection was closed"
        except PEER_GONE as exc:
            reason = f"connection failed: {exc!r}"
        finally:
            assert self._reader_done is not None
            self._reader_done.set()
        self._fail(reason)

    async def _read_frames(self) -> None:
        frames = self._frames
        assert frames is not None
        # Under asyncio, frames that arrive while this task waits are routed by the event loop
        # itself (no wake-up of this task between the worker's reply and its caller).
        frames.deliver_while_waiting(self._route)
        while True:
            self._route(await frames.receive())

    def _route(self, frame: Frame) -> None:
        """Hand a frame to its call (synchronous: from the reader task, or from the event loop
        while the reader waits)."""
        # The busy flag follows the frames in their order: a ROOM right behind a NACK must
        # clear what the NACK set, even before the refused call reads its NACK.
        if frame.kind == Kind.ROOM:
            self._room()
            return
        if frame.kind == Kind.HELLO:
            try:
                self._limit = envelope.decode_hello(frame.payload)
            except FrameError:
                log.warning("ignoring a malformed HELLO from %s", self.address)
            return
        if frame.kind == Kind.NACK and frame.payload == envelope.BUSY:
            self._refused = True
            self._roomy = False
            if _telemetry.state is not None:  # telemetry: a refusal
                _telemetry.state.refused(self._calls.get(frame.call_id), self.attributes)
        call = self._calls.get(frame.call_id)
        if call is None:
            if frame.kind in (Kind.STATS, Kind.RECYCLE):  # never a call's id: off its path
                waiter = self._stats_waiters.get(frame.call_id)
                if waiter is not None:
                    waiter.answer(frame.payload)
            return  # a call that already gave up (e.g. cancelled): drop its late frames
        if frame.kind == Kind.OUTPUT:  # what its routine logged or printed (runtime._output)
            self._output_of(call, frame)
            return
        if frame.kind == Kind.CANCELLING:
            if call.finished:  # aborting: it waits for this (see Call.abort)
                call.deliver(frame)
            return
        if frame.kind == Kind.ACK:
            call.accepted = True
            try:
                waited = envelope.decode_ack(frame.payload)
            except FrameError:
                waited = None
            if _telemetry.state is not None and waited is not None:  # telemetry: queue wait
                _telemetry.state.waited(waited, call.name, self.attributes)
            self._settle(call, started=time.perf_counter() - call.sent_at
                         if waited is None else waited)
            if self._roomy:
                self._accepted()
            if call.quiet_ack:
                return
        elif frame.kind in TERMINAL:
            self._settle(call, ended=True)  # refused, failed to load, or ended
        call.deliver(frame)

    def _output_of(self, call: Call, frame: Frame) -> None:
        output = self._output if call.relay is None else _RELAY
        if output is not None:
            uid, pid = self._identity
            output.receive(frame.payload, [uid, self.address, pid, call.name, call.id],
                           call.relay)

    def _settle(self, call: Call, *, started: float | None = None,
                ended: bool = False) -> None:
        """Account for ``call`` no longer waiting to start (it started ``started`` seconds
        after the worker read it; or it ended, or was given up, before it started) and, with
        ``ended``, no longer running; a connection that stops being busy says so."""
        was_busy = self.busy
        if call.waiting:
            call.waiting = False
            self._unstarted -= 1
            if started is not None:
                if started <= START_WITHIN:
                    self._window = min(self._window + 1, WINDOW_MAX)
                elif started > HELD_OVER:
                    self._window = max(1, int(self._window * HELD_OVER / started))
        if ended and call.running:
            call.running = False
            self._running -= 1
        if was_busy and not self.busy:
            self._free()

    def _free(self) -> None:
        if self._on_free is not None:
            try:
                self._on_free()
            except Exception:
                log.exception("on_free callback of %s failed", self.address)

    def _unresponsive(self, call: Call, why: str) -> None:
        log.warning("worker %s counts as stuck after the cancellation of %s: %s (its event loop "
                    "is held: C code holding the GIL, or a routine ignoring the interruption)",
                    self.address, call.name, why)
        if self._on_unresponsive is not None:
            try:
                self._on_unresponsive()
            except Exception:
                log.exception("on_unresponsive callback of %s failed", self.address)

    def _accepted(self) -> None:
        if self._on_accepted is not None:
            try:
                self._on_accepted()
            except Exception:
                log.exception("on_accepted callback of %s failed", self.address)

    def _room(self) -> None:
        self._refused = False
        self._roomy = True
        if self._on_room is not None:
            try:
                self._on_room()
            except Exception:
                log.exception("on_room callback of %s failed", self.address)

    async def _broken_by_send(self, reason: str) -> None:
        """A send of a call failed: the connection is broken (half a frame may have gone). The
        reader gets ``_CLOSE_TIMEOUT`` seconds to take in what the worker wrote before it
        went and find the end itself; then the connection is failed, for a peer that stopped
        reading but keeps the connection open would never end it."""
        try:
            with anyio.move_on_after(_CLOSE_TIMEOUT):
                await self._lost.wait()
        finally:
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            self._lost.set()
            if self._on_lost is not None:
                try:
                    self._on_lost()
                except Exception:
                    log.exception("on_lost callback of %s failed", self.address)
        calls, self._calls = self._calls, {}
        self._unstarted = self._running = 0
        for waiter in self._stats_waiters.values():
            waiter.done.set()  # with no answer: lost
        for call in calls.values():
            call.waiting = call.running = False
            call.lose()
        if self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Wait until no call is open on this connection, or the connection is lost."""
        while self._calls and self._failure is None:
            self._idle = anyio.Event()
            await self._idle.wait()

    async def wait_lost(self) -> None:
        """Wait until the connection fails, or the worker (or this side) closes it."""
        await self._lost.wait()

    def _withdraw(self, call: Call) -> None:
        """Keep following ``call``, given up before the worker started it, in a task of the
        connection's own (see :meth:`.Call.watch_withdrawn`); its caller goes on."""
        call.withdrawn = True
        call.quiet_ack = False  # its watcher must see an ACK that comes after all
        task_group = self._task_group
        if task_group is None or self._failure is not None:
            return
        task_group.start_soon(call.watch_withdrawn, name=f"anywool-withdrawn-{call.id}")

    def _bury(self, call: Call) -> None:
        call.withdrawn = False
        self._forget(call.id)

    def _frames_pending(self, kind: Kind, call_id: int) -> bool:
        """Whether a frame of ``kind`` for ``call_id`` has arrived and is not routed yet."""
        frames = self._frames
        return frames is not None and frames.pending(kind, call_id)

    def _forget(self, call_id: int) -> None:
        call = self._calls.get(call_id)
        if call is not None and call.withdrawn:
            return  # its watcher forgets it (see _bury)
        call = self._calls.pop(call_id, None)
        if call is not None:
            self._settle(call, ended=True)  # given up, if it had not ended
        if not self._calls and self._idle is not None:
            self._idle.set()

    async def cancel_all(self) -> None:
        """Ask the worker to cancel every call still open on this connection; its answers
        reach the callers as usual (:class:`~anywool.errors.RoutineCancelled`). Best effort:
        a broken connection is left as it is."""
        frames = self._frames
        if frames is None or self._failure is not None:
            return
        for call_id in list(self._calls):
            try:
                await frames.send(Frame(Kind.CANCEL, call_id))
            except PEER_GONE:
                return

    # -- stats: what the worker says of itself ---------------------------------------------

    async def stats(self, timeout: float = 5.0) -> WorkerStats:
        """Ask the worker for its statistics (it answers at once, without starting a call:
        also at its ``max_concurrency``, and while it drains).

        :param timeout: seconds (> 0) to wait for the answer.
        :returns: what the worker reported.
        :raises TimeoutError: no answer within ``timeout`` (the worker's event loop is held,
            or the worker is suspended).
        :raises WorkerError: the connection is broken, or was lost before the answer came.
        :raises FrameError: the worker's answer is malformed (the connection goes on).

        Cancellation: safe at any point; a late answer is dropped.
        """
        return envelope.decode_stats(await self._ask(Kind.STATS, timeout, "stats"))

    async def recycle(self, timeout: float = 5.0) -> str | None:
        """Ask the worker to have the pool that spawned it replace every worker it spawned, one
        at a time (:meth:`WorkerPool.recycle <anywool.WorkerPool.recycle>`); the worker answers
        at once, without starting a call. Whether the recycle then happens is the pool's
        business: this only says the pool was told.

        :param timeout: seconds (> 0) to wait for the answer.
        :returns: ``None`` when the worker passed the request on to its pool, else why it did
            not, in words (a worker run by hand, or by a bare ``LocalWorker``, has no pool that
            would act on it; a stopping worker refuses too).
        :raises TimeoutError: no answer within ``timeout``.
        :raises WorkerError: the connection is broken, or was lost before the answer came.
        :raises FrameError: the worker's answer is malformed.

        Cancellation: safe at any point; a late answer is dropped (the request may have been
        passed on all the same).
        """
        return envelope.decode_recycle_answer(await self._ask(Kind.RECYCLE, timeout,
                                                              "a recycle"))

    async def _ask(self, kind: Kind, timeout: float, what: str) -> Buffer:
        """Send a request of ``kind`` (not a call) and wait for its answer's payload."""
        frames = self._frames
        if self._failure is not None or frames is None:
            raise WorkerError(self.address, self._failure or "not connected")
        request_id = next(self._ids)
        waiter = self._stats_waiters[request_id] = _StatsWaiter()
        try:
            with anyio.fail_after(timeout):
                try:
                    await frames.send(Frame(kind, request_id))
                except PEER_GONE as exc:
                    self._fail(f"connection failed: {exc!r}")
                await waiter.done.wait()
        finally:
            del self._stats_waiters[request_id]
        if waiter.payload is None:
            raise WorkerError(self.address, f"lost while asking for {what}: {self._failure}")
        return waiter.payload

    # -- calls -------------------------------------------------------------------------------

    def _prepare(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 *, streaming: bool, plain: bool = False) -> tuple[Call, Parts, Origin | None]:
        """Register a call and make its CALL frame's payload (synchronous: nothing is sent yet; the
        call counts among those waiting to start from here on).

        A coroutine's call carries the seconds left of the caller's effective deadline (the
        worker cancels the routine on time by itself, even if the cancel frame is late or lost)
        and the caller's context variables; an async generator's steps carry their own. Some
        time left (or no deadline) also means no cancellation is pending: the call records it
        (``not_cancelled``), and its CALL frame is then sent without checking again.

        :raises PayloadTooLarge: the call does not fit one frame.
        :raises CallNotDelivered: the connection is broken.
        """
        name = getattr(fn, "__qualname__", repr(fn))
        origin = None if self._origin is None else self._origin()
        caller = _running_task_id()
        # On a worker, the output of the call this one is made from is relayed, or not asked.
        relay = None if caller is None else _output.current()
        call_id = next(self._ids)  # before the trace context, whose span names it
        client, trace = (None, None) if _telemetry.state is None else _telemetry.sending(
            call_id, self.attributes)
        timeout = None if streaming else seconds_left()
        request = CallRequest(
            serializer.dumps_value((fn, args, kwargs), name, "the arguments"),
            name,
            timeout,
            caller,
            origin,
            None if streaming else dump_context(name),
            plain,
            self._output is not None if caller is None else relay is not None,
            trace=trace,
        )
        known = origin is not None and origin[0] == self._origin_delivered
        payload = envelope.encode_call(request, origin_known=known)
        # Judged as if the origin travelled whole: what fits must not depend on which
        # connection the balancer picks, nor on whether it delivered the origin already.
        limit, size = payload_limit(self._max_frame_size), payload.nbytes
        if known and origin is not None and size + len(origin[1]) + 5 > limit:
            size = envelope.encode_call(request).nbytes  # near the limit only: exact
        if size > limit:
            raise PayloadTooLarge(f"the call to {name}", size, limit)
        if self._failure is not None or self._frames is None:
            raise CallNotDelivered(self.address, self._failure or "not connected")
        call = self._calls[call_id] = Call(self, call_id, name, quiet_ack=not streaming)
        call.relay = relay
        call.telemetry = client
        call.waiting = call.running = True
        call.not_cancelled = timeout != 0.0 and not streaming
        self._unstarted += 1
        self._running += 1
        call.sent_at = time.perf_counter()
        if self._on_sent is not None:
            try:
                self._on_sent()
            except Exception:
                log.exception("on_sent callback of %s failed", self.address)
        return call, payload, origin

    async def _send_call(self, call: Call, payload: Parts, origin: Origin | None) -> None:
        """Send a prepared call's CALL frame.

        :raises CallNotDelivered: the connection failed before the frame was written.
        Cancellation: raised only while waiting for its turn to write, when nothing was
        written (a frame, once started, is written whole): the call is finished then, and the
        worker has nothing to cancel.
        """
        assert self._frames is not None
        try:
            await self._frames.send_parts(Kind.CALL, call.id, payload,
                                          not_cancelled=call.not_cancelled)
        except PEER_GONE as exc:
            self._fail(f"connection failed: {exc!r}")
            raise CallNotDelivered(self.address, f"could not send the call: {exc!r}") from exc
        except anyio.get_cancelled_exc_class():
            call.finished = True
            raise
        if origin is not None:
            self._origin_delivered = origin[0]

    async def _open(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    *, streaming: bool, plain: bool = False) -> Call:
        """Register a call and send its CALL frame; a streaming call also waits for the
        worker's answer to it (a coroutine's caller reads it with the result, see
        :meth:`call`)."""
        call, payload, origin = self._prepare(fn, args, kwargs, streaming=streaming, plain=plain)
        try:
            await self._send_call(call, payload, origin)
            if streaming:
                first = await call.first_frame()
                if first.kind != Kind.ACK:
                    call.pushback(first)
        except BaseException:
            await call.release()
            raise
        return call

    async def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   *, plain: bool = False) -> Any:
        """Run the coroutine function ``fn(*args, **kwargs)`` on the worker; with ``plain``,
        the plain function ``fn``, called in the worker's event-loop thread.

        :returns: the routine's return value.
        :raises CallNotDelivered: the worker refused the call or the connection was already
            broken; the routine did not run.
        :raises WorkerError: the connection was lost while the call was in flight.
        :raises ~anywool.errors.RoutineCancelled: the routine was cancelled on the worker.
        :raises ~anywool.errors.PayloadTooLarge: the pickled call exceeds what one frame carries
            (about 64 MiB by default); nothing was sent.
        :raises Exception: whatever the routine raised, rebuilt in this process.

        Cancellation: sends a cancel frame, waits up to ``cancel_timeout`` seconds (shielded) for
        the worker to confirm the routine ended, then re-raises the cancellation.
        """
        # The hot path of every call: as few coroutine levels as can be (each adds to every
        # wake-up of the caller).
        call, payload, origin = self._prepare(fn, args, kwargs, streaming=False, plain=plain)
        try:
            await self._send_call(call, payload, origin)
            frame = await call.first_frame()
            call.finished = True
            if frame.kind == Kind.RETURN:
                return call.value(frame)
            await call.raise_remote(frame)
        finally:
            if call.finished:
                self._forget(call.id)
            else:
                await call.release()

    async def stream(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Call:
        """Start the async generator function ``fn(*args, **kwargs)`` on the worker.

        :returns: the accepted call; drive it with
            :func:`~anywool.runtime.client._call.drive_stream`.
        :raises CallNotDelivered: as for :meth:`call`.
        """
        return await self._open(fn, args, kwargs, streaming=True)


# What relays a nested call's output (its receive() needs no emitter).
_RELAY = _output.Output()


class _StatsWaiter:
    """A statistics request waiting for its answer (``payload``; ``None`` when lost)."""

    __slots__ = ("done", "payload")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.payload: Buffer | None = None

    def answer(self, payload: Buffer) -> None:
        if not self.done.is_set():
            self.payload = payload
            self.done.set()


def _running_task_id() -> int | None:
    """The id of the call the current task runs a routine for (``None`` outside routines)."""
    task = running_task()
    return None if task is None else task.id
