"""What ``dir()`` and ``__all__`` of the public packages say: the public API, nothing else."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["anywool", "anywool.discovery", "anywool.runtime"])
def test_dir_lists_the_public_api_only(package: str) -> None:
    module = importlib.import_module(package)
    listed = dir(module)
    assert set(module.__all__) <= set(listed)
    assert not {"TYPE_CHECKING", "exports", "annotations"} & set(listed)
    assert all(not name.startswith("_") or name == "__version__" for name in listed), listed
    for name in listed:  # each one is there to use
        getattr(module, name)


def test_a_fresh_interpreter_lists_exactly_the_exports_and_the_version() -> None:
    # Nothing imported yet but the package itself: dir() is __all__ and __version__.
    code = "import anywool; print(' '.join(dir(anywool)))"
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    import anywool

    assert listed == sorted([*anywool.__all__, "__version__"])


def test_the_runtimes_internal_packages_stay_out_of_dir_once_imported() -> None:
    # wire/, client/, worker/ and pool/ are machinery, though their names have no underscore.
    code = ("import anywool.runtime, anywool.runtime.pool._pool, anywool.runtime.worker._main; "
            "print(' '.join(dir(anywool.runtime)))")
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    import anywool.runtime

    assert listed == sorted(anywool.runtime.__all__)
