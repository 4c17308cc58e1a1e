"""Routines whose exception groups cross to the caller (imported by reference on workers)."""

from __future__ import annotations

import threading
from typing import Any

import anyio

from anywool import routine


class Locked(Exception):
    """Picklable as a class and rebuildable from its args; unpicklable once it holds a lock."""


def locked(message: str) -> Locked:
    exc = Locked(message)
    exc.lock = threading.Lock()
    return exc


def nested(depth: int) -> ExceptionGroup[ValueError]:
    """A ValueError at the bottom of ``depth`` nested groups (level ``i`` says ``level i``)."""
    group: Any = ValueError("at the bottom")
    for level in reversed(range(depth)):
        group = ExceptionGroup(f"level {level}", [group])
    return group


def _raise_with_an_unpicklable_leaf() -> None:
    try:
        raise OSError("the cause")
    except OSError as cause:
        inner = ExceptionGroup("inner", [KeyError("k")])
        raise ExceptionGroup("outer", [ValueError("v"), locked("held"), inner]) from cause


@routine
async def fails_with_an_unpicklable_leaf() -> None:
    _raise_with_an_unpicklable_leaf()


@routine
async def fails_in_a_task_group_with_an_unpicklable_leaf() -> None:
    async def fail(exc: Exception) -> None:
        raise exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(fail, ValueError("from a child"))
        tg.start_soon(fail, locked("from another child"))


@routine
async def streams_then_fails_with_an_unpicklable_leaf():
    yield 1
    _raise_with_an_unpicklable_leaf()


@routine
async def reports_what_is_thrown_in():
    """Yields, for each group thrown in, the leaves that ``except*`` matched on the worker."""
    report: list[str] = []
    while True:
        try:
            yield report
        except* ValueError as values:
            report = [repr(leaf) for leaf in values.exceptions]
        except* Locked as lockeds:
            report = [*report, *(repr(leaf) for leaf in lockeds.exceptions)]


@routine
async def fails_nested(depth: int) -> None:
    raise nested(depth)
