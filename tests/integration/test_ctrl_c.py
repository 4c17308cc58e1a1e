"""Ctrl-C and SIGTERM on a real script whose pool runs a CPU-bound call.

The script (``SCRIPT``, a ``python -c`` child in a session of its own, with the test's
environment and so its runtime directory) enters ``WorkerPool(spawn=2)`` on the backend given
(the default ``cancel_grace`` of 1 s unless a test says otherwise), prints its namespace and
its workers' pids, then ``ready``, then awaits a call that holds its worker's event loop: a
pure-Python loop as a routine, the same as a plain function of ``run_sync`` or of
``anywool.map``, or ``run_sync`` of a regular expression that backtracks in C, holding the GIL; or (``exiting``) it leaves the
pool's block while such a call runs, so that the pool's exit is draining it.

Ctrl-C (SIGINT, to the process group as a terminal sends it, or to the script alone) ends the
script within 2 s, by a plain ``KeyboardInterrupt`` (exit status ``-SIGINT``), however many
times it is pressed, and leaves no process and no file behind. SIGTERM (no Python cleanup at
all) leaves the workers to end themselves: they see their parent go, and a worker held in C is
killed by its lifeline 5 s later; the next claim of the namespace sweeps what the script left.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import anyio
import psutil
import pytest

from anywool import LocalDiscovery

from ..helpers import wait_until
from .children import Child, start, stop

pytestmark = pytest.mark.anyio

#: The documented bound: a Ctrl-C ends a script whose pool runs a CPU-bound call within 2 s
#: (a call that cannot be interrupted costs the pool's cancel_grace, 1 s, of it).
CTRL_C_BOUND = 2.0
#: Generous: a worker held in C is killed by its lifeline 5 s after its parent died.
ORPHANS_GONE_WITHIN = 15.0

SCRIPT = """
import faulthandler, os, re, signal, sys
import anyio
import anywool

faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test's view of a hang

# As in a terminal, whatever the test run does with SIGINT.
signal.signal(signal.SIGINT, signal.default_int_handler)
backend, kind, marker, grace = sys.argv[1:5]

def started(path):
    with open(path + ".tmp", "w") as file:
        file.write(str(os.getpid()))
    os.rename(path + ".tmp", path)

def spin_plain(path):
    started(path)
    count = 0
    while True:
        count += 1

def backtrack(path):
    started(path)
    re.fullmatch(r"(a+)+$", "a" * 40 + "b")  # C code holding the GIL, for days

@anywool.routine
async def spin(path):
    spin_plain(path)

async def main():
    async with anywool.WorkerPool(spawn=2, cancel_grace=float(grace)) as pool:
        print(pool.discovery.namespace, *[w.pid for w in pool.workers], flush=True)
        print("ready", flush=True)
        if kind == "routine":
            await spin(marker)
        elif kind == "run_sync":
            await anywool.run_sync(spin_plain, marker)
        elif kind == "map":
            async with anywool.map(spin_plain, [marker] * 8) as results:
                async for _ in results:
                    pass
        else:
            await anywool.run_sync(backtrack, marker)

@anywool.routine
async def spin_telling(path, fifo):
    with open(fifo, "w") as told:  # the script reads it: the call runs on its worker
        told.write("running")
    spin_plain(path)

def read_all(fifo):
    # Opening blocks until the routine opens it; the read returns once it wrote and closed.
    with open(fifo) as told:
        return told.read()

async def spin_quietly(path, fifo):
    try:
        await spin_telling(path, fifo)
    except Exception:
        pass  # ended by the pool's exit: what ends the script must be the Ctrl-C alone

async def exiting():
    # The pool exits while its call runs (the call is awaited outside its block), so its
    # exit drains the call (for up to 60 s): that is where the Ctrl-C lands.
    async with anyio.create_task_group() as tg:
        async with anywool.WorkerPool(spawn=2, cancel_grace=float(grace),
                                      shutdown_timeout=60) as pool:
            print(pool.discovery.namespace, *[w.pid for w in pool.workers], flush=True)
            print("ready", flush=True)
            fifo = marker + ".fifo"
            os.mkfifo(fifo)
            tg.start_soon(spin_quietly, marker, fifo)
            await anyio.to_thread.run_sync(read_all, fifo)
            print("exiting", flush=True)
    print("went on after the pool", flush=True)

if kind != "exiting":
    anyio.run(main, backend=backend)
else:
    try:
        anyio.run(exiting, backend=backend)
    except BaseExceptionGroup as group:
        # Under trio the KeyboardInterrupt is raised where the main task waits, inside the
        # task group around the pool, which wraps it (as any trio nursery does).
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], KeyboardInterrupt):
            raise group.exceptions[0] from None
        raise
