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

What this module must never do: swallow a cancellation, or let the graceful phase's failure
prevent the forceful one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["graceful_then_forceful"]


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
            log.warning("%s: timed out (bound: %s seconds); finishing forcefully", what, timeout,
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
            log.error("%s: the forceful part did not finish within %s seconds", what,
                      forceful_timeout)
