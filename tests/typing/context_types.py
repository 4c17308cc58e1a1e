"""Checked by pyright in tests/unit/test_typing.py, never imported by pytest."""

from typing import assert_type

import anywool

counter = anywool.ContextVar("typing.counter", default=0)
assert_type(counter, anywool.ContextVar[int])
assert_type(counter.get(), int)
assert_type(counter.get(None), int | None)
token = counter.set(3)
counter.reset(token)

declared: anywool.ContextVar[str] = anywool.ContextVar("typing.name")
assert_type(declared.get(), str)
