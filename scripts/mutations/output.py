"""Issue 23, item 1: worker output at the caller, each promise broken on its own.

The bounds on the worker (entries and bytes waiting, a line's length), the default and the off
switch, the caller's level check, the output sent before the reply, the drop count said once,
and the relay of a nested call's output to the outermost caller, all pinned in
``tests/integration/test_output.py``.
"""

from mutate import Mutation

OUTPUT = "tests/integration/test_output.py"
RECORDS = f"{OUTPUT}::test_records_arrive_with_the_worker_and_the_call_at_the_callers_levels"
LINES = f"{OUTPUT}::test_lines_arrive_whole_and_the_partial_last_one_at_the_end"
DEFAULT = f"{OUTPUT}::test_lines_go_to_the_callers_stderr_by_default_and_only_there"
OFF = f"{OUTPUT}::test_forward_output_false_leaves_it_on_the_workers_stderr"
NESTED = f"{OUTPUT}::test_nested_calls_reach_the_outermost_caller_with_the_innermost_worker"
FLOOD = f"{OUTPUT}::test_a_flood_is_bounded_and_its_drops_said_once"
HOST = f"{OUTPUT}::test_an_anywool_worker_host_forwards_to_the_calling_pool"
LIVE = f"{OUTPUT}::test_output_arrives_while_the_call_runs"
ORDER = f"{OUTPUT}::test_a_calls_output_precedes_each_of_its_replies_on_the_stream"
LEVELS = f"{OUTPUT}::test_a_worker_passes_what_the_callers_logging_lets_through_when_it_starts"
MODULE = "src/anywool/runtime/_output.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="output-worker-bound-entries",
        path=MODULE,
        old="if (len(self._entries) >= PENDING_AT_MOST\n",
        new="if (len(self._entries) >= PENDING_AT_MOST * 2\n",
        tests=(FLOOD,),
        why="README: at most 4096 entries wait on a worker connection; beyond, dropped",
    ),
    Mutation(
        name="output-worker-bound-bytes",
        path=MODULE,
        old="or self._bytes + size > PENDING_BYTES_AT_MOST) and not force:",
        new="or self._bytes + size > PENDING_BYTES_AT_MOST * 2) and not force:",
        tests=(FLOOD,),
        why="README: at most 1 MiB of entries waits on a worker connection",
    ),
    Mutation(
        name="output-line-not-cut",
        path=MODULE,
        old="    if len(text) <= TEXT_AT_MOST:\n        return text",
        new="    if True:\n        return text",
        tests=(LINES,),
        why="README: a line (or a record's text) longer than 64 Ki characters is cut, marked",
    ),
    Mutation(
        name="output-default-off-in-the-pool",
        path="src/anywool/runtime/pool/_pool.py",
        old="forward_output: bool = True,",
        new="forward_output: bool = False,",
        tests=(RECORDS,),
        why="README: forwarding is on by default",
    ),
    Mutation(
        name="output-default-off-in-the-proxy",
        path="src/anywool/runtime/client/_proxy.py",
        old="        forward_output: bool = True,\n        on_output: Callable[[OutputLine], object] | None = None,\n    ) -> None:\n        where",
        new="        forward_output: bool = False,\n        on_output: Callable[[OutputLine], object] | None = None,\n    ) -> None:\n        where",
        tests=(HOST,),
        why="README: forwarding is on by default (a WorkerProxy's too)",
    ),
    Mutation(
        name="output-off-switch-ignored-by-the-caller",
        path="src/anywool/runtime/client/_connection.py",
        old="self._output is not None if caller is None else relay is not None,",
        new="True if caller is None else relay is not None,",
        tests=(OFF,),
        why="README: forward_output=False leaves the output on the workers' stderr",
    ),
    Mutation(
        name="output-off-switch-ignored-by-the-worker",
        path="src/anywool/runtime/worker/_server.py",
        old="            forwarder = self._forwarders.get(frames) if request.forward else None",
        new="            forwarder = self._forwarders.get(frames)",
        tests=(OFF,),
        why="README: forward_output=False leaves the output on the workers' stderr",
    ),
    Mutation(
        name="output-worker-stderr-duplicates-forwarded-records",
        path=MODULE,
        old="    return current() is None or _own(record.name)",
        new="    return True",
        tests=(DEFAULT,),
        why="README: what a call forwards is not also written on the worker's stderr",
    ),
    Mutation(
        name="output-caller-level-unchecked",
        path=MODULE,
        old="            if not logger.isEnabledFor(levelno):\n                return\n",
        new="",
        tests=(RECORDS,),
        why="README: the caller's levels decide (isEnabledFor before handle)",
    ),
    Mutation(
        name="output-not-sent-before-the-return",
        path="src/anywool/runtime/worker/_server.py",
        old="        if call.output is not None and call.output.dirty:\n            await call.output.flush()  # the output first",
        new="        if False:\n            await call.output.flush()  # the output first",
        tests=(ORDER,),
        why="README: a call's output is emitted at the caller by the time the call returns",
    ),
    Mutation(
        name="output-not-sent-before-the-exception",
        path="src/anywool/runtime/worker/_server.py",
        old="        if call.output is not None and call.output.dirty:\n            await call.output.flush()\n        if call.telemetry is not None:\n            call.telemetry.failed(exc)\n",
        new="        if call.telemetry is not None:\n            call.telemetry.failed(exc)\n",
        tests=(ORDER,),
        why="README: ... or raises",
    ),
    Mutation(
        name="output-drops-said-per-line",
        path=MODULE,
        old='        else:\n            log.warning("%d lines of output',
        new='        else:\n          for _ in range(entry[3]):\n            log.warning("%d lines of output',
        tests=(FLOOD,),
        why="README: what is dropped is counted and said once per call",
    ),
    Mutation(
        name="output-drops-never-said",
        path=MODULE,
        old="        if dropped:\n            forwarder.put(",
        new="        if False:\n            forwarder.put(",
        tests=(FLOOD,),
        why="README: what is dropped is counted and said once per call",
    ),
    Mutation(
        name="output-nested-not-relayed",
        path="src/anywool/runtime/client/_connection.py",
        old="relay = None if caller is None else _output.current()",
        new="relay = None",
        tests=(NESTED,),
        why="README: a routine's calls to routines forward to the outermost caller",
    ),
    Mutation(
        name="output-nested-emitted-at-the-middle-worker",
        path=MODULE,
        old="            if relay is not None:\n                # A drop count goes",
        new="            if False:\n                # A drop count goes",
        tests=(NESTED,),
        why="README: a routine's calls to routines forward to the outermost caller",
    ),
    Mutation(
        name="output-nested-tagged-by-the-last-hop",
        path=MODULE,
        old="            if entry[1] is None:\n                entry[1] = source",
        new="            if True:\n                entry[1] = source",
        tests=(NESTED,),
        why="README: output carries the worker that produced it, however deep the call",
    ),
    Mutation(
        name="output-forwarder-not-woken-in-the-loop",
        path=MODULE,
        old="        if threading.get_ident() == self._loop_thread:\n            self._wake.set()",
        new="        if threading.get_ident() == self._loop_thread:\n            pass",
        tests=(LIVE,),
        why="README: output arrives while the call runs, not only at its end",
    ),
    Mutation(
        name="output-forwarder-not-woken-from-a-thread",
        path=MODULE,
        old="                self._call_soon(self._wake.set)",
        new="                pass",
        tests=(LIVE,),
        why="a routine's threads' output arrives while the call runs (the loop is woken)",
    ),
    Mutation(
        name="output-partial-line-copied-each-write",
        path="src/anywool/runtime/_output.py",
        old="""                elif isinstance(held, str) and len(held) + len(text) <= _SHORT:
                    partial[stream] = held + text""",
        new="""                elif isinstance(held, str):
                    partial[stream] = (held + text)[:TEXT_AT_MOST + 1]""",
        tests=("tests/unit/test_output.py::"
               "test_a_line_written_a_character_at_a_time_costs_what_is_written",),
        why="a line written a character at a time (print(..., end='')) costs what is written, "
            "not a copy of the line so far per write",
    ),
    Mutation(
        name="output-unformattable-message-raises",
        path="src/anywool/runtime/_output.py",
        old="""            message = _unformattable(record.msg, exc)""",
        new='''            message = f"{record.msg!r} (formatting its arguments failed: {exc!r})"''',
        tests=(f"{OUTPUT}::test_a_message_that_cannot_be_formatted_is_said_and_raises_nothing",),
        why="the capture never raises into the code that logs, also for a message whose str() "
            "and repr() fail",
    ),
    Mutation(
        name="output-lock-not-reentrant",
        path="src/anywool/runtime/_output.py",
        old="""        self.lock = threading.RLock()""",
        new="""        self.lock = threading.Lock()""",
        tests=(f"{OUTPUT}::test_a_finalizer_that_logs_during_output_does_not_deadlock",),
        why="a finalizer that logs, run by a collection while the capture holds its lock, "
            "must not deadlock the worker",
    ),
    Mutation(
        name="output-async-on-output-accepted",
        path="src/anywool/runtime/_output.py",
        old="""    if inspect.iscoroutinefunction(on_output):""",
        new="""    if False:""",
        tests=(f"{OUTPUT}::test_the_options_are_checked",),
        why="an async on_output is refused at construction (its coroutines would never run: "
            "every line lost, a RuntimeWarning each)",
    ),
    Mutation(
        name="output-relayed-drop-count-bounded",
        path="src/anywool/runtime/_output.py",
        old="""                relay.put(entry, _size(entry), force=entry[0] == OUTPUT_DROPPED)""",
        new="""                relay.put(entry, _size(entry))""",
        tests=("tests/unit/test_output.py::"
               "test_a_nested_calls_drop_count_is_relayed_past_the_bound",),
        why="a nested call's drop count reaches the outermost caller also when the relaying "
            "call's bound is reached (what is dropped is said)",
    ),
    Mutation(
        name="output-worker-passes-every-level",
        path="src/anywool/runtime/pool/_pool.py",
        old="return _output.lowest_level() if self._output_level is None else self._output_level",
        new="return logging.NOTSET if self._output_level is None else self._output_level",
        tests=(LEVELS,),
        why="README: a spawned worker passes the lowest level the caller's logging lets through",
    ),
    Mutation(
        name="output-lowest-level-ignores-other-loggers",
        path="src/anywool/runtime/_output.py",
        old="        if level != logging.NOTSET and level < lowest:",
        new="        if False:",
        tests=(RECORDS,),
        why="README: DEBUG once any logger here is set to DEBUG",
    ),
    Mutation(
        name="output-off-switch-lowers-the-workers-level",
        path="src/anywool/runtime/pool/_pool.py",
        old="""        if not self._forward_output:
            return None
""",
        new="",
        tests=(LEVELS,),
        why="README: with forward_output=False a worker keeps its own level (WARNING)",
    ),
    Mutation(
        name="output-host-keeps-its-own-level",
        path="src/anywool/cli/_worker_command.py",
        old="    _output_level = logging.NOTSET",
        new="    _output_level = None",
        tests=(HOST,),
        why="README: an anywool worker host passes every level",
    ),
]
