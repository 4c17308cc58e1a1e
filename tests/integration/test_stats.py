"""A look inside a running pool (issue 23, item 4): each worker's statistics, asked of the worker
over its connection (``pool.stats()``, ``WorkerConnection.stats``, ``anywool top``)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import sniffio

from anywool import LocalDiscovery, LocalWorker, WorkerPool, WorkerStats, routine
from anywool.lowlevel import CallNotDelivered, WorkerConnection
from anywool.runtime.wire import _envelope
from anywool.runtime.wire._frames import Frame, FrameError, FrameStream, Kind

from .children import REPO

pytestmark = pytest.mark.anyio

#: What a worker keeps alive (see hoard).
_hoard: list[bytes] = []


@routine
async def gated(gate: str) -> int:
    """Says it runs (over the Unix socket ``gate``), then waits for the test to let it go."""
    async with await anyio.connect_unix(gate) as stream:
        await stream.send(b"running")
        await stream.receive()
    return os.getpid()


@routine
async def hoard(size: int) -> None:
    """Keep ``size`` bytes alive in the worker, every page of them written."""
    _hoard.append(b"\x01" * size)


@routine
async def fail() -> None:
    raise ValueError("no")


@routine
async def noop() -> None:
    pass


async def one(pool: WorkerPool, timeout: float = 5.0) -> WorkerStats:
    [stats] = (await pool.stats(timeout)).values()
    assert stats is not None
    return stats


async def test_stats_count_calls_in_flight_served_and_busy_time(tmp_path: Path) -> None:
    gate = str(tmp_path / "gate")
    with anyio.fail_after(40):
        async with WorkerPool(spawn=1, max_concurrency=1) as pool, \
                await anyio.create_unix_listener(gate) as listener:
            before = await one(pool)
            assert (before.in_flight, before.served, before.max_concurrency) == (0, 0, 1)
            assert before.pid == pool.workers[0].pid
            assert before.backend == sniffio.current_async_library()
            async with anyio.create_task_group() as tg:
                tg.start_soon(gated, gate)
                held = await listener.accept()
                assert await held.receive() == b"running"
                # At its max_concurrency, the worker still answers, and the request is no call.
                running = await one(pool)
                assert (running.in_flight, running.served) == (1, 0)
                await anyio.sleep(0.3)  # time passing while a call runs (measured, not a wait)
                later = await one(pool)
                elapsed = later.uptime_seconds - running.uptime_seconds
                assert later.in_flight == 1 and elapsed >= 0.3
                assert later.busy_seconds - running.busy_seconds >= 0.9 * elapsed
                await held.send(b"go")
                await held.aclose()
            done = await one(pool)
            assert (done.in_flight, done.served, done.returned) == (0, 1, 1)
            assert done.busy_seconds >= later.busy_seconds
            await anyio.sleep(0.3)  # idle time passing
            idle = await one(pool)
            assert idle.uptime_seconds - done.uptime_seconds >= 0.3
            assert idle.busy_seconds == done.busy_seconds  # idle time is not busy time
            with pytest.raises(ValueError):
                await fail()
            with anyio.move_on_after(0.5):
                await gated(gate)  # never let go: cancelled by the deadline
            ended = await one(pool)
            assert (ended.in_flight, ended.served, ended.returned, ended.raised,
                    ended.cancelled) == (0, 3, 1, 1, 1)


async def test_memory_grows_with_what_a_routine_keeps_alive() -> None:
    size = 64 << 20
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1) as pool:
            before = await one(pool)
            await hoard(size)
            after = await one(pool)
    assert before.rss_bytes is not None and after.rss_bytes is not None
    assert not after.rss_peak  # Linux: the current size, from /proc
    assert after.rss_bytes - before.rss_bytes >= 0.9 * size


async def test_a_suspended_worker_is_reported_as_not_answering_within_the_timeout(
        namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=1, discovery=discovery) as pool:
            await noop()
            [worker] = pool.workers
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                started = anyio.current_time()
                found = await pool.stats(timeout=0.5)
                took = anyio.current_time() - started
                result = await anywool_cli("top", namespace, "--timeout", "0.5", "--json")
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            assert found == {worker.metadata.uid: None}
            assert 0.5 <= took < 1.5
            assert (await one(pool)).served == 1  # awake again, and answering
    [entry] = json.loads(result.stdout)
    assert (entry["stats"], entry["error"]) == (None, "no answer within 0.5 s")


def test_top_of_a_missing_namespace_is_exit_1(namespace: str) -> None:
    result = subprocess.run([sys.executable, "-m", "anywool.cli", "top", namespace, "--once"],
                            capture_output=True, text=True, timeout=30, cwd=REPO,
                            env=_environment(None))
    assert result.returncode == 1 and result.stdout == ""
    assert namespace in result.stderr


@pytest.mark.parametrize("option", ["--interval", "--timeout"])
def test_top_refuses_nan_seconds(namespace: str, option: str) -> None:
    # click's FloatRange lets NaN through: every worker was "unreachable" (--timeout), or
    # the live view crashed after its first table (--interval).
    result = subprocess.run([sys.executable, "-m", "anywool.cli", "top", namespace, option,
                             "nan"], capture_output=True, text=True, timeout=30, cwd=REPO,
                            env=_environment(None))
    assert result.returncode == 2 and result.stdout == ""
    assert f"Invalid value for '{option}': nan is not a number of seconds" in result.stderr


async def test_stats_are_answered_while_the_worker_drains(tmp_path: Path) -> None:
    gate = str(tmp_path / "gate")
    with anyio.fail_after(30):
        async with LocalWorker() as worker, \
                await anyio.create_unix_listener(gate) as listener, \
                WorkerConnection(worker.address) as connection, \
                anyio.create_task_group() as tg:
            tg.start_soon(connection.call, gated.__wrapped__, (gate,), {})
            async with await listener.accept() as held:
                assert await held.receive() == b"running"
                os.kill(worker.pid, signal.SIGINT)  # drain forever
                with pytest.raises(CallNotDelivered):  # draining: it takes no call
                    while True:
                        await connection.call(noop.__wrapped__, (), {})
                stats = await connection.stats(5)
                assert stats.in_flight == 1
                await held.send(b"go")


class _FakeWorker:
    """A Unix listener that speaks the worker protocol by hand: a HELLO, then ``answers`` to
    STATS requests, in order."""

    def __init__(self, path: str, answers: list[bytes]) -> None:
        self.path, self.answers = path, answers

    async def serve(self, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        async with await anyio.create_unix_listener(self.path) as listener:
            task_status.started()
            stream = await listener.accept()
            async with stream:
                frames = FrameStream(stream, stream)
                await frames.send(Frame(Kind.HELLO, 0, _envelope.encode_hello(None)))
                for answer in self.answers:
                    request = await frames.receive()
                    assert request.kind == Kind.STATS and request.payload == b""
                    await frames.send(Frame(Kind.STATS, request.call_id, answer))
                try:
                    await frames.receive()
                except anyio.EndOfStream:
                    pass


def _stats_map(**changes: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "pid": 1, "backend": "trio", "python": "3.12.0", "version": "1", "max_concurrency": None,
        "in_flight": 0, "served": 2, "returned": 2, "raised": 0, "cancelled": 0,
        "busy_seconds": 1.5, "uptime_seconds": 3, "rss_bytes": 4096, "rss_peak": False}
    fields.update(changes)
    return fields


async def test_a_malformed_answer_fails_that_request_only(tmp_path: Path) -> None:
    import msgpack

    path = str(tmp_path / "fake")
    good = msgpack.packb(_stats_map(future_field=[1, 2]))
    fake = _FakeWorker(path, [b"\xc1garbage", msgpack.packb(_stats_map(served=-1)), good])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(fake.serve)
            async with WorkerConnection(f"unix:{path}") as connection:
                with pytest.raises(FrameError, match="undecodable stats"):
                    await connection.stats(2)
                with pytest.raises(FrameError, match="served"):
                    await connection.stats(2)
                stats = await connection.stats(2)  # the connection goes on
                assert not connection.broken
    assert stats == WorkerStats(1, "trio", "3.12.0", "1", None, 0, 2, 2, 0, 0, 1.5, 3.0, 4096,
                                False)
    assert stats.busy_fraction == 0.5


# -- anywool top ---------------------------------------------------------------------------------


def _environment(runtime_dir: str | None, secret: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLUMNS"] = "80"  # off a terminal: top's rows must still not wrap (issue 25)
    env.pop("ANYWOOL_SECRET", None)
    if secret is not None:
        env["ANYWOOL_SECRET"] = secret
    if runtime_dir is not None:
        env["ANYWOOL_RUNTIME_DIR"] = runtime_dir
    return env


async def anywool_cli(*args: str, runtime_dir: str | None = None, secret: str | None = None,
                      allow_missing: bool = False) -> subprocess.CompletedProcess[bytes]:
    result = await anyio.run_process([sys.executable, "-m", "anywool.cli", *args], check=False,
                                     cwd=REPO, env=_environment(runtime_dir, secret))
    if not allow_missing:
        assert result.returncode == 0, result.stderr.decode()
    return result


async def test_top_once_and_json_show_each_workers_answer_and_refusals(
        namespace: str, anyio_backend: str) -> None:
    secret = secrets.token_hex(16)
    with anyio.fail_after(40):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=1, discovery=discovery, host="127.0.0.1", secret=secret) as pool:
            for _ in range(3):
                await noop()
            [worker] = pool.workers
            document = json.loads((await anywool_cli("top", namespace, "--json",
                                                     secret=secret)).stdout)
            table = (await anywool_cli("top", namespace, "--once", secret=secret)).stdout
            wrong = json.loads((await anywool_cli("top", namespace, "--json",
                                                  secret=secrets.token_hex(16))).stdout)
            none = json.loads((await anywool_cli("top", namespace, "--json")).stdout)
    [entry] = document
    assert (entry["uid"], entry["address"], entry["pid"], entry["error"]) == (
        str(worker.metadata.uid), worker.address, worker.pid, None)
    stats = entry["stats"]
    assert (stats["pid"], stats["in_flight"], stats["served"], stats["returned"]) == (
        worker.pid, 0, 3, 3)
    assert stats["rss_bytes"] > 0 and stats["uptime_seconds"] > 0
    assert stats["backend"] == anyio_backend and stats["version"]
    [row] = [line for line in table.decode().splitlines()
             if worker.metadata.uid.hex[:8] in line]
    # One line, whole, even at 80 columns off a terminal: the address is never wrapped.
    assert worker.address in row and str(worker.pid) in row and row.rstrip().endswith("ok")
    # A worker that refuses us is shown as such, with the reason: not an error of the command.
    assert wrong[0]["stats"] is None and wrong[0]["error"].startswith("refused: ")
    assert none[0]["stats"] is None and "no credentials" in none[0]["error"]
