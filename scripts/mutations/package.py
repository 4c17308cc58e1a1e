"""Mutations of what a user meets on first contact (issue 25): the extras named when a part is
asked for and missing, the public API as dir() and type checkers see it, durations and tables
as the commands print them, and a deadline over code that holds the event loop."""

from mutate import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="trio-missing-unsaid",
        path="src/anywool/_validate.py",
        old="""    if value == "trio":
        installed("trio", needed_by="backend='trio'", extra="trio")""",
        new="""    if False:
        installed("trio", needed_by="backend='trio'", extra="trio")""",
        tests=("tests/unit/test_validate.py::"
               "test_the_trio_backend_without_trio_names_the_extra_to_install",),
        why="issue 25: asking for trio without it names anywool[trio]",
    ),
    Mutation(
        name="lan-missing-unsaid-by-the-subscriber",
        path="src/anywool/discovery/lan/_lan.py",
        old="""            _validate.installed("zeroconf", needed_by="LanDiscovery", extra="lan")
            self.namespace = _validate.namespace(namespace)
            self.interfaces = _check_interfaces(interfaces)
            self._secret = _check_secret(secret)

        def __aiter__""",
        new="""            self.namespace = _validate.namespace(namespace)
            self.interfaces = _check_interfaces(interfaces)
            self._secret = _check_secret(secret)

        def __aiter__""",
        tests=("tests/unit/test_validate.py::"
               "test_lan_discovery_without_zeroconf_names_the_extra_to_install",),
        why="issue 25: LanDiscovery and its parts without zeroconf name anywool[lan]",
    ),
    Mutation(
        name="dir-shows-the-package-header",
        path="src/anywool/_lazy.py",
        old="""                      if isinstance(value, ModuleType) and not name.startswith("_")\n""",
        new="""                      if not name.startswith("_")\n""",
        tests=("tests/unit/test_public_api.py",),
        why="issue 25: dir(anywool) lists the public API only",
    ),
    Mutation(
        name="routine-on-async-iterator-annotation-untyped",
        path="src/anywool/runtime/_routine.py",
        old="""@overload
def routine(fn: Callable[P, AsyncIterator[Y]]) -> Callable[P, AsyncIterator[Y]]: ...""",
        new="",
        tests=("tests/unit/test_typing.py::"
               "test_a_users_module_over_the_whole_public_api_is_clean_under_pyright_strict",),
        why="issue 25: @routine on a function annotated -> AsyncIterator[T] keeps its type",
    ),
    Mutation(
        name="teardown-log-prints-every-digit",
        path="src/anywool/_teardown.py",
        old="""finishing forcefully", what, seconds(timeout),""",
        new="""finishing forcefully", what, f"{timeout} s",""",
        tests=("tests/unit/test_teardown.py::"
               "test_a_graceful_part_that_times_out_is_logged_with_its_timeout_error",),
        why="issue 25: log lines show rounded durations",
    ),
    Mutation(
        name="piped-tables-wrap-at-80",
        path="src/anywool/cli/_ops.py",
        old="""        out.width = PIPED_WIDTH""",
        new="""        pass""",
        tests=("tests/integration/test_ops_cli.py::"
               "test_piped_tables_keep_each_worker_on_one_line",),
        why="issue 25: show/reclaim rows stay whole when piped",
    ),
    Mutation(
        name="deadline-over-held-loop-reported-as-aborted",
        path="src/anywool/runtime/worker/_server.py",
        old="""    with anyio.move_on_after(REPLY_TIMEOUT):
        await anyio.sleep_forever()""",
        new="""    await anyio.lowlevel.checkpoint()""",
        tests=("tests/unit/test_interrupted_by_scope.py",),
        why="a deadline passing while a plain function holds an asyncio worker ends it cancelled",
    ),
]
