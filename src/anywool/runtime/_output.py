"""Worker output at the caller: what a routine logs and prints, captured on its worker and
emitted at its caller.

On the worker (:func:`install`, once per worker process): a handler on the root logger and
replacements of ``sys.stdout`` and ``sys.stderr`` look up the :class:`Sink` of the call the
current context runs for (a context variable the server sets in the call's task, so the
routine's own tasks and its ``anyio.to_thread`` threads see it too). With one, a record or a
line becomes an entry queued on the :class:`Forwarder` of the call's connection; without one
(outside calls, or in a call whose caller asked for nothing), output goes where it always went:
the worker's stderr. A forwarder sends its entries as ``OUTPUT`` frames (up to
:data:`BATCH_AT_MOST` bytes each) from a task of its own, and a call sends what is pending
before each of its replies, so that a caller has emitted a call's output when the call returns.
Pending entries are bounded per connection (:data:`PENDING_AT_MOST` entries,
:data:`PENDING_BYTES_AT_MOST` bytes); beyond, entries are dropped and counted per call, and the
count travels as one entry before the call's reply (a generator's: before each step's).

On the caller (:class:`Output`): entries are emitted synchronously as the connection's reader
routes the frames: a record through ``logging.getLogger(name)``, if that logger is enabled for
its level, with the worker and the call as ``anywool_*`` attributes; a line as an
:class:`OutputLine` to the pool's ``on_output`` (default: the caller's ``sys.stderr``, with a
short prefix); a drop count as one warning of the ``anywool.output`` logger. A client inside a
worker (a routine calling a routine) relays the entries into the sink of the call it is made
from instead, tagged with the worker that produced them, so they reach the outermost caller.

What this module must never do: raise into the code that logs or prints, or into a
connection's reader; grow without bound; block the event loop on a thread.
"""

from __future__ import annotations

import contextvars
import inspect
import io
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Literal

import anyio
import anyio.lowlevel

from anywool.runtime.wire import _envelope as envelope
from anywool.runtime.wire._envelope import (
    OUTPUT_DROPPED,
    OUTPUT_LINE,
    OUTPUT_RECORD,
    OutputEntry,
)
from anywool.runtime.wire._frames import Frame, FrameError, FrameStream, Kind
from anywool.runtime.wire._peer import PEER_GONE

log = logging.getLogger("anywool.output")

#: The most entries a worker connection holds unsent, and their most bytes (about: what their
#: texts take); beyond, entries are dropped and counted.
PENDING_AT_MOST = 4096
PENDING_BYTES_AT_MOST = 1 << 20
#: The most characters of one line, or of one record's message (its traceback apart, and its
#: traceback apart from it); the rest is cut, and the cut said by :data:`CUT_MARK`.
TEXT_AT_MOST = 64 * 1024
CUT_MARK = " [... cut at {} characters]"
# A partial line up to this many characters is kept as a str (see Sink.write).
_SHORT = 256
#: The most bytes of entries one ``OUTPUT`` frame carries (one entry larger goes alone).
BATCH_AT_MOST = 4 * 1024
# What an entry costs besides its texts, counted against PENDING_BYTES_AT_MOST.
_ENTRY_COST = 64

# The sink of the call the current context runs for, on a worker forwarding its output.
_sink: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("anywool_output",
                                                                     default=None)


def current() -> Sink | None:
    """The open sink of the call the current context runs for (``None``: no call, or one
    whose caller asked for nothing)."""
    sink = _sink.get()
    return None if sink is None or sink.closed else sink


def _cut(text: str) -> str:
    if len(text) <= TEXT_AT_MOST:
        return text
    return text[:TEXT_AT_MOST] + CUT_MARK.format(TEXT_AT_MOST)


# -- worker side: sinks and forwarders --------------------------------------------------------


