"""Mutations of recycling (issue 24, item 2): a worker past its max_calls or max_memory takes
no new call, finishes those it runs, and is replaced before it leaves."""

from mutate import Mutation

_SERVER = "src/anywool/runtime/worker/_server.py"
_WORKER = "src/anywool/runtime/worker/_main.py"
_RECYCLING = "src/anywool/runtime/pool/_recycling.py"
_SUPERVISOR = "src/anywool/runtime/pool/_supervisor.py"
_TESTS = "tests/integration/test_recycling.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="recycling-max-calls-off-by-one",
        path=_SERVER,
        old="""            if self.max_calls is not None and self.admitted >= self.max_calls:""",
        new="""            if self.max_calls is not None and self.admitted > self.max_calls:""",
        tests=(f"{_TESTS}::test_workers_past_max_calls_are_replaced_and_no_call_fails",),
        why="issue 24: a worker takes at most max_calls calls",
    ),
    Mutation(
        name="recycling-retiring-worker-keeps-taking-calls",
        path=_SERVER,
        old="""        if self.retiring is not None:
            return False
        return self.max_concurrency is None""",
        new="""        return self.max_concurrency is None""",
        tests=(f"{_TESTS}::test_workers_past_max_calls_are_replaced_and_no_call_fails",),
        why="issue 24: a worker past its bound takes no new calls",
    ),
    Mutation(
        name="recycling-stopped-before-its-replacement",
        path=_RECYCLING,
        old="""                replacement, failure = await supervisor.start_replacement(
                    give_up=not recycling)""",
        new="""                await supervisor.withdraw(worker)
                await supervisor.stop(worker)
                replacement, failure = await supervisor.start_replacement(
                    give_up=not recycling)""",
        tests=(f"{_TESTS}::test_a_worker_leaking_past_max_memory_is_replaced_while_its_call_runs",),
        why="issue 24: a retiring worker is replaced before it leaves",
    ),
    Mutation(
        name="recycling-memory-not-watched",
        path=_WORKER,
        old="""                main_tg.start_soon(_watch_memory, worker, max_memory)""",
        new="""                pass""",
        tests=(f"{_TESTS}::test_a_worker_leaking_past_max_memory_is_replaced_while_its_call_runs",),
        why="issue 24: max_memory, also while calls run",
    ),
    Mutation(
        name="recycling-retiring-cancels-its-calls",
        path=_SERVER,
        old="""        self.retiring = reason
        if self._on_retire""",
        new="""        self.retiring = reason
        for call in list(self.calls):
            call.cancel()
        if self._on_retire""",
        tests=(f"{_TESTS}::test_a_retiring_worker_finishes_the_stream_it_runs",
               f"{_TESTS}::test_a_worker_leaking_past_max_memory_is_replaced_while_its_call_runs"),
        why="issue 24: a worker past its bound finishes its calls",
    ),
    Mutation(
        name="recycling-retiring-drain-bounded-by-shutdown-timeout",
        path=_RECYCLING,
        old="""                await worker.drain()""",
        new="""                await supervisor.stop(worker)""",
        tests=(f"{_TESTS}::test_a_retiring_worker_finishes_a_call_that_outlasts_shutdown_timeout",),
        why="break24: shutdown_timeout bounds the exit's drain, not a retiring worker's calls",
    ),
    Mutation(
        name="recycling-exit-waits-for-a-starting-replacement",
        path=_SUPERVISOR,
        old="""            self._stop_starting()  # a replacement starting""",
        new="""            pass  # a replacement starting""",
        tests=(f"{_TESTS}::test_the_pools_exit_does_not_wait_for_a_replacement_that_is_starting",),
        why="break24: the pool's exit is bounded, a replacement's slow start (lifespan) included",
    ),
    Mutation(
        name="recycling-exit-drops-calls-on-withdrawn-workers",
        path="src/anywool/runtime/client/_proxy.py",
        old="""[c for _, c in self._ready.values()] + list(self._withdrawn)""",
        new="""[c for _, c in self._ready.values()]""",
        tests=(f"{_TESTS}::test_the_pools_own_call_on_a_retiring_worker_is_cancelled_at_exit",),
        why="break24: own calls on a withdrawn worker end RoutineCancelled at the exit",
    ),
    Mutation(
        name="recycling-memory-not-checked-at-start",
        path=_WORKER,
        old="""                too_large = _over(max_memory)""",
        new="""                too_large = None""",
        tests=(f"{_TESTS}::test_a_worker_past_max_memory_once_started_fails_its_start",),
        why="break24: a worker past max_memory once started fails its start (no endless churn)",
    ),
]

MUTATIONS += [
    Mutation(
        name="recycle-stops-before-the-replacement-is-connected",
        path=_RECYCLING,
        old="""                if replacement is not None:
                    await supervisor.until_connected(replacement)""",
        new="""                if False:
                    await supervisor.until_connected(replacement)""",
        tests=(f"{_TESTS}::test_recycle_replaces_every_worker_while_calls_flow",),
        why="issue 24: each replacement ready before the old one stops taking calls",
    ),
    Mutation(
        name="recycle-failure-stops-the-old-worker-anyway",
        path=_RECYCLING,
        old="""            if done is not None:
                done.set()
            return False""",
        new="""            if done is not None:
                done.set()""",
        tests=(f"{_TESTS}::test_a_recycle_whose_replacement_cannot_start_keeps_the_workers",),
        why="a rollout whose replacement cannot start leaves the running workers be",
    ),
    Mutation(
        name="recycle-asks-nobody",
        path=_RECYCLING,
        old="""                done = self._recycled[uid] = anyio.Event()
                asked.set()""",
        new="""                done = self._recycled[uid] = anyio.Event()
                done.set()""",
        tests=(f"{_TESTS}::test_recycle_replaces_every_worker_while_calls_flow",),
        why="issue 24: recycle() replaces every spawned worker",
    ),
    Mutation(
        name="sighup-not-recycling",
        path="src/anywool/cli/_worker_command.py",
        old="""        await pool.recycle()
    except Exception as exc:""",
        new="""        pass
    except Exception as exc:""",
        tests=("tests/integration/test_worker_command.py::test_sighup_recycles_the_hosted_workers",),
        why="issue 24: a host recycles its workers from outside (SIGHUP)",
    ),
]

