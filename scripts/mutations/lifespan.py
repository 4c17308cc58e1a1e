"""Mutations of worker lifespans (issue 24, item 1): entered before calls, exited after the
last one, its failures said where they belong, what it yields reached by routines."""

from mutate import Mutation

_LIFESPAN = "src/anywool/runtime/_lifespan.py"
_WORKER = "src/anywool/runtime/worker/_main.py"
_TESTS = "tests/integration/test_lifespan.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="lifespan-exits-before-the-calls-end",
        path=_LIFESPAN,
        old="""        try:
            yield _current
        except BaseException as exc:""",
        new="""        await self._exit(None, None, None)
        try:
            yield _current
        except BaseException as exc:""",
        tests=(f"{_TESTS}::test_the_lifespan_exits_after_the_last_call",),
        why="issue 24: the lifespan is exited after the worker's last call",
    ),
    Mutation(
        name="lifespan-entry-failure-unsaid",
        path=_WORKER,
        old="""    except Exception as exc:
        _start_failed(f"its lifespan failed to start: {exc!r}")""",
        new="""    except ZeroDivisionError as exc:
        _start_failed(f"its lifespan failed to start: {exc!r}")""",
        tests=(f"{_TESTS}::test_a_lifespan_that_fails_to_start_fails_the_pools_start",),
        why="issue 24: a lifespan failing on entry fails the start, the pool says the cause",
    ),
    Mutation(
        name="lifespan-exit-failure-not-logged",
        path=_LIFESPAN,
        old="""            log.exception("the worker's lifespan failed as it exited")""",
        new="""            pass""",
        tests=(f"{_TESTS}::test_a_lifespan_that_fails_at_exit_is_logged",),
        why="issue 24: a lifespan failing on exit is logged",
    ),
    Mutation(
        name="lifespan-state-not-published",
        path=_LIFESPAN,
        old="""            info = WorkerInfo(info.uid, info.namespace, info.address, info.pid, state)""",
        new="""            info = WorkerInfo(info.uid, info.namespace, info.address, info.pid, None)""",
        tests=(f"{_TESTS}::test_routines_reach_what_the_lifespan_yields",),
        why="issue 24: routines reach what the lifespan yields",
    ),
    Mutation(
        name="lifespan-not-a-context-manager-unchecked",
        path=_LIFESPAN,
        old="""            if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):""",
        new="""            if False:""",
        tests=(f"{_TESTS}::test_a_lifespan_that_is_no_context_manager_fails_the_start",),
        why="a lifespan returning something else fails the start with a clear error",
    ),
    Mutation(
        name="lifespan-exit-not-cancelled-by-sigterm",
        path="src/anywool/runtime/worker/_server.py",
        old="""            if signum == signal.SIGTERM:
                self.stop.terminate()""",
        new="""            if signum == signal.SIGTERM:
                self.stop.request(0)""",
        tests=("tests/integration/test_lifespan.py::test_sigterm_cancels_a_lifespan_exit_that_hangs",),
        why="break24: SIGTERM cancels the lifespan's exit, also one under way",
    ),
]

MUTATIONS += [
    Mutation(
        name="lifespan-size-unbounded",
        path=_LIFESPAN,
        old="""    if len(text) > _ENCODED_AT_MOST:""",
        new="""    if False:""",
        tests=(f"{_TESTS}::test_a_lifespan_too_large_to_hand_over_is_refused_at_construction",),
        why="a lifespan too large for the worker's environment is refused where it is given",
    ),
]
