"""The trace context anywool writes and reads itself (the default propagator's format, for a
fraction of its cost) and the SERVER span made when first needed: in this process, against the
OpenTelemetry SDK's own propagator and spans."""

from __future__ import annotations

import contextvars
import io
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import baggage, context, propagate, trace  # noqa: E402
from opentelemetry.propagators.composite import CompositePropagator  # noqa: E402
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF  # noqa: E402
from opentelemetry.trace.propagation.tracecontext import (  # noqa: E402
    TraceContextTextMapPropagator,
)
from opentelemetry.util._once import Once  # noqa: E402

from anywool.runtime import _telemetry  # noqa: E402

TRACE_ID, SPAN_ID = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331


def _reset() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


def _configure(provider: TracerProvider) -> _telemetry.Telemetry:
    _reset()
    trace.set_tracer_provider(provider)
    telemetry = _telemetry.current()
    assert telemetry is not None and telemetry.tracer is not None
    return telemetry


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    _configure(provider)
    try:
        yield spans
    finally:
        _reset()
        provider.shutdown()


@pytest.fixture
def telemetry(exporter: InMemorySpanExporter) -> _telemetry.Telemetry:
    current = _telemetry.current()
    assert current is not None
    return current


def _remote(flags: int = 1, state: trace.TraceState | None = None) -> trace.Span:
    return trace.NonRecordingSpan(trace.SpanContext(
        TRACE_ID, SPAN_ID, is_remote=True, trace_flags=trace.TraceFlags(flags),
        trace_state=state))


def _injected(span: trace.Span) -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def test_the_default_propagator_is_recognised(telemetry: _telemetry.Telemetry) -> None:
    assert _telemetry._w3c is propagate.get_global_textmap()


@pytest.mark.parametrize("flags", [0, 1, 3])
def test_carry_writes_what_the_propagator_writes(telemetry: _telemetry.Telemetry,
                                                 flags: int) -> None:
    span = _remote(flags)
    assert telemetry.carry(span) == _injected(span) == {
        "traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-{flags:02x}"}


def test_carry_leaves_trace_state_and_baggage_to_the_propagator(
        telemetry: _telemetry.Telemetry) -> None:
    span = _remote(state=trace.TraceState([("vendor", "v1")]))
    assert telemetry.carry(span) == _injected(span)
    assert telemetry.carry(span)["tracestate"] == "vendor=v1"  # type: ignore[index]
    token = context.attach(baggage.set_baggage("k", "v"))
    try:
        plain = _remote()
        assert telemetry.carry(plain) == _injected(plain)
        assert telemetry.carry(plain)["baggage"] == "k=v"  # type: ignore[index]
    finally:
        context.detach(token)


def test_carry_of_no_valid_span_is_nothing(telemetry: _telemetry.Telemetry) -> None:
    assert telemetry.carry(trace.INVALID_SPAN) is None
    assert telemetry.carry(None) is None  # no current span


@pytest.mark.parametrize("header", [
    f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01",
    f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00",
    f"00-{TRACE_ID:032X}-{SPAN_ID:016x}-01",  # upper case: not the format
    f"00-{0:032x}-{SPAN_ID:016x}-01",  # no trace id
    f"00-{TRACE_ID:032x}-{0:016x}-01",  # no span id
    f"01-{TRACE_ID:032x}-{SPAN_ID:016x}-01-extra",  # a later version, with more
    f"ff-{TRACE_ID:032x}-{SPAN_ID:016x}-01",  # an invalid version
    f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01-",  # version 00 with a tail
    f" 00-{TRACE_ID:032x}-{SPAN_ID:016x}-01",
    f"00-{TRACE_ID:031x}_-{SPAN_ID:016x}-01",
    "",
])
def test_parent_reads_what_the_propagator_reads(telemetry: _telemetry.Telemetry,
                                                header: str) -> None:
    carrier = {"traceparent": header}
    mine = trace.get_current_span(telemetry.parent(carrier)).get_span_context()
    theirs = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    assert (mine.trace_id, mine.span_id, mine.trace_flags, mine.is_remote, mine.is_valid) \
        == (theirs.trace_id, theirs.span_id, theirs.trace_flags, theirs.is_remote,
            theirs.is_valid)


def test_parent_with_baggage_is_the_propagators(telemetry: _telemetry.Telemetry) -> None:
    carrier = {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01", "baggage": "k=v"}
    assert not telemetry.plain(carrier)
    assert baggage.get_baggage("k", telemetry.parent(carrier)) == "v"
    assert telemetry.plain({"traceparent": carrier["traceparent"]}) and telemetry.plain(None)


def test_another_propagator_is_used_as_it_is(telemetry: _telemetry.Telemetry) -> None:
    class Marked(TraceContextTextMapPropagator):
        def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
            super().inject(carrier, context)
            carrier["marked"] = "yes"

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([Marked()]))
    try:
        carried = telemetry.carry(_remote())
        assert carried is not None and carried["marked"] == "yes"
        assert not telemetry.plain({"traceparent": carried["traceparent"]})
    finally:
        propagate.set_global_textmap(before)


