"""``anywool worker --discovery local``: the real command in another interpreter, dispatched to
from this one. (The LAN variant is in tests/lan.)"""

from __future__ import annotations

import contextlib
import re
import secrets
import signal
from pathlib import Path

import anyio
import psutil
import pytest

from anywool._address import Address
from anywool.discovery.local import LocalDiscovery
from anywool.errors import AuthenticationError
from anywool.runtime.pool._pool import WorkerPool

from ..helpers import wait_until
from .children import Child, start, stop
from .routines import letters, lifespan_state, parent_pid, whoami

pytestmark = pytest.mark.anyio

COMMAND = "from anywool.cli import main; main()"


async def host(*args: str) -> tuple[Child, list[str]]:
    """Start ``anywool worker ARGS``; its worker lines once it says ``ready``."""
    child = await start(COMMAND, "worker", *args)
    assert await child.readline() == "starting"
    lines = []
    while (line := await child.readline()) != "ready":
        lines.append(line)
    return child, lines


async def test_a_pool_elsewhere_dispatches_to_the_hosted_workers(
        namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--workers", "2", "--backend", anyio_backend)
        try:
            # One `worker <address> pid <pid>` line per worker.
            hosted = [re.fullmatch(r"worker (unix:/\S+) pid (\d+)", line) for line in lines]
            assert len(hosted) == 2 and all(hosted), lines
            pids = {int(match[2]) for match in hosted if match}
            assert len(pids) == 2
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum=2,
                                  lazy=False):
                assert {await parent_pid() for _ in range(4)} == {child.pid}
                assert {await whoami() for _ in range(4)} <= pids
                assert [c async for c in letters("abc")] == ["a", "b", "c"]
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])


async def test_hosted_workers_enter_the_lifespan_named_and_retire(namespace: str,
                                                      anyio_backend: str) -> None:
    with anyio.fail_after(60):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--backend", anyio_backend,
                                  "--lifespan", "tests.integration.lifespans:counter",
                                  "--max-calls", "1")
        try:
            [pid] = [int(line.rsplit(" ", 1)[1]) for line in lines]
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)):
                assert await lifespan_state() == {"pid": pid, "calls": 0}
                # Retired after its one call, replaced: the next call finds the replacement.
                assert await whoami() != pid
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])


async def test_sighup_recycles_the_hosted_workers(namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(60):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--workers", "2", "--backend", anyio_backend)
        try:
            before = {int(line.rsplit(" ", 1)[1]) for line in lines}
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum=2,
                                  lazy=False) as borrower:
                assert {await whoami() for _ in range(4)} == before
                child.process.send_signal(signal.SIGHUP)
                assert await child.readline() == "recycling"
                replaced = [await child.readline() for _ in range(2)]
                assert await child.readline() == "recycled"
                after = {int(line.rsplit(" ", 1)[1]) for line in replaced}
                assert len(after) == 2 and not after & before
                # This pool learns of the new workers through discovery, and uses them.
                await wait_until(lambda: {m.pid for m in borrower.proxy.workers} == after,
                                 "the borrower to see the new workers")
                assert {await whoami() for _ in range(4)} == after
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])


async def test_tcp_workers_with_a_secret_file(namespace: str, tmp_path: Path,
                                              anyio_backend: str) -> None:
    secret = secrets.token_hex(16)
    path = tmp_path / "secret"
    path.write_text(secret + "\n")  # the trailing newline is not part of it
    path.chmod(0o600)
    with anyio.fail_after(60):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--host", "127.0.0.1", "--secret-file", str(path),
                                  "--backend", anyio_backend)
        try:
            (line,) = lines
            assert Address.parse(line.split()[1]).host == "127.0.0.1"
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace),
                                  secret=secret):
                assert await parent_pid() == child.pid
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace),
                                  secret=secrets.token_hex(16)):
                with pytest.raises(AuthenticationError):
                    await parent_pid()
            child.process.send_signal(signal.SIGINT)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])


@pytest.fixture
def readable_secret(tmp_path: Path) -> str:
    path = tmp_path / "readable"
    path.write_text(secrets.token_hex(16))
    path.chmod(0o644)
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["--host", "127.0.0.1"], "--secret-file"),
    (["--host", "127.0.0.1", "--secret-file", "/nonexistent/secret"], "cannot read"),
    (["--host", "127.0.0.1", "--tls-cert", __file__], "--tls-cert and --tls-ca"),
    (["--interface", "127.0.0.1"], "--interface applies to --discovery lan only"),
    (["--host", "127.0.0.1", "--secret-file", "READABLE"], "accessible to other users"),
    (["--secret-file", "READABLE"], "add --host"),
    (["--host", ""], "host must be a host name"),
    (["--lifespan", "no_such_module_here:life"], "--lifespan='no_such_module_here:life' cannot"),
    (["--lifespan", "no_colon"], "--lifespan must be 'module:name'"),
    (["--max-memory", "1000"], "--max-memory"),
])
async def test_bad_options_are_usage_errors(namespace: str, args: list[str], message: str,
                                            readable_secret: str) -> None:
    args = [readable_secret if arg == "READABLE" else arg for arg in args]
    with anyio.fail_after(30):
        child = await start(COMMAND, "worker", "--discovery", "local", "--namespace", namespace,
                            *args, capture_stderr=True)
        try:
            assert await child.wait() == 2
            assert message in (await child.read_stderr()).decode()
        finally:
            await stop([child])


