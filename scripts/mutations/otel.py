"""Mutations of the OpenTelemetry instrumentation (issue 23, items 2 and 3): the trace context
a call carries, the worker's span attached as the call's parent context, a failure's status,
a metric recorded, and OpenTelemetry left unimported when nobody configured it."""

from mutate import Mutation

_TELEMETRY = "src/anywool/runtime/_telemetry.py"
_CONNECTION = "src/anywool/runtime/_connection.py"
_TESTS = "tests/integration/test_telemetry.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="otel-traceparent-not-sent",
        path=_CONNECTION,
        old="""            trace=trace,
        )""",
        new="""            trace=None,
        )""",
        tests=(f"{_TESTS}::test_nested_calls_build_one_trace_across_processes",),
        why="issue 23: the W3C trace context travels in every call",
    ),
    Mutation(
        name="otel-server-span-not-attached",
        path=_TELEMETRY,
        old="""            self.token = telemetry.attach(telemetry.in_context(span, parent))""",
        new="""            self.token = None""",
        tests=(f"{_TESTS}::test_nested_calls_build_one_trace_across_processes",),
        why="issue 23: nested calls build one tree (the server span is the routine's context)",
    ),
    Mutation(
        name="otel-error-status-missing",
        path=_TELEMETRY,
        old="""    span.set_status(telemetry.Status(telemetry.error, f"{kind}: {message}"[:500]))""",
        new="""    pass""",
        tests=(f"{_TESTS}::test_failure_sets_error_status_on_both_sides",),
        why="issue 23: a failed call's server span has status ERROR",
    ),
    Mutation(
        name="otel-server-duration-not-recorded",
        path=_TELEMETRY,
        old="""            telemetry.server_duration.record(time.perf_counter() - self.start, attributes)""",
        new="""            pass""",
        tests=(f"{_TESTS}::test_nested_calls_build_one_trace_across_processes",),
        why="issue 23: rpc.server.call.duration per call",
    ),
    Mutation(
        name="otel-refusal-not-counted",
        path=_TELEMETRY,
        old="""            self.refusals.add(1, _metric_attributes(call and call.name, attributes))""",
        new="""            pass""",
        tests=(f"{_TESTS}::test_busy_refusal_is_counted",),
        why="issue 23: admission refusals are a metric",
    ),
    Mutation(
        name="otel-imported-when-absent-check-skipped",
        path=_TELEMETRY,
        old="""        if "opentelemetry.trace" not in _modules:
            return None
        trace = _bind()""",
        new="""        try:
            trace = _bind()
        except ImportError:
            return None""",
        tests=(f"{_TESTS}::test_without_opentelemetry_calls_work_and_nothing_is_imported",),
        why="issue 23: OpenTelemetry absent (or unused): nothing of it is imported",
    ),
    Mutation(
        name="otel-cancellation-event-missing",
        path=_TELEMETRY,
        old="""            if self.span is not None:
                self.span.add_event(CANCELLED_EVENT)""",
        new="""            pass""",
        tests=(f"{_TESTS}::test_remote_cancellation_is_an_event_on_both_sides",),
        why="issue 23: a remote cancellation is an event on the worker's span",
    ),
    Mutation(
        name="otel-context-sent-without-provider",
        path=_CONNECTION,
        old="""        client, trace = (None, None) if _telemetry.state is None else _telemetry.sending(""",
        new="""        client, trace = (None, {
            "traceparent": "00-0000000000000000000000000000abcd-00000000000000ab-01"}
        ) if _telemetry.state is None else _telemetry.sending(""",
        tests=(f"{_TESTS}::test_no_trace_context_is_sent_without_a_provider",),
        why="issue 23: leave trace nil when there is nothing to carry",
    ),
    Mutation(
        name="otel-step-context-not-carried",
        path=_CONNECTION,
        old="""        trace = None if self.telemetry is None else self.telemetry.carry_step()""",
        new="""        trace = None""",
        tests=(f"{_TESTS}::test_each_step_carries_the_callers_baggage",),
        why="issue 23: the trace context travels in every generator step",
    ),
    Mutation(
        name="otel-unprintable-exception-raises",
        path=_TELEMETRY,
        old="""    try:
        message = str(exc)
    except Exception:""",
        new="""    try:
        span.record_exception(exc)
        message = str(exc)
    except ZeroDivisionError:""",
        tests=(f"{_TESTS}::test_an_exception_whose_str_raises_is_recorded_not_replaced",),
        why="an exception whose str() raises reaches the caller as itself, its spans say it "
            "failed (the SDK's record_exception calls str())",
    ),
    Mutation(
        name="otel-server-counted-before-its-span-starts",
        path="src/anywool/runtime/_telemetry.py",
        old="""        key = self.key = (name, namespace)
        self.span = self.token = None""",
        new="""        key = self.key = (name, namespace)
        _server_active[key] = _server_active.get(key, 0) + 1
        self.span = self.token = None""",
        tests=("tests/integration/test_telemetry.py::"
               "test_a_call_whose_span_cannot_start_is_not_left_in_flight",),
        why="a call whose SERVER span cannot start is never counted in flight (nothing would "
            "take the count back)",
    ),
]
