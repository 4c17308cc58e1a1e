"""OpenTelemetry (issue 23): spans across the process boundary, trace context, metrics, and
nothing at all when OpenTelemetry is absent. Real workers, both backends.

The test process configures the SDK with in-memory exporters (the ``otel`` fixture, restored
after); workers configure theirs through ``$ANYWOOL_WORKER_IMPORT`` (tests/integration/
otel_worker.py), which appends their finished spans, and their metrics at exit, to a file the
test reads once the pool (so every worker) has exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.metrics import _internal as metrics_internal  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.util._once import Once  # noqa: E402

from anywool import run_sync  # noqa: E402
from anywool.errors import RoutineCancelled  # noqa: E402
from anywool.runtime import _telemetry  # noqa: E402
from anywool.runtime._routine import routine  # noqa: E402
from anywool.runtime.client._proxy import WorkerProxy  # noqa: E402
from anywool.runtime.pool._pool import WorkerPool  # noqa: E402

from ..helpers import Signal, wait_until  # noqa: E402
from .otel_points import points  # noqa: E402
from .routines import hold_until_cancelled  # noqa: E402

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@routine
async def inner(x: int) -> int:
    return x + 1


@routine
async def outer(x: int) -> int:
    return 2 * await inner(x)


@routine
async def fail(message: str) -> None:
    raise LookupError(message)


class Unprintable(Exception):
    """An exception whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str() for this one")


@routine
async def fail_unprintably() -> None:
    raise Unprintable("x")


@routine
async def tens(n: int):
    """Yields ``inner(10 * i)`` for i < n: each step makes a nested call."""
    for i in range(n):
        yield await inner(10 * i)


def triple(x: int) -> int:
    return 3 * x


@routine
async def baggage_seen(steps: int):
    """Yields, at each step, the baggage item "k" the step runs with."""
    from opentelemetry import baggage

    for _ in range(steps):
        yield baggage.get_baggage("k")


@dataclass
class Otel:
    """The test process's exporters, and the file its workers write to."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    path: Path
    worker_records: list[dict[str, Any]] = field(default_factory=list)

    def worker_spans(self) -> list[dict[str, Any]]:
        return [line["span"] for line in self._lines() if "span" in line]

    def worker_points(self) -> dict[str, list[list[Any]]]:
        found: dict[str, list[list[Any]]] = {}
        for line in self._lines():
            for name, recorded in line.get("metrics", {}).items():
                found.setdefault(name, []).extend(recorded)
        return found

    def _lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def points(self) -> dict[str, list[list[Any]]]:
        return points(self.reader)


def _reset_globals() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None


@pytest.fixture
def worker_otel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Workers spawned in the test configure an SDK writing to the returned file."""
    path = tmp_path / "worker-otel.jsonl"
    monkeypatch.setenv("ANYWOOL_TEST_OTEL_FILE", str(path))
    monkeypatch.setenv("ANYWOOL_WORKER_IMPORT", "tests.integration.otel_worker")
    return path


@pytest.fixture
def otel(worker_otel: Path) -> Iterator[Otel]:
    """The SDK configured in the test process (in-memory span exporter and metric reader) and
    in its workers; the global providers are restored afterwards."""
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader])
    _reset_globals()
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    try:
        yield Otel(spans, reader, worker_otel)
    finally:
        _reset_globals()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _by_name(spans: list[dict[str, Any]], name: str, kind: str) -> dict[str, Any]:
    found = [span for span in spans if span["name"].endswith(name) and span["kind"] == kind]
    assert len(found) == 1, (name, kind, spans)
    return found[0]


def _local(otel: Otel) -> list[dict[str, Any]]:
    result = []
    for span in otel.spans.get_finished_spans():
        context = span.get_span_context()
        assert context is not None
        result.append({
            "name": span.name, "kind": span.kind.name, "trace_id": context.trace_id,
            "span_id": context.span_id,
            "parent_id": None if span.parent is None else span.parent.span_id,
            "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
            "events": [event.name for event in span.events],
            "start": span.start_time, "end": span.end_time,
        })
    return result


