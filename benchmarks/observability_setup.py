"""What ``observability.py`` imports first in its measuring children, and its workers through
``$ANYWOOL_WORKER_IMPORT``: OpenTelemetry as ``$ANYWOOL_BENCH_OTEL`` says.

* ``absent``: ``import opentelemetry`` (and any submodule) fails, as where it is not installed;
* ``unconfigured``: the API and the SDK imported, no provider set;
* ``traced``: an SDK tracer provider, every span sampled and batched to an exporter that drops
  them (the cost of a real exporter's work apart); no meter provider;
* ``metered``: the same, and an SDK meter provider whose reader nobody collects;
* ``span``: no global provider (anywool traces nothing), but a tracer of the caller's own
  (:data:`user_tracer`, batching to the same dropping exporter) with which the measurement
  wraps each call in one span: what the SDK costs a call at the least, whoever makes the span.
"""

import os
import sys
from collections.abc import Sequence

MODES = ("absent", "unconfigured", "traced", "metered", "span")
MODE = os.environ.get("ANYWOOL_BENCH_OTEL", "absent")
if MODE not in MODES:
    raise RuntimeError(f"$ANYWOOL_BENCH_OTEL must be one of {', '.join(MODES)}, not {MODE!r}")


class _Absent:
    """A ``sys.meta_path`` finder that refuses ``opentelemetry`` and its submodules."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"{name} is blocked (ANYWOOL_BENCH_OTEL=absent)", name=name)
        return None


if MODE == "absent":
    if "opentelemetry" in sys.modules:
        raise RuntimeError("opentelemetry was imported before it could be blocked")
    sys.meta_path.insert(0, _Absent())  # type: ignore[arg-type]
else:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    #: How many spans the exporter was given (and dropped), in this process.
    exported = 0

    class _Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            global exported
            exported += len(spans)
            return SpanExportResult.SUCCESS

    if MODE in ("traced", "metered", "span"):
        provider = TracerProvider()  # default sampler: every root span, and its children
        provider.add_span_processor(BatchSpanProcessor(_Drop()))
        if MODE == "span":
            #: The caller's own tracer, not the global provider's: anywool does not see it.
            user_tracer = provider.get_tracer("observability")
        else:
            trace.set_tracer_provider(provider)
    if MODE == "metered":
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
