"""How routines, their arguments, results and exceptions become bytes and back.

Everything is cloudpickle: module-level functions travel by reference (the receiving process
imports them, so it needs the sender's ``sys.path``), functions of ``__main__`` and closures by
value. Exceptions keep their traceback through tblib's pickling support.

An exception that cannot be pickled as it is degrades in two steps instead of failing the call:
first it is rebuilt as ``cls(*exc.args)`` (cause chain and traceback kept, attributes lost), and
as a last resort it becomes a :class:`RuntimeError` naming the original class and message. The
receiving side emits :class:`SerializationWarning` when it loads a degraded exception, because
that is where somebody will read it.

No I/O and no event loop here: plain functions on bytes.
"""

from __future__ import annotations

import copyreg
import pickle
import warnings
from typing import Any

import cloudpickle
from tblib import pickling_support

from anywool.errors import SerializationError

# Markers stored beside a pickled exception: how faithful the copy is.
_EXACT = 0
_REBUILT = 1
_REPLACED = 2


class SerializationWarning(UserWarning):
    """An exception crossed a process boundary with less fidelity than it was raised with."""


def dumps(obj: object) -> bytes:
    """Pickle ``obj`` as cloudpickle would.

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
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            pass
        else:
            if b"__main__" not in data:
                return data
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    """Unpickle what :func:`dumps` produced.

    :raises Exception: whatever unpickling raises, e.g. ``ModuleNotFoundError`` when a function
        pickled by reference lives in a module this process cannot import.
    :raises pickle.UnpicklingError: unpickling raised ``SystemExit`` or ``GeneratorExit`` (a
        value's reducer did), or in a worker ``KeyboardInterrupt`` too (see
        :func:`take_interrupts_as_values`): the process receiving a value must not exit
        because of it.
    """
    try:
        return pickle.loads(data)
    except _UNPICKLING_EXITS as exc:
        raise pickle.UnpicklingError(
            f"unpickling raised {type(exc).__name__}: {exc}") from exc


#: What pickling or unpickling a value may raise that is the value's doing: its reducers may raise
#: anything, ``SystemExit`` included. ``KeyboardInterrupt`` is the user's and propagates.
VALUE_FAILURES = (Exception, SystemExit, GeneratorExit)

# What unpickling turns into UnpicklingError rather than let it end the process.
_UNPICKLING_EXITS: tuple[type[BaseException], ...] = (SystemExit, GeneratorExit)


def take_interrupts_as_values() -> None:
    """Take a ``KeyboardInterrupt`` that unpickling raises as the value's doing, in this
    process: a worker's, where SIGINT asks for a drain and never raises it, so that only a
    value's reducer can. A call's argument, a step's value or a thrown exception that raises it
    then fails that call alone, as any value that cannot be unpickled does."""
    global _UNPICKLING_EXITS
    _UNPICKLING_EXITS = (SystemExit, GeneratorExit, KeyboardInterrupt)


def dumps_value(obj: object, routine: str, what: str, where: str = "") -> bytes:
    """:func:`dumps`, failing as :class:`~anywool.errors.SerializationError`.

    :param routine: the routine the value belongs to (named in the error).
    :param what: what the value is, in words (``"the arguments"``).
    :param where: where it is pickled, in words (``" on worker unix:/..."``), or ``""``.
    """
    try:
        return dumps(obj)
    except VALUE_FAILURES as exc:
        raise SerializationError(routine, what, f"cannot be pickled{where} "
                                                f"({type(exc).__name__}: {exc})") from exc


def loads_value(data: bytes, routine: str, what: str, where: str = "") -> Any:
    """:func:`loads`, failing as :class:`~anywool.errors.SerializationError` (see
    :func:`dumps_value`)."""
    try:
        return loads(data)
    except Exception as exc:
        raise SerializationError(routine, what, f"cannot be unpickled{where} "
                                                f"({type(exc).__name__}: {exc})") from exc


def dumps_context(values: dict[str, Any], routine: str, where: str = "") -> bytes:
    """Pickle context-variable values (see :mod:`anywool.runtime._context`); a failure names the
    variable whose value cannot be pickled."""
    try:
        return dumps(values)
    except VALUE_FAILURES as exc:
        for name, value in values.items():
            dumps_value(value, routine, f"the value of context variable {name!r}", where)
        raise SerializationError(routine, "the values of its context variables",
                                 f"cannot be pickled{where} ({type(exc).__name__}: {exc})") \
            from exc


def dumps_exception(exc: BaseException) -> bytes:
    """Pickle an exception with its traceback, cause and context.

    Never raises for an unpicklable exception: it falls back to ``type(exc)(*exc.args)`` with the
    cause chain rebuilt the same way, then to a :class:`RuntimeError` naming ``type(exc)`` and its
    message. :func:`loads_exception` warns when it loads such a fallback.
    """
    # BaseException: a __reduce__ that raises SystemExit must not end the process sending.
    try:
        return _pack(_EXACT, _with_tblib(exc))
    except BaseException:
        pass
    try:
        rebuilt = _rebuild(exc, set())
        return _pack(_REBUILT, _with_tblib(rebuilt))
    except BaseException:
        pass
    return _pack(_REPLACED, _replacement(exc))


def loads_exception(data: bytes) -> BaseException:
    """Load what :func:`dumps_exception` produced.

    Emits :class:`SerializationWarning` when the exception is a fallback copy. When the bytes
    cannot be unpickled at all (for example the exception class is not importable here), returns a
    :class:`RuntimeError` that says so rather than raising.
    """
    try:
        fidelity, payload = pickle.loads(data)
        exc = pickle.loads(payload)
    except (Exception, *_UNPICKLING_EXITS) as error:
        warnings.warn(
            f"a remote exception could not be unpickled ({type(error).__name__}: {error}); "
            "it is replaced by a RuntimeError",
            SerializationWarning,
            stacklevel=2,
        )
        return RuntimeError(f"remote exception could not be unpickled: {error}")
    if fidelity == _REBUILT:
        warnings.warn(
            f"the remote {_name(type(exc))} could not be pickled as raised; it was rebuilt from "
            "its args (attributes beyond args were lost)",
            SerializationWarning,
            stacklevel=2,
        )
    elif fidelity == _REPLACED:
        warnings.warn(
            f"a remote exception could not be pickled nor rebuilt from its args; "
            f"it is replaced by: {exc}",
            SerializationWarning,
            stacklevel=2,
        )
    return exc


def _pack(fidelity: int, exc: BaseException) -> bytes:
    # Two layers, so that the marker can be read even if the exception cannot be loaded.
    return pickle.dumps((fidelity, dumps(exc)), protocol=pickle.HIGHEST_PROTOCOL)


def _with_tblib(exc: BaseException) -> BaseException:
    # Registers copyreg reducers for the classes of every exception reachable from this one
    # (cause, context, the leaves of groups) and for tracebacks; idempotent and cheap after the
    # first time per class. Exception groups get a reducer of their own (see _reduce_group).
    for each in _reachable(exc):
        _trim(each)
        pickling_support.install(each)
        if isinstance(each, BaseExceptionGroup):
            copyreg.pickle(type(each), _reduce_group)
    return exc


#: The most traceback frames an exception keeps when it crosses (the innermost ones): each level
#: of nested routines adds its own, and pickling a traceback recurses once per frame.
MAX_FRAMES = 100


def _trim(exc: BaseException) -> None:
    """Keep only the innermost :data:`MAX_FRAMES` frames of ``exc``'s traceback, with a note."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if len(frames) > MAX_FRAMES:
        exc.__traceback__ = frames[-MAX_FRAMES]
        note = "(its traceback was shortened to the innermost frames as it crossed processes)"
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)


