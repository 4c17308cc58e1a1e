"""How routines, their arguments and results become bytes and back.

Everything is cloudpickle: module-level functions travel by reference (the receiving process
imports them, so it needs the sender's ``sys.path``), functions of ``__main__`` and closures by
value. Exceptions cross through :mod:`anywool.runtime.wire._exceptions`, which builds on this
module (each exception of a graph pickled on its own, with fallbacks).

Values travel as :class:`Pickled`: the pickle stream in pieces plus its out-of-band buffers,
so that a large buffer is never copied on the way out. :func:`dump` pickles with protocol 5 into
a sink of ours rather than into one ``bytes``: CPython's pickler hands a ``bytes`` or
``bytearray`` payload of 64 KiB or more straight to the sink's ``write`` (the object itself, not
a copy), and the sink keeps it as a piece of the stream; a buffer pickled as a
:class:`pickle.PickleBuffer` (``memoryview``, whose reducer here is one, NumPy arrays and
anything that reduces the same way) goes out of band. The frame codec then writes the pieces
and the buffers with one vectored send. Measured on 16 MiB: ``pickle.dumps`` alone
took 17 ms, the by-reference pickle under 0.1 ms. The pieces refer to the caller's objects: a
mutable buffer (a ``bytearray``, a writable ``memoryview``) is read as the frame is written,
so it must not change (nor be resized, which then fails) until its call's frame is written.
Unpickling takes the received stream and buffers as views of the frame (:func:`loads`), so a
value that can live on a buffer (an out-of-band buffer, a NumPy array) is not copied either;
it then keeps the whole frame it came in alive.

No I/O and no event loop here: plain functions on bytes.
"""

from __future__ import annotations

import copyreg
import pickle
from collections.abc import Sequence
from typing import Any

import cloudpickle

from anywool.errors import SerializationError


class SerializationWarning(UserWarning):
    """An exception crossed a process boundary with less fidelity than it was raised with."""


#: What a pickle is made of and read from: bytes-like objects.
Buffer = bytes | bytearray | memoryview

_PROTOCOL = 5  # out-of-band buffers (PEP 574); also what pickle.HIGHEST_PROTOCOL is here
# Payloads of at least this many bytes come to a sink's write by reference (CPython's
# FRAME_SIZE_TARGET): only those may be left out of the scan for "__main__".
_BY_REFERENCE = 64 * 1024
# The opcodes that announce a bytes, bytearray or str payload, with their length's width.
_ANNOUNCE_4 = frozenset(b"BX")  # BINBYTES, BINUNICODE
_ANNOUNCE_8 = frozenset(b"\x8e\x96\x8d")  # BINBYTES8, BYTEARRAY8, BINUNICODE8


class Pickled:
    """A pickle as it travels: the stream (in ``chunks``, read in order as one) and its
    out-of-band buffers (``buffers``, handed to the unpickler in order).

    Made by :func:`dump` (chunks may be the pickled objects' own buffers), or from a received
    frame (one chunk and the buffers, all views of that frame: read-only when the frame was
    small enough to arrive as ``bytes``, writable when it was received in place).
    """

    __slots__ = ("chunks", "buffers")

    def __init__(self, chunks: Sequence[Buffer], buffers: Sequence[Buffer] = ()) -> None:
        self.chunks = chunks
        self.buffers = buffers

    def sizes(self) -> list[int]:
        """The stream's size then each buffer's, in bytes: what a frame says of them."""
        chunks = self.chunks
        if len(chunks) == 1 and type(chunks[0]) is bytes:  # most values: one small pickle
            size = len(chunks[0])
        else:
            size = sum(map(_nbytes, chunks))
        if not self.buffers:
            return [size]
        return [size, *map(_nbytes, self.buffers)]

    def stream(self) -> Buffer:
        """The pickle stream as one buffer (joined, when it is in several chunks)."""
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _nbytes(buffer: Buffer) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def _reduce_memoryview(view: memoryview) -> tuple[Any, ...]:
    # As cloudpickle does (a memoryview arrives as bytes), without the copy of tobytes():
    # as a PickleBuffer, its bytes are sent out of band, or in band by reference.
    if view.c_contiguous:
        return bytes, (pickle.PickleBuffer(view),)
    return bytes, (view.tobytes(),)


