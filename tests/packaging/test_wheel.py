"""The package as a user installs it: the wheel and sdist built from this checkout, the wheel
installed in a fresh virtual environment outside the repository, its metadata, a user's module
type-checked against it, an example run with it.

The test run has no network (it runs in a private network namespace): the wheels of the
dependencies come from ``$ANYWOOL_WHEELHOUSE``, which ``make test`` fills from the package index
beforehand. Without it the tests that install skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The wheel is pure Python (py3-none-any) and its metadata the same whoever builds it: CI
# builds and checks it under 3.11 only.
pytestmark = pytest.mark.once_per_ci

ROOT = Path(__file__).resolve().parents[2]
USER_MODULE = ROOT / "tests" / "typing" / "user_api.py"

EXAMPLE = """
import anyio, anywool, sniffio

@anywool.routine
async def scale(x: int) -> int:
    return 2 * x

async def main() -> None:
    async with anywool.WorkerPool(spawn=2):
        print(sniffio.current_async_library(), await scale(21))

anyio.run(main)
anyio.run(main, backend="trio")
"""


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """``(wheel, sdist)`` built from this checkout by its build backend."""
    out = tmp_path_factory.mktemp("dist")
    code = ("import sys, hatchling.build as b; "
            "print(b.build_wheel(sys.argv[1])); print(b.build_sdist(sys.argv[1]))")
    wheel, sdist = _run(sys.executable, "-c", code, out, cwd=ROOT).split()
    yield out / wheel, out / sdist


@pytest.fixture(scope="module")
def venv(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv, outside the repository, with the wheel and every extra installed."""
    wheelhouse = os.environ.get("ANYWOOL_WHEELHOUSE")
    if not wheelhouse:
        pytest.skip("no $ANYWOOL_WHEELHOUSE to install the dependencies from (make test sets it)")
    home = tmp_path_factory.mktemp("user")
    _run(sys.executable, "-m", "venv", home / "venv", cwd=home)
    python = home / "venv" / "bin" / "python"
    wheel = built[0]
    _run(python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", wheelhouse,
         f"anywool[trio,lan,etcd,otel] @ {wheel.as_uri()}", "pytest", cwd=home, timeout=600)
    yield python
    shutil.rmtree(home, ignore_errors=True)


def test_the_wheel_and_sdist_ship_the_license_and_the_changelog(
        built: tuple[Path, Path]) -> None:
    wheel, sdist = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names
    assert "anywool/py.typed" in names
    with tarfile.open(sdist) as archive:
        members = {Path(name).relative_to(Path(name).parts[0]).as_posix()
                   for name in archive.getnames() if len(Path(name).parts) > 1}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= members


def test_the_installed_metadata_says_what_pypi_shows(venv: Path) -> None:
    code = ("import json, importlib.metadata as m; d = m.metadata('anywool'); "
            "print(json.dumps({k: d.get_all(k) for k in ('Classifier', 'Provides-Extra', "
            "'Requires-Dist', 'License-Expression', 'License-File', 'Requires-Python', "
            "'Description-Content-Type', 'Summary')}))")
    metadata = json.loads(_run(venv, "-c", code, cwd=venv.parent))
    classifiers = set(metadata["Classifier"])
    assert {"Framework :: AnyIO", "Framework :: AsyncIO", "Framework :: Trio",
            "Typing :: Typed", "Operating System :: POSIX :: Linux",
            "Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12",
            "Programming Language :: Python :: 3.13"} <= classifiers
    assert {"trio", "lan", "etcd", "otel"} <= set(metadata["Provides-Extra"])
    core = {r.split(";")[0].split(">")[0].split("=")[0].strip()
            for r in metadata["Requires-Dist"] if "extra ==" not in r}
    assert "trio" not in core and "zeroconf" not in core  # extras, not the default install
    assert metadata["License-Expression"] == ["MIT"] and metadata["License-File"] == ["LICENSE"]
    assert metadata["Requires-Python"] == [">=3.11"]
    assert metadata["Description-Content-Type"] == ["text/markdown"]


def test_a_users_module_type_checks_strictly_against_the_installed_package(
        venv: Path, tmp_path: Path) -> None:
    # Outside the repository, so only the installed wheel (and its py.typed) can answer.
    module = tmp_path / "user_api.py"
    shutil.copy(USER_MODULE, module)
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", str(venv), module],
        cwd=tmp_path, capture_output=True, text=True, timeout=300).stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert errors == []
    assert report["summary"]["filesAnalyzed"] == 1


def test_an_example_runs_on_both_backends_from_the_installed_package(
        venv: Path, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(EXAMPLE)
    out = _run(venv, "-I", script, cwd=tmp_path, timeout=120)
    assert out.splitlines() == ["asyncio 42", "trio 42"]
    where = _run(venv, "-I", "-c", "import anywool; print(anywool.__file__)", cwd=tmp_path)
    assert not where.startswith(str(ROOT))
