"""What call and step frames carry besides their pickles: the call's header, the caller's
deadline, context-variable values, and what comes back with each reply.

A call, step or reply payload is a header, then the pickles it carries as raw sections:

    header length (4 bytes, big-endian) | header (a msgpack array) | section | section | ...

The header says what the frame carries and how long each section is, so that a worker reads a
call's header, and names its routine in errors, without unpickling anything. A pickled field in
the header is the list of its sections' sizes in bytes: its pickle stream, then each of its
out-of-band buffers (see :class:`~anywool.runtime.wire._serializer.Pickled`); ``nil`` when the frame
carries none. The sections follow the header in the order of the fields, and end the payload
exactly. The pickles stay out of msgpack so that nothing copies them: a sender writes the
header and the pickle's own pieces with one vectored send, and a receiver hands the unpickler
views of the frame it received (as msgpack ``bin`` fields, 16 MiB cost 20 ms to pack and 3 ms
to unpack, a copy each way).

Header fields by kind:

* ``CALL``: ``[name, timeout, caller, origin_key, origin, plain, forward, trace, call,
  context]``. ``name`` the
  routine's qualified name; ``timeout`` the seconds left of the caller's deadline (``nil``:
  none); ``caller`` the id of the call this one is made from (a routine calling a routine;
  ``nil`` at the top); ``origin_key`` and ``origin`` identify and rebuild the proxy of the pool
  the call tree started from (``nil``: none travelled; ``origin`` is a small pickle, kept in
  the header as ``bin``); ``plain`` true for a plain function, called (by ``run_sync``) rather
  than awaited; ``forward`` true when the caller wants what the routine logs and prints sent
  back to it (``OUTPUT`` frames); ``trace`` the caller's trace context as W3C header fields
  (``traceparent``, ``tracestate``, ``baggage``: a map of str to str, ``nil``: none);
  ``call`` the sections of the pickle of ``(routine, args, kwargs)``;
  ``context`` those of the pickled values of the caller's context variables (``nil``: none
  set). The pickle ``origin`` travels only until the connection has delivered it once: later
  calls carry ``origin_key`` alone, which the worker looks up among the last
  :data:`ORIGINS_KEPT` origins of that connection (:class:`Origins`).
* ``ASEND``, ``ATHROW``, ``ACLOSE``: ``[timeout, trace, value, context]``, the same for one
  step of an async generator (``value``: the pickled value sent or exception thrown; one empty section for
  ``ACLOSE``).
* ``RETURN``, ``RESULT``, ``EXCEPTION``: ``[value, changes]``; ``END``: ``[changes]``, or an empty
  payload. ``changes`` is the pickle of the context variables the routine (or step) changed, or
  ``nil``. An exception's pickle has no out-of-band buffers.
* ``ACK``: how long the call waited on the worker between its frame being read and the routine
  starting, in microseconds (4 bytes, big-endian; empty from a worker that does not say): what
  a caller weighs before committing more calls to that worker.
* ``HELLO``: ``{"max_concurrency": n}`` (a msgpack map, alone; ``nil``: no bound), the first
  frame a worker sends on a connection. Keys a client does not know are ignored.
* ``NACK``: empty when the worker is stopping, :data:`BUSY` when it is at its
  ``max_concurrency``.
* ``OUTPUT``: what a routine logged or printed (see :mod:`anywool.runtime._output`): a msgpack
  array of entries, each an array ``[kind, source, created, ...]``: ``source`` is ``nil``
  from the worker that ran the routine (the frame's call names it), or ``[uid, address, pid,
  routine, task]`` once a client hop relayed it (``uid`` and ``pid`` may be ``nil``);
  ``created`` the worker's ``time.time()``. Then by kind: :data:`OUTPUT_RECORD` ``[name,
  levelno, levelname, message, pathname, lineno, func, exc_text, stack_info, thread]``
  (``exc_text``, ``stack_info`` and ``func`` may be ``nil``); :data:`OUTPUT_LINE`
  ``[stream, text]`` (``stream`` ``"stdout"`` or ``"stderr"``, ``text`` without its newline);
  :data:`OUTPUT_DROPPED` ``[count]``, how many entries the worker dropped for the call.
  Nothing in it is pickled: a malformed one is dropped by its receiver, never fails a call.
* ``STATS``: empty from the client (other payloads are reserved, and ignored); from the worker
  a msgpack map of its statistics (:func:`encode_stats`: the fields of
  :class:`~anywool.runtime.wire._stats.WorkerStats` by name). Keys a client does not know are
  ignored; a known key missing or of the wrong type fails that request
  (:func:`decode_stats`).
* ``RECYCLE``: empty from the client (other payloads are reserved, and ignored); from the
  worker empty when it passed the request on to the pool that spawned it, else why not, in
  UTF-8 words (:func:`encode_recycle_answer`, :func:`decode_recycle_answer`).

Encoders return :class:`~anywool.runtime.wire._frames.Parts` (the pickles' pieces by reference, for
``FrameStream.send_parts``); decoders return each pickle as views of the payload they were
given. Every decoder checks its kind's shape and raises
:class:`~anywool.runtime.wire._frames.FrameError`, so a malformed payload fails its call, never the
connection. No pickle is loaded here, no I/O done.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, cast

import msgpack

from anywool.runtime.wire._frames import CALL_ID_LIMIT, FrameError, Parts
from anywool.runtime.wire._serializer import Buffer, Pickled
from anywool.runtime.wire._stats import WorkerStats

#: ``(key, pickled proxy)``: the pool a call tree started from (see :mod:`anywool.runtime.worker._nested`).
Origin = tuple[bytes, bytes]

#: The payload of a ``NACK`` from a worker at its ``max_concurrency``.
BUSY = b"busy"

_ORIGIN_KEY_SIZE = 16
#: The origins a worker remembers per connection (a client sends a new one only when its pool's
#: own workers change, so this is never reached in practice).
ORIGINS_KEPT = 16


_HEADER_LENGTH = struct.Struct(">I")
# Payloads up to this size, when bytes, are sliced rather than viewed (cheaper when small).
_SLICE_AT_MOST = 4096
# One packer for every header: msgpack's packb makes one per call. (Packing plain values runs
# no Python code, so it is never entered twice at once.)
_packb = msgpack.Packer(use_bin_type=True).pack


def _assemble(fields: list[Any], pickles: tuple[Pickled | None, ...]) -> Parts:
    """The payload of a header whose last fields are ``pickles`` (as their sections' sizes),
    followed by their sections."""
    pieces: list[Buffer] = [b""]
    nbytes = 0
    for pickled in pickles:
        if pickled is None:
            fields.append(None)
            continue
        sizes = pickled.sizes()
        fields.append(sizes)
        nbytes += sum(sizes)
        pieces += pickled.chunks
        if pickled.buffers:
            pieces += pickled.buffers
    header = _packb(fields)
    pieces[0] = head = _HEADER_LENGTH.pack(len(header)) + header
    return Parts(pieces, nbytes + len(head))


def _disassemble(payload: Buffer, length: int, pickled: int, what: str) -> list[Any]:
    """The header's ``length`` fields, the last ``pickled`` of them (lists of section sizes, or
    ``nil``) replaced by the pickles whose sections follow the header: views of ``payload``, or
    slices of it when it is a small ``bytes``.

    :raises FrameError: the payload is not such a header and sections.
    """
    total = len(payload)  # bytes, a bytearray or a flat memoryview: its size in bytes
    if total < _HEADER_LENGTH.size:
        raise FrameError(f"a {what} of {total} bytes has no header")
    (size,) = _HEADER_LENGTH.unpack_from(payload)
    start = _HEADER_LENGTH.size + size
    if start > total:
        raise FrameError(f"a {what}'s header of {size} bytes overruns its {total} bytes")
    # A slice of a small bytes costs less than a view; anything else is viewed, not copied.
    view = payload if type(payload) is bytes and total <= _SLICE_AT_MOST else memoryview(payload)
    try:
        # Its own limits are the header's size (msgpack's default for unpackb); a map or an
        # ext where a field is expected fails that field's check below.
        fields = msgpack.unpackb(view[_HEADER_LENGTH.size:start])
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable {what} ({exc})") from None
    if type(fields) is not list or len(fields) != length:
        raise FrameError(f"a {what} must be an array of {length} fields")
    offset = start
    for index in range(length - pickled, length):
        sizes = fields[index]
        if sizes is None:
            continue
        if type(sizes) is not list or not sizes:
            raise FrameError(f"a {what}'s pickle must be given as a list of section sizes")
        if len(sizes) == 1:  # no out-of-band buffers: most pickles
            each = sizes[0]
            if type(each) is not int or each < 0:
                raise FrameError(f"a {what}'s section sizes must be ints >= 0")
            end = offset + each
            fields[index] = Pickled((view[offset:end],))
            offset = end
            continue
        sections = []
        for each in sizes:
            if type(each) is not int or each < 0:
                raise FrameError(f"a {what}'s section sizes must be ints >= 0")
            sections.append(view[offset:offset + each])
            offset += each
        fields[index] = Pickled(sections[:1], sections[1:])
    if offset != total:
        raise FrameError(f"a {what}'s sections take {offset - start} bytes, not the "
                         f"{total - start} that follow its header")
    return fields


def _optional_bytes(value: object, field: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    raise FrameError(f"{field} must be bytes or nil, got {type(value).__name__}")


#: The most fields a trace context may have, and the longest value (W3C: ``tracestate`` is at
#: most 512 characters, ``baggage`` 8192 bytes).
_TRACE_FIELDS = 8
_TRACE_VALUE_AT_MOST = 8192


def _trace(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > _TRACE_FIELDS or not all(
            type(k) is str and type(v) is str and len(v) <= _TRACE_VALUE_AT_MOST
            for k, v in value.items()):
        raise FrameError(f"a trace context must be a map of at most {_TRACE_FIELDS} str fields "
                         f"(values of at most {_TRACE_VALUE_AT_MOST} characters) or nil")
    return cast(dict[str, str], value)


def _timeout(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or math.isnan(value) or value < 0:
        raise FrameError(f"a deadline must be seconds >= 0 or nil, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class CallRequest:
    """The content of a ``CALL`` frame (see the module docstring)."""

    call: Pickled
    name: str
    timeout: float | None = None
    caller: int | None = None
    origin: Origin | None = None
    context: Pickled | None = None
    plain: bool = False
    forward: bool = True
    trace: dict[str, str] | None = None


def encode_call(request: CallRequest, *, origin_known: bool = False) -> Parts:
    """The payload of a ``CALL``; with ``origin_known`` its origin travels by key alone (the
    connection delivered it whole before)."""
    key, blob = request.origin if request.origin is not None else (None, None)
    return _assemble([request.name, request.timeout, request.caller, key,
                      None if origin_known else blob, request.plain, request.forward,
                      request.trace],
                     (request.call, request.context))


class Origins:
    """The origins one connection's calls referred to, by key: the last :data:`ORIGINS_KEPT`."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[bytes, bytes] = {}

    def learn(self, key: bytes, blob: bytes) -> None:
        by_key = self._by_key
        by_key.pop(key, None)
        by_key[key] = blob
        if len(by_key) > ORIGINS_KEPT:
            del by_key[next(iter(by_key))]

    def get(self, key: bytes) -> bytes | None:
        return self._by_key.get(key)