class _Reducers(dict[type, Any]):
    """The standard pickler's reducers: ours, then copyreg's (looked up at each miss, so that
    a reducer registered later, as tblib registers exceptions, is seen)."""

    def __missing__(self, cls: type) -> Any:
        return copyreg.dispatch_table[cls]


class _Pickler(pickle.Pickler):
    dispatch_table = _Reducers({memoryview: _reduce_memoryview})


class _Sink:
    """What a pickler writes to: keeps every piece as it comes (large payloads are the
    pickled objects themselves, an in-band PickleBuffer included: see :func:`_flat`), and
    out-of-band buffers when ``out_of_band``."""

    __slots__ = ("chunks", "write", "buffers", "out_of_band")

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        # What the pickler calls with each piece (it looks it up once): the list's own append,
        # which runs no Python code.
        self.write = self.chunks.append
        self.buffers: list[Buffer] = []
        self.out_of_band = True

    def buffer(self, buffer: pickle.PickleBuffer) -> bool:
        """The buffer callback: ``False`` takes ``buffer`` out of band (``True``: in band)."""
        if not self.out_of_band:
            return True
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: in band, where the pickler says what it can do
            return True
        self.buffers.append(view)
        return False


# Picklers ready for use, each with its sink: a pickler is made once and reused (clearing its
# memo), as making one costs more than pickling a small value. One is taken per dump, so a
# reducer that pickles something itself, or another thread, gets another.
_free: list[tuple[_Pickler, _Sink]] = []
_FREE_MAX = 4


def _flat(chunks: list[Any]) -> list[Buffer]:
    """``chunks`` with each PickleBuffer (written in band by reference) as its flat view."""
    return [chunk.raw() if type(chunk) is pickle.PickleBuffer else chunk for chunk in chunks]


def _by_reference(chunks: list[Buffer], index: int) -> bool:
    """Whether ``chunks[index]`` is a payload the pickler passed by reference: the chunk before
    it ends with the opcode and length that announce exactly it."""
    chunk = chunks[index]
    if type(chunk) is not bytes:
        return True  # a bytearray or a PickleBuffer's view: the pickler writes only bytes
    size = len(chunk)
    if size < _BY_REFERENCE or index == 0:
        return False
    before = chunks[index - 1]
    if not isinstance(before, bytes):
        return False
    if len(before) >= 5 and before[-5] in _ANNOUNCE_4:
        return int.from_bytes(before[-4:], "little") == size
    if len(before) >= 9 and before[-9] in _ANNOUNCE_8:
        return int.from_bytes(before[-8:], "little") == size
    return False


def _refers_to_main(chunks: list[Buffer]) -> bool:
    """Whether the pickle names ``__main__`` outside the payloads passed by reference (which
    hold values, never a module's name)."""
    for index, chunk in enumerate(chunks):
        if not _by_reference(chunks, index) and b"__main__" in chunk:
            return True
    return False


def dump(obj: object, *, out_of_band: bool = True) -> Pickled:
    """Pickle ``obj`` as cloudpickle would, without copying its large buffers (see the module
    docstring); with ``out_of_band=False``, every buffer is in the stream (for a pickle that is
    unpickled without its buffers, e.g. nested in another).

    The standard pickler goes first: for what refers only to importable modules (most calls'
    routines, arguments and results) it writes what cloudpickle writes, three times faster,
    since cloudpickle's hook runs in Python for every object. What it cannot pickle (a lambda,
    a local class), what refers to ``__main__`` (which cloudpickle pickles by value) and any
    module registered with ``cloudpickle.register_pickle_by_value`` go to cloudpickle, so a
    value's reducer may then run twice.

    :raises pickle.PicklingError: (or ``TypeError``/``AttributeError`` as cloudpickle raises
        them) when ``obj`` or something it references cannot be pickled.
    """
    if not cloudpickle.list_registry_pickle_by_value():
        try:
            pickler, sink = _free.pop()
        except IndexError:
            sink = _Sink()
            pickler = _Pickler(sink, _PROTOCOL, buffer_callback=sink.buffer)
        sink.out_of_band = out_of_band
        try:
            pickler.dump(obj)
        except Exception:
            pass  # this pickler and its sink are dropped: they may be in any state
        else:
            written, buffers = sink.chunks, sink.buffers
            chunks = written.copy()  # the pickler keeps appending to written: it is the sink's
            written.clear()
            if buffers:
                sink.buffers = []
            else:
                buffers = ()  # the sink's own (empty) list stays with it
            pickler.clear_memo()
            if len(_free) < _FREE_MAX:
                _free.append((pickler, sink))
            if len(chunks) == 1:  # a small pickle: the whole of it is the pickler's bytes
                if b"__main__" not in chunks[0]:
                    return Pickled(chunks, buffers)
            else:
                chunks = _flat(chunks)
                if not _refers_to_main(chunks):
                    return Pickled(chunks, buffers)
    sink = _Sink()
    sink.out_of_band = out_of_band
    cloudpickle.Pickler(sink, protocol=_PROTOCOL, buffer_callback=sink.buffer).dump(obj)
    return Pickled(_flat(sink.chunks), sink.buffers)


