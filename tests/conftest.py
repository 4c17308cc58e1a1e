"""Shared fixtures: the after-every-test checks of DESIGN §9.

Both AnyIO backends come from anywool's own pytest plugin (``anywool.testing``): the
``anywool_backends`` ini option in pyproject.toml makes it provide a module-scoped
``anyio_backend`` over asyncio and trio.

After every test (and after every function-scoped fixture it used has been torn down):

* no child process of the test process is alive, nor exited but unreaped (a zombie), except
  the etcd members that session- and module-scoped fixtures keep across tests
  (``tests.etcd.cluster.SERVICE_PIDS``);
* no thread started by the test is still running (idle event-loop pool threads excepted);
* the private runtime directory is empty (the plugin's ``anywool_runtime_dir``, which this
  suite uses for every test under the name ``runtime_dir``).

Teardown order. The three checks are autouse fixtures chained by dependency,
``_no_leaked_children -> _no_stray_threads -> runtime_dir``, so they are set up in the order
runtime_dir, _no_stray_threads, _no_leaked_children, *before* any fixture the test requests
(pytest sets up autouse fixtures first, then ``usefixtures``, then arguments), and torn down in
the reverse order, *after* all of them:

1. ``_no_leaked_children`` first: a descendant that is still exiting may still reap its own
   children or remove its files; once it is gone (or killed as a leak) nothing writes any more.
2. ``_no_stray_threads`` next: killing a leaked child also ends the asyncio watcher thread that
   waits for it (``asyncio-waitpid-N``), which would otherwise be reported a second time.
3. ``runtime_dir`` last (``anywool_runtime_dir`` under it): it inspects the directory only
   once no process or thread of the test can still write into it.

Each grace period polls (short, growing intervals) only while something is still there: a
clean test costs one ``children()`` scan and one ``threading.enumerate()``.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import thread as _cf_thread
from pathlib import Path
from types import FrameType

import psutil
import pytest
from anyio._backends import _asyncio as _anyio_asyncio

# The plugin's bounded grace: GRACE seconds, polled with growing intervals while something is
# still there.
from anywool.testing._settle import GRACE, settle
from tests.etcd import cluster as _etcd_cluster


def pytest_configure(config: pytest.Config) -> None:
    # Before xdist starts its workers and before any thread: see tests/netns.py.
    from tests import netns

    netns.enter()


@pytest.fixture(autouse=True)
def runtime_dir(anywool_runtime_dir: Path) -> Path:
    # The plugin's private runtime directory, for every test: short (worker sockets live
    # there), on a memory file system where there is one (so that the in-loop fast paths run;
    # tests that need a disk-backed one patch ``in_memory``), each test's first claim sweeping,
    # and checked empty afterwards.
    return anywool_runtime_dir


@pytest.fixture(autouse=True)
def _close_followed_streams() -> Iterator[None]:
    yield
    from tests.helpers import OPEN_STREAMS

    while OPEN_STREAMS:
        OPEN_STREAMS.pop().close()


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex}"


# -- child processes ---------------------------------------------------------------------------


def _children() -> list[psutil.Process]:
    # etcd members that session- or module-scoped fixtures keep across tests are not any one
    # test's children: they are listed while they run (tests/etcd/cluster.py).
    return [process for process in psutil.Process().children(recursive=True)
            if process.pid not in _etcd_cluster.SERVICE_PIDS]


def _describe_process(process: psutil.Process) -> tuple[bool, str]:
    """(is a zombie, ``pid … status … cmdline …``); a process gone meanwhile reads as such."""
    try:
        with process.oneshot():
            status = process.status()
            ppid = process.ppid()
            try:
                cmdline = " ".join(process.cmdline()) or f"[{process.name()}]"
            except (psutil.ZombieProcess, psutil.AccessDenied):
                cmdline = f"[{process.name()}]"
    except psutil.NoSuchProcess:
        return False, f"pid {process.pid} (exited while being described)"
    zombie = status == psutil.STATUS_ZOMBIE
    return zombie, f"pid {process.pid} (parent {ppid}) status {status}: {cmdline}"


def _kill_and_reap(processes: list[psutil.Process]) -> None:
    """Clean up after a leak, so the next test in this process does not inherit it."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    # Reaps our direct children (grandchildren go to init when their parent dies); a reaper
    # racing us (asyncio's watcher thread) just makes this a no-op for that pid.
    psutil.wait_procs(processes, timeout=GRACE)


@pytest.fixture(autouse=True)
def _no_leaked_children(_no_stray_threads: None) -> Iterator[None]:
    """After the test: no descendant process, alive or zombie (DESIGN §9)."""
    yield
    leaked = settle(_children)
    if not leaked:
        return
    running, zombies = [], []
    for process in leaked:
        zombie, text = _describe_process(process)
        (zombies if zombie else running).append(text)
    _kill_and_reap(leaked)
    lines = [f"{len(leaked)} child process(es) of the test process left after {GRACE:.0f} s of grace:"]
    if running:
        lines.append("  still running (killed now):")
        lines += [f"    {text}" for text in running]
    if zombies:
        lines.append("  exited but never reaped (zombies; reaped now):")
        lines += [f"    {text}" for text in zombies]
    pytest.fail("\n".join(lines), pytrace=False)


