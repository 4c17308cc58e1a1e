"""Shared fixtures: both AnyIO backends, a private runtime directory checked empty after each test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # A short path: worker Unix sockets live here and sun_path holds about 107 bytes.
    path = Path("/tmp") / f"aw-{uuid.uuid4().hex[:10]}"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", str(path))
    yield path
    leftovers = sorted(p.name for p in path.iterdir())
    for child in path.iterdir():
        _remove(child)
    path.rmdir()
    assert leftovers == [], f"runtime directory not empty after the test: {leftovers}"


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex}"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _remove(child)
        path.rmdir()
    else:
        path.unlink()
