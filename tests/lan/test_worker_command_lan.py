"""Across "hosts": ``anywool worker --discovery lan`` in one interpreter, a pool dispatching to
its workers over authenticated TCP from this one, both found through mDNS in the test run's
private network namespace."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import anyio
import pytest

from anywool._address import Address
from anywool.discovery.lan import LanDiscovery
from anywool.errors import AuthenticationError
from anywool.runtime.pool._pool import WorkerPool
from anywool.runtime.wire._frames import Frame, FrameStream, Kind
from tests import netns
from tests.helpers import Touch, call_payload, follow, wait_until
from tests.integration.children import Child, start, stop
from tests.integration.routines import letters, parent_pid

pytestmark = pytest.mark.anyio

COMMAND = "from anywool.cli import main; main()"
LOOPBACK = ["127.0.0.1"]


@pytest.fixture
def secret_file(tmp_path: Path) -> tuple[str, Path]:
    secret = secrets.token_hex(16)
    path = tmp_path / "secret"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return secret, path


async def host(namespace: str, secret_path: Path, backend: str, workers: int = 2,
               lines: list[str] | None = None) -> Child:
    child = await start(COMMAND, "worker", "--discovery", "lan", "--namespace", namespace,
                        "--workers", str(workers), "--secret-file", str(secret_path),
                        "--interface", "127.0.0.1", "--backend", backend)
    lines = [] if lines is None else lines
    assert await child.readline() == "starting"
    while (line := await child.readline()) != "ready":
        lines.append(line)
    assert len(lines) == workers
    for line in lines:
        # Bound to every interface, announced at this host's routable address.
        assert Address.parse(line.split()[1]).host == netns.ROUTABLE
    return child


async def test_a_pool_dispatches_to_a_lan_host(namespace: str, secret_file: tuple[str, Path],
                                               anyio_backend: str) -> None:
    secret, path = secret_file
    with anyio.fail_after(60):
        child = await host(namespace, path, anyio_backend)
        try:
            subscriber = LanDiscovery.Subscriber(namespace, interfaces=LOOPBACK, secret=secret)
            async with WorkerPool(discovery=subscriber, secret=secret, quorum=2, lazy=False):
                assert {await parent_pid() for _ in range(4)} == {child.pid}
                assert [c async for c in letters("lan")] == ["l", "a", "n"]
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])


async def test_a_wrong_secret_fails_with_authentication_error(
        namespace: str, secret_file: tuple[str, Path], anyio_backend: str) -> None:
    secret, path = secret_file
    wrong = secrets.token_hex(16)
    with anyio.fail_after(60):
        child = await host(namespace, path, anyio_backend, workers=1)
        try:
            # The pool's secret verifies the records too: the host's do not verify with it.
            async with WorkerPool(discovery=LanDiscovery.Subscriber(namespace,
                                                                    interfaces=LOOPBACK),
                                  secret=wrong, quorum_timeout=3):
                with pytest.raises(AuthenticationError, match="does not verify with our secret"):
                    await parent_pid()
            # Records verified with the right secret, connections made with a wrong one.
            async with WorkerPool(discovery=LanDiscovery.Subscriber(
                    namespace, interfaces=LOOPBACK, secret=secret), secret=wrong):
                with pytest.raises(AuthenticationError, match="rejected"):
                    await parent_pid()
        finally:
            child.process.send_signal(signal.SIGINT)
            await stop([child])


async def test_the_hosts_workers_leave_the_view_when_it_stops(
        namespace: str, secret_file: tuple[str, Path], anyio_backend: str) -> None:
    secret, path = secret_file
    with anyio.fail_after(60):
        child = await host(namespace, path, anyio_backend)
        try:
            async with anyio.create_task_group() as tg:
                events = await follow(tg, LanDiscovery.Subscriber(
                    namespace, interfaces=LOOPBACK, secret=secret))
                seen = {(await events.receive()).metadata.uid for _ in range(2)}
                child.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(2 + 5):  # the drain and stop, then the goodbyes' 2 s
                    dropped = set()
                    while dropped != seen:
                        event = await events.receive()
                        assert event.type == "worker-dropped"
                        dropped.add(event.metadata.uid)
                tg.cancel_scope.cancel()
            assert await child.wait() == 0
        finally:
            await stop([child])


async def test_a_killed_worker_leaves_the_pools_choice_at_once(
        namespace: str, secret_file: tuple[str, Path], anyio_backend: str) -> None:
    secret, path = secret_file
    lines: list[str] = []
    with anyio.fail_after(60):
        child = await host(namespace, path, anyio_backend, lines=lines)
        try:
            subscriber = LanDiscovery.Subscriber(namespace, interfaces=LOOPBACK, secret=secret)
            async with WorkerPool(discovery=subscriber, secret=secret, quorum=2, lazy=False) \
                    as pool:
                _, killed, _, pid = lines[0].split()
                os.kill(int(pid), signal.SIGKILL)
                # Long before its records expire (10 s), it is out of the proxy's choice (the
                # host replaces it meanwhile, at another address), and every call succeeds.
                await wait_until(lambda: killed not in {w.address for w in pool.proxy.workers},
                                 "the killed worker left the proxy's choice", timeout=5)
                assert [await parent_pid() for _ in range(10)] == [child.pid] * 10
        finally:
            child.process.send_signal(signal.SIGTERM)
            await stop([child])


async def test_an_unauthenticated_pickle_leaves_no_file_behind(
        namespace: str, secret_file: tuple[str, Path], tmp_path: Path, anyio_backend: str) -> None:
    _, path = secret_file
    touched = tmp_path / "touched"
    lines: list[str] = []
    with anyio.fail_after(60):
        child = await host(namespace, path, anyio_backend, workers=1, lines=lines)
        try:
            address = Address.parse(lines[0].split()[1])
            assert address.host is not None and address.port is not None
            async with await anyio.connect_tcp(address.host, address.port) as stream:
                frames = FrameStream(stream, stream)
                await frames.send(Frame(Kind.CALL, 1, call_payload(parent_pid,
                                                                   (Touch(str(touched)),))))
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await frames.receive()  # hung up on, unanswered
            child.process.send_signal(signal.SIGTERM)
            assert await child.wait() == 0
            assert not touched.exists()
        finally:
            await stop([child])


async def test_an_interface_zeroconf_cannot_use_is_one_line_of_error(
        namespace: str, secret_file: tuple[str, Path]) -> None:
    _, path = secret_file
    with anyio.fail_after(30):
        child = await start(COMMAND, "worker", "--discovery", "lan", "--namespace", namespace,
                            "--secret-file", str(path), "--interface", "10.9.9.9",
                            "--host", "0.0.0.0", capture_stderr=True)
        try:
            assert await child.wait() == 1
            errors = (await child.read_stderr()).decode()
            assert "zeroconf cannot use interfaces ['10.9.9.9']" in errors
            assert "Traceback" not in errors
        finally:
            await stop([child])
