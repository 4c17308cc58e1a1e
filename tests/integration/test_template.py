"""The pool's warm template (issue 24, item 5): workers forked from one warm interpreter the
pool owns, for pools larger than the CPUs and for every worker the pool starts after its own
start; nothing outlives the pool, and a template that dies costs nothing but speed. Real
processes, both backends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

import anyio
import psutil
import pytest

from anywool import LocalDiscovery, WorkerPool, routine
from anywool.runtime.pool._local_worker import LocalWorker, current_backend
from anywool.runtime.pool._template import UNKNOWN_CODE, Template, TemplateUnavailable
from anywool.runtime.pool._template_frames import Frames, encode, rights

from ..helpers import wait_until
from . import children

pytestmark = pytest.mark.anyio

CPUS = os.cpu_count() or 1


@routine
async def parent_pid() -> int:
    return os.getppid()


@routine
async def exit_now(code: int) -> None:
    os._exit(code)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _warm(pool: WorkerPool) -> Template | None:
    """The pool's warm template while it runs (kept by the pool's supervision)."""
    return pool._supervisor.template


def _template_pid(pool: WorkerPool) -> int:
    template = _warm(pool)
    assert template is not None and template._process is not None
    return template._process.pid


async def test_workers_started_after_the_pool_are_forked_from_its_template() -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=2) as pool:
            # Up to the CPUs, the pool's own start does not wait for a template.
            assert _warm(pool) is None
            assert {w.pid: psutil.Process(w.pid).ppid() for w in pool.workers} == \
                {w.pid: os.getpid() for w in pool.workers}
            await pool.recycle()  # the first worker started again asks for the template
            await wait_until(lambda: _warm(pool) is not None, "the template to be warm")
            template = _template_pid(pool)
            await pool.recycle()
            assert [psutil.Process(w.pid).ppid() for w in pool.workers] == [template] * 2
            # The workers it forks run routines like any other, and know it as their parent.
            assert {await parent_pid() for _ in range(4)} == {template}
            workers = [w.pid for w in pool.workers]
    assert _gone(template)
    assert all(_gone(pid) for pid in workers)


async def test_a_pool_larger_than_the_cpus_forks_all_its_workers() -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS + 1) as pool:
            template = _template_pid(pool)
            assert [psutil.Process(w.pid).ppid() for w in pool.workers] == [template] * (CPUS + 1)
            async with anyio.create_task_group() as tg:
                for _ in range(2 * (CPUS + 1)):
                    tg.start_soon(parent_pid)


async def test_a_pool_as_large_as_the_cpus_starts_its_workers_itself() -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS) as pool:
            assert _warm(pool) is None
            assert [psutil.Process(w.pid).ppid() for w in pool.workers] == [os.getpid()] * CPUS


async def test_a_dead_template_costs_only_speed() -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS + 1) as pool:
            template = _template_pid(pool)
            forked = [w.pid for w in pool.workers]
            os.kill(template, signal.SIGKILL)
            await wait_until(lambda: _warm(pool) is not None and _warm(pool).ended,
                             "the pool to see its template gone")
            # Its workers go on serving; one that dies is seen to (on its pidfd) and replaced
            # by a worker started as a process of its own.
            assert len(await _serve_all(pool)) == CPUS + 1
            victim = pool.workers[0]
            victim.kill()
            assert await victim.wait() == UNKNOWN_CODE
            await wait_until(lambda: len(pool.workers) == CPUS + 1
                             and victim.pid not in {w.pid for w in pool.workers},
                             "the dead worker to be replaced")
            replacement = next(w for w in pool.workers if w.pid not in forked)
            assert psutil.Process(replacement.pid).ppid() == os.getpid()
    assert all(_gone(pid) for pid in forked)


async def _serve_all(pool: WorkerPool) -> set[int]:
    seen: set[int] = set()
    async with anyio.create_task_group() as tg:
        for _ in range(4 * len(pool.workers)):
            tg.start_soon(lambda: _add(seen))
    return seen


async def _add(seen: set[int]) -> None:
    seen.add(await _pid())


@routine
async def _pid() -> int:
    return os.getpid()


async def test_a_forked_worker_exit_code_comes_from_the_template() -> None:
    with anyio.fail_after(30):
        async with Template(current_backend(), 20) as template:
            assert template._process is not None
            worker = LocalWorker()
            worker._fork_from(template)
            async with worker:
                assert psutil.Process(worker.pid).ppid() == template._process.pid
                worker.kill()
                assert await worker.wait() == -signal.SIGKILL


async def test_a_forked_worker_that_exits_is_replaced_and_its_code_said(
        caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS + 1) as pool:
            with pytest.raises(Exception):
                await exit_now(3)
            await wait_until(lambda: "exited unexpectedly (code 3)" in caplog.text,
                             "the pool to say how its worker ended")
            await wait_until(lambda: len(pool.workers) == CPUS + 1, "the replacement")
            assert len(await _serve_all(pool)) == CPUS + 1


async def test_forked_workers_end_with_their_pool_killed(namespace: str) -> None:
    code = f"""
