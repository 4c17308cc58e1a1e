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

import pickle
import warnings
from typing import Any

import cloudpickle
from tblib import pickling_support

# Markers stored beside a pickled exception: how faithful the copy is.
_EXACT = 0
_REBUILT = 1
_REPLACED = 2


class SerializationWarning(UserWarning):
    """An exception crossed a process boundary with less fidelity than it was raised with."""


def dumps(obj: object) -> bytes:
    """Pickle ``obj`` with cloudpickle.

    :raises pickle.PicklingError: (or ``TypeError``/``AttributeError`` as cloudpickle raises
        them) when ``obj`` or something it references cannot be pickled.
    """
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    """Unpickle what :func:`dumps` produced.

    :raises Exception: whatever unpickling raises, e.g. ``ModuleNotFoundError`` when a function
        pickled by reference lives in a module this process cannot import.
    """
    return pickle.loads(data)


def dumps_exception(exc: BaseException) -> bytes:
    """Pickle an exception with its traceback, cause and context.

    Never raises for an unpicklable exception: it falls back to ``type(exc)(*exc.args)`` with the
    cause chain rebuilt the same way, then to a :class:`RuntimeError` naming ``type(exc)`` and its
    message. :func:`loads_exception` warns when it loads such a fallback.
    """
    try:
        return _pack(_EXACT, _with_tblib(exc))
    except Exception:
        pass
    try:
        rebuilt = _rebuild(exc, set())
        return _pack(_REBUILT, _with_tblib(rebuilt))
    except Exception:
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
    except Exception as error:
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
    # Registers copyreg reducers for this exception's classes (cause/context chain included)
    # and for tracebacks; idempotent and cheap after the first time per class.
    pickling_support.install(exc)
    return exc


def _rebuild(exc: BaseException, seen: set[int]) -> BaseException:
    """``type(exc)(*exc.args)`` with traceback and cause chain; raises if that is impossible."""
    seen.add(id(exc))
    copy = type(exc)(*exc.args)
    copy.__traceback__ = exc.__traceback__
    cause = exc.__cause__
    if cause is not None and id(cause) not in seen:
        try:
            copy.__cause__ = _rebuild(cause, seen)
        except Exception:
            copy.__cause__ = _replacement(cause)
    copy.__suppress_context__ = exc.__suppress_context__
    dumps(_with_tblib(copy))  # prove it pickles now, or raise
    return copy


def _replacement(exc: BaseException) -> RuntimeError:
    try:
        message = str(exc)
    except Exception:
        message = "<message could not be rendered>"
    return RuntimeError(f"{_name(type(exc))}: {message}")


def _name(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", cls.__name__)
    return qualname if module in (None, "builtins") else f"{module}.{qualname}"
