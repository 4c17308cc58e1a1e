"""``anywool.ContextVar``: context variables whose values travel with calls, and come back.

A call carries the values its caller has set for every ``anywool.ContextVar`` (by name, the
variable's identity across processes); the routine runs with them set, and what it changed
comes back with its reply and is set in the caller's context, as if the routine had been awaited
locally. An async generator routine does the same at every step.

Each variable wraps one :class:`contextvars.ContextVar` created without a default, so "set in
this context" is a fact the standard library keeps and ``get``/``set``/``reset`` keep their
standard semantics (tokens included). Travel needs the names of all variables: a process-wide
registry, written once per declaration, read at every call (a tuple, so reading never locks).

No event loop and no I/O here: functions of the current :class:`contextvars.Context`.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
D = TypeVar("D")


class _Sentinel:
    """A module-level marker that pickles by name, so that it is itself in every process."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __reduce__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<{self._name}>"


#: The value of a variable a step left unset (it travels; ``get`` treats it as unset).
UNSET: Any = _Sentinel("UNSET")
#: No default was given.
NO_DEFAULT: Any = _Sentinel("NO_DEFAULT")

_lock = threading.Lock()
_by_name: dict[str, ContextVar[Any]] = {}
_all: tuple[ContextVar[Any], ...] = ()


class ContextVar(Generic[T]):
    """A context variable whose value travels with routine calls to their workers, and back.

    Use it like :class:`contextvars.ContextVar`, at module level::

        request_id = anywool.ContextVar("myapp.request_id", default=None)

    A call carries the values its caller has set (not defaults) for every ``anywool.ContextVar``;
    the routine, and the routines it calls, see them. Values the routine sets are set in the
    caller's context when the call returns or raises, as they would be had it been awaited
    locally. For an async generator routine this happens at every step (``__anext__``,
    ``asend``, ``athrow``, ``aclose``). Values travel pickled (cloudpickle) and are copies: a
    mutable value changed in place on the worker is not changed in the caller.

    :param name: the variable's identity across processes: a non-empty ``str``, declared once
        per process (use a dotted, module-like name). A routine's worker gets the variable by
        this name, whether or not it imports the module that declares it.
    :param default: what :meth:`get` returns when the variable is not set (none: ``get``
        raises ``LookupError``).
    :raises TypeError: ``name`` is not a ``str``.
    :raises ValueError: ``name`` is empty, or another ``anywool.ContextVar`` of this process
        already has it.

    Calling a routine raises :class:`~anywool.errors.SerializationError` (a ``TypeError``)
    naming the variable when a value set for it cannot be pickled; nothing is sent.
    """

    __slots__ = ("_name", "_default", "_var", "_declared")

    _name: str
    _default: Any
    _var: contextvars.ContextVar[Any]
    _declared: bool

    @overload
    def __new__(cls, name: str) -> ContextVar[T]: ...

    @overload
    def __new__(cls, name: str, *, default: T) -> ContextVar[T]: ...

    def __new__(cls, name: str, *, default: Any = NO_DEFAULT) -> ContextVar[Any]:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if not name:
            raise ValueError("name must not be empty: it identifies the variable across "
                             "processes")
        with _lock:
            existing = _by_name.get(name)
            if existing is not None:
                if existing._declared:
                    raise ValueError(
                        f"an anywool.ContextVar named {name!r} already exists in this process; "
                        "names identify variables across processes, so each is declared once")
                # Made by a call that arrived before the declaring module was imported here.
                existing._declared = True
                existing._default = default
                return existing
            return _register(cls, name, default, declared=True)

    @property
    def name(self) -> str:
        """The variable's name."""
        return self._name

    @overload
    def get(self, /) -> T: ...

    @overload
    def get(self, default: D, /) -> T | D: ...

    def get(self, default: Any = NO_DEFAULT, /) -> Any:
        """The value set in the current context, else ``default``, else the variable's default.

        :raises LookupError: the variable is not set and there is no default.
        """
        value = self._var.get(UNSET)
        if value is not UNSET:
            return value
        if default is not NO_DEFAULT:
            return default
        if self._default is not NO_DEFAULT:
            return self._default
        raise LookupError(self)

    def set(self, value: T) -> contextvars.Token[T]:
        """Set the value in the current context; :meth:`reset` with the token undoes it."""
        return self._var.set(value)

    def reset(self, token: contextvars.Token[T]) -> None:
        """Restore the value the variable had before the :meth:`set` that returned ``token``.

        :raises RuntimeError: the token was used already.
        :raises ValueError: the token comes from another variable or another context.
        """
        self._var.reset(token)

    def __reduce__(self) -> tuple[Any, ...]:
        # By name: a routine pickled by value (a ``__main__`` function) finds the worker's
        # variable of that name, declared or not.
        return (_named, (self._name, self._default))

    def __repr__(self) -> str:
        default = "" if self._default is NO_DEFAULT else f" default={self._default!r}"
        return f"<anywool.ContextVar name={self._name!r}{default} at {id(self):#x}>"


def _register(cls: type[ContextVar[Any]], name: str, default: Any, *,
              declared: bool) -> ContextVar[Any]:
    global _all
    var = object.__new__(cls)
    var._name = name
    var._default = default
    var._var = contextvars.ContextVar(f"anywool:{name}")
    var._declared = declared
    _by_name[name] = var
    _all = (*_all, var)
    return var


def _named(name: str, default: Any = NO_DEFAULT) -> ContextVar[Any]:
    """The variable called ``name`` in this process, made (undeclared) when there is none.

    ``default`` is the one a pickled variable carries: an undeclared variable without one
    (made for a value that arrived by name) takes it.
    """
    var = _by_name.get(name)
    if var is None:
        with _lock:
            var = _by_name.get(name)
            if var is None:
                return _register(ContextVar, name, default, declared=False)
    if default is not NO_DEFAULT and not var._declared and var._default is NO_DEFAULT:
        var._default = default
    return var


# -- travel ------------------------------------------------------------------------------------


def capture() -> dict[str, Any] | None:
    """The values set in the current context, by variable name (``None`` when none is set)."""
    values: dict[str, Any] | None = None
    for var in _all:
        value = var._var.get(UNSET)
        if value is not UNSET:
            if values is None:
                values = {}
            values[var._name] = value
    return values


def apply(values: dict[str, Any] | None) -> None:
    """Make the current context hold exactly ``values`` (unset every other variable)."""
    for var in _all:
        if var._var.get(UNSET) is not UNSET and (values is None or var._name not in values):
            var._var.set(UNSET)
    if values:
        for name, value in values.items():
            _named(name)._var.set(value)


def changes(before: dict[str, Any] | None) -> dict[str, Any] | None:
    """What differs between the current context and ``before`` (a :func:`capture`): the new
    values, and :data:`UNSET` for variables no longer set (``None`` when nothing differs)."""
    after = capture()
    if after is None and before is None:
        return None
    changed: dict[str, Any] = {}
    if after is not None:
        for name, value in after.items():
            if before is None or before.get(name, UNSET) is not value:
                changed[name] = value
    if before is not None:
        for name in before:
            if after is None or name not in after:
                changed[name] = UNSET
    return changed or None


def update(changed: dict[str, Any]) -> None:
    """Set ``changed`` (from :func:`changes`) in the current context."""
    for name, value in changed.items():
        _named(name)._var.set(value)