class Sink:
    """One call's output on its worker: entries go to its connection's forwarder; a partial
    line waits for its newline (or the call's end). Safe to use from any thread."""

    __slots__ = ("forwarder", "call_id", "dirty", "closed", "dropped", "_partial")

    def __init__(self, forwarder: Forwarder, call_id: int) -> None:
        self.forwarder = forwarder
        self.call_id = call_id
        self.dirty = False  # something was put since the last flush (read before each reply)
        self.closed = False
        self.dropped = 0
        # Each stream's line written so far without its newline: its first TEXT_AT_MOST + 1
        # characters (one more: it was cut, it says). A str while short; beyond, a StringIO,
        # where appending costs what is appended (a routine printing with end="" in a loop
        # writes a character at a time: appending to a str would copy the line every time).
        self._partial: dict[str, str | io.StringIO] = {}

    def open(self) -> contextvars.Token[Sink | None]:
        """Make this the sink of the current context (the call's task)."""
        return _sink.set(self)

    def put(self, entry: OutputEntry, size: int, *, force: bool = False) -> None:
        self.forwarder.put(self, entry, size, force=force)

    def write(self, stream: str, text: str) -> None:
        """Take ``text`` written to ``stream``: each whole line becomes an entry."""
        self.dirty = True
        partial = self._partial
        with self.forwarder.lock:
            held = partial.get(stream)
            if "\n" not in text:
                if held is None:
                    partial[stream] = text[:TEXT_AT_MOST + 1]
                elif isinstance(held, str) and len(held) + len(text) <= _SHORT:
                    partial[stream] = held + text
                else:
                    if isinstance(held, str):
                        held = partial[stream] = io.StringIO(held)
                        held.seek(0, io.SEEK_END)
                    room = TEXT_AT_MOST + 1 - held.tell()
                    if room > 0:
                        held.write(text[:room])
                return
            *lines, rest = text.split("\n")
            if held is not None:
                lines[0] = (held if isinstance(held, str) else held.getvalue()) + lines[0]
            if rest:
                partial[stream] = rest[:TEXT_AT_MOST + 1]
            elif held is not None:
                del partial[stream]
        now = time.time()
        for line in lines:
            self._line(stream, line, now)

    def _line(self, stream: str, line: str, now: float) -> None:
        line = _cut(line)  # counted as sent: a huge line is cut, not dropped
        self.put([OUTPUT_LINE, None, now, stream, line], len(line) + _ENTRY_COST)

    def end_lines(self) -> None:
        """Send the partial lines as lines (a call, or a generator's step, ends)."""
        with self.forwarder.lock:
            partial, self._partial = self._partial, {}
        now = time.time()
        for stream, held in partial.items():
            line = held if isinstance(held, str) else held.getvalue()
            if line:
                self._line(stream, line, now)

    async def flush(self) -> None:
        """Send everything pending on the connection, this call's partial lines and drop
        count included (before a reply of this call).

        :raises anyio.BrokenResourceError: and the rest of ``PEER_GONE``: the client is gone.
        """
        self.end_lines()
        forwarder = self.forwarder
        with forwarder.lock:
            dropped, self.dropped = self.dropped, 0
        if dropped:
            forwarder.put(self, [OUTPUT_DROPPED, None, time.time(), dropped], 0, force=True)
        self.dirty = False
        await forwarder.send_pending()

    def close(self) -> None:
        """The call ended: output in its context now goes where it would without a call."""
        self.closed = True


