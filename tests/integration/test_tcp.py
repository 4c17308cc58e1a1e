"""Workers on TCP: peers authenticate before anything is unpickled (HMAC secret or mutual TLS).

Real worker processes on loopback, both backends.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import anyio
import anyio.abc
import psutil
import pytest
import trustme

from anywool import _interfaces
from anywool._address import Address
from anywool._tls import MutualTLS
from anywool.discovery.local import LocalDiscovery
from anywool.errors import AuthenticationError, NoWorkersAvailable
from anywool.lowlevel import WorkerConnection
from anywool.runtime._routine import routine
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._pool import WorkerPool
from anywool.runtime.wire._auth import Credentials
from anywool.runtime.wire._frames import Frame, FrameStream, Kind

from ..helpers import Touch, call_payload
from .routines import countdown

pytestmark = pytest.mark.anyio

SECRET = secrets.token_bytes(32)


@routine
async def scale(x: int) -> int:
    return 2 * x


@routine
async def scale_nested(x: int) -> int:
    return await scale(x) + 1


@routine
async def environment(name: str) -> str | None:
    return os.environ.get(name)


@routine
async def echo_back(data: bytes) -> bytes:
    return data


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PEM files of one CA, a certificate it issued for 127.0.0.1, and one issued by another."""
    where = tmp_path_factory.mktemp("tls")
    ca, other = trustme.CA(), trustme.CA()
    files: dict[str, str] = {}
    ca.cert_pem.write_to_path(files.setdefault("ca", str(where / "ca.pem")))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        files.setdefault("cert", str(where / "cert.pem")))
    other.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        files.setdefault("stranger", str(where / "stranger.pem")))
    return files


def tcp(address: str) -> Address:
    parsed = Address.parse(address)
    assert not parsed.is_unix, address
    return parsed


async def test_a_pool_dispatches_to_its_tcp_workers() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2, host="127.0.0.1", secret=SECRET) as pool:
            assert [await scale(i) for i in range(4)] == [0, 2, 4, 6]
            assert [i async for i in countdown(3)] == [3, 2, 1]
            assert await scale_nested(5) == 11  # the worker's own proxy authenticates too
            for worker in pool.workers:
                assert tcp(worker.address).host == "127.0.0.1"
                assert worker.metadata.secure


async def test_a_wildcard_bind_announces_a_routable_address() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, host="0.0.0.0", secret=SECRET) as pool:
            (worker,) = pool.workers
            assert tcp(worker.address).host == _interfaces.routable_host()
            assert await scale(21) == 42


async def test_the_secret_is_not_on_the_command_line_nor_left_in_the_environment() -> None:
    text = SECRET.hex()
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, host="127.0.0.1", secret=SECRET) as pool:
            (worker,) = pool.workers
            assert text not in " ".join(psutil.Process(worker.pid).cmdline())
            assert await environment("ANYWOOL_WORKER_SECRET") is None


async def test_the_secret_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYWOOL_SECRET", "correct horse battery staple")
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, host="127.0.0.1"):
            assert await scale(2) == 4


@pytest.mark.parametrize("borrower_secret", [None, b"another secret of 32 bytes......"])
async def test_a_pool_whose_workers_reject_it_raises_authentication_error(
        namespace: str, borrower_secret: bytes | None) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=2, discovery=discovery, host="127.0.0.1", secret=SECRET):
            started = anyio.current_time()
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace),
                                  secret=borrower_secret, quorum_timeout=20):
                with pytest.raises(AuthenticationError) as caught:
                    await scale(1)
                assert not isinstance(caught.value, NoWorkersAvailable)
                assert caught.value.address.startswith("127.0.0.1:")
                expected = "no credentials" if borrower_secret is None else "rejected"
                assert expected in str(caught.value)
            # Not after the quorum timeout: once every worker said no, there is nothing to wait for.
            assert anyio.current_time() - started < 10


async def test_an_unauthenticated_payload_is_never_unpickled(tmp_path: Path) -> None:
    touched = tmp_path / "touched"
    payload = call_payload(scale, (Touch(str(touched)),))

    async def send_unauthenticated(stream: anyio.abc.ByteStream) -> None:
        frames = FrameStream(stream, stream)
        await frames.send(Frame(Kind.CALL, 1, payload))
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await frames.receive()  # the worker hangs up, answering nothing

    with anyio.fail_after(30):
        async with LocalWorker(host="127.0.0.1", secret=SECRET) as worker:
            address = tcp(worker.address)
            assert address.host is not None and address.port is not None
            async with await anyio.connect_tcp(address.host, address.port) as stream:
                await send_unauthenticated(stream)
        assert not touched.exists()
        # The same bytes over a Unix socket, which admits its user unauthenticated, do create
        # the file: the test above would have caught a worker that unpickled them.
        async with LocalWorker() as worker:
            path = Address.parse(worker.address).path
            assert path is not None
            async with await anyio.connect_unix(path) as stream:
                frames = FrameStream(stream, stream)
                await frames.send(Frame(Kind.CALL, 1, payload))
                while (await frames.receive()).kind not in (Kind.RETURN, Kind.EXCEPTION):
                    pass
        assert touched.exists()