async def test_nested_calls_build_one_trace_across_processes(otel: Otel) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1) as pool:
            assert await outer(3) == 8
            assert await run_sync(triple, 5) == 15
            [own] = pool.workers
            uid, pid, namespace = str(own.metadata.uid), own.pid, pool.proxy._namespace
    local, remote = _local(otel), otel.worker_spans()
    client_outer = _by_name(local, "outer", "CLIENT")
    server_outer = _by_name(remote, "outer", "SERVER")
    client_inner = _by_name(remote, "inner", "CLIENT")
    server_inner = _by_name(remote, "inner", "SERVER")
    # One tree: caller -> worker -> (nested) caller in the worker -> worker.
    assert client_outer["parent_id"] is None
    assert server_outer["parent_id"] == client_outer["span_id"]
    assert client_inner["parent_id"] == server_outer["span_id"]
    assert server_inner["parent_id"] == client_inner["span_id"]
    assert {span["trace_id"] for span in (client_outer, server_outer, client_inner,
                                          server_inner)} == {client_outer["trace_id"]}
    assert server_outer["pid"] == server_inner["pid"] == pid
    for span in (client_outer, server_outer):
        attributes = span["attributes"]
        assert attributes["rpc.system.name"] == "anywool"
        assert attributes["rpc.method"].endswith("outer")
        assert attributes["anywool.call.kind"] == "coroutine"
        assert attributes["anywool.worker.uid"] == uid
        assert attributes["anywool.namespace"] == namespace
        assert span["status"] == "UNSET"
    # The worker's span is made when first needed (here: by the nested call), dated back to
    # the call's start; both processes read the same clock.
    assert client_outer["start"] <= server_outer["start"] <= client_inner["start"] \
        <= client_outer["end"]
    plain = _by_name(local, "triple", "CLIENT")
    assert plain["attributes"]["anywool.call.kind"] == "function"
    assert _by_name(remote, "triple", "SERVER")["attributes"]["anywool.call.kind"] == "function"
    # Metrics: a duration per call on each side, nothing left in flight.
    points = otel.points()
    durations = {attributes["rpc.method"].rsplit(".", 1)[-1]: count
                 for attributes, count in points["rpc.client.call.duration"]}
    assert durations == {"outer": 1, "triple": 1}
    assert all(value == 0 for _, value in points["anywool.client.call.active"])
    assert sum(count for _, count in points["anywool.client.call.queue_wait"]) == 2
    worker_points = otel.worker_points()
    served = {attributes["rpc.method"].rsplit(".", 1)[-1]: count
              for attributes, count in worker_points["rpc.server.call.duration"]}
    assert served == {"outer": 1, "inner": 1, "triple": 1}
    assert all(value == 0 for _, value in worker_points["anywool.server.call.active"])
    added = [value for attributes, value in points["anywool.discovery.events"]
             if attributes == {"anywool.discovery.event": "worker-added",
                               "anywool.namespace": namespace}]
    assert added == [1]


async def test_failure_sets_error_status_on_both_sides(otel: Otel) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            with pytest.raises(LookupError):
                await fail("no such thing")
    for span in (_by_name(_local(otel), "fail", "CLIENT"),
                 _by_name(otel.worker_spans(), "fail", "SERVER")):
        assert span["status"] == "ERROR"
        assert span["attributes"]["error.type"] == "LookupError"
        assert span["events"] == ["exception"]
    [(attributes, count)] = otel.points()["rpc.client.call.duration"]
    assert attributes["error.type"] == "LookupError" and count == 1


async def test_an_exception_whose_str_raises_is_recorded_not_replaced(otel: Otel) -> None:
    # The SDK's record_exception calls str(): that must not turn the routine's exception into
    # the instrumentation's, on either side.
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            with pytest.raises(Unprintable):
                await fail_unprintably()
    for span in (_by_name(_local(otel), "fail_unprintably", "CLIENT"),
                 _by_name(otel.worker_spans(), "fail_unprintably", "SERVER")):
        assert span["status"] == "ERROR"
        assert span["attributes"]["error.type"].endswith("Unprintable")
        assert span["events"] == ["exception"]
    assert all(value == 0 for _, value in otel.points()["anywool.client.call.active"])


async def test_remote_cancellation_is_an_event_on_both_sides(otel: Otel,
                                                             tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1), Signal() as signal:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(hold_until_cancelled, signal.port, str(tmp_path / "f"))
                    await signal.started()
                    scope.cancel()
    for span in (_by_name(_local(otel), "hold_until_cancelled", "CLIENT"),
                 _by_name(otel.worker_spans(), "hold_until_cancelled", "SERVER")):
        assert "anywool.cancelled" in span["events"]
        assert span["status"] == "UNSET"  # the caller asked for it: no failure


