"""The OUTPUT payload (runtime._envelope) and the caller's side of runtime._output, in process."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import msgpack
import pytest

from anywool import OutputLine
from anywool.runtime import _envelope as envelope
from anywool.runtime import _output
from anywool.runtime._wire import FrameError

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


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


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
