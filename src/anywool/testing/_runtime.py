"""The ``anywool_runtime_dir`` fixture: a private runtime directory per test, empty at the end.

Everything anywool writes on this host (namespaces, worker sockets) goes under
``$ANYWOOL_RUNTIME_DIR``; pointing it at a fresh directory isolates a test from every other
test and process, and checking that the directory is empty afterwards catches whatever a test
left behind. Nothing here runs unless a test requests the fixture; importing this module
imports no part of anywool.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from anywool.testing._settle import GRACE, settle


def make_runtime_dir() -> Path:
    """Create a fresh, private (``0700``) directory with a short path, and return it.

    Short because worker sockets live in it and a Unix socket path holds about 107 bytes:
    ``/dev/shm/aw-<10 hex>`` where ``/dev/shm`` is a directory (a memory file system, like the
    default runtime directory, so anywool's in-loop fast paths run), else ``/tmp/aw-<10 hex>``.

    :raises OSError: the directory could not be created.
    """
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    for _ in range(8):
        path = base / f"aw-{secrets.token_hex(5)}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # whatever the umask
        return path
    raise FileExistsError(f"no fresh runtime directory name found in {base}")


def _entries(path: Path) -> list[str]:
    """What is in ``path``, a level deep: ``["ns-abc/ (owner, registry)", "stray"]``."""
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    described = []
    for name in names:
        child = path / name
        if child.is_dir() and not child.is_symlink():
            try:
                inside = ", ".join(sorted(os.listdir(child))) or "empty"
            except OSError:
                inside = "unreadable"
            described.append(f"{name}/ ({inside})")
        else:
            described.append(name)
    return described


@pytest.fixture
def anywool_runtime_dir() -> Iterator[Path]:
    """A fresh private runtime directory for the test, checked empty afterwards.

    Sets ``$ANYWOOL_RUNTIME_DIR`` to it for the duration of the test (undone afterwards; a
    ``monkeypatch.undo()`` in the test leaves it alone), and makes the test's first claim of a
    namespace sweep the directory, as the first claim of a fresh process does.

    Yields the directory (a :class:`~pathlib.Path`, mode ``0700``, see
    :func:`make_runtime_dir`). After the test, and after every fixture set up after this one
    has been torn down, it waits up to 5 seconds for the directory to become empty (polling
    with growing intervals, only while something is left: a process that is still exiting may
    still remove its files), then removes the directory with whatever is left in it. Anything
    left fails the test (an error at teardown) naming each entry, a level deep.
    """
    from anywool._runtime_dir import ENV_VAR
    from anywool.discovery.local import _claim

    with pytest.MonkeyPatch.context() as patch:
        path = make_runtime_dir()
        try:
            patch.setenv(ENV_VAR, str(path))
            # Claims sweep the runtime directory at most every few seconds per process: a test
            # must not depend on when the tests before it in this process swept theirs.
            patch.setattr(_claim, "_last_sweep", -math.inf)
            yield path
            leftovers = settle(lambda: _entries(path))
        finally:
            shutil.rmtree(path, ignore_errors=True)
    if leftovers:
        lines = [f"the runtime directory {path} was not empty {GRACE:.0f} s after the test "
                 "(removed now):"]
        lines += [f"  {entry}" for entry in leftovers]
        if path.exists():
            lines.append(f"  and {path} could not be removed")
        pytest.fail("\n".join(lines), pytrace=False)
