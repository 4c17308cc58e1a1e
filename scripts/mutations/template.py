"""Mutations of the pool's warm template (issue 24, item 5): workers forked from it for large
pools and for every worker started after the pool's start; exit codes and deaths seen; nothing
outlives the pool."""

from mutate import Mutation

_SUPERVISOR = "src/anywool/runtime/pool/_supervisor.py"
_TEMPLATE = "src/anywool/runtime/pool/_template.py"
_TEMPLATE_PROCESS = "src/anywool/runtime/pool/_template_process.py"
_TESTS = "tests/integration/test_template.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="template-never-warmed-after-the-start",
        path=_SUPERVISOR,
        old="""        if not self._wanted and self._task_group is not None:""",
        new="""        if False:""",
        tests=(f"{_TESTS}::test_workers_started_after_the_pool_are_forked_from_its_template",),
        why="issue 24: replacements and recycling fork from the warm template",
    ),
    Mutation(
        name="template-first-only-well-above-the-cpus",
        path=_SUPERVISOR,
        old="""        if count > (os.cpu_count() or 1):""",
        new="""        if count > (os.cpu_count() or 1) + 1:""",
        tests=(f"{_TESTS}::test_a_pool_larger_than_the_cpus_forks_all_its_workers",),
        why="issue 24: a pool larger than the CPUs forks all its workers",
    ),
    Mutation(
        name="template-first-up-to-the-cpus",
        path=_SUPERVISOR,
        old="""        if count > (os.cpu_count() or 1):""",
        new="""        if count >= (os.cpu_count() or 1):""",
        tests=(f"{_TESTS}::test_a_pool_as_large_as_the_cpus_starts_its_workers_itself",),
        why="up to the CPUs, workers start side by side, faster than after a template",
    ),
    Mutation(
        name="template-exit-code-lost",
        path=_TEMPLATE,
        old="""                            child._exited(int(message["code"]))""",
        new="""                            child._exited(0)""",
        tests=(f"{_TESTS}::test_a_forked_worker_exit_code_comes_from_the_template",
               f"{_TESTS}::test_a_forked_worker_that_exits_is_replaced_and_its_code_said"),
        why="a forked worker's exit code is the one it exited with",
    ),
    Mutation(
        name="template-dead-workers-never-seen-to-end",
        path=_TEMPLATE,
        old="""                        self._tasks.start_soon(self._shielded, reply._watch)""",
        new="""                        pass""",
        tests=(f"{_TESTS}::test_a_dead_template_costs_only_speed",
               f"{_TESTS}::test_a_wedged_template_neither_hides_a_worker_end_nor_slows_the_exit"),
        why="a worker that outlives the template, or whose end it does not say, is still seen "
            "to end, and replaced",
    ),
    Mutation(
        name="template-wedged-left-running",
        path=_TEMPLATE,
        old="""            self._abandon()
            raise TemplateUnavailable(f"no answer""",
        new="""            self.ended = True
            raise TemplateUnavailable(f"no answer""",
        tests=(f"{_TESTS}::test_a_template_that_does_not_answer_a_fork_in_time_is_killed",),
        why="a wedged template, resumed, would fork late a worker nobody runs",
    ),
    Mutation(
        name="template-ended-by-the-pool-cancellation",
        path=_SUPERVISOR,
        old="""                    with anyio.CancelScope(shield=True):
                        await self._workers_stopped.wait()""",
        new="""                    with anyio.CancelScope():
                        await self._workers_stopped.wait()""",
        tests=(f"{_TESTS}::test_a_cancelled_pool_stops_its_forked_workers_as_it_stops_any",),
        why="the template outlives the workers it forked, a cancelled pool's too",
    ),
    Mutation(
        name="template-stderr-of-its-start",
        path=_TEMPLATE_PROCESS,
        old="""        os.dup2(stderr, 2)
""",
        new="",
        tests=(f"{_TESTS}::test_a_forked_worker_writes_to_the_stderr_its_pool_has_when_it_starts",),
        why="a forked worker's stderr is the pool's as it is at the worker's start",
    ),
    Mutation(
        name="template-outlives-a-killed-pool",
        path=_TEMPLATE_PROCESS,
        old="""                if not data:
                    return None
""",
        new="""                if not data:
                    select.select([], [], [], 40)
                    return None
""",
        tests=(f"{_TESTS}::test_forked_workers_end_with_their_pool_killed",),
        why="issue 24: nothing outlives the pool",
    ),
    Mutation(
        name="template-left-unreaped-after-the-pool",
        path=_TEMPLATE,
        old="""        process = self._process
        if process is not None:
            # Killed, not asked""",
        new="""        process = None
        if process is not None:
            # Killed, not asked""",
        tests=(f"{_TESTS}::test_workers_started_after_the_pool_are_forked_from_its_template",),
        why="the template is reaped at the pool's exit",
    ),
]