def dumps(obj: object) -> bytes:
    """:func:`dump` into one ``bytes``, every buffer in band."""
    return bytes(dump(obj, out_of_band=False).stream())


def loads(data: Buffer, buffers: Sequence[Buffer] = ()) -> Any:
    """Unpickle what :func:`dump` or :func:`dumps` produced, from the stream ``data`` and the
    out-of-band ``buffers`` (views are taken as they are: nothing is copied to read them).

    :raises Exception: whatever unpickling raises, e.g. ``ModuleNotFoundError`` when a function
        pickled by reference lives in a module this process cannot import.
    :raises pickle.UnpicklingError: unpickling raised ``SystemExit`` or ``GeneratorExit`` (a
        value's reducer did), or in a worker ``KeyboardInterrupt`` too (see
        :func:`take_interrupts_as_values`): the process receiving a value must not exit
        because of it.
    """
    try:
        return pickle.loads(data, buffers=buffers)
    except UNPICKLING_EXITS as exc:
        raise pickle.UnpicklingError(
            f"unpickling raised {type(exc).__name__}: {exc}") from exc


#: What pickling or unpickling a value may raise that is the value's doing: its reducers may raise
#: anything, ``SystemExit`` included. ``KeyboardInterrupt`` is the user's and propagates.
VALUE_FAILURES = (Exception, SystemExit, GeneratorExit)

# What unpickling turns into UnpicklingError rather than let it end the process.
UNPICKLING_EXITS: tuple[type[BaseException], ...] = (SystemExit, GeneratorExit)


def take_interrupts_as_values() -> None:
    """Take a ``KeyboardInterrupt`` that unpickling raises as the value's doing, in this
    process: a worker's, where SIGINT asks for a drain and never raises it, so that only a
    value's reducer can. A call's argument, a step's value or a thrown exception that raises it
    then fails that call alone, as any value that cannot be unpickled does."""
    global UNPICKLING_EXITS
    UNPICKLING_EXITS = (SystemExit, GeneratorExit, KeyboardInterrupt)


def dumps_value(obj: object, routine: str, what: str, where: str = "") -> Pickled:
    """:func:`dump`, failing as :class:`~anywool.errors.SerializationError`.

    :param routine: the routine the value belongs to (named in the error).
    :param what: what the value is, in words (``"the arguments"``).
    :param where: where it is pickled, in words (``" on worker unix:/..."``), or ``""``.
    """
    try:
        return dump(obj)
    except VALUE_FAILURES as exc:
        raise SerializationError(routine, what, f"cannot be pickled{where} "
                                                f"({type(exc).__name__}: {exc})") from exc


def loads_value(data: Pickled, routine: str, what: str, where: str = "") -> Any:
    """:func:`loads` of ``data``'s stream and buffers, failing as
    :class:`~anywool.errors.SerializationError` (see :func:`dumps_value`)."""
    try:
        return loads(data.stream(), data.buffers)
    except Exception as exc:
        raise SerializationError(routine, what, f"cannot be unpickled{where} "
                                                f"({type(exc).__name__}: {exc})") from exc


def dumps_context(values: dict[str, Any], routine: str, where: str = "") -> Pickled:
    """Pickle context-variable values (see :mod:`anywool.runtime._context`); a failure names the
    variable whose value cannot be pickled."""
    try:
        return dump(values)
    except VALUE_FAILURES as exc:
        for name, value in values.items():
            dumps_value(value, routine, f"the value of context variable {name!r}", where)
        raise SerializationError(routine, "the values of its context variables",
                                 f"cannot be pickled{where} ({type(exc).__name__}: {exc})") \
            from exc
