"""Mutations of the OpenTelemetry instrumentation (issue 23, items 2 and 3): the trace context
a call carries, the worker's span attached as the call's parent context, a failure's status,
a metric recorded, and OpenTelemetry left unimported when nobody configured it."""

from mutate import Mutation

_TELEMETRY = "src/anywool/runtime/_telemetry.py"
_CONNECTION = "src/anywool/runtime/client/_connection.py"
_CALL = "src/anywool/runtime/client/_call.py"
_TESTS = "tests/integration/test_telemetry.py"
_UNIT = "tests/unit/test_telemetry_context.py"

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
        old="""            self.token = telemetry.attach(telemetry.in_context(span, base))""",
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
        path=_CALL,
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
        name="otel-span-start-failure-fails-the-call",
        path=_TELEMETRY,
        old="""                except Exception:
                    _failed_to_start(name)
                    return telemetry.invalid_span""",
        new="""                except ZeroDivisionError:
                    _failed_to_start(name)
                    return telemetry.invalid_span""",
        tests=(f"{_UNIT}::test_a_span_that_cannot_start_leaves_the_call_untraced",),
        why="a span processor that raises on start leaves the call untraced, not failed",
    ),
    Mutation(
        name="otel-server-span-not-dated-back",
        path=_TELEMETRY,
        old="""                        start_time=started_ns, attributes={""",
        new="""                        attributes={""",
        tests=(f"{_UNIT}::test_the_server_span_is_made_when_needed_and_dated_back",
               f"{_TESTS}::test_nested_calls_build_one_trace_across_processes"),
        why="the worker's span, made when first needed, starts at the call's start",
    ),
    Mutation(
        name="otel-server-span-made-at-once",
        path=_TELEMETRY,
        old="""            span = self.span = telemetry.Deferred(make)""",
        new="""            span = self.span = telemetry.Deferred(make)
            span.real()""",
        tests=(f"{_UNIT}::test_the_server_span_is_made_when_needed_and_dated_back",),
        why="the worker's span is made when first needed: a routine that never looks at it "
            "has its reply sent before the SDK's work",
    ),
    Mutation(
        name="otel-server-span-made-twice",
        path=_TELEMETRY,
        old="""                with self._lock:
                    span = self._span
                    if span is None:""",
        new="""                if True:
                    if True:""",
        tests=(f"{_UNIT}::test_the_server_span_is_made_once_across_threads",),
        why="the deferred span is made once, whichever thread needs it first",
    ),
    Mutation(
        name="otel-fast-traceparent-ignores-baggage",
        path=_TELEMETRY,
        old="""            if not context.trace_state and not self.baggage():""",
        new="""            if not context.trace_state:""",
        tests=(f"{_UNIT}::test_carry_leaves_trace_state_and_baggage_to_the_propagator",
               f"{_TESTS}::test_each_step_carries_the_callers_baggage"),
        why="the caller's baggage travels with every call and step",
    ),
    Mutation(
        name="otel-fast-traceparent-loose-parse",
        path=_TELEMETRY,
        old="""_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")""",
        new="""_TRACEPARENT = re.compile(r"..-([0-9a-fA-F]{32})-([0-9a-f]{16})-([0-9a-f]{2}).*")""",
        tests=(f"{_UNIT}::test_parent_reads_what_the_propagator_reads",),
        why="a traceparent is read as the default propagator reads it, no looser",
    ),
    Mutation(
        name="otel-fast-path-with-another-propagator",
        path=_TELEMETRY,
        old="""        if w3c is not None and self.textmap() is w3c:
            context = (self.current_span() if span is None else span).get_span_context()""",
        new="""        if w3c is not None:
            context = (self.current_span() if span is None else span).get_span_context()""",
        tests=(f"{_UNIT}::test_another_propagator_is_used_as_it_is",),
        why="a propagator set by the user writes the trace context, not anywool",
    ),
    Mutation(
        name="otel-deferred-span-reentry-waits",
        path=_TELEMETRY,
        old="""                if self._maker == me:""",
        new="""                if False:""",
        tests=(f"{_UNIT}::test_a_log_record_written_while_the_span_is_made_does_not_wedge_it",
               f"{_UNIT}::test_a_span_processor_reading_the_current_span_while_it_is_made"),
        why="what the making of the deferred span runs (a log filter, a span processor) may "
            "read the current span: that must not wait for the making",
    ),
    Mutation(
        name="otel-sdk-span-attributes-not-read-through",
        path=_TELEMETRY,
        old="""            return getattr(self.real(), name)""",
        new="""            raise AttributeError(name)""",
        tests=(f"{_UNIT}::test_the_sdk_spans_own_attributes_are_read_through",),
        why="a routine reads the SDK span's name and attributes as it did before the span was "
            "deferred",
    ),
    Mutation(
        name="otel-default-propagator-recognised-by-its-fields",
        path=_TELEMETRY,
        old="""            and [type(part) for part in getattr(textmap, "_propagators", ())] \\
            == [TraceContextTextMapPropagator, W3CBaggagePropagator] \\
            and set(textmap.fields) == _W3C_FIELDS:""",
        new="""            and set(textmap.fields) == _W3C_FIELDS:""",
        tests=(f"{_UNIT}::test_a_propagator_writing_the_same_fields_is_not_taken_for_the_default",),
        why="a vendor's propagator writing the same fields is used, not the fast path",
    ),
    Mutation(
        name="otel-bare-parent-keeps-the-workers-context",
        path=_TELEMETRY,
        old="""            base = parent if parent is not None or trace is None else telemetry.Context()""",
        new="""            base = parent""",
        tests=(f"{_UNIT}::test_a_bare_parent_gives_the_routine_the_callers_context_alone",),
        why="a call with the caller's trace context runs in that context alone, baggage or not",
    ),
]
