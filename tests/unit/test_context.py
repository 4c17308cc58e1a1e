"""anywool.ContextVar in one process: the contextvars semantics, names, and what travels."""

from __future__ import annotations

import contextvars
import pickle

import cloudpickle
import pytest

import anywool
from anywool.runtime import _context

LOCAL = anywool.ContextVar("tests.unit.context.local", default="fallback")
BARE = anywool.ContextVar("tests.unit.context.bare")


def in_fresh_context(fn):
    return contextvars.Context().run(fn)


def test_get_set_and_reset_behave_like_contextvars() -> None:
    def body() -> None:
        assert LOCAL.get() == "fallback" and LOCAL.get("given") == "given"
        with pytest.raises(LookupError):
            BARE.get()
        assert BARE.get(None) is None
        token = LOCAL.set("one")
        inner = LOCAL.set("two")
        assert LOCAL.get() == "two"
        LOCAL.reset(inner)
        assert LOCAL.get() == "one"
        with pytest.raises(RuntimeError):
            LOCAL.reset(inner)  # a token is used once
        with pytest.raises(ValueError):
            BARE.reset(token)  # another variable's token
        LOCAL.reset(token)
        assert LOCAL.get() == "fallback"

    in_fresh_context(body)


def test_a_value_set_in_one_context_is_not_seen_in_another() -> None:
    def setter() -> None:
        LOCAL.set("here")
        assert LOCAL.get() == "here"

    in_fresh_context(setter)
    assert in_fresh_context(LOCAL.get) == "fallback"


@pytest.mark.parametrize("name, error", [(7, TypeError), ("", ValueError)])
def test_a_bad_name_is_refused(name: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="name"):
        anywool.ContextVar(name)  # type: ignore[arg-type]


def test_a_name_is_declared_once_per_process() -> None:
    with pytest.raises(ValueError, match="already exists"):
        anywool.ContextVar("tests.unit.context.local")


def test_a_variable_pickles_by_name_to_the_same_variable() -> None:
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(LOCAL)) is LOCAL


def test_a_variable_arriving_before_its_declaration_is_adopted_by_it() -> None:
    # A routine pickled by value (from __main__) may bring a variable to a worker that never
    # imported the module declaring it; a later declaration is that same variable.
    arrived = _context._named("tests.unit.context.late", "early default")
    assert arrived.get() == "early default"
    declared = anywool.ContextVar("tests.unit.context.late", default="declared")
    assert declared is arrived and declared.get() == "declared"
    with pytest.raises(ValueError, match="already exists"):
        anywool.ContextVar("tests.unit.context.late")


def test_capture_apply_and_changes_round_trip() -> None:
    def caller() -> dict | None:
        LOCAL.set("from the caller")
        return _context.capture()

    values = in_fresh_context(caller)
    assert values == {"tests.unit.context.local": "from the caller"}  # set values only

    def routine_side() -> dict | None:
        _context.apply(values)
        assert LOCAL.get() == "from the caller" and BARE.get(None) is None
        BARE.set(3)
        return _context.changes(values)

    changed = in_fresh_context(routine_side)
    assert changed == {"tests.unit.context.bare": 3}

    def back_in_the_caller() -> tuple:
        _context.apply(values)
        _context.update(changed)
        return LOCAL.get(), BARE.get()

    assert in_fresh_context(back_in_the_caller) == ("from the caller", 3)


def test_a_variable_unset_by_a_step_reads_as_unset() -> None:
    def body() -> None:
        _context.apply({"tests.unit.context.bare": 1})
        assert BARE.get() == 1
        _context.apply(None)  # the caller no longer has it set
        with pytest.raises(LookupError):
            BARE.get()
        assert _context.capture() is None
        assert _context.changes({"tests.unit.context.bare": 1}) == {
            "tests.unit.context.bare": _context.UNSET}

    in_fresh_context(body)


def test_nothing_is_captured_when_nothing_is_set() -> None:
    assert in_fresh_context(_context.capture) is None
    assert in_fresh_context(lambda: _context.changes(None)) is None


def test_a_variable_made_for_a_value_takes_the_default_a_pickled_one_carries() -> None:
    # A value arrived by name first (no default known), then the variable itself, pickled by
    # value from a __main__ with its default: get() falls back to that default.
    made = _context._named("tests.unit.context.main_default")
    assert _context._named("tests.unit.context.main_default", 5) is made
    assert in_fresh_context(made.get) == 5