async def test_stream_is_one_span_and_its_steps_carry_the_context(otel: Otel) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            assert [item async for item in tens(3)] == [1, 11, 21]
    local, remote = _local(otel), otel.worker_spans()
    client = _by_name(local, "tens", "CLIENT")
    server = _by_name(remote, "tens", "SERVER")
    assert client["attributes"]["anywool.call.kind"] == "generator"
    assert server["parent_id"] == client["span_id"]
    # The nested calls each step made are the stream's children, in its trace.
    nested = [span for span in remote if span["kind"] == "CLIENT"]
    assert len(nested) == 3
    assert {span["parent_id"] for span in nested} == {server["span_id"]}
    assert {span["trace_id"] for span in nested} == {client["trace_id"]}
    [(_, count)] = otel.points()["rpc.client.call.duration"]
    assert count == 1


async def test_each_step_carries_the_callers_baggage(otel: Otel) -> None:
    from opentelemetry import baggage, context

    seen = []
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            stream = baggage_seen(2)
            for value in ("first", "second"):
                token = context.attach(baggage.set_baggage("k", value))
                try:
                    seen.append(await stream.__anext__())
                finally:
                    context.detach(token)
            await stream.aclose()
    assert seen == ["first", "second"]


async def test_busy_refusal_is_counted(otel: Otel, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, max_concurrency=1) as pool, Signal() as signal:
            namespace = pool.proxy._namespace
            assert namespace is not None
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_until_cancelled, signal.port, str(tmp_path / "f"))
                await signal.started()
                # Another proxy's connection does not know the worker is full: it is refused.
                async with WorkerProxy(namespace, lazy=False):
                    async with anyio.create_task_group() as waiting:
                        waiting.start_soon(inner, 1)

                        def refused() -> bool:
                            return any(value for _, value in otel.points().get(
                                "anywool.client.call.refused", []))

                        await wait_until(refused, "a busy refusal to be counted")
                        tg.cancel_scope.cancel()
    [(attributes, value)] = otel.points()["anywool.client.call.refused"]
    assert value == 1
    assert attributes["rpc.method"].endswith("inner")
    assert attributes["anywool.namespace"] == namespace


async def test_workers_are_counted_by_state(otel: Otel) -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1) as pool:
            namespace = pool.proxy._namespace
            await inner(0)
            counts = {attributes["anywool.worker.state"]: value
                      for attributes, value in otel.points()["anywool.workers"]
                      if attributes.get("anywool.namespace") == namespace}
    assert counts == {"connected": 1, "connecting": 0, "waiting": 0, "excluded": 0}


async def test_no_trace_context_is_sent_without_a_provider(worker_otel: Path) -> None:
    """Only the worker has an SDK: its span is a root, for the caller sent no context."""
    assert _telemetry.current() is None
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1):
            assert await inner(1) == 2
    otel = Otel(InMemorySpanExporter(), InMemoryMetricReader(), worker_otel)
    server = _by_name(otel.worker_spans(), "inner", "SERVER")
    assert server["parent_id"] is None


async def test_a_worker_setup_module_that_fails_fails_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from anywool.errors import WorkerError
    from anywool.runtime.pool._local_worker import LocalWorker

    monkeypatch.setenv("ANYWOOL_WORKER_IMPORT", "tests.integration.no_such_setup_module")
    with anyio.fail_after(30), pytest.raises(WorkerError) as info:
        async with LocalWorker():
            pass
    assert "no_such_setup_module" in str(info.value)


def test_without_opentelemetry_calls_work_and_nothing_is_imported(tmp_path: Path) -> None:
    """OpenTelemetry absent (its import fails): calls work, in the caller and in the worker no
    module of it is imported."""
    script = textwrap.dedent("""
        import sys

        class Absent:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"{name} is absent here")
                return None

        sys.meta_path.insert(0, Absent())

        import anyio
        import anywool

        @anywool.routine
        async def imported():
            return sorted(m for m in sys.modules if m.startswith("opentelemetry"))

        async def main():
            async with anywool.WorkerPool(spawn=1):
                remote = await imported()
            local = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
            print(remote, local)

        anyio.run(main)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("ANYWOOL_WORKER_IMPORT", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] []"
