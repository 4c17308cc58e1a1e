"""Durations in messages: rounded as a person reads them."""

from __future__ import annotations

import math

import pytest

from anywool._duration import seconds


@pytest.mark.parametrize(("value", "text"), [
    (12.499976594001055, "12.5 s"),
    (0.25, "0.25 s"),
    (0.0012345, "0.00123 s"),
    (2.0, "2 s"),
    (99.96, "100 s"),
    (120.0, "120 s"),
    (604800.4, "604800 s"),
    (0, "0 s"),
    (None, "no bound"),
    (math.inf, "no bound"),
])
def test_seconds_keep_three_significant_digits_and_no_trailing_zeros(
        value: float | None, text: str) -> None:
    assert seconds(value) == text
