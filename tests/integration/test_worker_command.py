"""``anywool worker --discovery local``: the real command in another interpreter, dispatched to
from this one. (The LAN variant is in tests/lan.)"""

from __future__ import annotations

import secrets
import signal
from pathlib import Path

import anyio
import pytest

from anywool._address import Address
from anywool.discovery.local import LocalDiscovery
from anywool.errors import AuthenticationError
from anywool.runtime._pool import WorkerPool

from .children import Child, start, stop
from .routines import letters, parent_pid

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
            assert len(lines) == 2 and all(line.startswith("worker unix:/") for line in lines)
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum=2,
                                  lazy=False):
                assert {await parent_pid() for _ in range(4)} == {child.pid}
                assert [c async for c in letters("abc")] == ["a", "b", "c"]
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