def _server_span(exporter: InMemorySpanExporter, name: str) -> Any:
    [span] = [span for span in exporter.get_finished_spans() if span.name == name]
    return span


def test_the_server_span_is_made_when_needed_and_dated_back(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    before = time.time_ns()
    call = telemetry.server("deferred", "coroutine",
                            {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"})
    current = trace.get_current_span()
    assert current is call.span and not call.span.made()  # type: ignore[attr-defined]
    time.sleep(0.05)  # the work the span covers
    made = time.time_ns()
    child = trace.get_tracer("test").start_span("child")  # needs its parent: made now
    assert call.span.made()  # type: ignore[attr-defined]
    child.end()
    call.finish()
    span = _server_span(exporter, "deferred")
    assert before <= span.start_time < made - 40_000_000  # the call's start, not the making
    assert span.parent is not None and span.parent.span_id == SPAN_ID
    assert span.context.trace_id == TRACE_ID and span.kind is trace.SpanKind.SERVER
    assert _server_span(exporter, "child").parent.span_id == span.context.span_id
    assert trace.get_current_span() is not call.span  # detached at the end


def test_an_untouched_server_span_is_made_at_the_end(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    call = telemetry.server("quiet", "generator", None)
    assert exporter.get_finished_spans() == ()
    call.finish()
    span = _server_span(exporter, "quiet")
    assert span.parent is None  # no caller's context: a root, not a child of this context
    assert span.attributes["anywool.call.kind"] == "generator"
    assert span.attributes["rpc.method"] == "quiet"


class _SlowStart(SpanProcessor):
    """Takes its time in ``on_start`` (the GIL released): threads that need the same deferred
    span meanwhile would each make one, were they not kept out."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        time.sleep(0.02)


def test_a_root_span_needed_during_the_call_is_a_root(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    # Made while the call's context is current (which holds the deferred span itself): its
    # parent must not be looked up there. In a thread of its own, bounded, should it wedge.
    call = telemetry.server("rooted", "coroutine", None)
    made: list[Any] = []
    thread = threading.Thread(target=contextvars.copy_context().run, args=(
        lambda: made.append(trace.get_current_span().get_span_context()),), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "making the span wedged"
    call.finish()
    span = _server_span(exporter, "rooted")
    assert span.parent is None and made == [span.context]


def test_the_server_span_is_made_once_across_threads(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    trace.get_tracer_provider().add_span_processor(_SlowStart())  # type: ignore[attr-defined]
    call = telemetry.server("shared", "coroutine", None)
    barrier = threading.Barrier(8)
    seen: list[int] = []

    def touch() -> None:
        barrier.wait()
        seen.append(call.span.get_span_context().span_id)  # type: ignore[union-attr]

    threads = [threading.Thread(target=touch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    call.finish()
    assert len(seen) == 8 and len(set(seen)) == 1
    assert len([span for span in exporter.get_finished_spans() if span.name == "shared"]) == 1


def test_an_unsampled_call_makes_no_recorded_span() -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = _configure(provider)
    try:
        call = telemetry.server("unsampled", "coroutine", None)
        assert not trace.get_current_span().is_recording()
        call.finish()
        assert spans.get_finished_spans() == ()
    finally:
        _reset()
        provider.shutdown()


class _RaisesOnStart(SpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("a broken span processor")


def test_a_span_that_cannot_start_leaves_the_call_untraced(
        caplog: pytest.LogCaptureFixture) -> None:
    # A span processor that raises on start: the calls go on untraced, each says so once, and
    # neither side leaves a call counted in flight.
    provider = TracerProvider()
    provider.add_span_processor(_RaisesOnStart())
    telemetry = _configure(provider)
    try:
        client_before, server_before = dict(_telemetry._client_active), \
            dict(_telemetry._server_active)
        with caplog.at_level(logging.WARNING, "anywool.telemetry"):
            server = telemetry.server("doomed", "coroutine", None)
            assert not trace.get_current_span().get_span_context().is_valid
            server.failed(LookupError("still reported"))
            server.finish()
            client = telemetry.client("doomed", "coroutine", None)
            with client.attached(finish=True):
                assert client.send(1, {}) is None  # nothing to carry
        messages = [record.getMessage() for record in caplog.records]
        assert messages == ["the span of a call to doomed could not be started; the call goes "
                            "on without it"] * 2
        assert _telemetry._client_active == {**client_before, ("doomed", None): 0}
        assert _telemetry._server_active == {**server_before, ("doomed", None): 0}
    finally:
        _reset()
        provider.shutdown()


def _bounded(target: Any) -> list[Any]:
    """``target()``'s value, run in a thread of its own (in this context) and bounded: a wedge
    fails the test instead of hanging it."""
    done: list[Any] = []
    thread = threading.Thread(target=contextvars.copy_context().run,
                              args=(lambda: done.append(target()),), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "making the span wedged"
    return done


class _LooksAtTheCurrentSpan(logging.Filter):
    """What log correlation does (opentelemetry-instrumentation-logging's record factory, the
    SDK's LoggingHandler): each record reads the current span."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen.append(trace.get_current_span().get_span_context())
        return True


def test_a_log_record_written_while_the_span_is_made_does_not_wedge_it() -> None:
    # The warning of a span that cannot start is written while the span is being made, in
    # the call's context: a filter reading the current span there re-enters the making.
    provider = TracerProvider()
    provider.add_span_processor(_RaisesOnStart())
    telemetry = _configure(provider)
    correlate = _LooksAtTheCurrentSpan()
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(correlate)
    logger = logging.getLogger("anywool.telemetry")
    logger.addHandler(handler)
    try:
        call = telemetry.server("logged", "coroutine", None)
        assert _bounded(lambda: trace.get_current_span().is_recording()) == [False]
        call.finish()
        assert correlate.seen and not any(seen.is_valid for seen in correlate.seen)
    finally:
        logger.removeHandler(handler)
        _reset()
        provider.shutdown()


class _ReadsTheCurrentSpan(SpanProcessor):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.seen.append(trace.get_current_span().get_span_context())


def test_a_span_processor_reading_the_current_span_while_it_is_made(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    reads = _ReadsTheCurrentSpan()
    trace.get_tracer_provider().add_span_processor(reads)  # type: ignore[attr-defined]
    call = telemetry.server("read", "coroutine", None)
    [made] = _bounded(lambda: trace.get_current_span().get_span_context())
    call.finish()
    assert made.is_valid and made == _server_span(exporter, "read").context
    assert reads.seen == [trace.INVALID_SPAN_CONTEXT]  # none yet: it was being made


def test_the_sdk_spans_own_attributes_are_read_through(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    # A routine reading what the SDK's span has beyond the API's (its name, attributes, ...)
    # read it before the span was deferred; and using it as a context manager is the SDK's.
    call = telemetry.server("read_through", "coroutine",
                            {"traceparent": f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"})
    current: Any = trace.get_current_span()
    assert current.name == "read_through" and current.kind is trace.SpanKind.SERVER
    assert current.attributes["rpc.method"] == "read_through"
    assert current.parent.span_id == SPAN_ID
    assert current.context == current.get_span_context()
    with pytest.raises(AttributeError):
        current.no_such_thing  # noqa: B018
    with pytest.raises(LookupError), current:
        raise LookupError("in the span")
    call.finish()
    span = _server_span(exporter, "read_through")
    assert span.status.status_code is trace.StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]


def test_a_propagator_writing_the_same_fields_is_not_taken_for_the_default(
        telemetry: _telemetry.Telemetry, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.baggage.propagation import W3CBaggagePropagator

    class Vendor(TraceContextTextMapPropagator):
        """A vendor's trace context: the same fields, its own entry in every tracestate."""

        def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
            super().inject(carrier, context)
            carrier["tracestate"] = "vendor=v1"

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([Vendor(), W3CBaggagePropagator()]))
    try:
        monkeypatch.setattr(_telemetry, "_trace", None)  # bound again, with this propagator
        monkeypatch.setattr(_telemetry, "_w3c", None)
        current = _telemetry.current()
        assert current is not None and _telemetry._w3c is None
        assert current.carry(_remote()) == _injected(_remote())
        assert current.carry(_remote())["tracestate"] == "vendor=v1"  # type: ignore[index]
    finally:
        propagate.set_global_textmap(before)


def test_a_bare_parent_gives_the_routine_the_callers_context_alone(
        telemetry: _telemetry.Telemetry, exporter: InMemorySpanExporter) -> None:
    # What the worker's task has in its context (baggage its setup attached, say) is not the
    # routine's when the caller sent its context, whether that carries baggage or not.
    parent = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    token = context.attach(baggage.set_baggage("ambient", "worker"))
    try:
        for carrier, seen in (({"traceparent": parent}, {}),
                              ({"traceparent": parent, "baggage": "k=v"}, {"k": "v"}),
                              (None, {"ambient": "worker"})):
            call = telemetry.server("alone", "coroutine", carrier)
            try:
                assert dict(baggage.get_all()) == seen
            finally:
                call.finish()
        spans = [span for span in exporter.get_finished_spans() if span.name == "alone"]
        assert [span.parent and span.parent.span_id for span in spans] == [SPAN_ID, SPAN_ID,
                                                                          None]
    finally:
        context.detach(token)
