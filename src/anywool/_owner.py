"""The parts every owner repeats: a single-use entry, and a task-group exit that never wraps the
caller's exception.

An owner (see STYLE.md, "Owners") is an async context manager whose lifetime is a scope: it
enters its task group on entry and exits it on exit, in the same task, once. Used by the runtime
owners (``WorkerConnection``, ``LocalWorker``, ``WorkerProxy``, ``WorkerPool``, the
``resolved()`` context) and by the discovery owners (``LocalDiscovery`` and its ``Publisher``).

What this module must never do: swallow an exception, or decide anything about teardown
timing (that is :mod:`anywool._teardown`).
"""

from __future__ import annotations

from anyio.abc import TaskGroup


class SingleUse:
    """Mixin: the owner may be entered once; a second ``__aenter__`` raises ``RuntimeError``.

    An owner's state (its task group, its claim, its process) is built for one scope, so a
    re-entry, even after exit, is refused rather than half-supported. ``_entered`` is ``True``
    from the first entry on, also when that entry failed.
    """

    _entered: bool = False
    #: What the message calls the owner (default: its class's qualified name).
    _single_use_name: str | None = None
    #: What the message tells the caller to do instead.
    _single_use_instead: str = "create a new one"

    def _enter_once(self) -> None:
        """Mark the owner entered; call first thing in ``__aenter__``.

        :raises RuntimeError: it was entered before (``"a WorkerPool is single-use; create a
            new one"``).
        """
        if self._entered:
            name = self._single_use_name or type(self).__qualname__
            raise RuntimeError(f"a {name} is single-use; {self._single_use_instead}")
        self._entered = True


async def exit_task_group(task_group: TaskGroup | None, *, cancel: bool = True) -> None:
    """Exit an owner's task group from the owner's ``__aexit__``, as if its body ended normally.

    The caller's exception (the one propagating through the owner's exit) is never given to the
    task group: given it, a task group re-raises it wrapped in an ``ExceptionGroup`` with its
    tasks' failures. Given none, it raises only its tasks' failures, and the caller's exception
    propagates past the owner unchanged.

    :param task_group: the entered task group; ``None`` (never entered, or already exited) is a
        no-op.
    :param cancel: cancel its tasks first (``False``: wait for them to end by themselves).
    :raises BaseExceptionGroup: what its tasks raised (their cancellation by ``cancel`` is
        absorbed).
    :raises KeyboardInterrupt: a Ctrl-C delivered while it waited (trio delivers one to the
        waiting task): as itself, not in a group of nothing else, so that it ends a script as
        a Ctrl-C does.

    Cancellation: an enclosing cancellation cancels the tasks still running; the exit waits
    until they have ended, then re-raises it.
    """
    if task_group is None:
        return
    if cancel:
        task_group.cancel_scope.cancel()
    try:
        await task_group.__aexit__(None, None, None)
    except BaseExceptionGroup as group:
        interrupts, rest = group.split(KeyboardInterrupt)
        if interrupts is None or rest is not None:
            raise
        raise _first_leaf(interrupts) from None


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
