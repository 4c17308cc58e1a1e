"""Mutations of recycling (issue 24, item 2): a worker past its max_calls or max_memory takes
no new call, finishes those it runs, and is replaced before it leaves."""

from mutate import Mutation

_SERVER = "src/anywool/runtime/_server.py"
_WORKER = "src/anywool/runtime/_worker.py"
_POOL = "src/anywool/runtime/_pool.py"
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
        path=_POOL,
        old="""        await self._start_replacement(backend, tags)
        await self._announce(worker, "worker-dropped")""",
        new="""        await self._announce(worker, "worker-dropped")
        await worker.stop(self._shutdown_timeout)
        await self._start_replacement(backend, tags)
        return""",
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
        path=_POOL,
        old="""                await worker.drain()""",
        new="""                await worker.stop(self._shutdown_timeout)""",
        tests=(f"{_TESTS}::test_a_retiring_worker_finishes_a_call_that_outlasts_shutdown_timeout",),
        why="break24: shutdown_timeout bounds the exit's drain, not a retiring worker's calls",
    ),
    Mutation(
        name="recycling-exit-waits-for-a-starting-replacement",
        path=_POOL,
        old="""            self._stop_starting()  # a replacement starting""",
        new="""            pass  # a replacement starting""",
        tests=(f"{_TESTS}::test_the_pools_exit_does_not_wait_for_a_replacement_that_is_starting",),
        why="break24: the pool's exit is bounded, a replacement's slow start (lifespan) included",
    ),
    Mutation(
        name="recycling-exit-drops-calls-on-withdrawn-workers",
        path="src/anywool/runtime/_proxy.py",
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