MUTATIONS += [
    Mutation(
        name="recycling-max-memory-floor-missing",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="""        "max_memory", max_memory, lower=MIN_MAX_MEMORY, upper=MAX_MAX_CALLS)""",
        new="""        "max_memory", max_memory, lower=1, upper=MAX_MAX_CALLS)""",
        tests=(f"{_TESTS}::test_bad_recycling_bounds_are_refused_at_construction",),
        why="max_memory is at least 1 MiB (README)",
    ),
    Mutation(
        name="recycling-max-calls-floor-missing",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="""    calls = None if max_calls is None else _validate.count("max_calls", max_calls,
                                                           upper=MAX_MAX_CALLS)""",
        new="""    calls = None if max_calls is None else _validate.count("max_calls", max_calls,
                                                           lower=0, upper=MAX_MAX_CALLS)""",
        tests=(f"{_TESTS}::test_bad_recycling_bounds_are_refused_at_construction",),
        why="max_calls is at least 1",
    ),
]

# -- anywool recycle NS, idle workers (issue 24, the rest) -------------------------------------

_COMMAND = "src/anywool/cli/_recycle_command.py"
_RECYCLE_TESTS = "tests/integration/test_recycle_command.py"
_IDLE_TESTS = "tests/integration/test_idle.py"

MUTATIONS += [
    Mutation(
        name="recycle-request-recycles-nothing",
        path=_RECYCLING,
        old="""                        self._recycle_wanted.set()""",
        new="""                        pass""",
        tests=(f"{_RECYCLE_TESTS}::test_recycle_replaces_every_hosted_worker_while_calls_go_on",),
        why="issue 24: anywool recycle NS replaces every worker of the host it asks",
    ),
    Mutation(
        name="recycle-request-secret-not-checked",
        path="src/anywool/runtime/wire/_auth.py",
        old="    if not hmac.compare_digest(their_proof, expected):\n        with anyio",
        new="    if False:\n        with anyio",
        tests=(f"{_RECYCLE_TESTS}::test_a_wrong_secret_is_refused_and_nothing_is_recycled",),
        why="issue 24: a recycle request with a wrong secret fails, and nothing is recycled",
    ),
    Mutation(
        name="recycle-request-accepted-without-a-pool",
        path=_SERVER,
        old="""        if not self.supervised or self._notify is None:""",
        new="""        if self._notify is None:""",
        tests=(f"{_RECYCLE_TESTS}::test_a_worker_no_pool_runs_refuses",),
        why="issue 24: a worker no pool supervises refuses a recycle request (nobody would act)",
    ),
    Mutation(
        name="recycle-hosts-not-one-at-a-time",
        path=_COMMAND,
        old="""    for host in found:
        failure = await _ask(host, credentials, connect_timeout)
        if failure is not None:
            return failure
        failure = await _until_replaced(source, host, timeout)""",
        new="""    for host in found:
        failure = await _ask(host, credentials, connect_timeout)
        if failure is not None:
            return failure
    for host in found:
        failure = await _until_replaced(source, host, timeout)""",
        tests=(f"{_RECYCLE_TESTS}::test_hosts_are_recycled_one_after_the_other",),
        why="issue 24: one host at a time, the next asked once the previous is done",
    ),
    Mutation(
        name="idle-retires-below-min-workers",
        path=_RECYCLING,
        old="""                        if (supervisor.slots > self._min_workers
                                and self._running_besides(worker) >= self._min_workers):""",
        new="""                        if (supervisor.slots >= self._min_workers
                                and self._running_besides(worker) >= self._min_workers - 1):""",
        tests=(f"{_IDLE_TESTS}::test_idle_workers_retire_down_to_min_workers_and_calls_grow_the_pool_back",
               f"{_IDLE_TESTS}::test_min_workers_equal_to_spawn_retires_nothing"),
        why="issue 24: idleness never leaves fewer than min_workers",
    ),
    Mutation(
        name="idle-retired-worker-replaced",
        path=_RECYCLING,
        old="""                                  replace=retiring != _IDLE):""",
        new="""                                  replace=True):""",
        tests=(f"{_IDLE_TESTS}::test_idle_workers_retire_down_to_min_workers_and_calls_grow_the_pool_back",),
        why="issue 24: an idle worker is retired, not replaced",
    ),
    Mutation(
        name="idle-pool-never-grows-back",
        path=_RECYCLING,
        old="""                        self._armed.discard(worker.metadata.uid)
                        self._grow()""",
        new="""                        self._armed.discard(worker.metadata.uid)""",
        tests=(f"{_IDLE_TESTS}::test_idle_workers_retire_down_to_min_workers_and_calls_grow_the_pool_back",),
        why="issue 24: calls coming again grow the pool back to spawn",
    ),
    Mutation(
        name="idle-counts-only-the-pools-own-calls",
        path=_SERVER,
        old="""            self.quiet_since = time.perf_counter()
            self.busy += self.quiet_since - self.busy_since""",
        new="""            self.busy += time.perf_counter() - self.busy_since""",
        tests=(f"{_IDLE_TESTS}::test_idle_retirement_counts_other_callers_calls",),
        why="issue 24: idleness counts every call the worker runs",
    ),
]
