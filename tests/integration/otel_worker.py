"""Imported in workers (``$ANYWOOL_WORKER_IMPORT``) by tests/integration/test_telemetry.py: an
OpenTelemetry SDK whose finished spans, and whose metrics at exit, are appended as JSON lines to
the file ``$ANYWOOL_TEST_OTEL_FILE`` names (one file per test), so the test reads what the
workers recorded once they stopped."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.integration import otel_points

PATH = os.environ["ANYWOOL_TEST_OTEL_FILE"]
_lock = threading.Lock()


def _write(record: dict) -> None:
    with _lock, open(PATH, "a") as file:
        file.write(json.dumps(record) + "\n")


def describe(span: ReadableSpan) -> dict:
    """A span as the tests compare it (JSON-able)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": context.trace_id,
        "span_id": context.span_id,
        "parent_id": None if span.parent is None else span.parent.span_id,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "start": span.start_time,
        "end": span.end_time,
        "pid": os.getpid(),
    }


class _FileExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            _write({"span": describe(span)})
        return SpanExportResult.SUCCESS


_reader = InMemoryMetricReader()
trace.set_tracer_provider(provider := TracerProvider())
provider.add_span_processor(SimpleSpanProcessor(_FileExporter()))
metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))


def points() -> dict:
    """Every metric point recorded so far in this worker."""
    return otel_points.points(_reader)


def _at_exit() -> None:
    _write({"metrics": points()})


import atexit  # noqa: E402  (registered after the MeterProvider's own: runs before its shutdown)

atexit.register(_at_exit)