def decode_call(payload: Buffer, origins: Origins | None = None) -> CallRequest:
    """Parse a call's header; an origin that travels by key alone is looked up in ``origins``
    (those that travelled whole are added to it).

    :raises FrameError: the payload is not a call's header, or refers to an origin by a key
        ``origins`` does not hold.
    """
    name, timeout, caller, key, blob, plain, forward, trace, call, context = _disassemble(
        payload, 10, 2, "call")
    if call is None:
        raise FrameError("a call must carry its routine and arguments")
    if not isinstance(name, str):
        raise FrameError("a call's routine name must be a str")
    if caller is not None and (isinstance(caller, bool) or not isinstance(caller, int)
                               or not 0 <= caller < CALL_ID_LIMIT):
        raise FrameError(f"a caller's call id must be an unsigned 64-bit int, got {caller!r}")
    key = _optional_bytes(key, "an origin key")
    blob = _optional_bytes(blob, "an origin")
    if (key is None and blob is not None) or (key is not None and len(key) != _ORIGIN_KEY_SIZE):
        raise FrameError("a call's origin must be a 16-byte key (and its pickle), or neither")
    origin = None
    if key is not None:
        if blob is not None:
            if origins is not None:
                origins.learn(key, blob)
        else:
            blob = None if origins is None else origins.get(key)
            if blob is None:
                raise FrameError("a call refers to an origin this connection never delivered")
        origin = (key, blob)
    if not isinstance(plain, bool):
        raise FrameError(f"a call's plain flag must be a bool, got {type(plain).__name__}")
    if not isinstance(forward, bool):
        raise FrameError(f"a call's forward flag must be a bool, got {type(forward).__name__}")
    return CallRequest(call, name, _timeout(timeout), caller, origin, context, plain, forward,
                       _trace(trace))