class Forwarder:
    """One worker connection's unsent output, and the task that sends it (started at the
    first call that forwards; it lives in the connection's task group).

    :param frames: the connection.
    :param start_soon: starts a task in the connection's task group.
    :param call_soon_threadsafe: schedules a function in the event loop from another thread.
    """

    def __init__(self, frames: FrameStream, start_soon: Callable[..., Any],
                 call_soon_threadsafe: Callable[..., Any]) -> None:
        # Reentrant: the garbage collector may run a finalizer that logs or prints (asyncio's
        # "Task was destroyed but it is pending!", a ResourceWarning) at any allocation made
        # while this is held, in this thread and in the call's context: it must not wait for
        # itself.
        self.lock = threading.RLock()
        self._frames = frames
        self._start_soon = start_soon
        self._call_soon = call_soon_threadsafe
        self._loop_thread = threading.get_ident()
        self._entries: deque[tuple[Sink, OutputEntry, int]] = deque()
        self._bytes = 0
        self._started = False
        self._asleep = False
        self._gone = False  # the client went: drop everything
        self._wake = anyio.Event()
        self._sending = anyio.Lock()

    def sink(self, call_id: int) -> Sink:
        """A sink for the call ``call_id`` (in the event loop: starts the forwarder's task
        with the first)."""
        if not self._started:
            self._started = True
            self._start_soon(self._run)
        return Sink(self, call_id)

    def put(self, sink: Sink, entry: OutputEntry, size: int, *, force: bool = False) -> None:
        """Queue ``entry`` of ``sink``'s call, or count it dropped when the bound is reached
        (``force``: a drop count, queued regardless)."""
        with self.lock:
            sink.dirty = True
            if self._gone:
                return
            if (len(self._entries) >= PENDING_AT_MOST
                    or self._bytes + size > PENDING_BYTES_AT_MOST) and not force:
                sink.dropped += 1
                return
            self._entries.append((sink, entry, size))
            self._bytes += size
            if not self._asleep:
                return
            self._asleep = False
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            try:
                self._call_soon(self._wake.set)
            except Exception:  # the event loop is closed: nothing will be sent
                pass

    async def _run(self) -> None:
        while not self._gone:
            with self.lock:
                idle = not self._entries
                if idle:
                    self._asleep = True
                    self._wake = anyio.Event()
            if idle:
                await self._wake.wait()
            try:
                await self.send_pending(yielding=True)
            except PEER_GONE:
                return  # the connection's handler sees it too, and ends its calls
            except Exception:  # never into the connection's task group
                log.exception("forwarding output failed; the rest of this connection's is "
                              "dropped")
                self._give_up()
                return

    async def send_pending(self, *, yielding: bool = False) -> None:
        """Send the entries queued so far, in frames of one call each (one sender at a time,
        so each call's entries keep their order); with ``yielding``, let other tasks run
        between frames (the forwarder's own task: a routine that floods its output must not
        hold the loop through it).

        :raises anyio.BrokenResourceError: and the rest of ``PEER_GONE``: the client is gone
            (everything pending is dropped).
        """
        async with self._sending:
            with self.lock:
                left = len(self._entries)
            while left > 0 and not self._gone:
                batch: list[OutputEntry] = []
                nbytes = 0
                with self.lock:
                    sink = self._entries[0][0]
                    while left and self._entries and self._entries[0][0] is sink \
                            and (not batch or nbytes + self._entries[0][2] <= BATCH_AT_MOST):
                        _, entry, size = self._entries.popleft()
                        batch.append(entry)
                        nbytes += size
                        left -= 1
                    self._bytes -= nbytes
                try:
                    await self._frames.send(Frame(Kind.OUTPUT, sink.call_id,
                                                  envelope.encode_output(batch)))
                except PEER_GONE:
                    self._give_up()
                    raise
                except FrameError:  # an entry too large for a frame: it cannot go
                    log.warning("dropped %d output entries of a call: too large for a frame",
                                len(batch))
                if yielding:
                    await anyio.lowlevel.checkpoint()

    def _give_up(self) -> None:
        with self.lock:
            self._gone = True
            self._entries.clear()
            self._bytes = 0
        self._wake.set()


# -- worker side: capture ---------------------------------------------------------------------


class _Capture(logging.Handler):
    """The root logger's handler that queues the records of forwarding calls (formatted here:
    nothing unpicklable travels). Records of anywool's own loggers stay on the worker."""

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        # Per record of a flood: kept lean (no lock of the handler's own: the forwarder's
        # is enough).
        sink = _sink.get()
        if sink is None or sink.closed:
            return False
        name = record.name
        if name[:7] == "anywool" and (len(name) == 7 or name[7] == "."):
            return False  # anywool's own: the worker's diagnostics
        try:
            message = record.getMessage()
        except Exception as exc:  # as logging's own formatting would fail: say why, in place
            message = _unformattable(record.msg, exc)
        if len(message) > TEXT_AT_MOST:
            message = _cut(message)  # counted as sent: a huge record is cut, not dropped
        size = len(message) + _ENTRY_COST
        exc_text = record.exc_text
        if record.exc_info and not exc_text:
            exc_text = _cut(_formatter.formatException(record.exc_info))
        stack = record.stack_info
        if exc_text is not None or stack is not None:
            stack = None if stack is None else _cut(stack)
            size += len(exc_text or "") + len(stack or "")
        sink.forwarder.put(sink, [OUTPUT_RECORD, None, record.created, name, record.levelno,
                                  record.levelname, message, record.pathname, record.lineno,
                                  record.funcName, exc_text, stack, record.threadName], size)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


_formatter = logging.Formatter()


def _unformattable(msg: object, exc: Exception) -> str:
    """A record's message when ``getMessage()`` raised ``exc``: what it was, and why (without
    raising: ``msg``'s ``repr()`` may fail as its ``str()`` did)."""
    try:
        return f"{msg!r} (formatting its arguments failed: {exc!r})"
    except Exception:
        return (f"{object.__repr__(msg)} (formatting it failed: "
                f"{type(exc).__module__}.{type(exc).__qualname__})")


def _outside_forwarding_calls(record: logging.LogRecord) -> bool:
    """A filter for the worker's own handlers: what a forwarding call logs goes to its caller,
    not (also) here; anywool's own records always stay here."""
    return current() is None or _own(record.name)


