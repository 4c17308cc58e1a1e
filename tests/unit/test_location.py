"""Where this anywool is, as the processes it starts and its interrupter see it: computed at
the package's root, so that a module that moves does not point somewhere else."""

from __future__ import annotations

import os
from pathlib import Path

import anywool
from anywool._location import IMPORT_ROOT, PACKAGE
from anywool.runtime.worker._interrupt import _machinery_roots  # pyright: ignore[reportPrivateUsage]


def test_the_import_root_holds_this_anywool() -> None:
    assert Path(IMPORT_ROOT, "anywool", "__init__.py").samefile(anywool.__file__)
    assert PACKAGE == os.path.join(IMPORT_ROOT, "anywool")


def test_every_module_of_the_runtime_and_discovery_is_machinery_to_the_interrupter() -> None:
    # An interruption raised in one of them would cut anywool's own bookkeeping halfway.
    roots = _machinery_roots()
    modules = [path for package in ("runtime", "discovery")
               for path in Path(PACKAGE, package).rglob("*.py")]
    assert len(modules) > 60
    assert [str(path) for path in modules if not str(path).startswith(roots)] == []


def test_a_users_module_is_not_machinery() -> None:
    roots = _machinery_roots()
    assert not __file__.startswith(roots)
    assert not os.path.join(IMPORT_ROOT, "user_module.py").startswith(roots)
    assert not os.path.join(PACKAGE, "errors.py").startswith(roots)  # as before the layout
