"""Factory forms: turn what a user passed for a dependency into the object itself.

A *Factory* of ``T`` is any of:

- a ``T`` itself;
- a callable (a class included) that, called with no arguments, returns any of these forms;
- an awaitable of any of these forms;
- a sync or an async context manager: it is **entered**, and what its ``__enter__`` /
  ``__aenter__`` returns is the object, taken as it is (it is not resolved again).

The forms nest: an awaitable that produces a context manager (``async def make(): return
LocalDiscovery("jobs")``) has that context manager entered, like any other. An object that is
both a context manager and callable is entered, not called. Whoever resolves a dependency exits,
exactly once and in reverse order, everything it entered, and nothing else.

What this module must never do: exit a context manager it did not enter, or exit one twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, AsyncExitStack
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar, Union, overload

from anywool._owner import SingleUse

T = TypeVar("T")
D = TypeVar("D")

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


def is_context_manager(obj: object) -> bool:
    """Whether ``obj`` is a sync or an async context manager (it would be entered)."""
    return _is_async_cm(obj) or _is_sync_cm(obj)


def is_factory(obj: object) -> bool:
    """Whether ``obj`` would be entered, awaited or called when resolved (it is not a value)."""
    return _is_async_cm(obj) or _is_sync_cm(obj) or inspect.isawaitable(obj) or callable(obj)


def expected_names(expect: type | tuple[type, ...]) -> str:
    """``"A"``, ``"A or B"``, ``"A, B or C"``: the expected types, for an error message."""
    names = [t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,))]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


async def resolve(
    factory: object, stack: AsyncExitStack, *, is_value: Callable[[object], bool] | None = None
) -> Any:
    """Resolve ``factory`` to a value, entering context managers on ``stack``.

    :param factory: the Factory form.
    :param stack: where entered context managers are registered for exit.
    :param is_value: objects for which it returns true are taken as they are, never entered,
        awaited or called (e.g. a discovery its caller already entered).
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


class _Resolved(SingleUse, Generic[T]):
    _single_use_name = "resolved() context"
    _single_use_instead = "call resolved() again"

    def __init__(
        self,
        dependency: object,
        expect: type | tuple[type, ...] | None,
        is_value: Callable[[object], bool] | None,
        name: str,
    ) -> None:
        self._name = name
        self._dependency = dependency
        self._expect = expect
        self._is_value = is_value
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> T:
        self._enter_once()
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            obj = await resolve(self._dependency, stack, is_value=self._is_value)
            expect = self._expect
            if expect is not None and not isinstance(obj, expect):
                raise TypeError(
                    f"{self._name} must resolve to a {expected_names(expect)}, but "
                    f"{self._dependency!r} resolved to {obj!r}"
                )
        except BaseException as exc:
            if not await stack.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            raise RuntimeError("a context manager swallowed the error that resolving raised") \
                from exc
        self._stack = stack
        return obj

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        return await stack.__aexit__(exc_type, exc, tb)


@overload
def resolved(
    dependency: object,
    *,
    expect: type[T],
    is_value: Callable[[object], bool] | None = None,
    name: str = "dependency",
) -> AbstractAsyncContextManager[T]: ...


@overload
def resolved(
    dependency: D,
    *,
    expect: tuple[type, ...] | None = None,
    is_value: Callable[[object], bool] | None = None,
    name: str = "dependency",
) -> AbstractAsyncContextManager[D]: ...


def resolved(
    dependency: Any,
    *,
    expect: type | tuple[type, ...] | None = None,
    is_value: Callable[[object], bool] | None = None,
    name: str = "dependency",
) -> AbstractAsyncContextManager[Any]:
    """Resolve a dependency given in any Factory form, for the lifetime of an ``async with``.

    ``async with resolved(factory, expect=DiscoveryLike) as discovery:`` calls, awaits and enters
    whatever ``factory`` needs (see the module docstring), checks the result, and on exit exits
    exactly what it entered, once, in reverse order, also when the body or the check raises.

    :param dependency: the dependency in any Factory form.
    :param expect: a type (a runtime-checkable protocol included) or a tuple of types the result
        must be an instance of; ``None`` accepts anything. With a single type the result is
        typed as that type; otherwise it keeps the type of ``dependency``.
    :param is_value: objects for which it returns true are taken as they are (e.g. a discovery
        its caller already entered), never entered, awaited or called.
    :param name: what the dependency is called in error messages (e.g. ``"discovery"``).
    :raises TypeError: the result is not an instance of ``expect`` (the message names the
        expected type or types; what was entered has been exited), or the forms nest more than
        8 levels deep.
    :raises RuntimeError: the returned context is entered a second time.
    :raises TypeError: (at once) ``expect`` is neither a type nor a non-empty tuple of types.
    :raises Exception: whatever calling, awaiting or entering the dependency raised (what was
        entered before has been exited).

    Cancellation: entering is cancelled like the calls it makes; what was entered is exited.
    """
    if expect is not None:
        kinds = expect if isinstance(expect, tuple) else (expect,)
        if not kinds or not all(isinstance(kind, type) for kind in kinds):
            raise TypeError(f"expect must be a type or a non-empty tuple of types, got {expect!r}")
    return _Resolved(dependency, expect, is_value, name)
