"""The README's stated defaults, each read where a caller meets it.

Where the default is a public parameter, the test reads it from the signature (or from what a
public object passes on, as ``LocalDiscovery.publisher`` does); where the README states a bound
that has no parameter (the sweep interval, a proxy's idle timeout, the lifeline's delay), it
reads the module constant the code path uses, or asks the function that applies it. Waiting
out a 10 s or 30 s default in every run would cost more than it tells: the bounds themselves
are held at short explicit values, and at defaults of a few seconds, in
``tests/integration/test_bounds.py`` and ``tests/integration/test_interrupt.py``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import pytest

from anywool import LocalDiscovery, WorkerPool, WorkerProxy
from anywool.discovery import _hub
from anywool.discovery.local import _claim
from anywool.runtime.pool import _local_worker, _pool, _supervisor
from anywool.runtime.worker import _contract, _gatekeeper, _interrupt, _main, _nested
from anywool.testing import _pools, _settle, hold_registry_lock, owner_process


def _default(callable_: Callable[..., object], parameter: str) -> object:
    return inspect.signature(callable_).parameters[parameter].default


DEFAULTS = [
    # (what, actual, README's value, README's words)
    ("WorkerPool quorum", lambda: _default(WorkerPool, "quorum"), 1, "quorum workers (default 1)"),
    ("WorkerPool quorum_timeout", lambda: _default(WorkerPool, "quorum_timeout"), 10.0,
     "after quorum_timeout seconds (default 10)"),
    ("WorkerPool lazy", lambda: _default(WorkerPool, "lazy"), True, "lazy=True (the default)"),
    ("WorkerPool shutdown_timeout", lambda: _default(WorkerPool, "shutdown_timeout"), 10.0,
     "after shutdown_timeout seconds (default 10)"),
    ("WorkerPool announce_timeout", lambda: _default(WorkerPool, "announce_timeout"), 5.0,
     "shares announce_timeout seconds (default 5)"),
    ("WorkerPool cancel_grace", lambda: _default(WorkerPool, "cancel_grace"), 1.0,
     "after cancel_grace seconds (default 1; an option of WorkerPool and WorkerProxy)"),
    ("WorkerProxy quorum_timeout", lambda: _default(WorkerProxy, "quorum_timeout"), 10.0,
     "it takes ... quorum_timeout ... like a pool"),
    ("WorkerProxy cancel_grace", lambda: _default(WorkerProxy, "cancel_grace"), 1.0,
     "cancel_grace seconds (default 1; an option of WorkerPool and WorkerProxy)"),
    ("WorkerProxy cancel_timeout", lambda: _default(WorkerProxy, "cancel_timeout"), 5.0,
     "waited for, up to cancel_timeout (5 s)"),
    ("LocalDiscovery capacity", lambda: _default(LocalDiscovery, "capacity"), 128,
     "capacity workers (default 128)"),
    ("LocalDiscovery block_size", lambda: _default(LocalDiscovery, "block_size"), 1024,
     "block_size bytes of encoded metadata each (default 1024)"),
    ("LocalDiscovery lock_timeout", lambda: _default(LocalDiscovery, "lock_timeout"), 30.0,
     "a publish waits at most lock_timeout seconds (default 30)"),
    ("LocalDiscovery teardown_timeout", lambda: _default(LocalDiscovery, "teardown_timeout"),
     5.0, "an owner's exit marks the namespace retired within its own teardown_timeout"),
    ("LocalDiscovery reap_interval", lambda: _default(LocalDiscovery, "reap_interval"), 1.0,
     "the owner's reaper drops the withdrawn publisher's workers within about a second"),
    # What the owner hands its publisher (and so a spawning pool's announcements).
    ("LocalDiscovery.publisher lock_timeout", lambda: LocalDiscovery("x").publisher.lock_timeout,
     30.0, "a publish waits at most lock_timeout seconds (default 30)"),
    ("LocalDiscovery.publisher teardown_timeout",
     lambda: LocalDiscovery("x").publisher.teardown_timeout, 5.0,
     "within teardown_timeout seconds (default 5)"),
    ("LocalDiscovery.Publisher lock_timeout",
     lambda: LocalDiscovery.Publisher("x").lock_timeout, 30.0,
     "a publish waits at most lock_timeout seconds (default 30)"),
    ("LocalDiscovery.Publisher teardown_timeout",
     lambda: LocalDiscovery.Publisher("x").teardown_timeout, 5.0,
     "A publisher's exit withdraws its workers within teardown_timeout seconds (default 5)"),
    # A subscriber without poll_interval polls at the shared default.
    ("Subscriber poll_interval", lambda: _hub.DEFAULT_POLL_INTERVAL, 1.0,
     "every poll_interval seconds (default 1) they also check the registry"),
    ("nested proxy idle timeout", _nested.idle_timeout_from_environment, 60.0,
     "$ANYWOOL_PROXY_IDLE_TIMEOUT seconds (default 60)"),
    ("nested proxies kept unused", lambda: _nested.MAX_IDLE, 8, "when more than 8 are unused"),
    ("interrupt after the loop stood still", lambda: _interrupt.HELD_AFTER, 0.1,
     "when the loop has not turned for 0.1 s"),
    ("lifeline delay", lambda: _main._ORPHAN_GRACE, 5.0,
     "one held in C code by its lifeline 5 s later"),
    ("SIGTERM before SIGKILL", lambda: _local_worker._TERM_TIMEOUT, 3.0,
     "3 s for a worker that ignores its stop to obey SIGTERM before SIGKILL"),
    ("slot given up: dies within", lambda: _supervisor._MIN_UPTIME, 2.0, "dies within 2 s of starting"),
    ("slot given up: times in a row", lambda: _supervisor._MAX_START_FAILURES, 3, "3 times in a row"),
    ("pending handshake deadline", lambda: _gatekeeper.PENDING_HANDSHAKE_TIMEOUT, 2.0,
     "gives each 2 s from its accept to finish"),
    ("pending handshakes at once", lambda: _gatekeeper.MAX_PENDING_HANDSHAKES, 256,
     "A worker keeps at most 256 handshakes pending"),
    # The pytest plugin's.
    ("worker_pool shutdown_timeout", lambda: _pools.DEFAULTS["shutdown_timeout"], 5.0,
     "shutdown_timeout and announce_timeout of 5 s"),
    ("worker_pool announce_timeout", lambda: _pools.DEFAULTS["announce_timeout"], 5.0,
     "shutdown_timeout and announce_timeout of 5 s"),
    ("worker_pool and anywool_runtime_dir grace", lambda: _settle.GRACE, 5.0,
     "waits up to 5 s for the directory to empty; still there after 5 s"),
    ("owner_process stop_timeout", lambda: _default(owner_process, "stop_timeout"), 10.0,
     "after stop_timeout seconds (default 10) it is killed"),
    ("hold_registry_lock timeout", lambda: _default(hold_registry_lock, "timeout"), 5.0,
     "within timeout seconds (default 5)"),
]


@pytest.mark.parametrize(("actual", "documented", "words"),
                         [pytest.param(a, d, w, id=what) for what, a, d, w in DEFAULTS])
def test_the_documented_default_is_the_one_in_effect(actual: Callable[[], object],
                                                     documented: object, words: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_contract.PROXY_IDLE_TIMEOUT_ENV, raising=False)
    assert actual() == documented, f"README: {words!r}"


def test_claims_sweep_the_runtime_directory_at_most_every_10_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # README: "a process's claims sweep the rest of the directory at most every 10 s".
    now = time.monotonic()
    monkeypatch.setattr(_claim, "_last_sweep", now - 9.5)
    assert not _claim.sweep_due()
    monkeypatch.setattr(_claim, "_last_sweep", now - 10.0)
    assert _claim.sweep_due()


def test_the_cli_worker_drains_10_s_by_default() -> None:
    # README: "lets their calls finish (--drain, 10 s by default)".
    from anywool.cli._worker_command import worker

    (drain,) = [p for p in worker.params if p.name == "drain"]
    assert drain.default == 10.0