@dataclass(frozen=True, slots=True)
class Step:
    """The content of an ``ASEND``, ``ATHROW`` or ``ACLOSE`` frame."""

    value: Pickled
    timeout: float | None = None
    context: Pickled | None = None
    trace: dict[str, str] | None = None


#: The value of an ``ACLOSE`` step: nothing (one empty section).
NOTHING = Pickled([b""])


def encode_step(step: Step) -> Parts:
    return _assemble([step.timeout, step.trace], (step.value, step.context))


def decode_step(payload: Buffer) -> Step:
    """:raises FrameError: the payload is not a step."""
    timeout, trace, value, context = _disassemble(payload, 4, 2, "step")
    if value is None:
        raise FrameError("a step must carry its value")
    return Step(value, _timeout(timeout), context, _trace(trace))


def encode_reply(value: Pickled, changes: Pickled | None = None) -> Parts:
    """The payload of a ``RETURN``, ``RESULT`` or ``EXCEPTION``."""
    return _assemble([], (value, changes))


def decode_reply(payload: Buffer) -> tuple[Pickled, Pickled | None]:
    """:raises FrameError: the payload is not a reply."""
    value, changes = _disassemble(payload, 2, 2, "reply")
    if value is None:
        raise FrameError("a reply must carry its value")
    return value, changes