async def test_a_host_it_cannot_listen_on_is_one_line_of_error(namespace: str, tmp_path: Path
                                                               ) -> None:
    path = tmp_path / "secret"
    path.write_text(secrets.token_hex(16))
    path.chmod(0o600)
    with anyio.fail_after(30):
        child = await start(COMMAND, "worker", "--discovery", "local", "--namespace", namespace,
                            "--host", "192.0.2.1", "--secret-file", str(path),
                            capture_stderr=True)
        try:
            assert await child.wait() == 1
            errors = (await child.read_stderr()).decode()
            assert "cannot listen on 192.0.2.1:0" in errors
            assert "Traceback" not in errors
        finally:
            await stop([child])


async def test_a_second_signal_cuts_the_drain_short(namespace: str, tmp_path: Path,
                                                    anyio_backend: str) -> None:
    from anywool.errors import RoutineCancelled, WorkerError

    from ..helpers import Signal
    from .routines import hold_until_cancelled

    with anyio.fail_after(60):
        child, _ = await host("--discovery", "local", "--namespace", namespace, "--drain", "300",
                              "--backend", anyio_backend)
        try:
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace)), \
                    Signal() as started, anyio.create_task_group() as tg:
                outcome: list[BaseException] = []

                async def held() -> None:
                    try:
                        await hold_until_cancelled(started.port, str(tmp_path / "finally"))
                    except (RoutineCancelled, WorkerError) as exc:  # or the connection lost
                        outcome.append(exc)

                tg.start_soon(held)
                await started.started()
                child.process.send_signal(signal.SIGTERM)  # drains: the call goes on
                assert await child.readline() == "stopping"
                child.process.send_signal(signal.SIGTERM)  # not for 300 s
                assert await child.readline() == "stopped"
                assert await child.wait() == 0
            assert len(outcome) == 1
            assert (tmp_path / "finally").read_text() == "finally ran"
        finally:
            await stop([child])


# Where in the command's start-up the stop signal is sent: as soon as the process exists (it may
# arrive before the command handles signals), once it said ``starting`` (as its event loop
# starts), once its first worker process exists (the pool spawning), once both exist (the pool
# connecting and announcing them, just before ``ready``).
ARRIVALS = ("spawned", "starting", "first worker", "all workers")
# Seconds a command stopped during its start-up gets to exit. It takes far less; a signal lost
# in the start-up leaves it serving indefinitely.
STOP_BOUND = 30


async def _workers_of(child: Child, count: int) -> set[int]:
    """The pids of the command's worker processes, once it has ``count`` of them."""
    command = psutil.Process(child.pid)

    def workers() -> set[int]:
        found = set()
        for process in command.children():
            try:
                if "anywool.worker" in process.cmdline():
                    found.add(process.pid)
            except psutil.NoSuchProcess:
                pass
        return found

    with anyio.fail_after(30):
        while len(found := workers()) < count:
            await anyio.sleep(0.005)
    return found


async def _read_to_the_end(child: Child, lines: list[str]) -> None:
    """Add standard output's lines to ``lines`` until the command closes it."""
    try:
        while True:
            lines.append(await child.readline())
    except anyio.EndOfStream:
        pass


async def _stop_during_start_up(namespace: str, backend: str, signum: signal.Signals,
                                arrival: str) -> None:
    child = await start(COMMAND, "worker", "--discovery", "local", "--namespace", namespace,
                        "--workers", "2", "--backend", backend, capture_stderr=True)
    try:
        lines: list[str] = []
        workers: set[int] = set()
        if arrival != "spawned":
            lines.append(await child.readline())
            assert lines == ["starting"]
        if arrival in ("first worker", "all workers"):
            workers = await _workers_of(child, 1 if arrival == "first worker" else 2)
        child.process.send_signal(signum)
        with anyio.move_on_after(STOP_BOUND):
            await _read_to_the_end(child, lines)
            await child.wait()
        status = child.process.returncode
        if status is None:
            pytest.fail(f"still running {STOP_BOUND} s after {signum.name} at {arrival!r}: "
                        f"it said {lines}")
        where = f"{signum.name} at {arrival!r}: {lines}, status {status}"
        if not lines:
            # Before the command handles signals: they end it the default way (SIGINT is a
            # KeyboardInterrupt: click's "Aborted!", or Python's own exit by SIGINT).
            expected = {-signal.SIGTERM} if signum == signal.SIGTERM else {-signal.SIGINT, 1}
            assert status in expected, where
        else:
            assert status == 0, where + "\n" + (await child.read_stderr()).decode()
            assert lines[0] == "starting" and lines[-2:] == ["stopping", "stopped"], where
            middle = lines[1:-2]  # the start was cut short, or had just finished
            assert middle == [] or (middle[-1] == "ready" and len(middle) == 3 and all(
                line.startswith("worker unix:/") for line in middle[:-1])), where
        # Not our children: psutil waits on their exit (bounded).
        alive = []
        for pid in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                alive.append(psutil.Process(pid))
        _, still = await anyio.to_thread.run_sync(lambda: psutil.wait_procs(alive, timeout=10))
        assert not still, f"{where}: workers still running: {still}"
    finally:
        await stop([child])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_during_the_start_up_stops_the_command(
        namespace: str, anyio_backend: str, signum: signal.Signals) -> None:
    # All at once: each command's load also moves the others' arrivals around their start-up.
    with anyio.fail_after(STOP_BOUND + 60):
        async with anyio.create_task_group() as tg:
            for i, arrival in enumerate(ARRIVALS):
                tg.start_soon(_stop_during_start_up, f"{namespace}-{i}", anyio_backend, signum,
                              arrival)
