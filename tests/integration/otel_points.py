"""What the telemetry tests read out of an OpenTelemetry metric reader, in the test process and
in workers alike (no side effects: ``otel_worker`` configures an SDK when imported)."""

from __future__ import annotations

from typing import Any


def points(reader: Any) -> dict[str, list[list[Any]]]:
    """Every metric point ``reader`` has: {name: [[attributes, value or histogram count]]}."""
    found: dict[str, list[list[Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None)
                    if value is None:
                        value = point.value
                    found.setdefault(metric.name, []).append([dict(point.attributes), value])
    return found