def encode_end(changes: Pickled | None = None) -> Parts:
    """The payload of an ``END``."""
    return Parts([], 0) if changes is None else _assemble([], (changes,))


def decode_end(payload: Buffer) -> Pickled | None:
    """:raises FrameError: the payload is not an end."""
    if not len(payload):
        return None
    [changes] = _disassemble(payload, 1, 1, "end")
    return changes


_WAITED = struct.Struct(">I")


def encode_ack(waited: float) -> bytes:
    """The payload of an ``ACK`` for a call that waited ``waited`` seconds to start."""
    return _WAITED.pack(min(max(0, int(waited * 1e6)), 0xFFFFFFFF))


def decode_ack(payload: Buffer) -> float | None:
    """Seconds the call waited to start on the worker (``None``: the worker did not say).

    :raises FrameError: the payload is neither empty nor 4 bytes.
    """
    if not payload:
        return None
    if len(payload) != _WAITED.size:
        raise FrameError(f"an ACK carries 0 or {_WAITED.size} bytes, got {len(payload)}")
    return _WAITED.unpack(payload)[0] / 1e6


def encode_hello(max_concurrency: int | None) -> bytes:
    """The payload of a worker's ``HELLO``."""
    return _pack_map({"max_concurrency": max_concurrency})


def decode_hello(payload: Buffer) -> int | None:
    """The ``max_concurrency`` a ``HELLO`` announces (``None``: no bound).

    :raises FrameError: the payload is not a hello.
    """
    try:
        fields = msgpack.unpackb(payload, raw=False, max_bin_len=0, max_str_len=64,
                                 max_array_len=0, max_map_len=16, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable hello ({exc})") from None
    if not isinstance(fields, dict):
        raise FrameError("a hello must be a map")
    bound = fields.get("max_concurrency")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)
                              or bound < 1):
        raise FrameError(f"a hello's max_concurrency must be an int >= 1 or nil, got {bound!r}")
    return bound


#: The kinds of an ``OUTPUT`` entry: a ``logging`` record, a line written to ``sys.stdout`` or
#: ``sys.stderr``, a count of entries dropped.
OUTPUT_RECORD, OUTPUT_LINE, OUTPUT_DROPPED = 0, 1, 2
#: An entry as it travels: a msgpack-ready list (see the module docstring).
OutputEntry = list[Any]
_STREAMS = ("stdout", "stderr")
_ENTRY_LENGTH = {OUTPUT_RECORD: 13, OUTPUT_LINE: 5, OUTPUT_DROPPED: 4}


def encode_output(entries: list[OutputEntry]) -> bytes:
    """The payload of an ``OUTPUT`` frame carrying ``entries``."""
    return cast(bytes, _packb(entries))


