"""Factory forms: turn what a user passed for a dependency into the object itself.

A *Factory* of ``T`` is any of: a ``T``; a callable returning any of these forms; an awaitable of
one; a sync or async context manager whose ``__enter__``/``__aenter__`` returns the ``T``
(taken as it is: it is not resolved again). Whatever is
entered is entered on the caller's :class:`~contextlib.AsyncExitStack`, so exactly what was
entered is exited, once, in reverse order, when the stack closes.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, AsyncExitStack
from typing import Any, TypeAlias, TypeVar, Union

__all__ = ["Factory", "resolve"]

T = TypeVar("T")

Factory: TypeAlias = Union[
    T,
    Callable[[], Any],
    Awaitable[Any],
    AbstractContextManager[Any],
    AbstractAsyncContextManager[Any],
]

_MAX_DEPTH = 8


def _is_async_cm(obj: object) -> bool:
    return hasattr(type(obj), "__aenter__") and hasattr(type(obj), "__aexit__")


def _is_sync_cm(obj: object) -> bool:
    return hasattr(type(obj), "__enter__") and hasattr(type(obj), "__exit__")


async def resolve(factory: object, stack: AsyncExitStack, *, is_value: Callable[[object], bool] | None = None) -> Any:
    """Resolve ``factory`` to a value, entering context managers on ``stack``.

    Context managers are entered first (an object that is both a context manager and callable is
    entered, not called), then awaitables awaited, then callables (classes included) called; the
    outcome is resolved again, up to a depth of 8.

    :param factory: the Factory form.
    :param stack: where entered context managers are registered for exit.
    :param is_value: objects for which it returns true are taken as they are, never entered,
        awaited or called (e.g. a discovery subscriber that happens to be a context manager).
    :raises TypeError: the forms nest deeper than 8 levels.
    :raises Exception: whatever calling, awaiting or entering raised; what was entered before is
        still on ``stack``.
    """
    obj = factory
    for _ in range(_MAX_DEPTH):
        if is_value is not None and is_value(obj):
            return obj
        if _is_async_cm(obj):
            return await stack.enter_async_context(obj)  # type: ignore[arg-type]
        if _is_sync_cm(obj):
            return stack.enter_context(obj)  # type: ignore[arg-type]
        if inspect.isawaitable(obj):
            obj = await obj
            continue
        if callable(obj):
            obj = obj()
            continue
        return obj
    raise TypeError(f"factory {factory!r} nests more than {_MAX_DEPTH} levels of factories")