"""


def _started_with(runtime_dir: Path) -> list[psutil.Process]:
    """The processes alive (not zombies) whose environment names ``runtime_dir``: the script
    and everything it started, replacement workers and lifelines included (the test process's
    own environment at start-up does not name it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get("ANYWOOL_RUNTIME_DIR") == str(runtime_dir):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _alive(process: psutil.Process) -> bool:
    """Running, and not an exited process waiting to be reaped (the same process: psutil
    compares its start time, so a reused pid does not count)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _describe(processes: list[psutil.Process]) -> str:
    lines = []
    for process in processes:
        try:
            lines.append(f"pid {process.pid}: {' '.join(process.cmdline())}")
        except psutil.Error:
            lines.append(f"pid {process.pid} (gone meanwhile)")
    return "; ".join(lines)


class Script:
    """The running script, as the test sees it once it said ``ready``."""

    def __init__(self, child: Child, namespace: str, worker_pids: list[int]) -> None:
        self.child = child
        self.namespace = namespace
        self.worker_pids = worker_pids
        self.descendants: list[psutil.Process] = []

    @property
    def pid(self) -> int:
        return self.child.pid

    def signal(self, signum: int, *, group: bool) -> None:
        """Send ``signum`` to the script's process group (as a terminal does) or to it alone;
        nothing when it is gone already."""
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, signum)
            elif self.child.process.returncode is None:
                os.kill(self.pid, signum)


@contextlib.asynccontextmanager
async def _script(backend: str, kind: str, tmp_path: Path, runtime_dir: Path, *,
                  cancel_grace: float = 1.0):
    started = tmp_path / "started"
    child = await start(SCRIPT, backend, kind, str(started), str(cancel_grace), new_group=True,
                        capture_stderr=True)
    try:
        namespace, *pids = (await child.readline()).split()
        assert await child.readline() == "ready"
        script = Script(child, namespace, [int(pid) for pid in pids])
        await wait_until(started.exists, "the call to start", timeout=30)
        # Pressed once the call is well under way (its worker burnt some CPU time in it): a
        # Ctrl-C that lands as the call starts races with the call's acknowledgement, a bug
        # of its own (test_interrupt.py, test_a_call_cancelled_before_its_acknowledgement_...).
        busy = psutil.Process(int(started.read_text()))
        assert busy.pid in script.worker_pids
        spent = _cpu_seconds(busy)
        await wait_until(lambda: _cpu_seconds(busy) > spent + 0.2, "the call to run a while")
        script.descendants = psutil.Process(child.pid).children(recursive=True)
        assert set(script.worker_pids) <= {p.pid for p in script.descendants}
        yield script
    finally:
        with anyio.CancelScope(shield=True):
            # Whatever the test found: nothing of the script outlives it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            for process in _started_with(runtime_dir):
                with contextlib.suppress(psutil.Error):
                    process.kill()
            await stop([child])


async def _exit_after_ctrl_c(script: Script, runtime_dir: Path, *, group: bool,
                             again_after: float | None = None) -> None:
    """Press Ctrl-C (and again ``again_after`` seconds later); the script exits within the
    bound, by a plain KeyboardInterrupt, leaving no process and no file."""
    pressed = anyio.current_time()
    script.signal(signal.SIGINT, group=group)
    async with anyio.create_task_group() as tg:
        if again_after is not None:

            async def press_again() -> None:
                await anyio.sleep(again_after)  # the moment is what the test varies
                script.signal(signal.SIGINT, group=group)

            tg.start_soon(press_again)
        with anyio.move_on_after(CTRL_C_BOUND + 10) as waited:
            code = await script.child.wait()
        took = anyio.current_time() - pressed
        tg.cancel_scope.cancel()
    stderr = b""
    if waited.cancelled_caught:
        script.signal(signal.SIGUSR2, group=False)  # its threads' stacks, to its stderr
        with anyio.move_on_after(2):
            await script.child.wait()
        script.signal(signal.SIGKILL, group=True)
        with anyio.move_on_after(5):
            stderr = await script.child.read_stderr()
        pytest.fail(f"the script did not exit {CTRL_C_BOUND + 10} s after Ctrl-C:\n"
                    f"{stderr.decode(errors='replace')}")
    with anyio.move_on_after(5):  # until every holder of its stderr (its processes) is gone
        stderr = await script.child.read_stderr()
    text = stderr.decode(errors="replace")
    assert took <= CTRL_C_BOUND, f"the script took {took:.2f} s to exit after Ctrl-C:\n{text}"
    assert code == -signal.SIGINT, text
    lines = text.rstrip().splitlines() or [""]
    ignored = "Exception ignored in: <function BaseEventLoop.__del__"
    if again_after is not None and lines[-1] == "lost sys.stderr":
        # The second press interrupted the interpreter printing the first one's traceback:
        # CPython then reports the KeyboardInterrupt so, whatever the program (no library
        # can shield that printing); it still exits by it.
        assert "object type name: KeyboardInterrupt" in text, text
    elif again_after is not None and any(line.startswith(ignored) for line in lines):
        # The second press landed in asyncio.Runner closing its loop, after anyio.run's own
        # code: the KeyboardInterrupt is raised there, and the half-closed loop's finaliser
        # then reports a closed descriptor at exit. Any asyncio program shows the same; the
        # exit is still by KeyboardInterrupt, raised from the loop's closing.
        before = lines[:next(i for i, line in enumerate(lines) if line.startswith(ignored))]
        assert before[-1] == "KeyboardInterrupt", text
        assert any("_close_self_pipe" in line for line in before), text
    else:
        assert lines[-1] == "KeyboardInterrupt", text
    left = _started_with(runtime_dir)
    assert left == [], f"left running: {_describe(left)}"
    assert not any(_alive(p) for p in script.descendants)
    assert list(runtime_dir.iterdir()) == []


@pytest.mark.parametrize("kind", ["routine", "run_sync", "backtrack", "map"])
async def test_ctrl_c_to_the_process_group_ends_the_script_promptly_and_leaves_nothing(
        kind: str, anyio_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    with anyio.fail_after(60):
        async with _script(anyio_backend, kind, tmp_path, runtime_dir) as script:
            # Workers run in sessions of their own: the group's Ctrl-C reaches the script
            # alone, which stops them.
            assert all(os.getsid(pid) == pid != script.pid for pid in script.worker_pids)
            await _exit_after_ctrl_c(script, runtime_dir, group=True)


@pytest.mark.parametrize("kind", ["routine", "backtrack"])
async def test_sigint_to_the_script_alone_ends_it_promptly_and_leaves_nothing(
        kind: str, anyio_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    with anyio.fail_after(60):
        async with _script(anyio_backend, kind, tmp_path, runtime_dir) as script:
            await _exit_after_ctrl_c(script, runtime_dir, group=False)


# The second press lands while anywool tears the pool down: a pure-Python call is interrupted
# within some 0.2 s (so only 0.05 s), one stuck in C code holds the exit for cancel_grace (1 s)
# and more. Later, it would land in asyncio's closing of its loop or in the interpreter's own
# printing of the traceback, which no library can shield.
@pytest.mark.parametrize(("kind", "again_after"), [
    ("routine", 0.05),
    ("backtrack", 0.05),
    ("backtrack", 0.5),
    ("backtrack", 1.1),
])
async def test_a_second_ctrl_c_never_slows_the_exit_nor_changes_how_it_ends(
        kind: str, again_after: float, anyio_backend: str, tmp_path: Path,
        runtime_dir: Path) -> None:
    with anyio.fail_after(60):
        async with _script(anyio_backend, kind, tmp_path, runtime_dir) as script:
            await _exit_after_ctrl_c(script, runtime_dir, group=True, again_after=again_after)


async def test_a_ctrl_c_while_the_pool_exits_hurries_the_exit_and_still_ends_the_script(
        anyio_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    # The exit holds off a KeyboardInterrupt while it hurries (it must not land halfway
    # through the teardown), then hands the Ctrl-C on: the script never goes on as if it had
    # not been pressed.
    with anyio.fail_after(60):
        async with _script(anyio_backend, "exiting", tmp_path, runtime_dir) as script:
            assert await script.child.readline() == "exiting"
            await _exit_after_ctrl_c(script, runtime_dir, group=True)


def _is_worker(process: psutil.Process) -> bool:
    try:
        return "anywool.worker" in process.cmdline()
    except psutil.Error:
        return False


async def test_a_ctrl_c_to_the_process_group_makes_the_pool_start_no_worker(
        anyio_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    started_after: set[int] = set()
    with anyio.fail_after(60):
        # A cancel_grace long enough for the pool to see the idle worker go before it exits
        # itself, however loaded the machine.
        async with _script(anyio_backend, "backtrack", tmp_path, runtime_dir,
                           cancel_grace=5.0) as script:
            before = {script.pid} | {p.pid for p in script.descendants}
            script.signal(signal.SIGINT, group=True)
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while True:  # a worker lives for far longer than a poll interval
                        started_after.update(p.pid for p in _started_with(runtime_dir)
                                             if p.pid not in before and _is_worker(p))
                        await anyio.sleep(0.02)

                tg.start_soon(watch)
                assert await script.child.wait() == -signal.SIGINT
                tg.cancel_scope.cancel()
    assert started_after == set(), "worker processes started after the Ctrl-C"


@pytest.mark.parametrize("kind", ["routine", "backtrack"])
async def test_after_sigterm_to_the_script_its_workers_end_themselves_and_the_namespace_is_swept(
        kind: str, anyio_backend: str, tmp_path: Path, runtime_dir: Path) -> None:
    with anyio.fail_after(60):
        async with _script(anyio_backend, kind, tmp_path, runtime_dir) as script:
            script.signal(signal.SIGTERM, group=False)
            assert await script.child.wait() == -signal.SIGTERM  # no Python cleanup ran
            await wait_until(lambda: _started_with(runtime_dir) == [],
                             "every process the script started to exit by itself",
                             timeout=ORPHANS_GONE_WITHIN)
            assert not any(_alive(p) for p in script.descendants)
            # The dead owner left its namespace; the next claim sweeps it.
            assert [entry.name[:3] for entry in runtime_dir.iterdir()] == ["ns-"]
            async with LocalDiscovery(script.namespace) as successor:
                assert successor.claimed
        assert list(runtime_dir.iterdir()) == []
