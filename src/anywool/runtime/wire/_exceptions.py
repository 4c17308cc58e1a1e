"""How an exception crosses a process boundary: whole when it can, else each exception of its
graph (cause, context, the members of its groups) on its own, so that one that cannot cross
degrades alone.

An exception is a graph: each exception links to its ``__cause__`` and ``__context__``, and an
exception group to its members. :func:`dumps_exception` first pickles the graph as one object
(tblib's reducers keep every traceback): the smallest and fastest form. That fails when one
exception of the graph cannot be pickled, or when the graph is deeper than pickling's recursion
allows (a group nested about 240 levels deep, say). Then every exception of the graph is pickled
as a separate node, its links left out and written as node numbers beside it, and
:func:`loads_exception` builds the nodes back (members before their groups) and then links them:
the depth costs no recursion, and an exception that cannot be pickled degrades alone while the
rest of the graph crosses exactly:

- rebuilt as ``type(exc)(*exc.args)`` (traceback, links and notes kept, other attributes lost);
- else a :class:`RuntimeError` naming the class and message (traceback, links and notes kept);
- a group whose own part (its class) cannot be pickled becomes the built-in group of its
  message and members, which keeps it matching ``except*``.

Node by node, a node that cannot be unpickled on the receiving side (its class is not importable
there, say) also degrades alone, to a :class:`RuntimeError`; a graph that crossed whole and cannot
be unpickled becomes one :class:`RuntimeError`. The receiving side emits
:class:`SerializationWarning` for each degraded exception, because that is where somebody will
read it.

No I/O and no event loop here: plain functions on bytes.
"""

from __future__ import annotations

import copyreg
import pickle
import warnings
from typing import Any

from tblib import pickling_support

from anywool.runtime.wire import _serializer
from anywool.runtime.wire._serializer import Buffer, SerializationWarning, dumps

# One node of the graph, as it travels: its pickle (without links), the message and members of a
# group (None otherwise), and the node numbers of its cause and context.
_Node = tuple[bytes, str | None, tuple[int, ...] | None, int | None, int | None]

#: The most traceback frames an exception keeps when it crosses (the innermost ones): each level
#: of nested routines adds its own, and pickling a traceback recurses once per frame.
MAX_FRAMES = 100


def dumps_exception(exc: BaseException) -> bytes:
    """Pickle an exception with its traceback, cause, context, notes and, for a group, its
    members at any depth of nesting.

    Never raises for an exception that cannot be pickled: each exception of the graph that cannot
    degrades on its own (see the module docstring) and :func:`loads_exception` warns when it loads
    it; if even that fails, the whole is a :class:`RuntimeError` naming ``type(exc)`` and its
    message. Trims each traceback to its innermost :data:`MAX_FRAMES` frames (with a note).
    """
    # BaseException: a __reduce__ that raises SystemExit must not end the process sending.
    try:
        found = _prepare(exc)
        try:
            return _pack(dumps(exc), [])
        except BaseException:
            pass
        degraded: list[str] = []
        return _pack(_dump_nodes(exc, found, degraded), degraded)
    except BaseException:
        pass
    replacement = _replacement(exc)
    note = f"a remote exception could not be pickled; it is replaced by: {replacement}"
    return _pack(dumps(replacement), [note])


def loads_exception(data: Buffer) -> BaseException:
    """Load what :func:`dumps_exception` produced.

    Emits :class:`SerializationWarning` for each exception of the graph that is a fallback copy,
    or that cannot be unpickled here (see the module docstring). When the bytes cannot be read at
    all, returns a :class:`RuntimeError` that says so rather than raising.

    :raises KeyboardInterrupt: unpickling raised it, outside a worker (see
        :func:`~anywool.runtime.wire._serializer.take_interrupts_as_values`).
    """
    exits = _serializer.UNPICKLING_EXITS  # read at each call: a worker widens it at start
    lost: list[str] = []
    try:
        body, degraded = pickle.loads(data)
        if isinstance(body, bytes):
            exc = pickle.loads(body)
            if not isinstance(exc, BaseException):
                raise TypeError(f"expected an exception, got {type(exc).__name__}")
        else:
            root, nodes = body
            exc = _load_nodes(root, nodes, lost, exits)
    except (Exception, *exits) as error:
        warnings.warn(
            f"a remote exception could not be unpickled ({type(error).__name__}: {error}); "
            "it is replaced by a RuntimeError",
            SerializationWarning,
            stacklevel=2,
        )
        return RuntimeError(f"remote exception could not be unpickled: {error}")
    for note in [*degraded, *lost]:
        warnings.warn(note, SerializationWarning, stacklevel=2)
    return exc


