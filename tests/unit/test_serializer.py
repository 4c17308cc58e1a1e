"""Exceptions across processes: full fidelity, rebuilt fallback, last-resort replacement."""

from __future__ import annotations

import threading
import traceback

import pytest

from anywool.runtime._serializer import (
    SerializationWarning,
    dumps,
    dumps_exception,
    loads,
    loads_exception,
)


def _raise_here(message: str) -> None:
    raise KeyError(message)  # the line the traceback must mention


class Locked(Exception):
    """Rebuildable from its args, unpicklable as raised once a lock is attached."""


class Stubborn(Exception):
    """Neither picklable as raised nor rebuildable from its args."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.lock = threading.Lock()


def test_values_round_trip() -> None:
    value = {"a": [1, 2.5, None], "b": (b"x", frozenset({3}))}
    assert loads(dumps(value)) == value


def test_exception_round_trips_with_traceback_and_cause() -> None:
    try:
        try:
            _raise_here("inner")
        except KeyError as inner:
            raise ValueError("outer") from inner
    except ValueError as exc:
        data = dumps_exception(exc)
    copy = loads_exception(data)
    assert type(copy) is ValueError and copy.args == ("outer",)
    assert type(copy.__cause__) is KeyError and copy.__cause__.args == ("inner",)
    rendered = "".join(traceback.format_exception(copy))
    assert "_raise_here" in rendered
    assert "raise KeyError(message)  # the line the traceback must mention" in rendered


def test_unpicklable_exception_is_rebuilt_from_args_with_a_warning() -> None:
    try:
        try:
            raise OSError(5, "cause")
        except OSError as cause:
            exc = Locked("no pickles")
            exc.lock = threading.Lock()
            raise exc from cause
    except Locked as exc:
        data = dumps_exception(exc)
    with pytest.warns(SerializationWarning, match="it was rebuilt from its args"):
        copy = loads_exception(data)
    assert type(copy) is Locked and copy.args == ("no pickles",)
    assert isinstance(copy.__cause__, OSError) and copy.__cause__.errno == 5
    assert "test_unpicklable_exception_is_rebuilt" in "".join(traceback.format_exception(copy))


def test_exception_neither_picklable_nor_rebuildable_becomes_runtime_error() -> None:
    exc = Stubborn(7, "stuck")
    with pytest.warns(SerializationWarning, match="replaced by"):
        copy = loads_exception(dumps_exception(exc))
    assert type(copy) is RuntimeError
    assert "Stubborn" in str(copy) and "7: stuck" in str(copy)


def test_undecodable_exception_bytes_become_runtime_error() -> None:
    with pytest.warns(SerializationWarning, match="could not be unpickled"):
        copy = loads_exception(b"not a pickle")
    assert type(copy) is RuntimeError


def test_exception_groups_keep_their_leaves_nesting_notes_and_chain():
    from anywool.runtime._serializer import dumps_exception, loads_exception

    def raise_group() -> None:
        try:
            raise OSError("the cause")
        except OSError as cause:
            raise BaseExceptionGroup("outer", [
                ValueError("v"), SystemExit(4), ExceptionGroup("inner", [KeyError("k")]),
            ]) from cause

    try:
        raise_group()
    except BaseExceptionGroup as raised:
        raised.add_note("noted")
        group = raised
    copy = loads_exception(dumps_exception(group))
    assert type(copy) is BaseExceptionGroup and copy.message == "outer"
    assert [type(e) for e in copy.exceptions] == [ValueError, SystemExit, ExceptionGroup]
    assert [str(e) for e in copy.exceptions[:2]] == ["v", "4"]
    inner = copy.exceptions[2]
    assert inner.message == "inner" and repr(inner.exceptions[0]) == "KeyError('k')"
    assert copy.__notes__ == ["noted"]
    assert isinstance(copy.__cause__, OSError) and str(copy.__cause__) == "the cause"
    assert copy.__traceback__ is not None


def test_what_refers_to_importable_modules_only_is_pickled_by_the_standard_pickler() -> None:
    import pickle

    value = (dumps, (1, "two", b"three"), {"four": [4.0]})
    assert dumps(value) == pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def test_what_the_standard_pickler_cannot_do_goes_to_cloudpickle() -> None:
    def local(x: int) -> int:
        return x + 1

    assert loads(dumps(lambda x: x * 2))(21) == 42
    assert loads(dumps(local))(41) == 42


def test_a_value_referring_to_main_travels_by_value() -> None:
    # In a fresh interpreter, a function of __main__ pickles by value (cloudpickle), so that a
    # process without that __main__ can load it, as a worker must.
    import subprocess
    import sys

    code = (
        "import pickle, sys\n"
        "from anywool.runtime import _serializer\n"
        "def triple(x):\n"
        "    return 3 * x\n"
        "data = _serializer.dumps((triple, 14))\n"
        "sys.stdout.buffer.write(data)\n"
    )
    data = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                          check=True).stdout
    fn, arg = loads(data)
    assert fn(arg) == 42


def test_a_module_registered_by_value_goes_to_cloudpickle() -> None:
    import pickle

    import cloudpickle

    from tests.integration import routines

    cloudpickle.register_pickle_by_value(routines)
    try:
        data = dumps(routines.whoami)
    finally:
        cloudpickle.unregister_pickle_by_value(routines)
    assert data != pickle.dumps(routines.whoami, protocol=pickle.HIGHEST_PROTOCOL)


def _interrupt() -> None:
    raise KeyboardInterrupt


class InterruptsWhenUnpickled:
    def __reduce__(self) -> tuple[object, ...]:
        return (_interrupt, ())


def test_an_interrupt_from_unpickling_is_the_users_except_in_a_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    from anywool.errors import SerializationError
    from anywool.runtime import _serializer

    data = dumps(InterruptsWhenUnpickled())
    exception = dumps_exception(ValueError(InterruptsWhenUnpickled()))
    with pytest.raises(KeyboardInterrupt):  # a caller's Ctrl-C may be what it is
        loads(data)
    # (The setting is the process's: restored after the test.)
    monkeypatch.setattr(_serializer, "_UNPICKLING_EXITS", _serializer._UNPICKLING_EXITS)
    _serializer.take_interrupts_as_values()
    with pytest.raises(pickle.UnpicklingError, match="KeyboardInterrupt"):
        loads(data)
    with pytest.raises(SerializationError, match="cannot be unpickled"):
        _serializer.loads_value(_serializer.Pickled([data]), "f", "the arguments")
    with pytest.warns(SerializationWarning):
        assert isinstance(loads_exception(exception), RuntimeError)