def _own(name: str) -> bool:
    return name == "anywool" or name.startswith("anywool.")


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` of a worker: what a forwarding call writes goes to its
    caller line by line; everything else to the stream it replaced."""

    def __init__(self, stream: IO[str], name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        sink = _sink.get()
        if sink is None or sink.closed:
            return self._stream.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        sink.write(self._name, text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        sink = _sink.get()
        if sink is None or sink.closed:
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_installed = False


# What encode_level says for a worker whose callers forward nothing: its levels stay.
_KEEP_LEVEL = "keep"


def lowest_level() -> int:
    """The lowest level this process's logging lets through anywhere: its root logger's
    effective level, or a lower one set on any logger. A worker whose root logger passes this
    level and up forwards every record its caller would emit, and drops the rest at the cost
    of a level check, as the caller would (a record below every level a caller's loggers have
    is never emitted there)."""
    lowest = logging.getLogger().getEffectiveLevel()
    for logger in list(logging.Logger.manager.loggerDict.values()):
        level = getattr(logger, "level", logging.NOTSET)  # a PlaceHolder has none
        if level != logging.NOTSET and level < lowest:
            lowest = level
    return lowest


def encode_level(level: int | None) -> str:
    """The root level a spawning pool asks its worker for (:func:`lowest_level`; ``None``:
    the worker's own), as the worker's environment carries it (the variable is the worker
    contract's ``OUTPUT_LEVEL_ENV``); :func:`decode_level` reads it back."""
    return _KEEP_LEVEL if level is None else str(level)


def decode_level(text: str | None, variable: str) -> int | None:
    """The root level a spawning pool asked for, from ``text`` as :func:`encode_level` made
    it: ``None`` to keep the worker's own; every level (``NOTSET``) when ``text`` is ``None``
    (not set), as for a worker run by hand or hosting callers of other processes, or when it
    is malformed (a warning names ``$variable``)."""
    if text is None:
        return logging.NOTSET
    if text == _KEEP_LEVEL:
        return None
    try:
        return max(logging.NOTSET, int(text))
    except ValueError:
        log.warning("ignoring malformed $%s %r", variable, text)
        return logging.NOTSET


def install(level: int | None = logging.NOTSET) -> None:
    """Capture this process's output for the calls that forward it (once; later calls do
    nothing). The root logger passes ``level`` and up from now on (``None``: its level stays),
    so that a routine's records reach the caller, whose levels decide; its handlers so far
    keep the root's former level (WARNING in a worker) and leave out what forwarding calls
    log, so the worker's stderr shows what it showed before."""
    global _installed
    if _installed:
        return
    _installed = True
    root = logging.getLogger()
    for handler in root.handlers:
        if handler.level == logging.NOTSET:
            handler.setLevel(root.getEffectiveLevel())
        handler.addFilter(_outside_forwarding_calls)
    if level is not None:
        root.setLevel(level)
    root.addHandler(_Capture())
    sys.stdout = _Stream(sys.stdout, "stdout")  # type: ignore[assignment]
    sys.stderr = _Stream(sys.stderr, "stderr")  # type: ignore[assignment]


# -- caller side ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputLine:
    """One line a routine wrote to its ``sys.stdout`` or ``sys.stderr`` (``print`` included),
    as a pool's ``on_output`` receives it.

    :param stream: ``"stdout"`` or ``"stderr"``.
    :param text: the line, without its newline; a line longer than 65 536 characters is cut
        there, and says how much was cut.
    :param worker: the uid of the worker that ran the routine (``None``: not known, as for a
        bare connection).
    :param address: that worker's address.
    :param pid: that worker's process id (``None``: not known).
    :param routine: the routine's qualified name.
    :param task: the call's id (:attr:`anywool.RoutineTask.id` on the worker).
    :param created: when the worker took the line, as ``time.time()`` there (seconds).
    """

    stream: Literal["stdout", "stderr"]
    text: str
    worker: str | None
    address: str
    pid: int | None
    routine: str
    task: int
    created: float


def write_to_stderr(line: OutputLine) -> None:
    """The default ``on_output``: the line on the caller's ``sys.stderr``, as
    ``[routine uid8 pid N] text``."""
    worker = (line.worker or line.address)[:8]
    pid = "" if line.pid is None else f" pid {line.pid}"
    sys.stderr.write(f"[{line.routine} {worker}{pid}] {line.text}\n")


class Output:
    """Where one pool's (or proxy's) forwarded output goes; shared by its connections.

    :param on_output: called with each :class:`OutputLine` (synchronously, from a
        connection's reader: it must not block).
    """

    def __init__(self, on_output: Callable[[OutputLine], object] = write_to_stderr) -> None:
        self.on_output = on_output
        self._failed = False

    def receive(self, payload: bytes | memoryview | bytearray, source: list[Any],
                relay: Sink | None) -> None:
        """Take an ``OUTPUT`` payload of the call ``source`` (``[uid, address, pid, routine,
        task]``): relay its entries into ``relay`` (a client on a worker), else emit them.
        Never raises: a malformed payload, or a failing handler, is logged (the latter once)."""
        try:
            entries = envelope.decode_output(payload)
        except FrameError as exc:
            log.warning("dropped malformed output of %s from %s: %s", source[3], source[1], exc)
            return
        for entry in entries:
            if entry[1] is None:
                entry[1] = source
            if relay is not None:
                # A drop count goes whatever the bound: it says what the bound took.
                relay.put(entry, _size(entry), force=entry[0] == OUTPUT_DROPPED)
                continue
            try:
                self._emit(entry)
            except Exception:
                if not self._failed:
                    self._failed = True
                    log.exception("emitting the output of %s from %s failed (said once)",
                                  entry[1][3], entry[1][1])

    def _emit(self, entry: OutputEntry) -> None:
        kind, (uid, address, pid, routine, task), created = entry[0], entry[1], entry[2]
        if kind == OUTPUT_RECORD:
            name, levelno, levelname, message, pathname, lineno, func, exc, stack, thread = \
                entry[3:]
            logger = _loggers.get(name)
            if type(logger) is not logging.Logger:  # none yet, a placeholder, or a subclass's
                logger = logging.getLogger(name)
            if not logger.isEnabledFor(levelno):
                return
            # As logging.makeLogRecord makes one, without the cost of LogRecord.__init__ (a
            # third of a record's way here), which would only be overwritten.
            record = _new_record(logging.LogRecord)
            record.__dict__ = {
                "name": name, "msg": message, "args": None, "levelname": levelname,
                "levelno": levelno, "pathname": pathname, "filename": _basename(pathname),
                "module": _module(pathname), "exc_info": None, "exc_text": exc,
                "stack_info": stack, "lineno": lineno, "funcName": func, "created": created,
                "msecs": (created - int(created)) * 1000,
                "relativeCreated": (created - _START) * 1000, "thread": None,
                "threadName": thread, "processName": f"anywool-worker-{pid}", "process": pid,
                "taskName": None, "anywool_worker": uid, "anywool_address": address,
                "anywool_pid": pid, "anywool_routine": routine, "anywool_task": task}
            logger.handle(record)
        elif kind == OUTPUT_LINE:
            self.on_output(OutputLine(entry[3], entry[4], uid, address, pid, routine, task,
                                      created))
        else:
            log.warning("%d lines of output of %s (task %s) on worker %s were dropped: it "
                        "wrote faster than they could be sent (at most %d entries, %d bytes "
                        "wait to be sent)", entry[3], routine, task, uid or address,
                        PENDING_AT_MOST, PENDING_BYTES_AT_MOST)


_new_record = object.__new__
_loggers = logging.Logger.manager.loggerDict
# What LogRecord.relativeCreated counts from: when logging was loaded.
_START: float = getattr(logging, "_startTime", time.time())


def _basename(path: str) -> str:
    return path.rpartition("/")[2]


def _module(path: str) -> str:
    base = _basename(path)
    stem, dot, _ = base.rpartition(".")
    return stem if dot else base


def _size(entry: OutputEntry) -> int:
    return _ENTRY_COST + sum(len(field) for field in entry[3:] if type(field) is str)


def check_options(forward_output: object, on_output: object) -> Output | None:
    """The :class:`Output` of a pool or proxy given these options (``None``: forwarding off).

    :raises TypeError: ``forward_output`` is not a bool, or ``on_output`` not callable, or a
        coroutine function (it is called synchronously: its coroutines would never run).
    :raises ValueError: ``on_output`` given with ``forward_output=False``.
    """
    if not isinstance(forward_output, bool):
        raise TypeError(f"forward_output must be a bool, got {forward_output!r}")
    if on_output is not None and not callable(on_output):
        raise TypeError(f"on_output must be a callable taking an anywool.OutputLine, or None, "
                        f"got {on_output!r}")
    if inspect.iscoroutinefunction(on_output):
        raise TypeError(f"on_output is called synchronously, from a connection's reader: it "
                        f"must be a plain function, got the coroutine function {on_output!r}")
    if not forward_output:
        if on_output is not None:
            raise ValueError("on_output is never called with forward_output=False")
        return None
    return Output() if on_output is None else Output(on_output)


__all__ = ["Output", "OutputLine", "Sink", "Forwarder", "check_options", "current", "install"]