async def test_a_worker_that_refused_a_peer_goes_on_serving() -> None:
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, host="127.0.0.1", secret=SECRET) as pool:
            address = tcp(pool.workers[0].address)
            assert address.host is not None and address.port is not None
            async with await anyio.connect_tcp(address.host, address.port) as stream:
                await stream.send(b"GET / HTTP/1.0\r\n\r\n")
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    while await stream.receive():
                        pass
            assert await scale(3) == 6


async def test_mutual_tls(certificates: dict[str, str]) -> None:
    tls = MutualTLS(certificates["cert"], cafile=certificates["ca"])
    with anyio.fail_after(30):
        async with WorkerPool(spawn=2, host="127.0.0.1", tls=tls) as pool:
            assert [await scale(i) for i in range(4)] == [0, 2, 4, 6]
            assert [i async for i in countdown(2)] == [2, 1]
            assert await scale_nested(1) == 3
            assert all(worker.metadata.secure for worker in pool.workers)


async def test_mutual_tls_and_a_secret_together(certificates: dict[str, str]) -> None:
    tls = MutualTLS(certificates["cert"], cafile=certificates["ca"])
    with anyio.fail_after(30):
        async with WorkerPool(spawn=1, host="127.0.0.1", tls=tls, secret=SECRET):
            assert await scale(4) == 8


async def test_large_payloads_cross_authenticated_and_tls_connections(
        certificates: dict[str, str]) -> None:
    # Over TCP a frame's parts go through the authenticated stream's own send (TLS: anyio's
    # TLSStream), not the raw socket's vectored one.
    data = os.urandom(12 * 1024 * 1024)
    tls = MutualTLS(certificates["cert"], cafile=certificates["ca"])
    with anyio.fail_after(60):
        for credentials in ({"secret": SECRET}, {"tls": tls}):
            async with WorkerPool(spawn=1, host="127.0.0.1", **credentials):  # type: ignore[arg-type]
                assert await echo_back(data) == data
                assert await echo_back(bytearray(data)) == data
                assert await scale(2) == 4


async def test_a_certificate_from_another_ca_is_rejected(
        namespace: str, certificates: dict[str, str]) -> None:
    ours = MutualTLS(certificates["cert"], cafile=certificates["ca"])
    stranger = MutualTLS(certificates["stranger"], cafile=certificates["ca"])
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=1, discovery=discovery, host="127.0.0.1", tls=ours):
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), tls=stranger):
                with pytest.raises(AuthenticationError):
                    await scale(1)


@pytest.mark.parametrize("make", [
    lambda: WorkerPool(spawn=1, host="127.0.0.1"),
    lambda: LocalWorker(host="127.0.0.1"),
])
def test_tcp_without_credentials_is_refused_at_construction(make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANYWOOL_SECRET", raising=False)
    with pytest.raises(ValueError, match="secret=.*tls="):
        make()


def test_a_short_secret_is_refused_naming_the_parameter() -> None:
    with pytest.raises(ValueError, match="secret must be at least 16 bytes") as caught:
        WorkerPool(spawn=1, host="127.0.0.1", secret="tiny-secret")
    assert "tiny-secret" not in str(caught.value)  # a secret never appears in a message


def test_host_without_spawned_workers_is_refused(namespace: str) -> None:
    with pytest.raises(ValueError, match="spawns none"):
        WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), host="127.0.0.1",
                   secret=SECRET)


def test_a_bad_host_is_refused() -> None:
    with pytest.raises(ValueError, match="host"):
        LocalWorker(host="a:b", secret=SECRET)
    with pytest.raises(TypeError, match="host"):
        LocalWorker(host=1, secret=SECRET)  # type: ignore[arg-type]


async def test_a_relay_gets_nothing_from_a_client_that_dialed_it() -> None:
    # A peer that a client dials (say, on the port of a worker that died) relays every byte to
    # a real worker: the client's proof covers the address it dialed, so the worker refuses.
    async def relay(client: anyio.abc.SocketStream, target: Address) -> None:
        assert target.host is not None and target.port is not None
        async with client, await anyio.connect_tcp(target.host, target.port) as upstream:
            async def pump(source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream) -> None:
                try:
                    async for chunk in source:
                        await sink.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                finally:
                    await anyio.aclose_forcefully(sink)

            async with anyio.create_task_group() as pumps:
                pumps.start_soon(pump, client, upstream)
                pumps.start_soon(pump, upstream, client)

    with anyio.fail_after(30):
        async with LocalWorker(host="127.0.0.1", secret=SECRET) as worker, \
                await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, \
                anyio.create_task_group() as tg:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            tg.start_soon(listener.serve, lambda s: relay(s, tcp(worker.address)))
            credentials = Credentials(SECRET)
            with pytest.raises(AuthenticationError, match="rejected"):
                async with WorkerConnection(f"127.0.0.1:{port}", credentials=credentials):
                    pass
            async with WorkerConnection(worker.address, credentials=credentials) as direct:
                assert await direct.call(scale.__wrapped__, (2,), {}) == 4
            tg.cancel_scope.cancel()


async def test_a_quorum_short_of_rejecting_workers_says_so(namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=1, discovery=discovery, host="127.0.0.1", secret=SECRET), \
                WorkerPool(spawn=1, discovery=discovery, host="127.0.0.1",
                           secret=b"the other pool's secret........"):
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum=2,
                                  quorum_timeout=2, secret=SECRET):
                with pytest.raises(NoWorkersAvailable, match="1 refused to authenticate us"):
                    await scale(1)
