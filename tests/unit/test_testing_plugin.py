"""anywool.testing, the pytest plugin, as a user's test suite sees it.

Each test here writes a small suite and runs pytest on it with pytester: in this process where
the inner suite starts no process, in a child interpreter where it does (so that whatever it
leaves is its own). The plugin reaches the inner runs the way it reaches users: through its
``pytest11`` entry point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _output_as_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the inner runs print the same on CI as elsewhere.

    pytest stops shortening the short test summary when ``CI`` or ``BUILD_NUMBER`` is set, so a
    multi-line failure message would appear twice there and once on a developer's machine.
    """
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)

# The inner suites live in pytester's own directory, away from this project's conftest.py and
# pyproject.toml: they stand alone, as a user's do.
ASYNC_SUITE = """
import pytest
import sniffio

pytestmark = pytest.mark.anyio

async def test_backend(anyio_backend):
    assert sniffio.current_async_library() == anyio_backend

def test_sync():
    pass
"""


def _ids(result: pytest.RunResult) -> list[str]:
    """The node ids a ``--collect-only -q`` run printed."""
    return [line for line in result.stdout.lines if "::" in line]


def _ini(pytester: pytest.Pytester, backends: str | None) -> None:
    """A pytest.ini, with ``anywool_backends`` set to the lines of ``backends`` if given."""
    lines = ["[pytest]"]
    if backends is not None:
        lines.append("anywool_backends =")
        lines += [f"    {line}" for line in backends.splitlines()]
    pytester.makeini("\n".join(lines) + "\n")


# -- importing -------------------------------------------------------------------------------


def test_importing_the_plugin_imports_nothing_of_anywool_but_the_package() -> None:
    # The plugin is imported by every pytest run wherever anywool is installed.
    code = ("import sys, anywool.testing; "
            "print(*sorted(m for m in sys.modules if m.startswith('anywool.')"
            " and not m.startswith('anywool.testing')))")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert output.split() == ["anywool._lazy", "anywool._version"]  # what `import anywool` imports


def test_a_suite_that_asks_for_nothing_runs_as_without_the_plugin(
        pytester: pytest.Pytester) -> None:
    _ini(pytester, None)
    pytester.makepyfile(test_suite=ASYNC_SUITE)
    with_plugin = pytester.runpytest("--collect-only", "-q")
    without = pytester.runpytest("--collect-only", "-q", "-p", "no:anywool")
    assert _ids(with_plugin) == _ids(without)
    assert len(_ids(without)) >= 2  # the async test under AnyIO's own default, and the sync one
    # The plugin was there all the same, and "-p no:anywool" did leave it out.
    assert "anywool_runtime_dir" in pytester.runpytest("--fixtures").stdout.str()
    assert "anywool_runtime_dir" not in pytester.runpytest(
        "--fixtures", "-p", "no:anywool").stdout.str()


# -- the ini option --------------------------------------------------------------------------


@pytest.mark.parametrize(("backends", "expected"), [
    ("trio", ["trio"]),
    ("asyncio", ["asyncio"]),
    ("asyncio trio", ["asyncio", "trio"]),
    ("trio\nasyncio\ntrio", ["trio", "asyncio"]),
], ids=["trio", "asyncio", "both", "lines"])
def test_the_ini_option_runs_every_async_test_under_the_named_backends(
        pytester: pytest.Pytester, backends: str, expected: list[str]) -> None:
    # AnyIO's own default here is every installed backend: "trio" alone shows that the
    # option's fixture is the one in use.
    _ini(pytester, backends)
    pytester.makepyfile(test_suite=ASYNC_SUITE)
    collected = pytester.runpytest("--collect-only", "-q")
    assert _ids(collected) == [f"test_suite.py::test_backend[{name}]" for name in expected] + [
        "test_suite.py::test_sync"]
    run = pytester.runpytest()
    run.assert_outcomes(passed=len(expected) + 1)


def test_the_ini_options_anyio_backend_is_module_scoped(pytester: pytest.Pytester) -> None:
    _ini(pytester, "asyncio trio")
    pytester.makepyfile(test_suite=ASYNC_SUITE)
    plan = pytester.runpytest("--setup-plan")
    assert "SETUP    M anyio_backend['asyncio']" in plan.stdout.str()
    assert "SETUP    M anyio_backend['trio']" in plan.stdout.str()


def test_a_conftest_anyio_backend_overrides_the_ini_option(pytester: pytest.Pytester) -> None:
    _ini(pytester, "asyncio trio")
    pytester.makeconftest("""
        import pytest

        @pytest.fixture
        def anyio_backend():
            return "trio"
    """)
    pytester.makepyfile(test_suite=ASYNC_SUITE)
    assert _ids(pytester.runpytest("--collect-only", "-q")) == [
        "test_suite.py::test_backend", "test_suite.py::test_sync"]
    pytester.runpytest().assert_outcomes(passed=2)


