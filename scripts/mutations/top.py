"""Issue 23, item 4: a look inside a running pool (worker stats, ``pool.stats()``,
``anywool top``), each promise broken on its own.

The counts are pinned in ``tests/integration/test_stats.py`` (a call held by the test is in
flight, calls that ended are served by outcome, busy time grows while a call runs and not while
idle), the bounds by a suspended worker, the wire's promises (a STATS request is no call,
answered at ``max_concurrency`` and while draining) and authentication by ``anywool top``
against a TCP worker.
"""

from mutate import Mutation

STATS = "tests/integration/test_stats.py"
COUNTS = f"{STATS}::test_stats_count_calls_in_flight_served_and_busy_time"
SUSPENDED = f"{STATS}::test_a_suspended_worker_is_reported_as_not_answering_within_the_timeout"
DRAINING = f"{STATS}::test_stats_are_answered_while_the_worker_drains"
TOP = f"{STATS}::test_top_once_and_json_show_each_workers_answer_and_refusals"
SERVER = "src/anywool/runtime/worker/_server.py"

MUTATIONS: list[Mutation] = [
    # -- what the worker counts --------------------------------------------------------------
    Mutation(
        name="top-in-flight-not-reported",
        path=SERVER,
        old="self.max_concurrency, stop.in_flight, stop.served,",
        new="self.max_concurrency, 0, stop.served,",
        tests=(COUNTS,),
        why="README: in_flight, the calls running now",
    ),
    Mutation(
        name="top-served-not-counted",
        path=SERVER,
        old="        self.served += 1\n",
        new="        self.served += 0\n",
        tests=(COUNTS,),
        why="README: served, the calls that ended",
    ),
    Mutation(
        name="top-returned-not-counted",
        path=SERVER,
        old="                                   Kind.RETURN):\n            self.stop.returned += 1",
        new="                                   Kind.RETURN):\n            pass",
        tests=(COUNTS,),
        why="README: returned, raised, cancelled: how the calls ended",
    ),
    Mutation(
        name="top-busy-ignores-the-call-running-now",
        path=SERVER,
        old="busy = stop.busy + (now - stop.busy_since if stop.in_flight else 0.0)",
        new="busy = stop.busy",
        tests=(COUNTS,),
        why="README: busy_seconds grows while a call runs",
    ),
    Mutation(
        name="top-busy-counts-idle-time",
        path=SERVER,
        old="(now - stop.busy_since if stop.in_flight else 0.0)",
        new="(now - stop.busy_since if True else 0.0)",
        tests=(COUNTS,),
        why="README: busy_seconds counts only time with a call in flight",
    ),
    Mutation(
        name="top-busy-stretch-not-accumulated",
        path=SERVER,
        old="self.busy += self.quiet_since - self.busy_since",
        new="self.busy += 0.0",
        tests=(COUNTS,),
        why="README: busy_seconds keeps the time of the calls that ended",
    ),
    # -- the request ---------------------------------------------------------------------------
    Mutation(
        name="top-stats-refused-at-max-concurrency",
        path=SERVER,
        old="if frame.kind == Kind.STATS:  # not a call",
        new="if frame.kind == Kind.STATS and self._has_room():  # not a call",
        tests=(COUNTS,),
        why="README: answered also when the worker runs its max_concurrency calls",
    ),
    Mutation(
        name="top-stats-not-answered-while-draining",
        path=SERVER,
        old="if frame.kind == Kind.STATS:  # not a call",
        new="if frame.kind == Kind.STATS and not self.stop.draining:  # not a call",
        tests=(DRAINING,),
        why="README: answered also while the worker drains",
    ),
    Mutation(
        name="top-stats-counted-as-a-call",
        path=SERVER,
        old="    async def _send_stats(self, frames: FrameStream, request_id: int) -> None:\n",
        new="    async def _send_stats(self, frames: FrameStream, request_id: int) -> None:\n"
            "        self.stop.started(time.perf_counter())\n        self.stop.finished()\n",
        tests=(COUNTS,),
        why="README: a statistics request is not a call, counted in none of the fields",
    ),
    Mutation(
        name="top-connection-stats-timeout-unbounded",
        path="src/anywool/runtime/client/_connection.py",
        old="            with anyio.fail_after(timeout):\n                try:\n"
            "                    await frames.send(Frame(kind, request_id))",
        new="            with anyio.fail_after(timeout + 5):\n                try:\n"
            "                    await frames.send(Frame(kind, request_id))",
        tests=(SUSPENDED,),
        why="README: a worker that does not answer within timeout is reported as None",
    ),
    Mutation(
        name="top-pool-stats-timeout-ignored",
        path="src/anywool/runtime/client/_proxy.py",
        old="found[uid] = await connection.stats(timeout)",
        new="found[uid] = await connection.stats(timeout * 10)",
        tests=(SUSPENDED,),
        why="README: pool.stats(timeout): each worker gets timeout seconds",
    ),
    # -- authentication ------------------------------------------------------------------------
    Mutation(
        name="top-tcp-worker-serves-without-a-handshake",
        path="src/anywool/runtime/worker/_main.py",
        old="gate = _gatekeeper.Gatekeeper(credentials, str(announced), worker.handle)",
        new="gate = None",
        tests=(TOP,),
        why="README: top asks TCP workers over an authenticated connection, like any call",
    ),
    Mutation(
        name="top-cli-without-credentials",
        path="src/anywool/cli/_top_command.py",
        old="credentials=credentials) as connection:",
        new="credentials=None) as connection:",
        tests=(TOP,),
        why="README: top authenticates with --secret-file or $ANYWOOL_SECRET",
    ),
    Mutation(
        name="top-cli-refusal-shown-as-unreachable",
        path="src/anywool/cli/_top_command.py",
        old='return _Sample(metadata, None, f"refused: {exc.reason}")',
        new='return _Sample(metadata, None, f"unreachable: {exc.reason}")',
        tests=(TOP,),
        why="README: a worker that refuses our credentials is shown as refused, with why",
    ),
    Mutation(
        name="top-nan-seconds-accepted",
        path="src/anywool/cli/_top_command.py",
        old="""    if math.isnan(value):""",
        new="""    if value != value and False:""",
        tests=("tests/integration/test_stats.py::test_top_refuses_nan_seconds",),
        why="anywool top refuses --interval nan and --timeout nan as usage errors",
    ),
]
