"""The synchronous routine of ``peers.py``, for ``anyio.to_process`` and ``trio_parallel``.

A module of its own that imports nothing, so that their workers import only this (not anywool)
when they unpickle the function by reference.
"""

from __future__ import annotations


def echo_sync(x: object) -> object:
    return x
