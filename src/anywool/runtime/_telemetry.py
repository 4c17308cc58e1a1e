"""anywool's OpenTelemetry instrumentation: spans, trace-context propagation and metrics.

Everything here goes through the OpenTelemetry API (``opentelemetry-api``, the ``otel`` extra)
and only once somebody else has imported it: configuring an SDK imports it, and until then
there is nothing to record and nothing is imported. :func:`current` says, at the cost of a few
attribute reads, whether a tracer or meter provider is configured now; the hooks the runtime
calls on its hot path are guarded by it (or by :data:`state`, what it last found), so with
OpenTelemetry absent, or present without a provider, a call costs next to nothing more. A
provider set later is seen at the next call.

How a provider is recognised: the API keeps the global providers in module globals
(``opentelemetry.trace._TRACER_PROVIDER``, ``opentelemetry.metrics._internal._METER_PROVIDER``)
that stay ``None`` until one is set. Reading them costs about 20 ns, where the public
``get_tracer_provider()`` costs about 2 µs (it looks in ``os.environ`` on every call). Should a
later API drop them, the public functions are used instead.

What a call records (names in the README, "Tracing and metrics"):

* a CLIENT span per call at the caller (a stream: one span from its first step to its end),
  child of the caller's current span; it starts when the call is sent, dated back to the
  dispatch (waits for a worker included), and is never made current in the caller's task:
  the CALL carries it explicitly as the W3C trace context (``traceparent``, ``tracestate``,
  ``baggage``); each step of a stream carries the stream's span with the caller's baggage at
  that step;
* a SERVER span per call in the worker, child of the carried context, current in the call's
  own task (contextvars: asyncio and trio alike) for the whole call, so the calls a routine
  makes are its children; a generator's step runs with the server span current and that
  step's baggage. The SDK's span is made when first needed (a child span, the routine reading
  it, a failure, the call's end: see :class:`_Deferred`), dated back to the call's start: a
  routine that never looks at it has its reply sent before the SDK's work is done (that work
  is most of what tracing adds to a round trip; measured in ``benchmarks/observability.py``);
* the trace context in the W3C format, written and read here when the global propagator is
  OpenTelemetry's default (trace context and baggage) and there is no baggage or trace state
  to carry, through the propagator otherwise;
* the durations, calls in flight, busy refusals, queue waits, workers by state and discovery
  events as metrics.

What this module must never do: import ``opentelemetry`` by itself, or hold a span's context
across a ``yield``. (A span processor or exporter that raises is the SDK's to contain; the
SDK's own processors log.)
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from anywool._version import __version__

#: The system name of the RPC semantic conventions.
SYSTEM = "anywool"
#: The event added to a call's spans when its caller cancelled it.
CANCELLED_EVENT = "anywool.cancelled"

# Histogram bucket boundaries (seconds): calls take from tens of microseconds to minutes.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_MISSING = object()
# A traceparent as the default propagator reads it in full (version 00, lower-case hex).
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})

log = logging.getLogger("anywool.telemetry")

_modules = sys.modules
# The API modules, once somebody imported opentelemetry.trace: (trace, metrics internals).
_trace: Any = None
_metrics: Any = None
_seen: tuple[object, object] = (None, None)  # the providers `state` was made for
# The global propagator when it was OpenTelemetry's default one at _bind (``None`` otherwise):
# while it is still the global one, the trace context is written and read here (see carry()).
_w3c: Any = None

#: What :func:`current` last found: the instrumentation of the configured providers, or
#: ``None`` (nothing configured, or OpenTelemetry not imported).
state: Telemetry | None = None

#: The worker's own span attributes (``anywool.worker.uid``, ``anywool.namespace``), set at the
#: worker's start (see :func:`set_worker`).
worker: dict[str, str] = {}

# The client call the current task is making (set around a dispatch).
_client: ContextVar[ClientCall | None] = ContextVar("anywool_client_call", default=None)

# The proxies whose workers are counted by the workers gauge (see watch()).
_proxies: set[Any] = set()
# Calls in flight by (routine, namespace), at the caller and in the worker: plain counts that
# the metric reader observes (an UpDownCounter's add costs as much as a histogram's record).
_client_active: dict[tuple[str, str | None], int] = {}
_server_active: dict[tuple[str, str | None], int] = {}


def current() -> Telemetry | None:
    """The instrumentation to record with now, or ``None`` when no tracer or meter provider is
    configured (or OpenTelemetry was never imported): cheap enough for every call."""
    trace = _trace
    if trace is None:
        if "opentelemetry.trace" not in _modules:
            return None
        trace = _bind()
    seen = _seen
    tracer_provider = getattr(trace, "_TRACER_PROVIDER", _MISSING)
    meter_provider = getattr(_metrics, "_METER_PROVIDER", _MISSING)
    if tracer_provider is seen[0] and meter_provider is seen[1] \
            and tracer_provider is not _MISSING:
        return state
    return _refresh(tracer_provider, meter_provider)


def _bind() -> Any:
    global _trace, _metrics, _w3c
    from opentelemetry import propagate, trace
    from opentelemetry.metrics import _internal as metrics

    # Providers named in OTEL_PYTHON_*_PROVIDER are loaded by the first get_*_provider().
    trace.get_tracer_provider()
    metrics.get_meter_provider()
    # The default propagator: trace context and baggage, unless $OTEL_PROPAGATORS said
    # otherwise (what it loads is then somebody else's format) or it was replaced already.
    # Recognised by its parts' exact classes, not by the fields they write: a propagator of
    # somebody else's that writes `traceparent` (a vendor's subclass stamping its tracestate,
    # say) is used as it is.
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    configured = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage")
    textmap = propagate.get_global_textmap()
    if [name.strip() for name in configured.split(",")] == ["tracecontext", "baggage"] \
            and type(textmap) is CompositePropagator \
            and [type(part) for part in getattr(textmap, "_propagators", ())] \
            == [TraceContextTextMapPropagator, W3CBaggagePropagator] \
            and set(textmap.fields) == _W3C_FIELDS:
        _w3c = textmap
    _metrics = metrics
    _trace = trace
    return trace


def _refresh(tracer_provider: object, meter_provider: object) -> Telemetry | None:
    global state, _seen
    from opentelemetry import metrics, trace

    tracer = meter = None
    provider: Any = (trace.get_tracer_provider() if tracer_provider is _MISSING
                     else tracer_provider)
    if provider is not None and not isinstance(
            provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        tracer = provider.get_tracer("anywool", __version__)
    provider = metrics.get_meter_provider() if meter_provider is _MISSING else meter_provider
    if provider is not None and not isinstance(provider, metrics.NoOpMeterProvider) \
            and type(provider).__name__ != "_ProxyMeterProvider":
        meter = provider.get_meter("anywool", __version__)
    state = None if tracer is None and meter is None else Telemetry(tracer, meter)
    _seen = (tracer_provider, meter_provider)
    return state


def set_worker(uid: str | None, namespace: str | None) -> None:
    """Say who this worker process is, for its SERVER spans (at the worker's start)."""
    worker.clear()
    if uid:
        worker["anywool.worker.uid"] = uid
    if namespace is not None:
        worker["anywool.namespace"] = namespace


def watch(proxy: Any, watching: bool = True) -> None:
    """Count ``proxy``'s workers in the workers gauge (until called with ``watching=False``);
    ``proxy`` provides ``_telemetry_counts() -> (namespace, {state: count})``."""
    if watching:
        _proxies.add(proxy)
    else:
        _proxies.discard(proxy)


def error_type(exc: BaseException) -> str:
    """The ``error.type`` of ``exc``: its class's qualified name, with its module unless a
    builtin."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _is_cancellation(exc: BaseException) -> bool:
    import anyio

    try:
        return isinstance(exc, anyio.get_cancelled_exc_class())
    except Exception:  # no event loop here (not expected)
        return False


# -- the hooks on the hot path (each called only when `state` is not None) ---------------------


def sending(call_id: int, attributes: Mapping[str, str]
            ) -> tuple[ClientCall | None, dict[str, str] | None]:
    """A call about to go as ``call_id`` to the worker ``attributes`` describe: the client
    call the current task makes, if any (told where it goes), and the trace context the call
    carries (``None``: nothing to carry)."""
    client = _client.get()
    if client is not None:
        return client, client.send(call_id, attributes)
    telemetry = state  # a bare connection's call: the current context, if traced
    if telemetry is None or telemetry.tracer is None:
        return None, None
    return None, telemetry.carry(None)


class Telemetry:
    """The instruments of one configured pair of providers (either may be missing)."""

    def __init__(self, tracer: Any, meter: Any) -> None:
        from opentelemetry import baggage, context, propagate, trace

        self.tracer = tracer
        self.meter = meter
        self.inject = propagate.inject
        self.extract = propagate.extract
        self.textmap = propagate.get_global_textmap
        self.baggage = baggage.get_all
        self.attach = context.attach
        self.detach = context.detach
        self.Context = context.Context
        self.in_context = trace.set_span_in_context
        self.current_span = trace.get_current_span
        self.SpanContext = trace.SpanContext
        self.TraceFlags = trace.TraceFlags
        self.NonRecordingSpan = trace.NonRecordingSpan
        self.invalid_span = trace.INVALID_SPAN
        self.Deferred: Any = _deferred_class(trace.Span, trace.INVALID_SPAN)
        self.client_kind = trace.SpanKind.CLIENT
        self.server_kind = trace.SpanKind.SERVER
        self.error = trace.StatusCode.ERROR
        self.Status = trace.Status
        if meter is None:
            return
        self.client_duration = _histogram(
            meter, "rpc.client.call.duration", "Duration of calls, at the caller.")
        self.server_duration = _histogram(
            meter, "rpc.server.call.duration", "Duration of calls, in the worker.")
        self.queue_wait = _histogram(
            meter, "anywool.client.call.queue_wait",
            "How long a call waited in the worker between its frame being read and its start "
            "(what the worker's ACK reports).")
        meter.create_observable_up_down_counter(
            "anywool.client.call.active", callbacks=[_observer(_client_active)], unit="{call}",
            description="Calls in flight, at the caller.")
        meter.create_observable_up_down_counter(
            "anywool.server.call.active", callbacks=[_observer(_server_active)], unit="{call}",
            description="Calls in flight, in the worker.")
        self.refusals = meter.create_counter(
            "anywool.client.call.refused", unit="{call}",
            description="Calls a worker refused because it ran its max_concurrency calls.")
        self.discovery_events = meter.create_counter(
            "anywool.discovery.events", unit="{event}",
            description="Discovery events a proxy consumed.")
        meter.create_observable_up_down_counter(
            "anywool.workers", callbacks=[_observe_workers], unit="{worker}",
            description="Workers a proxy sees, by namespace and state.")

    def client(self, name: str, kind: str, namespace: str | None) -> ClientCall:
        return ClientCall(self, name, kind, namespace)

    def server(self, name: str, kind: str, trace: dict[str, str] | None) -> ServerCall:
        return ServerCall(self, name, kind, trace)

    def carry(self, span: Any) -> dict[str, str] | None:
        """The trace context that carries ``span`` (``None``: the current span) with the
        current baggage; ``None`` when there is nothing to carry.

        With the default propagator, no trace state and no baggage (the usual case) the
        ``traceparent`` is written here, as that propagator would write it, for a fraction of
        its cost."""
        w3c = _w3c
        if w3c is not None and self.textmap() is w3c:
            context = (self.current_span() if span is None else span).get_span_context()
            if not context.trace_state and not self.baggage():
                if not context.is_valid:
                    return None
                return {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                                       f"{context.trace_flags:02x}"}
        carrier: dict[str, str] = {}
        self.inject(carrier, context=None if span is None else self.in_context(span))
        return carrier or None

    def parent(self, carrier: dict[str, str]) -> Any:
        """The context ``carrier`` (a call's or a step's trace context) describes: the remote
        parent span and its baggage."""
        w3c = _w3c
        if w3c is not None and len(carrier) == 1 and self.textmap() is w3c:
            match = _TRACEPARENT.fullmatch(carrier.get("traceparent", ""))
            if match is not None:
                trace_id, span_id, flags = match.groups()
                context = self.SpanContext(int(trace_id, 16), int(span_id, 16), True,
                                           self.TraceFlags(int(flags, 16)))
                if context.is_valid:
                    return self.in_context(self.NonRecordingSpan(context), self.Context())
        return self.extract(carrier)  # anything else: as the propagator reads it

    def plain(self, carrier: dict[str, str] | None) -> bool:
        """Whether ``carrier`` holds a parent span and nothing a routine could read (no
        baggage): its context can wait until the span is made."""
        return carrier is None or (len(carrier) == 1 and _w3c is not None
                                   and self.textmap() is _w3c and "traceparent" in carrier)

    def refused(self, call: Any, attributes: Mapping[str, str] | None) -> None:
        """A worker refused ``call`` (a connection's ``Call``, if it is still known) as
        busy."""
        if self.meter is not None:
            self.refusals.add(1, _metric_attributes(call and call.name, attributes))
        client = None if call is None else call.telemetry
        if client is not None and client.span is not None:
            client.span.add_event("anywool.refused", dict(attributes or {}))

    def waited(self, seconds: float, name: str, attributes: Mapping[str, str] | None) -> None:
        if self.meter is not None:
            self.queue_wait.record(seconds, _metric_attributes(name, attributes))

    def discovery_event(self, namespace: str | None, event: str) -> None:
        if self.meter is not None:
            attributes = {"anywool.discovery.event": event}
            if namespace is not None:
                attributes["anywool.namespace"] = namespace
            self.discovery_events.add(1, attributes)


def _histogram(meter: Any, name: str, description: str) -> Any:
    try:
        return meter.create_histogram(name, unit="s", description=description,
                                      explicit_bucket_boundaries_advisory=list(_BUCKETS))
    except TypeError:  # an API before 1.23: the SDK's default buckets
        return meter.create_histogram(name, unit="s", description=description)


def _metric_attributes(name: str | None, attributes: Mapping[str, str] | None
                       ) -> dict[str, str]:
    result = {"rpc.system.name": SYSTEM}
    if name is not None:
        result["rpc.method"] = name
    if attributes is not None and "anywool.namespace" in attributes:
        result["anywool.namespace"] = attributes["anywool.namespace"]
    return result


def _observer(counts: dict[tuple[str, str | None], int]) -> Any:
    def observe(options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        observations = []
        for (name, namespace), count in dict(counts).items():  # copied atomically
            attributes = {"rpc.system.name": SYSTEM, "rpc.method": name}
            if namespace is not None:
                attributes["anywool.namespace"] = namespace
            observations.append(Observation(count, attributes))
        return observations

    return observe


def _observe_workers(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    totals: dict[tuple[str | None, str], int] = {}
    for proxy in tuple(_proxies):  # tuple(set) copies atomically: the loop may add meanwhile
        namespace, counts = proxy._telemetry_counts()
        for name, count in counts.items():
            key = (namespace, name)
            totals[key] = totals.get(key, 0) + count
    observations = []
    for (namespace, name), count in totals.items():
        attributes = {"anywool.worker.state": name}
        if namespace is not None:
            attributes["anywool.namespace"] = namespace
        observations.append(Observation(count, attributes))
    return observations


class ClientCall:
    """One call at the caller: its CLIENT span (when tracing), its duration and in-flight
    count (when metering).

    The span starts when the call is first sent (:meth:`send`, from the connection, which
    knows the worker and the call id), dated back to this object's creation so that it covers
    the wait for a worker too; it is never made current in the caller's task (nothing runs
    there meanwhile: the call's context travels explicitly). A coroutine's call is a context
    manager around its dispatch (:meth:`attached` with ``finish``); a stream is finished by
    whoever drives it (:meth:`finish`).
    """

    __slots__ = ("telemetry", "span", "start", "started_ns", "name", "kind", "attributes",
                 "key", "finished")

    def __init__(self, telemetry: Telemetry, name: str, kind: str, namespace: str | None) -> None:
        self.telemetry = telemetry
        self.finished = False
        self.name = name
        self.kind = kind
        attributes = self.attributes = {"rpc.system.name": SYSTEM, "rpc.method": name}
        if namespace is not None:
            attributes["anywool.namespace"] = namespace
        key = self.key = (name, namespace)
        _client_active[key] = _client_active.get(key, 0) + 1
        self.span: Any = None
        self.started_ns = time.time_ns()
        self.start = time.perf_counter()

    def attached(self, *, finish: bool = False) -> _Attached:
        """A context manager making this the call the current task makes (for the connection,
        see :func:`sending`); with ``finish``, the call ends with it."""
        return _Attached(self, finish)

    def _start(self, attributes: Mapping[str, Any]) -> Any:
        telemetry = self.telemetry
        try:
            span = telemetry.tracer.start_span(
                self.name, kind=telemetry.client_kind, start_time=self.started_ns,
                attributes={**self.attributes, "anywool.call.kind": self.kind, **attributes})
        except Exception:  # a span processor that raises: the call goes on untraced
            _failed_to_start(self.name)
            span = telemetry.invalid_span
        self.span = span
        return span

    def send(self, call_id: int, attributes: Mapping[str, str]) -> dict[str, str] | None:
        """The trace context of this call, sent now as ``call_id`` to the worker
        ``attributes`` describe (again, after a refusal: its attributes are updated)."""
        telemetry = self.telemetry
        if telemetry.tracer is None:
            return None
        span = self.span
        if span is None:
            span = self._start(attributes)
        else:
            span.set_attributes(attributes)
        return telemetry.carry(span)

    def carry_step(self) -> dict[str, str] | None:
        """The trace context a step of this stream carries: its span, the current baggage."""
        if self.span is None:
            return None
        return self.telemetry.carry(self.span)

    def finish(self, exc: BaseException | None = None) -> None:
        """End the call (once): with ``exc``, it failed (or was cancelled, for a
        cancellation)."""
        if self.finished:
            return
        self.finished = True
        _client_active[self.key] -= 1
        telemetry = self.telemetry
        attributes = self.attributes
        span = self.span
        if span is None and telemetry.tracer is not None:
            span = self._start({})  # never sent: its span says why
        if exc is not None:
            if _is_cancellation(exc):
                if span is not None:
                    span.add_event(CANCELLED_EVENT)
            elif not isinstance(exc, GeneratorExit):
                kind = error_type(exc)
                attributes = {**attributes, "error.type": kind}
                if span is not None:
                    _record_failure(telemetry, span, exc, kind)
        if telemetry.meter is not None:
            telemetry.client_duration.record(time.perf_counter() - self.start, attributes)
        if span is not None:
            span.end()


def _record_failure(telemetry: Telemetry, span: Any, exc: BaseException, kind: str) -> None:
    """Say on ``span`` that its call failed with ``exc`` (of ``error.type`` ``kind``): the
    attribute, the exception as an event, the ERROR status. An exception whose ``str()``
    raises is described without it (the SDK's ``record_exception`` would raise too)."""
    span.set_attribute("error.type", kind)
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
        span.add_event("exception", {
            "exception.type": kind, "exception.message": message,
            "exception.stacktrace": "".join(traceback.format_exception(exc))})
    else:
        span.record_exception(exc)
    span.set_status(telemetry.Status(telemetry.error, f"{kind}: {message}"[:500]))


class _Attached:
    __slots__ = ("client", "finish", "reset")

    def __init__(self, client: ClientCall, finish: bool) -> None:
        self.client = client
        self.finish = finish

    def __enter__(self) -> ClientCall:
        self.reset = _client.set(self.client)
        return self.client

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        _client.reset(self.reset)
        if self.finish or exc is not None:
            self.client.finish(exc)


def _failed_to_start(name: str) -> None:
    log.warning("the span of a call to %s could not be started; the call goes on without it",
                name, exc_info=True)


def _deferred_class(span_class: Any, invalid: Any) -> Any:
    """The class :class:`_Deferred` (made here: its base is the API's ``Span``, imported
    only once somebody else imported OpenTelemetry); ``invalid`` is the API's
    ``INVALID_SPAN``."""

    own = frozenset({"_make", "_span", "_lock", "_maker"})
    get_ident = threading.get_ident

    class Deferred(span_class):  # type: ignore[misc, valid-type]
        __doc__ = _Deferred.__doc__
        __slots__ = ("_make", "_span", "_lock", "_maker")

        def __init__(self, make: Callable[[], Any]) -> None:
            self._make: Callable[[], Any] | None = make
            self._span: Any = None
            self._lock = threading.Lock()  # a routine's threads may reach it too
            self._maker: int | None = None  # the thread making it, meanwhile

        def made(self) -> bool:
            return self._span is not None

        def real(self) -> Any:
            span = self._span
            if span is None:
                me = get_ident()
                if self._maker == me:
                    # Being made by this very thread: what the making runs (a span processor,
                    # the filter of a log record it writes, a signal handler) asked for the
                    # current span, which is this one. There is none yet (waiting for it here
                    # would wait forever).
                    return invalid
                with self._lock:
                    span = self._span
                    if span is None:
                        make = self._make
                        assert make is not None
                        self._maker = me
                        try:
                            span = self._span = make()
                        finally:
                            self._maker = None
                        self._make = None  # what it held can go
            return span

        def __getattr__(self, name: str) -> Any:
            # What the SDK's span has beyond the API's (name, attributes, context, parent,
            # kind, start_time, ...): the span's own, as a routine read it before.
            if name in own or name.startswith("__"):
                raise AttributeError(name)
            return getattr(self.real(), name)

        def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
            # The span's own: the SDK's records the exception and sets the status.
            self.real().__exit__(exc_type, exc_val, exc_tb)

        def get_span_context(self) -> Any:
            return self.real().get_span_context()

        def is_recording(self) -> bool:
            return self.real().is_recording()

        def set_attributes(self, attributes: Any) -> None:
            self.real().set_attributes(attributes)

        def set_attribute(self, key: str, value: Any) -> None:
            self.real().set_attribute(key, value)

        def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
            self.real().add_event(name, attributes, timestamp)

        def add_link(self, context: Any, attributes: Any = None) -> None:
            self.real().add_link(context, attributes)

        def update_name(self, name: str) -> None:
            self.real().update_name(name)

        def set_status(self, status: Any, description: Any = None) -> None:
            self.real().set_status(status, description)

        def record_exception(self, exception: BaseException, attributes: Any = None,
                             timestamp: Any = None, escaped: bool = False) -> None:
            self.real().record_exception(exception, attributes, timestamp, escaped)

        def end(self, end_time: Any = None) -> None:
            self.real().end(end_time)

        def __repr__(self) -> str:
            return f"<deferred {self._span!r}>"

    return Deferred


class _Deferred:
    """A call's SERVER span, made by the SDK when first needed: when a span starts under it,
    the routine reads or changes it (``trace.get_current_span()``), the call fails, or it
    ends; made then with the call's start time, its parent and its attributes, it is the
    span it would have been, its processors' ``on_start`` only later. Until then it costs a
    closure. Made once, under a lock (a routine's threads see it too). A span that cannot be
    made (a processor's ``on_start`` raised) is logged and replaced by a non-recording one:
    the call goes on."""


class ServerCall:
    """One call in the worker: its SERVER span (made when first needed, see
    :class:`_Deferred`), current in the call's task from its creation to :meth:`finish`
    (which must run in that task), and its duration and in-flight count."""

    __slots__ = ("telemetry", "span", "token", "start", "attributes", "key", "cancelled",
                 "failed_as")

    def __init__(self, telemetry: Telemetry, name: str, kind: str,
                 trace: dict[str, str] | None) -> None:
        self.telemetry = telemetry
        self.cancelled = False
        self.failed_as: str | None = None
        attributes = self.attributes = {"rpc.system.name": SYSTEM, "rpc.method": name}
        namespace = worker.get("anywool.namespace")
        if namespace is not None:
            attributes["anywool.namespace"] = namespace
        self.key = (name, namespace)
        self.span = self.token = None
        if telemetry.tracer is not None:
            # A parent with baggage is read now (the routine sees the baggage); a bare parent
            # (or none) when the span is made.
            parent = None if telemetry.plain(trace) else telemetry.parent(trace)  # type: ignore[arg-type]
            started_ns = time.time_ns()
            tracer = telemetry.tracer

            def make() -> Any:
                # Explicit, never the current context: that holds this very span.
                context = parent if parent is not None else telemetry.Context() \
                    if trace is None else telemetry.parent(trace)
                try:
                    return tracer.start_span(
                        name, context=context, kind=telemetry.server_kind,
                        start_time=started_ns, attributes={
                            **attributes, **worker, "anywool.call.kind": kind})
                except Exception:
                    _failed_to_start(name)
                    return telemetry.invalid_span

            span = self.span = telemetry.Deferred(make)
            # With a caller's context, the routine's is that alone (its baggage, none of this
            # task's), read now or not; without one, this task's.
            base = parent if parent is not None or trace is None else telemetry.Context()
            self.token = telemetry.attach(telemetry.in_context(span, base))
        _server_active[self.key] = _server_active.get(self.key, 0) + 1
        self.start = time.perf_counter()

    def step(self, trace: dict[str, str] | None) -> Any:
        """Make a generator's step run with this span current and the step's baggage; pass
        what it returns to :meth:`step_done`."""
        telemetry = self.telemetry
        if trace is None or self.span is None:
            return None
        return telemetry.attach(telemetry.in_context(self.span, telemetry.parent(trace)))

    def step_done(self, token: Any) -> None:
        if token is not None:
            self.telemetry.detach(token)

    def cancel(self) -> None:
        """The caller cancelled the call (a CANCEL frame)."""
        if not self.cancelled:
            self.cancelled = True
            if self.span is not None:
                self.span.add_event(CANCELLED_EVENT)

    def failed(self, exc: BaseException) -> None:
        """The call ends with ``exc``; a cancellation the caller asked for is no failure."""
        if self.failed_as is not None or (self.cancelled and _is_routine_cancelled(exc)):
            return
        kind = self.failed_as = error_type(exc)
        if self.span is not None:
            _record_failure(self.telemetry, self.span, exc, kind)

    def finish(self) -> None:
        telemetry = self.telemetry
        _server_active[self.key] -= 1
        if telemetry.meter is not None:
            attributes = self.attributes
            if self.failed_as is not None:
                attributes = {**attributes, "error.type": self.failed_as}
            telemetry.server_duration.record(time.perf_counter() - self.start, attributes)
        if self.token is not None:
            try:
                telemetry.detach(self.token)
            except Exception:  # pragma: no cover - detached elsewhere: the SDK logs it
                pass
        if self.span is not None:
            self.span.end()


def _is_routine_cancelled(exc: BaseException) -> bool:
    from anywool.errors import RoutineCancelled

    return isinstance(exc, RoutineCancelled)