@pytest.mark.parametrize("backends", ["asyncio curio", "Trio"])
def test_an_unknown_backend_in_the_ini_option_is_a_usage_error(
        pytester: pytest.Pytester, backends: str) -> None:
    _ini(pytester, backends)
    pytester.makepyfile(test_suite=ASYNC_SUITE)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    bad = backends.split()[-1]
    assert f"unknown AnyIO backend {bad!r}" in result.stderr.str()
    assert "anywool_backends" in result.stderr.str()


# -- the marker ------------------------------------------------------------------------------


def test_the_marker_parametrises_only_what_it_marks(pytester: pytest.Pytester) -> None:
    _ini(pytester, "asyncio")
    pytester.makepyfile(test_suite="""
        import pytest
        import sniffio

        pytestmark = pytest.mark.anyio

        async def test_plain(anyio_backend):
            assert sniffio.current_async_library() == anyio_backend

        @pytest.mark.anywool_backends("trio")
        async def test_trio(anyio_backend):
            assert sniffio.current_async_library() == anyio_backend == "trio"

        @pytest.mark.anywool_backends()
        async def test_both(anyio_backend):
            assert sniffio.current_async_library() == anyio_backend

        @pytest.mark.anywool_backends("trio")
        class TestMarked:
            async def test_in_class(self, anyio_backend):
                assert anyio_backend == "trio"

            @pytest.mark.anywool_backends("asyncio")
            async def test_closest_wins(self, anyio_backend):
                assert anyio_backend == "asyncio"

            def test_sync(self):
                pass
    """)
    # Sorted: module-scoped parameters make pytest group the tests by backend.
    assert sorted(_ids(pytester.runpytest("--collect-only", "-q"))) == sorted([
        "test_suite.py::test_plain[asyncio]",
        "test_suite.py::test_trio[trio]",
        "test_suite.py::test_both[asyncio]",
        "test_suite.py::test_both[trio]",
        "test_suite.py::TestMarked::test_in_class[trio]",
        "test_suite.py::TestMarked::test_closest_wins[asyncio]",
        "test_suite.py::TestMarked::test_sync",
    ])
    pytester.runpytest("--strict-markers").assert_outcomes(passed=7)


def test_the_marker_on_a_module_overrides_anyios_default_and_is_module_scoped(
        pytester: pytest.Pytester) -> None:
    _ini(pytester, None)
    pytester.makepyfile(test_suite="""
        import pytest

        pytestmark = [pytest.mark.anyio, pytest.mark.anywool_backends("trio")]

        async def test_one(anyio_backend):
            assert anyio_backend == "trio"

        async def test_two(anyio_backend):
            assert anyio_backend == "trio"
    """)
    assert _ids(pytester.runpytest("--collect-only", "-q")) == [
        "test_suite.py::test_one[trio]", "test_suite.py::test_two[trio]"]
    plan = pytester.runpytest("--setup-plan").stdout.str()
    assert plan.count("SETUP    M anyio_backend['trio']") == 1
    pytester.runpytest().assert_outcomes(passed=2)


def test_an_unknown_backend_in_the_marker_fails_its_collection(pytester: pytest.Pytester) -> None:
    _ini(pytester, None)
    pytester.makepyfile(test_suite="""
        import pytest

        @pytest.mark.anyio
        @pytest.mark.anywool_backends("asyncio", "uvloop")
        async def test_marked(anyio_backend):
            pass
    """)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error: nothing ran
    result.assert_outcomes(errors=1)
    assert "unknown AnyIO backend 'uvloop'" in result.stdout.str()
    assert "test_suite.py::test_marked" in result.stdout.str()


def test_the_marker_and_the_ini_option_are_registered(pytester: pytest.Pytester) -> None:
    _ini(pytester, None)
    assert "@pytest.mark.anywool_backends(*names)" in pytester.runpytest("--markers").stdout.str()
    assert "anywool_backends (linelist)" in pytester.runpytest("--help").stdout.str()


# -- anywool_runtime_dir ---------------------------------------------------------------------


def test_the_runtime_dir_is_fresh_private_short_and_named_by_the_environment(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite="""
        import math, os, stat
        from pathlib import Path

        from anywool.discovery.local import _claim

        OUTER, BEFORE = os.environ.get("ANYWOOL_RUNTIME_DIR"), _claim._last_sweep
        seen = []

        def test_first(anywool_runtime_dir):
            assert os.environ["ANYWOOL_RUNTIME_DIR"] == str(anywool_runtime_dir)
            assert stat.S_IMODE(anywool_runtime_dir.stat().st_mode) == 0o700
            assert list(anywool_runtime_dir.iterdir()) == []
            base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
            assert anywool_runtime_dir.parent == Path(base)
            assert len(anywool_runtime_dir.name) == len("aw-") + 10
            _claim._last_sweep = 123.0  # as a claim of this test would
            seen.append(anywool_runtime_dir)

        def test_second(anywool_runtime_dir):
            assert anywool_runtime_dir != seen[0] and not seen[0].exists()
            assert _claim._last_sweep == -math.inf  # this test's first claim sweeps

        def test_after():  # both are restored
            assert os.environ.get("ANYWOOL_RUNTIME_DIR") == OUTER
            assert _claim._last_sweep == BEFORE
    """)
    pytester.runpytest().assert_outcomes(passed=3)


