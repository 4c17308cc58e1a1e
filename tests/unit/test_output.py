"""The OUTPUT payload (runtime._envelope) and the caller's side of runtime._output, in process."""

from __future__ import annotations

import logging
import threading
import time
import tracemalloc
from collections.abc import Iterator

import msgpack
import pytest

from anywool import OutputLine
from anywool.runtime import _output
from anywool.runtime.wire import _envelope as envelope
from anywool.runtime.wire._frames import FrameError

from ..helpers import Records

SOURCE = ["0f3c", "unix:/w", 42, "crunch", 7]


def record(**changes: object) -> list[object]:
    entry: list[object] = [envelope.OUTPUT_RECORD, None, 1.5, "tests.output.unit", 20, "INFO",
                           "hello", "/w/jobs.py", 3, "crunch", None, None, "MainThread"]
    for index, value in changes.items():
        entry[int(index[1:])] = value
    return entry


def test_entries_round_trip() -> None:
    entries = [record(), [envelope.OUTPUT_LINE, SOURCE, 2.0, "stderr", "a line"],
               [envelope.OUTPUT_DROPPED, None, 3, 12]]
    assert envelope.decode_output(envelope.encode_output(entries)) == entries


@pytest.mark.parametrize("payload", [
    b"\xc1",  # not msgpack
    msgpack.packb({"entries": []}),
    msgpack.packb([[9, None, 1.0]]),  # unknown kind
    msgpack.packb([record()[:-1]]),  # short
    msgpack.packb([record(_4="INFO")]),  # levelno not an int
    msgpack.packb([record(_1=["uid", "unix:/w", 1, "r"])]),  # source short
    msgpack.packb([record(_2="now")]),
    msgpack.packb([[envelope.OUTPUT_LINE, None, 1.0, "stdin", "x"]]),
    msgpack.packb([[envelope.OUTPUT_DROPPED, None, 1.0, 0]]),
    msgpack.packb([[envelope.OUTPUT_LINE, None, 1.0, "stdout", b"bytes"]], use_bin_type=True),
])
def test_a_malformed_payload_is_refused(payload: bytes) -> None:
    with pytest.raises(FrameError):
        envelope.decode_output(payload)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    loggers = [logging.getLogger("tests.output.unit"), logging.getLogger("anywool.output")]
    for logger in loggers:
        logger.addHandler(handler)
    loggers[0].setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        loggers[0].setLevel(logging.NOTSET)


def test_a_malformed_payload_is_logged_and_dropped(records: Records) -> None:
    _output.Output().receive(b"\xc1", SOURCE, None)
    [said] = records.records
    assert said.name == "anywool.output" and said.levelno == logging.WARNING
    assert "dropped malformed output of crunch from unix:/w" in said.getMessage()


def test_a_record_is_made_as_makelogrecord_makes_one(records: Records) -> None:
    _output.Output().receive(envelope.encode_output([record()]), SOURCE, None)
    [got] = records.records
    expected = logging.makeLogRecord({"name": "tests.output.unit", "msg": "hello"})
    assert set(vars(expected)) <= set(vars(got))
    assert (got.filename, got.module, got.created, got.msecs) == ("jobs.py", "jobs", 1.5, 500)
    assert (got.anywool_worker, got.anywool_address, got.anywool_pid, got.anywool_routine,  # type: ignore[attr-defined]
            got.anywool_task) == tuple(SOURCE)  # type: ignore[attr-defined]


def test_a_failing_on_output_is_logged_once(records: Records) -> None:
    calls: list[OutputLine] = []

    def broken(line: OutputLine) -> None:
        calls.append(line)
        raise RuntimeError("no")

    output = _output.Output(broken)
    line = [envelope.OUTPUT_LINE, None, 1.0, "stdout", "x"]
    for _ in range(2):
        output.receive(envelope.encode_output([line, line]), SOURCE, None)
    assert len(calls) == 4
    [said] = records.records
    assert said.levelno == logging.ERROR and said.exc_info is not None


class _Lines:
    """A forwarder as a sink sees one: what is put is kept."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[list[object]] = []

    def put(self, sink: object, entry: list[object], size: int, *, force: bool = False) -> None:
        self.entries.append(entry)


def test_a_line_written_a_character_at_a_time_costs_what_is_written() -> None:
    # print(".", end="") in a loop: each write appends one character to a line that never
    # ends. Appending must not copy the line so far (it did, up to 64 Ki characters a write:
    # 300 000 such writes took half a minute). Measured in memory, not time (which a shared
    # machine makes noisy): a copy of the line would be allocated at each write, at least
    # 64 KiB of it at once; appending allocates a few bytes.
    lines = _Lines()
    long = _output.Sink(lines, 2)  # type: ignore[arg-type]
    long.write("stdout", "start " + "-" * 100_000)
    for _ in range(1000):  # settled: whatever grows with the first writes has grown
        long.write("stdout", ".")
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(1000):
            long.write("stdout", ".")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 32 * 1024, peak - before
    assert lines.entries == []  # no newline yet
    long.write("stdout", "!\nnext")
    long.write("stderr", "short")
    long.end_lines()
    [(_, _, _, stream, cut), next_line, other] = [entry[:5] for entry in lines.entries]
    assert stream == "stdout"
    assert cut == "start " + "-" * (_output.TEXT_AT_MOST - 6) \
        + _output.CUT_MARK.format(_output.TEXT_AT_MOST)
    assert next_line[3:] == ["stdout", "next"] and other[3:] == ["stderr", "short"]


def test_partial_lines_join_whole_across_writes() -> None:
    lines = _Lines()
    sink = _output.Sink(lines, 1)  # type: ignore[arg-type]
    pieces = ["a" * 200, "b" * 100, "c" * 5000, "d\ne", "f", "\n", "g\n\nh"]
    for piece in pieces:
        sink.write("stdout", piece)
    sink.end_lines()
    assert [entry[4] for entry in lines.entries] == "".join(pieces).split("\n")


def test_a_nested_calls_drop_count_is_relayed_past_the_bound() -> None:
    # A routine calling a routine relays the inner call's entries into its own call's sink;
    # when that is full, the lines go, but the inner drop count must not (it says what the
    # inner bound took: lost here, some hundred thousand drops were said as "1 line").
    forwarder = _output.Forwarder(None, lambda *args: None, lambda *args: None)  # type: ignore[arg-type]
    relay = forwarder.sink(1)
    filler: list[object] = [envelope.OUTPUT_LINE, SOURCE, 1.0, "stdout", "x"]
    for _ in range(_output.PENDING_AT_MOST):
        relay.put(filler, 100)
    assert relay.dropped == 0
    entries = [[envelope.OUTPUT_LINE, None, 2.0, "stdout", "inner line"],
               [envelope.OUTPUT_DROPPED, None, 3.0, 123_456]]
    _output.Output().receive(envelope.encode_output(entries), SOURCE, relay)
    assert relay.dropped == 1  # the line: over the bound
    queued = forwarder._entries[-1][1]
    assert queued == [envelope.OUTPUT_DROPPED, SOURCE, 3.0, 123_456]