# -- pickling ------------------------------------------------------------------------------------


class _Unlinked:
    """Pickles as its exception without the exception's cause and context (which travel as node
    numbers): tblib's reduction (traceback, notes, suppress_context, attributes) with those two
    left out."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        exc = self.exc
        func, args, *rest = pickling_support.pickle_exception(exc)
        # tblib's layout, kept stable for old pickles: (type, args or attributes, cause,
        # traceback, context, suppress_context, notes[, args]).
        if args[2] is not exc.__cause__ or args[4] is not exc.__context__:
            raise TypeError("unexpected reduction of an exception by tblib")
        return (func, (args[0], args[1], None, args[3], None, *args[5:]), *rest)


def _pack(body: bytes | tuple[int, list[_Node]], degraded: list[str]) -> bytes:
    # Only built-in values at this layer: it can be read even when the exception cannot be.
    return pickle.dumps((body, degraded), protocol=pickle.HIGHEST_PROTOCOL)


def _prepare(exc: BaseException) -> list[BaseException]:
    """Every exception of ``exc``'s graph, tracebacks trimmed and classes given their reducers
    (tblib's; ours for groups), which register in copyreg once per class and cost little after."""
    found = _reachable(exc)
    classes = {type(each) for each in found}
    pickling_support.install(*classes)
    for cls in classes:
        if issubclass(cls, BaseExceptionGroup):
            copyreg.pickle(cls, _reduce_group)
    for each in found:
        _trim(each)
    return found


def _dump_nodes(exc: BaseException, found: list[BaseException],
                degraded: list[str]) -> tuple[int, list[_Node]]:
    """``exc``'s graph (``found``) node by node: the root's number and the nodes, members
    before their groups; each exception that needed a fallback has a note in ``degraded``."""
    order = _members_first(found)
    number = {id(found[i]): n for n, i in enumerate(order)}
    nodes: list[_Node] = []
    for i in order:
        each = found[i]
        cause = None if each.__cause__ is None else number[id(each.__cause__)]
        context = None if each.__context__ is None else number[id(each.__context__)]
        if isinstance(each, BaseExceptionGroup):
            members = tuple(number[id(member)] for member in each.exceptions)
            payload = _dump_group(each, degraded)
            nodes.append((payload, each.message, members, cause, context))
        else:
            nodes.append((_dump_single(each, degraded), None, None, cause, context))
    return number[id(exc)], nodes


def _reachable(exc: BaseException) -> list[BaseException]:
    """Every exception linked from ``exc`` (cause, context, members), ``exc`` first; iterative,
    since a graph may be far deeper than the recursion limit."""
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


def _members_first(found: list[BaseException]) -> list[int]:
    """Indices of ``found`` with each group after all its members (which a group needs to be
    built); causes and contexts are linked afterwards, so they may form cycles."""
    index = {id(each): i for i, each in enumerate(found)}
    placed: set[int] = set()
    expanding: set[int] = set()  # groups whose members are being placed
    order: list[int] = []
    for start in range(len(found)):
        stack = [start]
        while stack:
            i = stack[-1]
            if i in placed:
                stack.pop()
                continue
            each = found[i]
            waiting = [] if not isinstance(each, BaseExceptionGroup) else [
                j for j in (index[id(member)] for member in each.exceptions) if j not in placed]
            if not waiting:
                stack.pop()
                placed.add(i)
                expanding.discard(i)
                order.append(i)
            elif i in expanding or not expanding.isdisjoint(waiting):  # refuse, not loop
                raise ValueError("an exception group contains itself")
            else:
                expanding.add(i)
                stack.extend(waiting)
    return order


def _dump_single(exc: BaseException, degraded: list[str]) -> bytes:
    """``exc`` pickled without its links, or its first fallback that pickles."""
    try:
        return dumps(_Unlinked(exc))
    except BaseException:
        pass
    try:
        copy = type(exc)(*exc.args)
        _carry(exc, copy)
        payload = dumps(_Unlinked(copy))
    except BaseException:
        pass
    else:
        degraded.append(f"the remote {_name(type(exc))} could not be pickled as raised; it was "
                        "rebuilt from its args (attributes beyond args were lost)")
        return payload
    replacement = _replacement(exc)
    try:
        _carry(exc, replacement)
        payload = dumps(_Unlinked(replacement))
    except BaseException:  # its traceback or notes: without them
        replacement = _replacement(exc)
        payload = dumps(_Unlinked(replacement))
    degraded.append("a remote exception could not be pickled nor rebuilt from its args; "
                    f"it is replaced by: {replacement}")
    return payload


def _dump_group(group: BaseExceptionGroup[Any], degraded: list[str]) -> bytes:
    """A group's own part: its class, traceback, suppress_context and notes (its message and
    members travel beside it); without its class when that cannot be pickled."""
    notes = getattr(group, "__notes__", None)
    try:
        return dumps((type(group), group.__traceback__, group.__suppress_context__, notes))
    except BaseException:
        pass
    degraded.append(f"the remote {_name(type(group))} could not be pickled as raised; it "
                    "arrives as a built-in exception group of the same message and exceptions")
    try:
        return dumps((None, group.__traceback__, group.__suppress_context__, notes))
    except BaseException:
        return dumps((None, None, group.__suppress_context__, None))


def _carry(exc: BaseException, copy: BaseException) -> None:
    """Give a fallback ``copy`` what ``exc`` shows besides its args (links travel apart)."""
    copy.__traceback__ = exc.__traceback__
    copy.__suppress_context__ = exc.__suppress_context__
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        copy.__notes__ = [note for note in notes if isinstance(note, str)]


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


def _reduce_group(group: BaseExceptionGroup[Any]) -> tuple[Any, ...]:
    # The generic reducers rebuild an exception from its args, which
    # BaseExceptionGroup's __new__ refuses when a leaf is not an Exception. This keeps the
    # message, the leaves (each pickled as itself), traceback, cause, context and notes.
    return (_unpickle_group, (type(group), group.message, list(group.exceptions),
                              group.__traceback__, group.__cause__, group.__context__,
                              group.__suppress_context__, getattr(group, "__notes__", None)))


# -- unpickling ----------------------------------------------------------------------------------


def _load_nodes(root: int, nodes: list[_Node], lost: list[str],
                exits: tuple[type[BaseException], ...]) -> BaseException:
    """Build the nodes in order, then link them; the root's exception."""
    built: list[BaseException] = []
    for payload, message, members, _, _ in nodes:
        built.append(_load_node(payload, message, members, built, lost, exits))
    for exc, (_, _, _, cause, context) in zip(built, nodes, strict=True):
        suppress = exc.__suppress_context__  # setting __cause__ sets it: keep the original
        exc.__cause__ = None if cause is None else built[cause]
        exc.__context__ = None if context is None else built[context]
        exc.__suppress_context__ = suppress
    return built[root]


def _load_node(payload: bytes, message: str | None, members: tuple[int, ...] | None,
               built: list[BaseException], lost: list[str],
               exits: tuple[type[BaseException], ...]) -> BaseException:
    """One node, unlinked; a node that cannot be unpickled here becomes a RuntimeError (a group:
    the built-in group of its message and members), with a note in ``lost``."""
    if members is None:
        try:
            exc = pickle.loads(payload)
            if not isinstance(exc, BaseException):
                raise TypeError(f"expected an exception, got {type(exc).__name__}")
        except (Exception, *exits) as error:
            lost.append(f"a remote exception could not be unpickled ({type(error).__name__}: "
                        f"{error}); it is replaced by a RuntimeError")
            return RuntimeError(f"remote exception could not be unpickled: {error}")
        return exc
    if message is None or any(i >= len(built) for i in members):
        raise ValueError("malformed exception group node")
    try:
        cls, traceback, suppress_context, notes = pickle.loads(payload)
    except (Exception, *exits) as error:
        lost.append(f"a remote exception group could not be unpickled ({type(error).__name__}: "
                    f"{error}); it is replaced by a built-in group of its message and exceptions")
        cls, traceback, suppress_context, notes = None, None, False, None
    return _unpickle_group(cls or BaseExceptionGroup, message, [built[i] for i in members],
                           traceback, None, None, suppress_context, notes)


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
