"""Issue 21, part 2: the README's time bounds and defaults, each broken on its own.

A budget that grows by a second or two, or a default that changes, must fail a test: the bounds
are held at their value in ``tests/integration/test_bounds.py`` and
``tests/integration/test_interrupt.py`` (not sooner, and at most ``LATE`` later), and the
defaults in ``tests/unit/test_defaults.py``.
"""

from mutate import Mutation

BOUNDS = "tests/integration/test_bounds.py"
INTERRUPT = "tests/integration/test_interrupt.py"
DEFAULTS = "tests/unit/test_defaults.py::test_the_documented_default_is_the_one_in_effect"


def _default(what: str) -> str:
    return f"{DEFAULTS}[{what}]"


MUTATIONS: list[Mutation] = [
    # -- WorkerPool exit ---------------------------------------------------------------------
    Mutation(
        name="bounds-pool-announce-budget-2s-longer",
        path="src/anywool/runtime/pool/_pool.py",
        old="self._announce_budget = Budget(self._announce_timeout)",
        new="self._announce_budget = Budget(self._announce_timeout + 2)",
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_a_pool_exit_its_default_announce_timeout_of_5_s",),
        why="README: what waits on the namespace shares announce_timeout seconds (default 5)",
    ),
    Mutation(
        name="bounds-pool-announce-timeout-default",
        path="src/anywool/runtime/pool/_pool.py",
        old="announce_timeout: float = 5.0,",
        new="announce_timeout: float = 7.0,",
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_a_pool_exit_its_default_announce_timeout_of_5_s",),
        why="README: announce_timeout seconds (default 5)",
    ),
    Mutation(
        name="bounds-pool-publisher-exit-own-budget",
        path="src/anywool/runtime/pool/_publishing.py",
        old='name="discovery.publisher"), self._budget))',
        new='name="discovery.publisher"), Budget(self._timeout)))',
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_a_pool_exit_its_default_announce_timeout_of_5_s",),
        why="README: the publisher's exit shares announce_timeout with the announcement",
    ),
    Mutation(
        name="bounds-pool-discovery-exit-own-budget",
        path="src/anywool/runtime/pool/_pool.py",
        old="            self._announce_budget))\n        if self._credentials",
        new="            Budget(self._announce_timeout)))\n        if self._credentials",
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_a_pool_exit_its_default_announce_timeout_of_5_s",),
        why="README: the owner's (discovery's) exit shares announce_timeout",
    ),
    Mutation(
        name="bounds-pool-shutdown-budget-2s-longer",
        path="src/anywool/runtime/pool/_pool.py",
        old="self._shutdown_budget = Budget(self._shutdown_timeout)",
        new="self._shutdown_budget = Budget(self._shutdown_timeout + 2)",
        tests=(f"{BOUNDS}::test_the_pools_own_calls_still_running_are_cancelled_at_shutdown_timeout",),
        why="README: cancels those still running after shutdown_timeout seconds",
    ),
    Mutation(
        name="bounds-pool-shutdown-timeout-default",
        path="src/anywool/runtime/pool/_pool.py",
        old="shutdown_timeout: float = 10.0,",
        new="shutdown_timeout: float = 12.0,",
        tests=(_default("WorkerPool shutdown_timeout"),),
        why="README: shutdown_timeout seconds (default 10)",
    ),
    # -- quorum ------------------------------------------------------------------------------
    Mutation(
        name="bounds-proxy-quorum-wait-2s-longer",
        path="src/anywool/runtime/client/_proxy.py",
        old="with anyio.move_on_after(self._quorum_timeout):",
        new="with anyio.move_on_after(self._quorum_timeout + 2):",
        tests=(f"{BOUNDS}::test_a_strict_pool_entry_gives_up_at_quorum_timeout",
               f"{BOUNDS}::test_a_lazy_pools_first_call_gives_up_at_quorum_timeout"),
        why="README: TimeoutError after quorum_timeout seconds; NoWorkersAvailable likewise",
    ),
    Mutation(
        name="bounds-pool-quorum-timeout-default",
        path="src/anywool/runtime/pool/_pool.py",
        old="quorum_timeout: float = 10.0,",
        new="quorum_timeout: float = 12.0,",
        tests=(_default("WorkerPool quorum_timeout"),),
        why="README: quorum_timeout seconds (default 10)",
    ),
    Mutation(
        name="bounds-proxy-quorum-timeout-default",
        path="src/anywool/runtime/client/_proxy.py",
        old="quorum_timeout: float = 10.0,",
        new="quorum_timeout: float = 12.0,",
        tests=(_default("WorkerProxy quorum_timeout"),),
        why="README: a proxy takes quorum_timeout like a pool (default 10)",
    ),
    Mutation(
        name="bounds-pool-quorum-default",
        path="src/anywool/runtime/pool/_pool.py",
        old="quorum: int = 1,",
        new="quorum: int = 2,",
        tests=(_default("WorkerPool quorum"),),
        why="README: quorum workers (default 1)",
    ),
    # -- cancellation ------------------------------------------------------------------------
    Mutation(
        name="bounds-pool-cancel-grace-default",
        path="src/anywool/runtime/pool/_pool.py",
        old="cancel_grace: float = 1.0,",
        new="cancel_grace: float = 2.0,",
        tests=(f"{INTERRUPT}::test_a_routine_that_swallows_the_interruption_loses_its_worker_after_cancel_grace",),
        why="README: after cancel_grace seconds (default 1) the caller resumes",
    ),
    Mutation(
        name="bounds-proxy-cancel-grace-default",
        path="src/anywool/runtime/client/_proxy.py",
        old="cancel_grace: float = 1.0,",
        new="cancel_grace: float = 2.0,",
        tests=(f"{INTERRUPT}::test_a_bare_proxy_gives_up_a_stuck_call_after_cancel_grace_but_ends_no_worker",),
        why="README: cancel_grace (default 1; an option of WorkerPool and WorkerProxy)",
    ),
    Mutation(
        name="bounds-connection-cancel-grace-longer",
        path="src/anywool/runtime/client/_call.py",
        old="with anyio.move_on_after(connection._cancel_grace) as grace,",
        new="with anyio.move_on_after(connection._cancel_grace + 0.7) as grace,",
        tests=(f"{INTERRUPT}::test_a_routine_that_swallows_the_interruption_loses_its_worker_after_cancel_grace",),
        why="README: after cancel_grace seconds the caller stops waiting and resumes",
    ),
    Mutation(
        name="bounds-proxy-cancel-timeout-default",
        path="src/anywool/runtime/client/_proxy.py",
        old="cancel_timeout: float = 5.0,",
        new="cancel_timeout: float = 7.0,",
        tests=(f"{INTERRUPT}::test_a_routine_unwinding_slowly_holds_its_caller_for_the_default_cancel_timeout_of_5_s",),
        why="README: a worker that unwinds slowly is waited for, up to cancel_timeout (5 s)",
    ),
    Mutation(
        name="bounds-connection-cancel-timeout-longer",
        path="src/anywool/runtime/client/_call.py",
        old="with anyio.move_on_after(connection._cancel_timeout) as unwinding,",
        new="with anyio.move_on_after(connection._cancel_timeout + 2) as unwinding,",
        tests=(f"{INTERRUPT}::test_a_routine_unwinding_slowly_holds_its_caller_for_the_default_cancel_timeout_of_5_s",),
        why="README: waited for, up to cancel_timeout (5 s)",
    ),
    Mutation(
        name="bounds-interrupt-held-after",
        path="src/anywool/runtime/worker/_interrupt.py",
        old="HELD_AFTER = 0.1",
        new="HELD_AFTER = 0.3",
        tests=(_default("interrupt after the loop stood still"),),
        why="README: when the loop has not turned for 0.1 s ... the worker raises in that call",
    ),
    # -- LocalDiscovery ----------------------------------------------------------------------
    Mutation(
        name="bounds-publish-waits-past-lock-timeout",
        path="src/anywool/discovery/local/_local.py",
        old="metadata, held.lease.id, lock_timeout=self.lock_timeout,",
        new="metadata, held.lease.id, lock_timeout=self.lock_timeout and self.lock_timeout + 2,",
        tests=(f"{BOUNDS}::test_a_publish_on_a_wedged_registry_gives_up_at_lock_timeout",),
        why="README: a publish waits at most lock_timeout seconds, then raises TimeoutError",
    ),
    Mutation(
        name="bounds-owner-lock-timeout-default",
        path="src/anywool/discovery/local/_local.py",
        old="        lock_timeout: float | None = 30.0,\n",
        new="        lock_timeout: float | None = 40.0,\n",
        tests=(_default("LocalDiscovery lock_timeout"),
               _default("LocalDiscovery.publisher lock_timeout")),
        why="README: lock_timeout seconds (default 30)",
    ),
    Mutation(
        name="bounds-publisher-lock-timeout-default",
        path="src/anywool/discovery/local/_local.py",
        old="*, lock_timeout: float | None = 30.0,",
        new="*, lock_timeout: float | None = 40.0,",
        tests=(_default("LocalDiscovery.Publisher lock_timeout"),),
        why="README: lock_timeout seconds (default 30)",
    ),
    Mutation(
        name="bounds-publisher-teardown-timeout-default",
        path="src/anywool/discovery/local/_local.py",
        old="teardown_timeout: float = 5.0) -> None:",
        new="teardown_timeout: float = 7.0) -> None:",
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_a_publishers_exit_its_default_teardown_timeout_of_5_s",),
        why="README: a publisher's exit withdraws its workers within teardown_timeout (default 5)",
    ),
    Mutation(
        name="bounds-publisher-teardown-2s-longer",
        path="src/anywool/discovery/local/_local.py",
        old="timeout=self.teardown_timeout,",
        new="timeout=self.teardown_timeout + 2,",
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_a_publishers_exit_its_default_teardown_timeout_of_5_s",),
        why="README: a publisher's exit withdraws its workers within teardown_timeout",
    ),
    Mutation(
        name="bounds-owner-teardown-timeout-default",
        path="src/anywool/discovery/local/_local.py",
        old="        teardown_timeout: float = 5.0,\n",
        new="        teardown_timeout: float = 7.0,\n",
        tests=(_default("LocalDiscovery teardown_timeout"),
               _default("LocalDiscovery.publisher teardown_timeout")),
        why="README: an owner's exit marks the namespace retired within its own teardown_timeout",
    ),
    Mutation(
        name="bounds-owner-teardown-2s-longer",
        path="src/anywool/discovery/local/_local.py",
        old="timeout=self._teardown_timeout,",
        new="timeout=self._teardown_timeout + 2,",
        tests=(f"{BOUNDS}::test_a_wedged_registry_costs_an_owners_exit_its_teardown_timeout",),
        why="README: an owner's exit marks the namespace retired within its teardown_timeout",
    ),
    Mutation(
        name="bounds-reap-interval-default",
        path="src/anywool/discovery/local/_local.py",
        old="reap_interval: float = 1.0,",
        new="reap_interval: float = 3.0,",
        tests=(f"{BOUNDS}::test_a_killed_publishers_workers_are_dropped_within_the_default_reap_interval",),
        why="README: a publisher that dies loses its workers within about a second",
    ),
    Mutation(
        name="bounds-poll-interval-default",
        path="src/anywool/discovery/_hub.py",
        old="DEFAULT_POLL_INTERVAL = 1.0",
        new="DEFAULT_POLL_INTERVAL = 2.0",
        tests=(_default("Subscriber poll_interval"),),
        why="README: every poll_interval seconds (default 1) they also check the registry",
    ),
    Mutation(
        name="bounds-sweep-interval",
        path="src/anywool/discovery/local/_claim.py",
        old="SWEEP_INTERVAL = 10.0",
        new="SWEEP_INTERVAL = 12.0",
        tests=("tests/unit/test_defaults.py::test_claims_sweep_the_runtime_directory_at_most_every_10_s",),
        why="README: a process's claims sweep the rest of the directory at most every 10 s",
    ),
    Mutation(
        name="bounds-sweep-more-often",
        path="src/anywool/discovery/local/_claim.py",
        old="SWEEP_INTERVAL = 10.0",
        new="SWEEP_INTERVAL = 5.0",
        tests=("tests/unit/test_defaults.py::test_claims_sweep_the_runtime_directory_at_most_every_10_s",),
        why="README: at most every 10 s (so that claiming stays cheap)",
    ),
    # -- workers -----------------------------------------------------------------------------
    Mutation(
        name="bounds-nested-idle-timeout-default",
        path="src/anywool/runtime/worker/_nested.py",
        old="DEFAULT_IDLE_TIMEOUT = 60.0",
        new="DEFAULT_IDLE_TIMEOUT = 90.0",
        tests=(_default("nested proxy idle timeout"),),
        why="README: $ANYWOOL_PROXY_IDLE_TIMEOUT seconds (default 60)",
    ),
    Mutation(
        name="bounds-nested-max-idle",
        path="src/anywool/runtime/worker/_nested.py",
        old="MAX_IDLE = 8",
        new="MAX_IDLE = 16",
        tests=(_default("nested proxies kept unused"),),
        why="README: or at once when more than 8 are unused",
    ),
    Mutation(
        name="bounds-lifeline-delay",
        path="src/anywool/runtime/worker/_main.py",
        old="_ORPHAN_GRACE = 5.0",
        new="_ORPHAN_GRACE = 7.0",
        tests=(_default("lifeline delay"),),
        why="README: one held in C code [is ended] by its lifeline 5 s later",
    ),
    Mutation(
        name="bounds-sigterm-before-sigkill",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="_TERM_TIMEOUT = 3.0",
        new="_TERM_TIMEOUT = 5.0",
        tests=(_default("SIGTERM before SIGKILL"),),
        why="README: 3 s for a worker that ignores its stop to obey SIGTERM before SIGKILL",
    ),
    Mutation(
        name="bounds-slot-min-uptime",
        path="src/anywool/runtime/pool/_supervisor.py",
        old="_MIN_UPTIME = 2.0",
        new="_MIN_UPTIME = 4.0",
        tests=(_default("slot given up: dies within"),),
        why="README: a slot whose worker dies within 2 s of starting, 3 times in a row",
    ),
    Mutation(
        name="bounds-slot-start-failures",
        path="src/anywool/runtime/pool/_supervisor.py",
        old="_MAX_START_FAILURES = 3",
        new="_MAX_START_FAILURES = 5",
        tests=(_default("slot given up: times in a row"),),
        why="README: 3 times in a row is given up",
    ),
    Mutation(
        name="bounds-handshake-deadline",
        path="src/anywool/runtime/worker/_gatekeeper.py",
        old="PENDING_HANDSHAKE_TIMEOUT: float = 2.0",
        new="PENDING_HANDSHAKE_TIMEOUT: float = 3.0",
        tests=(_default("pending handshake deadline"),
               "tests/integration/test_handshake_flood.py"),
        why="README: a worker gives each pending handshake 2 s from its accept",
    ),
    Mutation(
        name="bounds-handshakes-at-once",
        path="src/anywool/runtime/worker/_gatekeeper.py",
        old="MAX_PENDING_HANDSHAKES: int = 256",
        new="MAX_PENDING_HANDSHAKES: int = 512",
        tests=(_default("pending handshakes at once"),),
        why="README: a worker keeps at most 256 handshakes pending",
    ),
    Mutation(
        name="bounds-cli-drain-default",
        path="src/anywool/cli/_worker_command.py",
        old='@click.option("--drain", type=click.FloatRange(min=0), default=10.0,',
        new='@click.option("--drain", type=click.FloatRange(min=0), default=12.0,',
        tests=("tests/unit/test_defaults.py::test_the_cli_worker_drains_10_s_by_default",),
        why="README: lets their calls finish (--drain, 10 s by default)",
    ),
    # -- the pytest plugin -------------------------------------------------------------------
    Mutation(
        name="bounds-worker-pool-fixture-defaults",
        path="src/anywool/testing/_pools.py",
        old='"shutdown_timeout": 5.0, "announce_timeout": 5.0}',
        new='"shutdown_timeout": 10.0, "announce_timeout": 7.0}',
        tests=(_default("worker_pool shutdown_timeout"), _default("worker_pool announce_timeout")),
        why="README: worker_pool's shutdown_timeout and announce_timeout of 5 s",
    ),
    Mutation(
        name="bounds-plugin-settle-grace",
        path="src/anywool/testing/_settle.py",
        old="GRACE = 5.0",
        new="GRACE = 7.0",
        tests=(_default("worker_pool and anywool_runtime_dir grace"),),
        why="README: waits up to 5 s for the directory to empty; still there after 5 s",
    ),
    Mutation(
        name="bounds-owner-process-stop-timeout",
        path="src/anywool/testing/_owner_process.py",
        old="stop_timeout: float = 10.0,",
        new="stop_timeout: float = 12.0,",
        tests=(_default("owner_process stop_timeout"),),
        why="README: after stop_timeout seconds (default 10) it is killed",
    ),
    Mutation(
        name="bounds-hold-registry-lock-timeout",
        path="src/anywool/testing/_faults.py",
        old="timeout: float | None = 5.0) -> RegistryLock:",
        new="timeout: float | None = 7.0) -> RegistryLock:",
        tests=(_default("hold_registry_lock timeout"),),
        why="README: TimeoutError when the lock is not taken within timeout seconds (default 5)",
    ),
    # -- the atomic claim, raced for real ---------------------------------------------------
    Mutation(
        name="race-claim-check-then-rename",
        path="src/anywool/discovery/local/_claim.py",
        old="                os.rename(tmp, target)\n",
        new=("                if os.path.exists(target):\n"
             "                    raise OSError(errno.EEXIST, 'exists')\n"
             "                time.sleep(0.05)  # a check-then-act window\n"
             "                shutil.rmtree(target, ignore_errors=True)\n"
             "                os.rename(tmp, target)\n"),
        tests=("tests/integration/test_cross_process.py::test_racing_interpreters_admit_exactly_one_owner",),
        why="README: a namespace has exactly one owner on the host; a second claim raises",
    ),
]
