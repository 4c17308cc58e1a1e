"""Exceptions across processes: full fidelity, rebuilt fallback, last-resort replacement."""

from __future__ import annotations

import threading
import traceback

import pytest

from anywool.runtime.wire._exceptions import dumps_exception, loads_exception
from anywool.runtime.wire._serializer import SerializationWarning, dumps, loads


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


class Tagged(ExceptionGroup):
    """A user's group type: crosses as itself."""


def _raise_value(message: str) -> None:
    raise ValueError(message)  # a leaf's own frame


def _group_with(bad: BaseException) -> ExceptionGroup:
    """A group whose leaves have tracebacks, a cause, a context and notes, ``bad`` among them."""
    leaves: list[Exception] = []
    try:
        try:
            raise LookupError("the context")
        except LookupError:
            try:
                _raise_value("v")
            except ValueError as value:
                raise value from KeyError("the cause")
    except ValueError as value:
        value.add_note("a note")
        leaves.append(value)
    try:
        raise bad
    except type(bad) as raised:
        leaves.append(raised)
    return Tagged("outer", [leaves[0], ExceptionGroup("inner", [leaves[1], OSError(2, "k")])])


def _assert_the_good_leaves_crossed(copy: BaseException) -> None:
    assert type(copy) is Tagged and copy.message == "outer"
    value, inner = copy.exceptions
    assert type(value) is ValueError and value.args == ("v",) and value.__notes__ == ["a note"]
    assert repr(value.__cause__) == "KeyError('the cause')"
    assert repr(value.__context__) == "LookupError('the context')"
    assert "_raise_value" in "".join(traceback.format_exception(value))
    assert type(inner) is ExceptionGroup and inner.message == "inner"
    assert type(inner.exceptions[1]) is FileNotFoundError and inner.exceptions[1].errno == 2


def test_an_unpicklable_leaf_is_rebuilt_alone_and_its_group_crosses() -> None:
    held = Locked("held")
    held.lock = threading.Lock()
    data = dumps_exception(_group_with(held))
    with pytest.warns(SerializationWarning, match="Locked could not be pickled") as caught:
        copy = loads_exception(data)
    _assert_the_good_leaves_crossed(copy)
    held = copy.exceptions[1].exceptions[0]
    assert type(held) is Locked and held.args == ("held",) and not hasattr(held, "lock")
    assert "_group_with" in "".join(traceback.format_exception(held))
    assert len(caught) == 1  # one warning: one degraded leaf


def test_a_leaf_neither_picklable_nor_rebuildable_is_replaced_alone() -> None:
    data = dumps_exception(_group_with(Stubborn(7, "stuck")))
    with pytest.warns(SerializationWarning, match="replaced by"):
        copy = loads_exception(data)
    _assert_the_good_leaves_crossed(copy)
    replaced = copy.exceptions[1].exceptions[0]
    assert type(replaced) is RuntimeError and "Stubborn: 7: stuck" in str(replaced)
    assert "_group_with" in "".join(traceback.format_exception(replaced))


def test_a_group_whose_class_cannot_be_pickled_arrives_as_a_built_in_group() -> None:
    class Held(ExceptionGroup):
        lock = threading.Lock()  # pickled with the (local) class: it cannot be

    group = Held("held", [ValueError("v"), ExceptionGroup("inner", [KeyError("k")])])
    group.add_note("kept")
    with pytest.warns(SerializationWarning, match="Held could not be pickled"):
        copy = loads_exception(dumps_exception(group))
    assert type(copy) is ExceptionGroup and copy.message == "held"
    assert copy.__notes__ == ["kept"]
    assert repr(copy.exceptions) == (
        "(ValueError('v'), ExceptionGroup('inner', [KeyError('k')]))")


class RefusedHere(Exception):
    """Pickles, but its unpickling fails (as a class missing on the receiving side would)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_refuse, self.args)


def _refuse(*args: object) -> RefusedHere:
    raise ImportError("no such class here")


def test_a_leaf_that_cannot_be_unpickled_is_replaced_alone_beside_one_that_degraded() -> None:
    # An unpicklable leaf sends the group node by node: then each node is also loaded alone.
    held = Locked("held")
    held.lock = threading.Lock()
    group = _group_with(RefusedHere("r"))
    data = dumps_exception(ExceptionGroup("both", [group, held]))
    with pytest.warns(SerializationWarning) as caught:
        copy = loads_exception(data)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert any("Locked could not be pickled" in m for m in messages)
    assert any("could not be unpickled" in m and "no such class here" in m for m in messages)
    outer, rebuilt = copy.exceptions
    _assert_the_good_leaves_crossed(outer)
    replaced = outer.exceptions[1].exceptions[0]
    assert type(replaced) is RuntimeError and "no such class here" in str(replaced)
    assert type(rebuilt) is Locked and rebuilt.args == ("held",)


def test_groups_and_chains_far_deeper_than_the_recursion_limit_cross_whole() -> None:
    import sys

    depth = 5 * sys.getrecursionlimit()
    group: BaseException = ValueError("at the bottom")
    for level in reversed(range(depth)):
        group = ExceptionGroup(f"level {level}", [group])
    chain: BaseException = KeyError(0)
    for link in range(1, depth):
        chain, chain.__cause__ = KeyError(link), chain
    group.__context__ = chain
    copy = loads_exception(dumps_exception(group))
    levels, each = 0, copy
    while isinstance(each, ExceptionGroup):
        assert each.message == f"level {levels}" and len(each.exceptions) == 1
        levels, each = levels + 1, each.exceptions[0]
    assert levels == depth and repr(each) == "ValueError('at the bottom')"
    links, each = 0, copy.__context__
    while each is not None:
        assert each.args == (depth - 1 - links,)
        links, each = links + 1, each.__cause__
    assert links == depth


def test_shared_exceptions_and_cycles_keep_their_identity() -> None:
    shared = KeyError("in two groups")
    first, second = ValueError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first  # a cycle
    second.__cause__ = None
    second.__suppress_context__ = True  # as after "raise ... from None"
    group = ExceptionGroup("g", [ExceptionGroup("a", [shared, first]),
                                 ExceptionGroup("b", [shared, second])])
    copy = loads_exception(dumps_exception(group))
    a, b = copy.exceptions
    assert a.exceptions[0] is b.exceptions[0] and repr(a.exceptions[0]) == repr(shared)
    first_copy, second_copy = a.exceptions[1], b.exceptions[1]
    assert first_copy.__context__ is second_copy and second_copy.__context__ is first_copy
    assert second_copy.__suppress_context__ and not first_copy.__suppress_context__


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
        "from anywool.runtime.wire import _serializer\n"
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
    from anywool.runtime.wire import _serializer

    data = dumps(InterruptsWhenUnpickled())
    exception = dumps_exception(ValueError(InterruptsWhenUnpickled()))
    with pytest.raises(KeyboardInterrupt):  # a caller's Ctrl-C may be what it is
        loads(data)
    # (The setting is the process's: restored after the test.)
    monkeypatch.setattr(_serializer, "UNPICKLING_EXITS", _serializer.UNPICKLING_EXITS)
    _serializer.take_interrupts_as_values()
    with pytest.raises(pickle.UnpicklingError, match="KeyboardInterrupt"):
        loads(data)
    with pytest.raises(SerializationError, match="cannot be unpickled"):
        _serializer.loads_value(_serializer.Pickled([data]), "f", "the arguments")
    with pytest.warns(SerializationWarning):
        assert isinstance(loads_exception(exception), RuntimeError)
