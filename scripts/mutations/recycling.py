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
        await self._announce(worker, "worker-dropped")
        self._own.discard(worker.metadata.uid)
        self._own_changed()
        await worker.stop(self._shutdown_timeout)""",
        new="""        await self._announce(worker, "worker-dropped")
        self._own.discard(worker.metadata.uid)
        self._own_changed()
        await worker.stop(self._shutdown_timeout)
        await self._start_replacement(backend, tags)""",
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
]

MUTATIONS += [
    Mutation(
        name="recycle-stops-before-the-replacement-is-connected",
        path=_POOL,
        old="""        if replacement is not None:
            await self._until_proxy_has(replacement)""",
        new="""        if False:
            await self._until_proxy_has(replacement)""",
        tests=(f"{_TESTS}::test_recycle_replaces_every_worker_while_calls_flow",),
        why="issue 24: each replacement ready before the old one stops taking calls",
    ),
    Mutation(
        name="recycle-failure-stops-the-old-worker-anyway",
        path=_POOL,
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
        path=_POOL,
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
        old="""            await pool.recycle()
        except Exception as exc:""",
        new="""            pass
        except Exception as exc:""",
        tests=("tests/integration/test_worker_command.py::test_sighup_recycles_the_hosted_workers",),
        why="issue 24: a host recycles its workers from outside (SIGHUP)",
    ),
]