def test_a_file_left_in_the_runtime_dir_fails_the_test_naming_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    from anywool.testing import _runtime

    # The inner run is in this process: its grace shortened (the wait itself is tested below).
    monkeypatch.setattr(_runtime, "settle", functools.partial(_runtime.settle, grace=0.05))
    pytester.makepyfile(test_suite="""
        def test_leaves_files(anywool_runtime_dir):
            (anywool_runtime_dir / "stray").write_text("")
            (anywool_runtime_dir / "ns-left").mkdir()
            (anywool_runtime_dir / "ns-left" / "registry").write_text("")
            print("DIR", anywool_runtime_dir)
    """)
    result = pytester.runpytest("-s")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaves_files*",
        "the runtime directory * was not empty 5 s after the test (removed now):",
        "  ns-left/ (registry)",
        "  stray",
    ])
    match = re.search(r"DIR (\S+)", result.stdout.str())
    assert match is not None
    assert not os.path.exists(match.group(1))


def test_the_runtime_dir_waits_for_a_file_that_is_still_going_away(
        pytester: pytest.Pytester) -> None:
    # The file is removed by a process that starts only as the test's own fixtures are torn
    # down: when the runtime directory is first checked it is still there.
    pytester.makepyfile(test_suite="""
        import subprocess, sys
        import pytest

        children = []

        @pytest.fixture
        def reaper():
            yield
            for child in children:
                child.wait(30)

        @pytest.fixture
        def removed_after_the_test(anywool_runtime_dir):
            path = anywool_runtime_dir / "going"
            path.write_text("")
            yield
            children.append(subprocess.Popen(
                [sys.executable, "-c", "import os, sys; os.unlink(sys.argv[1])", str(path)]))

        def test_leaves_a_file_behind_for_a_moment(reaper, removed_after_the_test):
            pass
    """)
    pytester.runpytest_subprocess(timeout=60).assert_outcomes(passed=1)


# -- worker_pool -----------------------------------------------------------------------------


def test_a_pool_made_and_never_entered_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite="""
        def test_forgets_to_enter(worker_pool):
            worker_pool(spawn=2)
    """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["WorkerPool(spawn=2, namespace=None) was made but never "
                                 "entered (async with)"])


LEAKING_SUITE = """
import os
import threading

import functools

import anyio
import pytest

from anywool.testing import _pools, kill_worker

# A short grace: a leaked pool's workers stay until killed, however long it waits.
_pools.settle = functools.partial(_pools.settle, grace=0.2)


class Leaker:
    \"\"\"Runs a pool in an event loop of its own thread, until released.\"\"\"

    def __init__(self):
        self.ready = threading.Event()
        self.release = threading.Event()
        self.thread = None
        self.pids = []

    async def main(self, worker_pool):
        async with worker_pool() as pool:
            victim = kill_worker(pool)
            async for event in pool.discovery.subscriber:
                if event.type == "worker-added" and event.metadata.pid != victim:
                    break
            self.pids = [victim, pool.workers[0].pid]
            self.ready.set()
            await anyio.to_thread.run_sync(self.release.wait)

    def start(self, worker_pool):
        self.thread = threading.Thread(target=anyio.run, args=(self.main, worker_pool))
        self.thread.start()
        assert self.ready.wait(60)


@pytest.fixture
def leaker(anywool_runtime_dir):
    # Set up before worker_pool, torn down after it: the pool is still entered when
    # worker_pool checks it, and exits before the runtime directory is checked.
    leaker = Leaker()
    yield leaker
    print("REPLACEMENT-GONE", not os.path.exists(f"/proc/{leaker.pids[1]}"), flush=True)
    leaker.release.set()
    leaker.thread.join(60)


def test_leaks_a_pool(leaker, worker_pool):
    leaker.start(worker_pool)
    print("PIDS", *leaker.pids, flush=True)
"""


def test_a_pool_left_entered_fails_the_test_and_its_workers_are_killed(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=LEAKING_SUITE)
    result = pytester.runpytest_subprocess("-s", timeout=120)
    result.assert_outcomes(passed=1, errors=1)
    output = result.stdout.str()
    match = re.search(r"PIDS (\d+) (\d+)", output)
    assert match is not None
    victim, replacement = match.groups()
    assert "was entered but never exited" in output
    (leak,) = [line for line in result.stdout.lines if "killed and reaped now" in line]
    # The replacement of the worker that was killed is remembered too; the dead one is not a
    # leak.
    assert leak.endswith(f"pid {replacement}"), leak
    assert victim != replacement
    assert "REPLACEMENT-GONE True" in output
