"""The STATS payload (issue 23): what a worker says of itself, and what a client accepts."""

from __future__ import annotations

import math

import msgpack
import pytest

from anywool import WorkerStats
from anywool.runtime.wire._envelope import decode_stats, encode_stats
from anywool.runtime.wire._frames import FrameError
from anywool.runtime.wire._stats import memory

STATS = WorkerStats(41, "asyncio", "3.12.1", "0.1.0", 4, 1, 10, 7, 2, 1, 2.5, 10.0, 1 << 20,
                    False)


def _fields(**changes: object) -> bytes:
    fields = msgpack.unpackb(encode_stats(STATS))
    fields.update(changes)
    return msgpack.packb(fields)


def test_stats_round_trip_and_unknown_keys_are_ignored() -> None:
    assert decode_stats(encode_stats(STATS)) == STATS
    assert decode_stats(_fields(later={"any": [1, b"x"]})) == STATS


@pytest.mark.parametrize("changes, match", [
    ({"served": True}, "served"),
    ({"in_flight": -1}, "in_flight"),
    ({"busy_seconds": math.nan}, "busy_seconds"),
    ({"busy_seconds": "1"}, "busy_seconds"),
    ({"rss_peak": 0}, "rss_peak"),
    ({"pid": None}, "pid"),
])
def test_a_field_of_the_wrong_kind_is_a_frame_error(changes: dict, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode_stats(_fields(**changes))


def test_a_missing_field_or_a_non_map_is_a_frame_error() -> None:
    fields = msgpack.unpackb(encode_stats(STATS))
    del fields["uptime_seconds"]
    with pytest.raises(FrameError, match="uptime_seconds"):
        decode_stats(msgpack.packb(fields))
    with pytest.raises(FrameError, match="map"):
        decode_stats(msgpack.packb([1, 2]))
    with pytest.raises(FrameError, match="undecodable"):
        decode_stats(b"\xc1")


def test_memory_is_the_current_resident_size_on_linux() -> None:
    size, peak = memory()
    assert size is not None and size > 1 << 20 and peak is False
