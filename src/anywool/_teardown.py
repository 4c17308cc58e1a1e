"""Teardown in two phases: a graceful one the caller may cut short, then a forceful one that always runs.

This follows trio's convention for closing a resource: a close that is cancelled still closes,
only less politely. Every owner in anywool splits its exit this way:

- **graceful**: work that may wait on *another* process (a registry lock held elsewhere, a worker
  draining its calls, a peer acknowledging). It runs in the caller's cancel scopes, so an
  enclosing ``move_on_after`` or a cancelled task group cuts it short, and under a deadline of
  its own; a timeout is logged with its ``TimeoutError``.
- **forceful**: local work that is bounded by itself (one non-blocking lock attempt, signalling
  and reaping our own children, removing our own files). It is shielded and runs after the
  graceful phase whatever happened to it, so nothing is leaked, then the caller's cancellation
  (if any) is re-raised.

An owner made of several parts (a pool) divides its exit into :class:`Budget` s: each step
spends what it uses of its budget, and :class:`ExitWithin` bounds the exit of a context manager
by what is left.

What this module must never do: swallow a cancellation, or let the graceful phase's failure
prevent the forceful one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from types import TracebackType
from typing import Any

import anyio

from anywool._duration import seconds


async def graceful_then_forceful(
    graceful: Callable[[], Awaitable[object]],
    forceful: Callable[[], Awaitable[object]],
    *,
    timeout: float | None,
    what: str,
    log: logging.Logger,
    forceful_timeout: float = 10.0,
) -> None:
    """Run ``graceful`` (cancellable, at most ``timeout`` seconds), then ``forceful`` (shielded).

    :param graceful: the polite part of the teardown; it may wait on other processes.
    :param forceful: the part that must always happen; it must not wait on other processes. It
        runs after ``graceful`` in every case (also when ``graceful`` completed), so it must be
        idempotent with respect to what ``graceful`` already did.
    :param timeout: seconds allowed for ``graceful`` (``None``: no bound of its own; ``0``: it is
        skipped).
    :param what: a few words for the log, e.g. ``"withdrawing the workers of publisher 'ns'"``.
    :param log: where a timeout or failure of either phase is reported.
    :param forceful_timeout: a safety bound on ``forceful`` in seconds.

    Never raises an ``Exception`` (failures are logged). Cancellation of the caller ends
    ``graceful`` at its next checkpoint; ``forceful`` still runs, then the cancellation is
    re-raised.
    """
    bound = math.inf if timeout is None else timeout
    try:
        try:
            if bound > 0:
                with anyio.fail_after(bound):
                    await graceful()
        except TimeoutError:
            log.warning("%s: timed out (bound: %s); finishing forcefully", what, seconds(timeout),
                        exc_info=True)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:
            log.warning("%s failed; finishing forcefully", what, exc_info=True)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(forceful_timeout) as scope:
            try:
                await forceful()
            except Exception:
                log.exception("%s: the forceful part failed", what)
        if scope.cancelled_caught:
            log.error("%s: the forceful part did not finish within %s", what,
                      seconds(forceful_timeout))


class Budget:
    """Seconds to spend, at exit, on one kind of waiting; each step spends what it uses."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds
        self._scopes: set[anyio.CancelScope] = set()  # the steps spending it now

    def spend_since(self, start: float) -> None:
        self.left = max(0.0, self.left - (anyio.current_time() - start))

    def exhaust(self) -> None:
        """Spend what is left now: the steps spending it end (their deadline is now), and the
        next ones get nothing."""
        self.left = 0.0
        for scope in self._scopes:
            scope.deadline = -math.inf

    @contextmanager
    def scope(self, *, fail: bool = False) -> Iterator[anyio.CancelScope]:
        """A cancel scope (``fail``: raising ``TimeoutError``) ending when the budget does."""
        start = anyio.current_time()
        try:
            with (anyio.fail_after if fail else anyio.move_on_after)(self.left) as scope:
                self._scopes.add(scope)
                try:
                    yield scope
                finally:
                    self._scopes.discard(scope)
        finally:
            self.spend_since(start)

    def track(self, scope: anyio.CancelScope) -> None:
        """Count ``scope`` among the steps spending this budget until :meth:`untrack`."""
        self._scopes.add(scope)

    def untrack(self, scope: anyio.CancelScope) -> None:
        self._scopes.discard(scope)


class ExitWithin:
    """An async context manager whose exit spends at most what is left of a budget.

    The bounding cancel scope is entered *before* the inner context manager and exited after
    it, so a task group the inner one holds nests inside it, as scopes must.
    """

    def __init__(self, inner: AbstractAsyncContextManager[Any], budget: Budget) -> None:
        self._inner = inner
        self._budget = budget
        self._scope = anyio.CancelScope()

    async def __aenter__(self) -> Any:
        self._scope.__enter__()
        try:
            return await self._inner.__aenter__()
        except BaseException as exc:
            self._scope.__exit__(type(exc), exc, exc.__traceback__)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        start = anyio.current_time()
        self._scope.deadline = start + self._budget.left
        self._budget.track(self._scope)
        try:
            suppress = await self._inner.__aexit__(exc_type, exc, tb)
        except BaseException as error:
            self._budget.untrack(self._scope)
            self._budget.spend_since(start)
            if self._scope.__exit__(type(error), error, error.__traceback__):
                return None  # our own deadline: the caller's exception (if any) goes on
            raise
        self._budget.untrack(self._scope)
        self._budget.spend_since(start)
        self._scope.__exit__(None, None, None)
        return suppress
