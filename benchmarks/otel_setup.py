"""Imported by the processes of ``benchmarks/otel.py``'s "configured" runs (the caller, and its
workers through ``$ANYWOOL_WORKER_IMPORT``): an OpenTelemetry SDK that traces and meters every
call and exports to nowhere (a batch span processor in front of an exporter that drops
everything; a metric reader nobody collects). With ``$ANYWOOL_BENCH_OTEL=traced``: spans
only."""

import os
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(_Drop()))
trace.set_tracer_provider(_provider)
if os.environ.get("ANYWOOL_BENCH_OTEL") != "traced":  # "traced": spans only, no metrics
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
