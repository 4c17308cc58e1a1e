"""Exception groups raised on a worker (or thrown into one) reach the other side member by
member: one member that cannot be pickled degrades alone, and nesting has no depth limit."""

from __future__ import annotations

import sys
import traceback

import anyio
import pytest

from anywool import SerializationWarning

from .routines_groups import (
    Locked,
    fails_in_a_task_group_with_an_unpicklable_leaf,
    fails_nested,
    fails_with_an_unpicklable_leaf,
    locked,
    reports_what_is_thrown_in,
    streams_then_fails_with_an_unpicklable_leaf,
)

pytestmark = pytest.mark.anyio

# Deeper than the ~240 levels at which a group pickled as one object hits the recursion limit,
# and shallow enough for the caller's own except* (CPython's split recurses once per level).
DEEP = 600


def _assert_the_group_of_an_unpicklable_leaf(group: BaseException) -> None:
    assert type(group) is ExceptionGroup and group.message == "outer"
    value, held, inner = group.exceptions
    assert repr(value) == "ValueError('v')"
    assert type(held) is Locked and held.args == ("held",)  # rebuilt from its args
    assert type(inner) is ExceptionGroup and inner.message == "inner"
    assert repr(inner.exceptions[0]) == "KeyError('k')"
    assert repr(group.__cause__) == "OSError('the cause')"
    assert "_raise_with_an_unpicklable_leaf" in "".join(traceback.format_exception(group))


async def test_an_unpicklable_leaf_degrades_alone_and_except_star_matches_the_others(
        worker_pool):
    matched: dict[str, list[str]] = {}
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.warns(SerializationWarning, match="routines_groups.Locked"):
                try:
                    await fails_with_an_unpicklable_leaf()
                except* ValueError as values:
                    matched["values"] = [repr(leaf) for leaf in values.exceptions]
                except* KeyError as keys:
                    matched["keys"] = [repr(leaf) for leaf in keys.exceptions]
                except* Locked as lockeds:
                    matched["locked"] = [repr(leaf) for leaf in lockeds.exceptions]
    assert matched == {"values": ["ValueError('v')"],
                       "keys": ["ExceptionGroup('inner', [KeyError('k')])"],  # nesting kept
                       "locked": ["Locked('held')"]}


async def test_the_group_of_an_unpicklable_leaf_arrives_with_its_structure(worker_pool):
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.warns(SerializationWarning, match="rebuilt from its args"):
                with pytest.raises(ExceptionGroup) as info:
                    await fails_with_an_unpicklable_leaf()
    _assert_the_group_of_an_unpicklable_leaf(info.value)


async def test_a_task_groups_unpicklable_leaf_degrades_alone(worker_pool):
    caught: list[BaseException] = []
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.warns(SerializationWarning, match="routines_groups.Locked"):
                try:
                    await fails_in_a_task_group_with_an_unpicklable_leaf()
                except* ValueError as values:
                    caught.extend(values.exceptions)
                except* Locked as lockeds:
                    caught.extend(lockeds.exceptions)
    assert sorted(map(repr, caught)) == ["Locked('from another child')",
                                         "ValueError('from a child')"]


async def test_a_generator_routines_group_with_an_unpicklable_leaf_degrades_alone(worker_pool):
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            agen = streams_then_fails_with_an_unpicklable_leaf()
            assert await agen.__anext__() == 1
            with pytest.warns(SerializationWarning, match="routines_groups.Locked"):
                with pytest.raises(ExceptionGroup) as info:
                    await agen.__anext__()
    _assert_the_group_of_an_unpicklable_leaf(info.value)


async def test_a_group_thrown_into_a_generator_routine_keeps_its_picklable_leaves(worker_pool):
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            agen = reports_what_is_thrown_in()
            assert await agen.__anext__() == []
            thrown = ExceptionGroup("thrown", [ValueError("v"), locked("held")])
            assert await agen.athrow(thrown) == ["ValueError('v')", "Locked('held')"]
            await agen.aclose()


async def test_a_group_nested_past_the_recursion_limit_arrives_whole(worker_pool):
    depth = 3 * sys.getrecursionlimit()  # also past what except* and split() can take
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            with pytest.raises(ExceptionGroup) as info:
                await fails_nested(depth)
    levels, group = 0, info.value
    while isinstance(group, ExceptionGroup):
        assert group.message == f"level {levels}" and len(group.exceptions) == 1
        levels, group = levels + 1, group.exceptions[0]
    assert levels == depth and repr(group) == "ValueError('at the bottom')"


async def test_except_star_matches_a_group_nested_deeper_than_pickles_recursion(worker_pool):
    matched: list[BaseExceptionGroup[ValueError]] = []
    with anyio.fail_after(60):
        async with worker_pool(spawn=1):
            try:
                await fails_nested(DEEP)
            except* ValueError as values:
                matched.append(values)  # the split keeps the nesting and the messages
    (group,) = matched
    levels: int = 0
    while isinstance(group, ExceptionGroup):
        assert group.message == f"level {levels}" and len(group.exceptions) == 1
        levels, group = levels + 1, group.exceptions[0]
    assert levels == DEEP and repr(group) == "ValueError('at the bottom')"
