"""Every python block of README.md and docs/ runs as written, and prints what the page shows
(the convention: ``tests/docs/examples.py``).

Each block runs in a fresh interpreter, in a fresh directory that holds it and the page's
helper modules, with this checkout's ``src`` on ``PYTHONPATH``; under both backends where
``anyio.run`` is left to choose. The suite's after-test checks apply too: no process left
running, the runtime directory (inherited through ``$ANYWOOL_RUNTIME_DIR``) left empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.docs.examples import Block, blocks, matches, pages

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a block may run (a pytest block: the whole inner session).
TIMEOUT = 60.0
PYTEST_TIMEOUT = 120.0

# Runs the block at argv[2] as __main__ (as `python block.py` would), with anyio.run's default
# backend set to argv[1] ("-": left alone): so one program, written once, runs under both.
LAUNCHER = """\
import runpy, sys
backend, path = sys.argv[1], sys.argv[2]
if backend != "-":
    import anyio
    _run = anyio.run
    def run(func, *args, backend=backend, **options):
        return _run(func, *args, backend=backend, **options)
    anyio.run = run
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""
PYTEST_INI = "[pytest]\nanywool_backends = asyncio trio\n"


def _cases() -> Iterator[object]:
    for page in pages(ROOT):
        relative = page.relative_to(ROOT).as_posix()
        for block in blocks(relative, page.read_text()):
            for backend in block.backends:
                marks = [pytest.mark.skip(reason=block.reason)] if block.marker == "skip" else []
                if block.marker == "pytest":
                    # A pytest project of its own using the plugin, as the pytest example in
                    # tests/examples: CI runs these under one Python (see .ci/run).
                    marks.append(pytest.mark.once_per_ci)
                case_id = block.id if backend is None else f"{block.id}[{backend}]"
                yield pytest.param(block, backend, id=case_id, marks=marks)


@pytest.fixture(scope="module")
def etcd_url() -> Iterator[str]:
    from tests.etcd import cluster

    reason = cluster.unavailable_reason()
    if reason is not None:
        if os.environ.get("ANYWOOL_REQUIRE_ETCD"):
            pytest.fail(f"$ANYWOOL_REQUIRE_ETCD is set, but no etcd can run: {reason}")
        pytest.skip(f"needs an etcd server binary: {reason}")
    member = cluster.EtcdMember.start(name="docs", service=True)
    try:
        yield member.url
    finally:
        member.close()


def _environment(directory: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(directory), str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.parametrize(("block", "backend"), list(_cases()))
def test_example(block: Block, backend: str | None, tmp_path: Path,
                 request: pytest.FixtureRequest) -> None:
    env = _environment(tmp_path)
    if block.marker == "lan" and (reason := netns.lan_unavailable()) is not None:
        if os.environ.get("ANYWOOL_REQUIRE_LAN"):
            pytest.fail(f"$ANYWOOL_REQUIRE_LAN is set, but this block needs multicast: {reason}")
        pytest.skip(reason)
    if block.marker == "etcd":
        env["ANYWOOL_EXAMPLE_ETCD"] = request.getfixturevalue("etcd_url")
    for name, code in block.helpers.items():
        (tmp_path / name).write_text(code)
    if block.marker == "pytest":
        (tmp_path / "test_example.py").write_text(block.code)
        (tmp_path / "pytest.ini").write_text(PYTEST_INI)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "test_example.py"]
        timeout = PYTEST_TIMEOUT
    else:
        (tmp_path / "example.py").write_text(block.code)
        (tmp_path / "launch.py").write_text(LAUNCHER)
        command = [sys.executable, "launch.py", backend or "-", "example.py"]
        timeout = TIMEOUT
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    said = f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    assert done.returncode == 0, f"{block.id} exited {done.returncode}\n{said}"
    if block.expected is not None:
        assert matches(block.expected, done.stdout), \
            f"{block.id} printed other than the page shows\n--- page\n{block.expected}\n{said}"