def decode_output(payload: Buffer) -> list[OutputEntry]:
    """The entries of an ``OUTPUT`` payload, each checked for its kind's shape.

    :raises FrameError: the payload, or one of its entries, is malformed.
    """
    try:
        entries = msgpack.unpackb(payload, raw=False, max_bin_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable output ({exc})") from None
    if type(entries) is not list:
        raise FrameError("an output payload must be an array of entries")
    for entry in entries:
        _check_entry(entry)
    return entries


def _check_entry(entry: Any) -> None:
    # The hot part of a flood at the caller: one pass, type() checks, no generator.
    if type(entry) is not list or not entry:
        raise FrameError("an output entry must be an array [kind, source, created, ...]")
    kind = entry[0]
    if _ENTRY_LENGTH.get(kind) != len(entry):
        raise FrameError(f"an output entry of kind {kind!r} must have its kind's length")
    source = entry[1]
    if source is not None and not (
            type(source) is list and len(source) == 5
            and (source[0] is None or type(source[0]) is str) and type(source[1]) is str
            and (source[2] is None or type(source[2]) is int) and type(source[3]) is str
            and type(source[4]) is int):
        raise FrameError("an output entry's source must be [uid, address, pid, routine, task] "
                         "or nil")
    if type(entry[2]) is not float and type(entry[2]) is not int:
        raise FrameError("an output entry's time must be a number")
    if kind == OUTPUT_RECORD:
        if not (type(entry[3]) is str and type(entry[4]) is int and type(entry[5]) is str
                and type(entry[6]) is str and type(entry[7]) is str and type(entry[8]) is int
                and (entry[9] is None or type(entry[9]) is str)
                and (entry[10] is None or type(entry[10]) is str)
                and (entry[11] is None or type(entry[11]) is str)
                and (entry[12] is None or type(entry[12]) is str)):
            raise FrameError("a malformed output record")
    elif kind == OUTPUT_LINE:
        if entry[3] not in _STREAMS or type(entry[4]) is not str:
            raise FrameError('an output line must be ["stdout" | "stderr", text]')
    elif type(entry[3]) is not int or entry[3] < 1:
        raise FrameError("an output drop count must be an int >= 1")


def _pack_map(fields: dict[str, Any]) -> bytes:
    return cast(bytes, msgpack.packb(fields, use_bin_type=True))


# -- STATS: what a worker says of itself ------------------------------------------------------

# Each field of a STATS answer and what it must be (bool is never an int here).
_STATS_FIELDS: dict[str, tuple[type, ...]] = {
    "pid": (int,), "backend": (str,), "python": (str,), "version": (str,),
    "max_concurrency": (int, type(None)), "in_flight": (int,), "served": (int,),
    "returned": (int,), "raised": (int,), "cancelled": (int,),
    "busy_seconds": (float, int), "uptime_seconds": (float, int),
    "rss_bytes": (int, type(None)), "rss_peak": (bool,),
}


def encode_stats(stats: WorkerStats) -> bytes:
    """The payload of a worker's ``STATS`` answer."""
    return _pack_map({name: getattr(stats, name) for name in _STATS_FIELDS})


def decode_stats(payload: Buffer) -> WorkerStats:
    """The statistics a worker's ``STATS`` answer carries (unknown keys ignored).

    :raises FrameError: the payload is not a map, or a known field is missing, of the wrong
        type, or a negative count or time.
    """
    try:
        # msgpack's own limits (the payload's size): keys this side does not know may carry
        # anything.
        fields = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"undecodable stats ({exc})") from None
    if not isinstance(fields, dict):
        raise FrameError("stats must be a map")
    values: dict[str, Any] = {}
    for name, types in _STATS_FIELDS.items():
        if name not in fields:
            raise FrameError(f"stats without {name!r}")
        value = fields[name]
        if type(value) not in types or (type(value) is not bool and isinstance(value, (int, float))
                                        and not value >= 0):
            raise FrameError(f"stats' {name} must be "
                             f"{' or '.join(t.__name__ for t in types)} (>= 0), got {value!r}")
        values[name] = float(value) if float in types else value
    return WorkerStats(**values)


# -- RECYCLE: a worker asked to retire, and its answer ----------------------------------------

#: The longest refusal a worker's ``RECYCLE`` answer carries (bytes): words, not data.
MAX_REFUSAL = 1024


def encode_recycle_answer(refusal: str | None) -> bytes:
    """The payload of a worker's ``RECYCLE`` answer: empty when accepted, else ``refusal``."""
    if refusal is None:
        return b""
    # Cut on a character's boundary: a refusal the client cannot decode says nothing.
    return refusal.encode()[:MAX_REFUSAL].decode(errors="ignore").encode()


def decode_recycle_answer(payload: Buffer) -> str | None:
    """``None`` when the worker accepted the ``RECYCLE`` request, else its refusal in words.

    :raises FrameError: the refusal is longer than :data:`MAX_REFUSAL` bytes, or not UTF-8.
    """
    data = bytes(payload)
    if not data:
        return None
    if len(data) > MAX_REFUSAL:
        raise FrameError(f"a recycle refusal of {len(data)} bytes (at most {MAX_REFUSAL})")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise FrameError("a recycle refusal that is not UTF-8") from None