import anyio, os, sys
from anywool import LocalDiscovery, WorkerPool

async def main():
    async with WorkerPool(spawn={CPUS + 1}, discovery=LocalDiscovery({namespace!r})) as pool:
        print(pool._supervisor.template._process.pid, *[w.pid for w in pool.workers], flush=True)
        await anyio.sleep_forever()

anyio.run(main, backend={current_backend()!r})
"""
    child = await children.start(code)
    try:
        with anyio.fail_after(60):
            pids = [int(p) for p in (await child.readline()).split()]
            assert len(pids) == CPUS + 2
            child.process.send_signal(signal.SIGKILL)
            await child.wait()
            # The template at end-of-file; the workers on their pipes and lifelines.
            await wait_until(lambda: all(_gone(pid) for pid in pids),
                             "the template and its workers to end", timeout=30)
            async with LocalDiscovery(namespace) as successor:  # what a SIGKILL left behind
                assert successor.claimed
    finally:
        await children.stop([child])


def test_frames_hand_out_descriptors_in_order_and_refuse_what_is_not_a_frame() -> None:
    a, b = socket.socketpair()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        data = encode({"n": 1, "fds": 2}) + encode({"n": 2}) + encode({"n": 3, "fds": 1})
        a.sendmsg([data[:5]], rights([r1, w1]))
        a.sendmsg([data[5:]], rights([r2]))
        frames = Frames()
        received = 0
        while received < len(data):
            chunk, ancillary, _, _ = b.recvmsg(7, socket.CMSG_SPACE(16))
            frames.feed(chunk, ancillary)
            received += len(chunk)
        out = []
        while (frame := frames.next()) is not None:
            out.append((frame[0]["n"], len(frame[1])))
            for fd in frame[1]:
                os.close(fd)
        assert out == [(1, 2), (2, 0), (3, 1)]
        bad = Frames()
        bad.feed(encode({"fds": 1}), [])
        with pytest.raises(ValueError, match="descriptors"):
            bad.next()
        bad = Frames()
        bad.feed(encode([1]), [])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="list"):
            bad.next()
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)
        a.close()
        b.close()


def test_the_template_refuses_an_unknown_backend() -> None:
    import subprocess

    result = subprocess.run([sys.executable, "-m", "anywool.runtime._template", "curio"],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "asyncio|trio" in result.stderr


async def test_a_pool_whose_template_cannot_start_starts_its_workers_itself(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def unavailable(self: Template) -> Template:
        raise TemplateUnavailable("no pidfds here")

    monkeypatch.setattr(Template, "__aenter__", unavailable)
    caplog.set_level("INFO", logger="anywool.runtime._pool")
    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS + 1) as pool:
            assert _warm(pool) is None
            assert [psutil.Process(w.pid).ppid() for w in pool.workers] == \
                [os.getpid()] * (CPUS + 1)
            assert len(await _serve_all(pool)) == CPUS + 1
    assert "no warm template (no pidfds here)" in caplog.text


async def test_a_wedged_template_neither_hides_a_worker_end_nor_slows_the_exit(
        caplog: pytest.LogCaptureFixture) -> None:
    # A template that stops (SIGSTOP, or so slow that it seems to) reaps nothing and says
    # nothing: the pool still sees its forked workers end (on their pidfds, the code unknown),
    # replaces them (as processes of their own, once the fork request times out), and stops
    # the others at its exit without waiting out SIGTERM and SIGKILL for ends it cannot hear.
    with anyio.fail_after(60):
        async with WorkerPool(spawn=CPUS + 1, shutdown_timeout=1) as pool:
            template = _template_pid(pool)
            forked = [w.pid for w in pool.workers]
            os.kill(template, signal.SIGSTOP)
            try:
                victim = pool.workers[0]
                victim.kill()
                with anyio.fail_after(20):
                    assert await victim.wait() == UNKNOWN_CODE
                await wait_until(lambda: len(pool.workers) == CPUS + 1
                                 and victim.pid not in {w.pid for w in pool.workers},
                                 "the dead worker to be replaced", timeout=30)
                assert len(await _serve_all(pool)) == CPUS + 1
            except BaseException:
                os.kill(template, signal.SIGCONT)
                raise
    assert "survived SIGKILL" not in caplog.text
    assert _gone(template)
    assert all(_gone(pid) for pid in forked)


async def test_a_template_that_does_not_answer_a_fork_in_time_is_killed() -> None:
    # A fork request that timed out makes the template unusable, and it is killed: resumed, it
    # would fork the request late (a worker nobody runs, started with the arguments of the one
    # started instead, its socket directory included) and answer it, its answers taken for
    # another request's, or left blocking what it says next. The workers it forked stay, and
    # are seen to end on their pidfds.
    with anyio.fail_after(60):
        async with Template(current_backend(), 20) as template:
            assert template._process is not None
            pid = template._process.pid
            keep = LocalWorker()
            keep._fork_from(template)
            async with keep:
                os.kill(pid, signal.SIGSTOP)
                try:
                    late = [LocalWorker(), LocalWorker()]
                    async with anyio.create_task_group() as tg:
                        for worker in late:
                            worker._fork_from(template)
                            tg.start_soon(worker.__aenter__)
                            # The second waits behind the first, whose request is sent.
                            await wait_until(lambda: template._lock.locked(), "a fork request")
                    assert template.ended
                    # Both started as processes of their own once the first request timed out.
                    assert [psutil.Process(w.pid).ppid() for w in late] == [os.getpid()] * 2
                    await wait_until(lambda: _gone(pid), "the wedged template to be killed")
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                for worker in late:
                    await worker.stop(0)
                keep.kill()
                assert await keep.wait() == UNKNOWN_CODE



async def test_a_cancelled_pool_stops_its_forked_workers_as_it_stops_any(
        caplog: pytest.LogCaptureFixture) -> None:
    # The pool's cancellation (a deadline, a Ctrl-C) reaches its template's tasks too: the
    # template must still outlive the workers, and say how they end, while they are stopped
    # (SIGTERM first, as any worker: not SIGKILLed by the template's end).
    fds = set(os.listdir("/proc/self/fd"))
    with anyio.fail_after(60):
        with anyio.CancelScope() as scope:
            async with WorkerPool(spawn=CPUS + 1) as pool:
                template = _template_pid(pool)
                forked = [w.pid for w in pool.workers]
                processes = [w._process for w in pool.workers]
                scope.cancel()
                await anyio.sleep_forever()
    assert "survived SIGKILL" not in caplog.text
    codes = [p.returncode for p in processes if p is not None]
    assert len(codes) == CPUS + 1
    assert not {UNKNOWN_CODE, -signal.SIGKILL} & set(codes), codes
    assert _gone(template)
    assert all(_gone(pid) for pid in forked)
    assert set(os.listdir("/proc/self/fd")) <= fds


@routine
async def write_stderr(text: str) -> int:
    os.write(2, text.encode())
    return os.getppid()


async def test_a_forked_worker_writes_to_the_stderr_its_pool_has_when_it_starts(
        tmp_path: object) -> None:
    # As a worker started as a process of its own does (it inherits the pool's descriptor 2
    # as it is then), not to whatever the pool's stderr was when its template started.
    import pathlib

    log_file = pathlib.Path(str(tmp_path)) / "stderr"
    with anyio.fail_after(60):
        async with WorkerPool(spawn=1) as pool:
            await pool.recycle()
            await wait_until(lambda: _warm(pool) is not None, "the template to be warm")
            saved = os.dup(2)
            try:
                with open(log_file, "wb") as f:
                    os.dup2(f.fileno(), 2)
                try:
                    await pool.recycle()
                finally:
                    os.dup2(saved, 2)
            finally:
                os.close(saved)
            assert await write_stderr("to the new stderr\n") == _template_pid(pool)
    assert "to the new stderr" in log_file.read_text()


async def test_the_pool_block_exception_is_not_given_to_the_template_task_group(
        caplog: pytest.LogCaptureFixture) -> None:
    # The template's task group wraps no part of the pool's block: given the block's exception
    # a task group re-raises it in a group (trio), and the pool's exit failed with it (a
    # Ctrl-C then ended a script with an exception group, not as a Ctrl-C does).
    with anyio.fail_after(60):
        with pytest.raises(ValueError, match="mine"):
            async with WorkerPool(spawn=1):
                raise ValueError("mine")
    assert "teardown failed" not in caplog.text
