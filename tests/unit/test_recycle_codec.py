"""The RECYCLE answer (issue 24): accepted (empty) or a refusal in words, bounded."""

from __future__ import annotations

import pytest

from anywool.cli._recycle_command import _POOL_EXTRA
from anywool.runtime.pool._pool import POOL_EXTRA
from anywool.runtime.wire._envelope import (
    MAX_REFUSAL,
    decode_recycle_answer,
    encode_recycle_answer,
)
from anywool.runtime.wire._frames import FrameError


def test_an_acceptance_and_a_refusal_round_trip() -> None:
    assert encode_recycle_answer(None) == b""
    assert decode_recycle_answer(b"") is None
    assert decode_recycle_answer(encode_recycle_answer("not run by a pool")) == \
        "not run by a pool"


def test_a_long_refusal_is_cut_on_a_character_boundary() -> None:
    payload = encode_recycle_answer("é" * MAX_REFUSAL)  # two bytes each
    assert len(payload) <= MAX_REFUSAL
    assert decode_recycle_answer(payload) == "é" * (MAX_REFUSAL // 2)


@pytest.mark.parametrize("payload, match", [
    (b"x" * (MAX_REFUSAL + 1), "a recycle refusal of 1025 bytes"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_a_malformed_answer_is_a_frame_error(payload: bytes, match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode_recycle_answer(payload)


def test_the_command_reads_the_key_pools_write() -> None:
    assert _POOL_EXTRA == POOL_EXTRA