def _reachable(exc: BaseException) -> list[BaseException]:
    found: dict[int, BaseException] = {}
    pending = [exc]
    while pending:
        each = pending.pop()
        if id(each) in found:
            continue
        found[id(each)] = each
        pending.extend(e for e in (each.__cause__, each.__context__) if e is not None)
        if isinstance(each, BaseExceptionGroup):
            pending.extend(each.exceptions)
    return list(found.values())


def _reduce_group(group: BaseExceptionGroup[Any]) -> tuple[Any, ...]:
    # The generic reducers rebuild an exception from its args, which BaseExceptionGroup's
    # __new__ refuses when a leaf is not an Exception. This keeps the message, the leaves
    # (each pickled as itself), traceback, cause, context and notes.
    return (_unpickle_group, (type(group), group.message, list(group.exceptions),
                              group.__traceback__, group.__cause__, group.__context__,
                              group.__suppress_context__, getattr(group, "__notes__", None)))


def _unpickle_group(cls: type[BaseExceptionGroup[Any]], message: str,
                    exceptions: list[BaseException], traceback: Any, cause: Any, context: Any,
                    suppress_context: bool, notes: list[str] | None) -> BaseExceptionGroup[Any]:
    try:
        group = cls(message, exceptions)
    except Exception:  # a subclass with a constructor of its own: the closest built-in group
        group = BaseExceptionGroup(message, exceptions)
    group.__traceback__ = traceback
    group.__cause__ = cause
    group.__context__ = context
    group.__suppress_context__ = suppress_context
    if notes is not None:
        group.__notes__ = notes
    return group


def _rebuild(exc: BaseException, seen: set[int]) -> BaseException:
    """``type(exc)(*exc.args)`` with traceback and cause chain; raises if that is impossible."""
    seen.add(id(exc))
    copy = type(exc)(*exc.args)
    copy.__traceback__ = exc.__traceback__
    cause = exc.__cause__
    if cause is not None and id(cause) not in seen:
        try:
            copy.__cause__ = _rebuild(cause, seen)
        except BaseException:
            copy.__cause__ = _replacement(cause)
    copy.__suppress_context__ = exc.__suppress_context__
    dumps(_with_tblib(copy))  # prove it pickles now, or raise
    return copy


def _replacement(exc: BaseException) -> RuntimeError:
    try:
        message = str(exc)
    except BaseException:
        message = "<message could not be rendered>"
    return RuntimeError(f"{_name(type(exc))}: {message}")


def _name(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", cls.__name__)
    return qualname if module in (None, "builtins") else f"{module}.{qualname}"