# -- threads -----------------------------------------------------------------------------------
#
# Threads that legitimately outlive a test are the *idle* workers of the event loops' thread
# pools, kept for reuse, plus the test harness's own threads. Each is excluded only in its idle
# state, so a pool thread still running a job the test gave it is caught:
#
# * trio's thread cache (trio/_core/_thread_cache.py): a cached thread is named
#   "Trio thread N" while idle; trio.to_thread.run_sync (which anyio.to_thread uses under trio)
#   renames it to "<function> from <task>" for the duration of a job (trio/_threads.py) and
#   back afterwards. Cached threads linger for 10 s after their last job. The only nameless job
#   is trio's own guest-mode I/O wait (trio/_core/_run.py), the event loop itself.
# * AnyIO's asyncio worker threads (anyio/_backends/_asyncio.py, WorkerThread): always named
#   "AnyIO worker thread", busy or idle, so the name cannot tell; the pool's own idle list
#   (``thread.idle_workers``) can. A worker told to stop when its event loop closed is no
#   longer listed and gets the grace to exit.
# * asyncio's default executor (loop.run_in_executor(None, …), loop.getaddrinfo): a
#   ThreadPoolExecutor whose threads are named "asyncio_N", busy or idle; it is idle unless its
#   stack is inside a work item (concurrent.futures.thread._WorkItem.run).
# * pytest-timeout (timeout_method = "thread"): a threading.Timer named
#   "pytest_timeout <nodeid>", started before the fixtures and joined after them.
# * xdist's execnet threads are started with _thread.start_new_thread, not threading.Thread: they
#   show up in threading.enumerate() only as a threading._DummyThread ("Dummy-N"), and only if
#   they ever call threading.current_thread(). A _DummyThread is never removed and its
#   is_alive() is always True (Python 3.11), so it cannot be judged; anywool starts its
#   threads with threading.Thread (``anywool-*``) and anyio/trio pools, never _thread.
#
# A thread that was already there before the test is not the test's, with one exception: a pool
# thread that was idle before the test and is now running a job (the test handed it that job).

_TRIO_IDLE_NAME = re.compile(r"Trio thread \d+")
_ASYNCIO_EXECUTOR_NAME = re.compile(r"asyncio_\d+")
_WORK_ITEM_RUN = _cf_thread._WorkItem.run.__code__  # the frame of a job in a ThreadPoolExecutor


def _is_idle_pool_thread(thread: threading.Thread, frames: dict[int, FrameType]) -> bool:
    if isinstance(thread, _anyio_asyncio.WorkerThread):
        return thread in thread.idle_workers
    if _TRIO_IDLE_NAME.fullmatch(thread.name):
        return True
    if _ASYNCIO_EXECUTOR_NAME.fullmatch(thread.name) and thread.ident is not None:
        frame = frames.get(thread.ident)
        while frame is not None:
            if frame.f_code is _WORK_ITEM_RUN:
                return False
            frame = frame.f_back
        return True
    return False


def _is_harness_thread(thread: threading.Thread) -> bool:
    if isinstance(thread, threading.Timer) and thread.name.startswith("pytest_timeout "):
        return True
    return isinstance(thread, threading._DummyThread)  # pyright: ignore[reportAttributeAccessIssue]


def _stray_threads(before: dict[threading.Thread, bool]) -> list[threading.Thread]:
    frames = sys._current_frames()
    stray = []
    for thread in threading.enumerate():
        if not thread.is_alive() or _is_harness_thread(thread) or _is_idle_pool_thread(thread, frames):
            continue
        was_idle_in_pool = before.get(thread)
        if was_idle_in_pool is None or was_idle_in_pool:  # new, or an idle pool thread put to work
            stray.append(thread)
    return stray


def _describe_thread(thread: threading.Thread) -> str:
    kind = type(thread).__qualname__
    where = ""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is not None:
        code = frame.f_code
        where = f", at {code.co_filename}:{frame.f_lineno} in {code.co_name}"
    return f"{thread.name!r} ({kind}, ident {thread.ident}, daemon={thread.daemon}{where})"


@pytest.fixture(autouse=True)
def _no_stray_threads(runtime_dir: Path) -> Iterator[None]:
    """After the test: no thread it started is still running (DESIGN §9)."""
    frames = sys._current_frames()
    before = {thread: _is_idle_pool_thread(thread, frames) for thread in threading.enumerate()}
    del frames
    yield
    stray = settle(lambda: _stray_threads(before))
    if stray:
        lines = [f"{len(stray)} thread(s) started by the test still running after {GRACE:.0f} s of grace:"]
        lines += [f"  {_describe_thread(thread)}" for thread in stray]
        pytest.fail("\n".join(lines), pytrace=False)
