"""Peer authentication (runtime/_auth): the HMAC handshake, mutual TLS, both, and their rules.

Every connection is a real loopback TCP connection. A "manual" peer speaks the handshake by hand
(with the module's own constants) where the point is what a hostile or broken peer does.
"""

from __future__ import annotations

import copy
import pickle
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import cloudpickle
import pytest
import trustme
from anyio.abc import ByteStream, SocketAttribute, SocketStream
from anyio.streams.tls import TLSAttribute, TLSStream

from anywool._tls import MutualTLS
from anywool.errors import AuthenticationError, WorkerError
from anywool.runtime.wire import _auth
from anywool.runtime.wire._auth import Credentials, authenticate_client, authenticate_server
from anywool.runtime.wire._frames import Frame, FrameStream, Kind

pytestmark = pytest.mark.anyio

HELLO = 42
PROOF = 32
LIMIT = 10  # seconds any test may take


# -- plumbing ----------------------------------------------------------------------------------


@asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[SocketStream, SocketStream]]:
    """A connected (client, server) pair of loopback TCP streams, closed at the end."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as multi:
        listener = multi.listeners[0]
        port = listener.extra(SocketAttribute.local_port)
        client = await anyio.connect_tcp("127.0.0.1", port)
        async with client, await listener.accept() as server:
            yield client, server


async def both(client: Callable[[], Awaitable[Any]],
               server: Callable[[], Awaitable[Any]]) -> tuple[Any, Any]:
    """Run both sides concurrently; each side's result, or the Exception it raised."""
    results: dict[str, Any] = {}

    async def run(name: str, side: Callable[[], Awaitable[Any]]) -> None:
        try:
            results[name] = await side()
        except Exception as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "client", client)
        tg.start_soon(run, "server", server)
    return results["client"], results["server"]


class Recording(ByteStream):
    """A byte stream that records everything read from it."""

    def __init__(self, inner: ByteStream) -> None:
        self.inner = inner
        self.received = bytearray()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self.inner.receive(max_bytes)
        self.received += data
        return data

    async def send(self, item: bytes) -> None:
        await self.inner.send(item)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self.inner.extra_attributes


async def read_exactly(stream: ByteStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await stream.receive(size - len(data))
    return data


async def read_to_end(stream: ByteStream) -> bytes:
    """Everything until the peer hangs up (a reset counts as hanging up)."""
    data = b""
    try:
        while True:
            data += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        return data


def hello(role: bytes, *, secret: bool = True, tls: bool = False, version: int = 1,
          nonce: bytes | None = None) -> bytes:
    flags = (0x01 if secret else 0) | (0x02 if tls else 0)
    return b"anywool" + bytes((version, role[0], flags)) + (nonce or secrets.token_bytes(32))


def proof_c(secret: bytes, hello_c: bytes, hello_w: bytes) -> bytes:
    return _auth._mac(secret, _auth._CLIENT_LABEL, hello_c, hello_w)


def proof_w(secret: bytes, hello_c: bytes, hello_w: bytes, client_proof: bytes) -> bytes:
    return _auth._mac(secret, _auth._WORKER_LABEL, hello_c, hello_w, client_proof)


@pytest.fixture
def secret() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture
def creds(secret: bytes) -> Credentials:
    return Credentials(secret)


@dataclass
class Identity:
    """PEM files of one certificate (for 127.0.0.1 and localhost) and its CA, as MutualTLS."""

    certfile: Path
    keyfile: Path
    cafile: Path

    def tls(self, cafile: Path | None = None) -> MutualTLS:
        return MutualTLS(self.certfile, self.keyfile, cafile=cafile or self.cafile)


def issue(tmp_path: Path, name: str, ca: trustme.CA | None = None) -> Identity:
    ca = ca or trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    identity = Identity(tmp_path / f"{name}-cert.pem", tmp_path / f"{name}-key.pem",
                        tmp_path / f"{name}-ca.pem")
    identity.certfile.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(identity.keyfile))
    ca.cert_pem.write_to_path(str(identity.cafile))
    return identity


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def worker_id(tmp_path: Path, ca: trustme.CA) -> Identity:
    return issue(tmp_path, "worker", ca)


@pytest.fixture
def client_id(tmp_path: Path, ca: trustme.CA) -> Identity:
    return issue(tmp_path, "client", ca)


@pytest.fixture
def stranger_id(tmp_path: Path) -> Identity:
    """A certificate from another CA."""
    return issue(tmp_path, "stranger")


async def handshake(client_creds: Credentials, server_creds: Credentials, **client: Any
                    ) -> tuple[Any, Any]:
    """Both real sides over one connection; each result (closed at the end) or exception."""
    client.setdefault("address", "127.0.0.1:1")
    client.setdefault("server_hostname", "127.0.0.1")
    async with tcp_pair() as (c, s):
        results = await both(lambda: authenticate_client(c, client_creds, **client),
                             lambda: authenticate_server(s, server_creds,
                                                         address=client["address"]))
        for result in results:
            if isinstance(result, ByteStream):
                await result.aclose()
    return results


# -- the shared secret ---------------------------------------------------------------------------


async def test_same_secret_yields_streams_that_carry_frames_intact(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def client() -> Frame:
                stream = await authenticate_client(c, creds, address="w", server_hostname=None)
                frames = FrameStream(stream, stream)
                await frames.send(Frame(Kind.CALL, 7, b"to the worker"))
                return await frames.receive()

            async def server() -> Frame:
                stream = await authenticate_server(s, Credentials(creds.secret), address="w")
                frames = FrameStream(stream, stream)
                # Sent at once, so it may share a segment with our proof: nothing is lost.
                await frames.send(Frame(Kind.RESULT, 7, b"to the client"))
                return await frames.receive()

            at_client, at_server = await both(client, server)
    assert at_server == Frame(Kind.CALL, 7, b"to the worker")
    assert at_client == Frame(Kind.RESULT, 7, b"to the client")


async def test_wrong_secret_is_rejected_on_both_sides(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(creds, Credentials(secrets.token_bytes(32)))
    assert isinstance(at_client, AuthenticationError)
    assert at_client.address == "127.0.0.1:1"
    assert "the worker rejected our credentials" in str(at_client)
    assert isinstance(at_server, AuthenticationError)
    assert at_server.address.startswith("127.0.0.1:")
    assert "proof is wrong" in at_server.reason


async def test_server_reads_nothing_past_a_failed_proof(secret: bytes) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):
            recording = Recording(s)

            async def attacker() -> bytes:
                ours = hello(b"C")
                await c.send(ours)
                await read_exactly(c, HELLO)
                await c.send(secrets.token_bytes(PROOF) + b"P" * 4096)  # a payload right after
                return await read_to_end(c)

            answer, at_server = await both(
                attacker, lambda: authenticate_server(recording, Credentials(secret), address="w"))
    assert isinstance(at_server, AuthenticationError)
    assert len(recording.received) == HELLO + PROOF  # the payload was never read
    assert answer in (b"", b"\x15")  # a rejection, or a reset that lost it: never a proof


async def test_client_refuses_a_worker_that_cannot_prove_the_secret(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def impostor() -> bytes:
                received = await read_exactly(s, HELLO)
                await s.send(hello(b"W"))
                received += await read_exactly(s, PROOF)
                await s.send(b"\x06" + secrets.token_bytes(PROOF))  # "accepted", and a guess
                return received + await read_to_end(s)

            at_client, received = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None), impostor)
    assert isinstance(at_client, AuthenticationError)
    assert "could not prove it holds the secret" in at_client.reason
    # Its hello and its proof, then it hung up: never a byte of payload to an impostor.
    assert len(received) == HELLO + PROOF


async def test_secret_on_one_side_only_is_named_on_both_sides(creds: Credentials,
                                                              worker_id: Identity,
                                                              client_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(Credentials(tls=client_id.tls()),
                                               Credentials(creds.secret, worker_id.tls()))
    assert isinstance(at_client, AuthenticationError)
    assert "requires a shared secret and we have none" in at_client.reason
    assert isinstance(at_server, AuthenticationError)
    assert "no shared secret but we do" in at_server.reason


# -- what is not anywool, or not this version ----------------------------------------------------


async def test_server_refuses_a_peer_that_is_not_anywool_and_says_nothing(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def browser() -> bytes:
                await c.send(b"GET / HTTP/1.1\r\nHost: worker\r\n\r\n")
                return await read_to_end(c)

            answer, at_server = await both(browser, lambda: authenticate_server(s, creds, address="w"))
    assert answer == b""
    assert isinstance(at_server, AuthenticationError)
    assert "is not anywool" in at_server.reason and "GET / HT" in at_server.reason


async def test_client_refuses_a_peer_that_is_not_anywool(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def ssh() -> bytes:
                await s.send(b"SSH-2.0-OpenSSH_9.6\r\n")
                return await read_to_end(s)

            at_client, received = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None), ssh)
    assert isinstance(at_client, AuthenticationError)
    assert "the worker is not anywool" in at_client.reason
    assert len(received) == HELLO


async def test_another_version_is_named_by_the_server(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def future_client() -> bytes:
                await c.send(hello(b"C", version=2))
                return await read_to_end(c)

            answer, at_server = await both(
                future_client, lambda: authenticate_server(s, creds, address="w"))
    assert isinstance(at_server, AuthenticationError)
    assert "version 2" in at_server.reason and "we speak version 1" in at_server.reason
    assert answer[:8] == b"anywool\x01"  # our hello, so that the other side can say why too


async def test_another_version_is_named_by_the_client(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def future_worker() -> bytes:
                await s.send(hello(b"W", version=2))
                return await read_to_end(s)

            at_client, _ = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None), future_worker)
    assert isinstance(at_client, AuthenticationError)
    assert "version 2" in at_client.reason


async def test_tls_client_against_a_plain_worker_is_named(creds: Credentials, client_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(Credentials(creds.secret, client_id.tls()), creds)
    assert isinstance(at_server, AuthenticationError)
    assert "speaks TLS and we do not" in at_server.reason
    assert isinstance(at_client, AuthenticationError)
    assert "hung up during the TLS handshake" in at_client.reason


async def test_plain_client_against_a_tls_worker_is_named(creds: Credentials, worker_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(creds, Credentials(creds.secret, worker_id.tls()))
    assert isinstance(at_server, AuthenticationError)
    assert "does not speak TLS" in at_server.reason
    assert isinstance(at_client, AuthenticationError)


# -- stalls and cancellation -----------------------------------------------------------------------


async def test_server_gives_up_on_a_stalled_client(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):
            await c.send(b"anywool")  # a start, then nothing
            with pytest.raises(AuthenticationError) as info:
                await authenticate_server(s, creds, timeout=0.2, address="w")
    assert "within 0.2 s" in info.value.reason


async def test_client_gives_up_on_a_stalled_worker(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, _):
            with pytest.raises(WorkerError) as info:
                await authenticate_client(c, creds, address="w", server_hostname=None, timeout=0.2)
            with pytest.raises(anyio.ClosedResourceError):
                await c.send(b"x")
    # A slow worker (a blocked event loop, say) is not one that rejected our credentials.
    assert not isinstance(info.value, AuthenticationError)
    assert "did not complete the authentication handshake within 0.2 s" in info.value.reason


async def test_a_proof_for_another_address_is_rejected(creds: Credentials) -> None:
    # A peer that a client dialed relays the handshake to a real worker elsewhere: the client's
    # proof covers the address it dialed, not the real worker's, so that worker rejects it.
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):
            at_client, at_server = await both(
                lambda: authenticate_client(c, creds, address="10.0.0.9:4000",
                                            server_hostname=None),
                lambda: authenticate_server(s, creds, address="10.0.0.7:4000"))
    assert isinstance(at_client, AuthenticationError) and "rejected" in at_client.reason
    assert isinstance(at_server, AuthenticationError)
    assert "dialed another address than 10.0.0.7:4000" in at_server.reason


async def test_cancelled_client_closes_its_stream(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):
            async with anyio.create_task_group() as tg:

                async def cancel_once_hello_arrives() -> None:
                    await read_exactly(s, HELLO)
                    tg.cancel_scope.cancel()

                tg.start_soon(cancel_once_hello_arrives)
                await authenticate_client(c, creds, address="w", server_hostname=None)
            assert await read_to_end(s) == b""
            with pytest.raises(anyio.ClosedResourceError):
                await c.send(b"x")


# -- replay and reflection -----------------------------------------------------------------------


async def test_a_client_transcript_replayed_to_a_new_connection_fails(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):
            recording = Recording(s)
            at_client, at_server = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None),
                lambda: authenticate_server(recording, creds, address="w"))
            assert isinstance(at_client, ByteStream) and isinstance(at_server, ByteStream)
        transcript = bytes(recording.received)
        assert len(transcript) == HELLO + PROOF

        async with tcp_pair() as (c, s):

            async def replay() -> bytes:
                await c.send(transcript)
                return await read_to_end(c)

            answer, at_server = await both(replay, lambda: authenticate_server(s, creds, address="w"))
    assert isinstance(at_server, AuthenticationError)
    assert "proof is wrong" in at_server.reason
    assert answer[HELLO:] in (b"", b"\x15")


async def test_a_worker_transcript_replayed_to_a_new_client_fails(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):
            recording = Recording(c)
            at_client, at_server = await both(
                lambda: authenticate_client(recording, creds, address="w", server_hostname=None),
                lambda: authenticate_server(s, creds, address="w"))
            assert isinstance(at_client, ByteStream) and isinstance(at_server, ByteStream)
        transcript = bytes(recording.received)
        assert len(transcript) == HELLO + 1 + PROOF

        async with tcp_pair() as (c, s):

            async def replay() -> None:
                await read_exactly(s, HELLO)
                await s.send(transcript[:HELLO])
                await read_exactly(s, PROOF)
                await s.send(transcript[HELLO:])

            at_client, _ = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None), replay)
    assert isinstance(at_client, AuthenticationError)
    assert "could not prove it holds the secret" in at_client.reason


async def test_a_client_proof_reflected_as_the_worker_proof_fails(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def mirror() -> None:
                await read_exactly(s, HELLO)
                await s.send(hello(b"W"))
                their_proof = await read_exactly(s, PROOF)
                await s.send(b"\x06" + their_proof)

            at_client, _ = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None), mirror)
    assert isinstance(at_client, AuthenticationError)
    assert "could not prove it holds the secret" in at_client.reason


async def test_a_hello_reflected_back_is_refused_by_the_client(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def mirror() -> bytes:
                await s.send(await read_exactly(s, HELLO))
                return await read_to_end(s)

            at_client, received = await both(
                lambda: authenticate_client(c, creds, address="w", server_hostname=None), mirror)
    assert isinstance(at_client, AuthenticationError)
    assert "reflection" in at_client.reason
    assert received == b""  # no proof for a reflected hello


async def test_a_worker_hello_reflected_to_another_connection_is_refused(creds: Credentials) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c1, s1), tcp_pair() as (c2, s2):

            async def attacker() -> bytes:
                await c1.send(hello(b"C"))
                worker_hello = await read_exactly(c1, HELLO)
                await c2.send(worker_hello)  # as if it were a client's
                answer = await read_to_end(c2)
                # The first connection served its purpose (the worker's hello): hanging up ends
                # its handshake now rather than at its 5 s timeout.
                await c1.aclose()
                return answer

            async def servers() -> tuple[Any, Any]:
                return await both(lambda: authenticate_server(s1, creds, address="w"),
                                  lambda: authenticate_server(s2, creds, address="w"))

            answer, (_, at_second) = await both(attacker, servers)
            await c1.aclose()
    assert isinstance(at_second, AuthenticationError)
    assert "reflection" in at_second.reason
    assert answer == b""


# -- mutual TLS --------------------------------------------------------------------------------------


async def test_mutual_tls_authenticates_both_and_carries_frames(worker_id: Identity,
                                                               client_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def client() -> tuple[Frame, object]:
                stream = await authenticate_client(c, Credentials(tls=client_id.tls()),
                                                   address="w", server_hostname="127.0.0.1")
                async with stream:
                    await FrameStream(stream, stream).send(Frame(Kind.CALL, 1, b"hi"))
                    return (await FrameStream(stream, stream).receive(),
                            stream.extra(TLSAttribute.peer_certificate))

            async def server() -> tuple[Frame, object]:
                stream = await authenticate_server(s, Credentials(tls=worker_id.tls()),
                                                   address="w")
                async with stream:
                    frames = FrameStream(stream, stream)
                    await frames.send(Frame(Kind.RESULT, 1, b"ho"))
                    return await frames.receive(), stream.extra(TLSAttribute.peer_certificate)

            (at_client, worker_cert), (at_server, client_cert) = await both(client, server)
    assert at_client == Frame(Kind.RESULT, 1, b"ho") and at_server == Frame(Kind.CALL, 1, b"hi")
    assert worker_cert and client_cert  # each side saw the other's certificate


async def test_tls_and_secret_together(creds: Credentials, worker_id: Identity,
                                       client_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(Credentials(creds.secret, client_id.tls()),
                                               Credentials(creds.secret, worker_id.tls()))
        assert isinstance(at_client, TLSStream) and isinstance(at_server, TLSStream)
        at_client, at_server = await handshake(Credentials(creds.secret, client_id.tls()),
                                               Credentials(secrets.token_bytes(32), worker_id.tls()))
    assert isinstance(at_client, AuthenticationError)
    assert "the worker rejected our credentials" in at_client.reason
    assert isinstance(at_server, AuthenticationError)


async def test_client_without_a_certificate_is_rejected(worker_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, s):

            async def anonymous() -> bytes:
                context = ssl.create_default_context(cafile=str(worker_id.cafile))
                try:
                    stream = await TLSStream.wrap(c, hostname="127.0.0.1", ssl_context=context,
                                                  standard_compatible=False)
                    await stream.send(hello(b"C", secret=False, tls=True))
                    return await read_to_end(stream)
                except ssl.SSLError:
                    return b""

            answer, at_server = await both(
                anonymous,
                lambda: authenticate_server(s, Credentials(tls=worker_id.tls()), address="w"))
    assert answer == b""
    assert isinstance(at_server, AuthenticationError)
    assert "TLS handshake failed" in at_server.reason and "CERTIFICATE" in at_server.reason


async def test_worker_certificate_from_another_ca_is_rejected_by_the_client(
        client_id: Identity, stranger_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(Credentials(tls=client_id.tls()),
                                               Credentials(tls=stranger_id.tls()))
    assert isinstance(at_client, AuthenticationError)
    assert "the worker's certificate does not verify" in at_client.reason
    assert isinstance(at_server, AuthenticationError)


async def test_client_certificate_from_another_ca_is_rejected_by_the_worker(
        worker_id: Identity, stranger_id: Identity) -> None:
    # The stranger trusts our CA (so it accepts the worker) but holds a certificate of its own.
    with anyio.fail_after(LIMIT):
        at_client, at_server = await handshake(Credentials(tls=stranger_id.tls(worker_id.cafile)),
                                               Credentials(tls=worker_id.tls()))
    assert isinstance(at_server, AuthenticationError)
    assert "the client's certificate does not verify" in at_server.reason
    assert isinstance(at_client, AuthenticationError)
    assert "without a hello" in at_client.reason


async def test_worker_certificate_must_name_the_host(worker_id: Identity, client_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        at_client, _ = await handshake(Credentials(tls=client_id.tls()),
                                       Credentials(tls=worker_id.tls()),
                                       server_hostname="elsewhere.example")
    assert isinstance(at_client, AuthenticationError)
    assert "does not verify" in at_client.reason and "elsewhere.example" in at_client.reason


async def test_tls_needs_a_server_hostname(client_id: Identity) -> None:
    with anyio.fail_after(LIMIT):
        async with tcp_pair() as (c, _):
            with pytest.raises(ValueError, match="server_hostname"):
                await authenticate_client(c, Credentials(tls=client_id.tls()), address="w",
                                          server_hostname=None)
            with pytest.raises(anyio.ClosedResourceError):
                await c.send(b"x")


# -- Credentials --------------------------------------------------------------------------------------


def test_resolve_without_secret_or_tls_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANYWOOL_SECRET", raising=False)
    assert Credentials.resolve(None, None) is None


def test_resolve_takes_the_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYWOOL_SECRET", "e" * 20)
    credentials = Credentials.resolve(None, None)
    assert credentials is not None and credentials.secret == b"e" * 20 and credentials.tls is None


def test_resolve_with_tls_only(monkeypatch: pytest.MonkeyPatch, client_id: Identity) -> None:
    monkeypatch.delenv("ANYWOOL_SECRET", raising=False)
    tls = client_id.tls()
    credentials = Credentials.resolve(None, tls)
    assert credentials is not None and credentials.secret is None and credentials.tls == tls


def test_resolve_refuses_a_short_secret_naming_the_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError) as info:
        Credentials.resolve("hunter2hunter", None, parameter="worker_secret")
    assert "worker_secret" in str(info.value) and "hunter2" not in str(info.value)
    monkeypatch.setenv("ANYWOOL_SECRET", "tooShortSecret")
    with pytest.raises(ValueError) as info:
        Credentials.resolve(None, None)
    assert "$ANYWOOL_SECRET" in str(info.value) and "tooShortSecret" not in str(info.value)


def test_resolve_refuses_wrong_types_naming_the_parameter() -> None:
    with pytest.raises(TypeError, match="^worker_secret must be bytes or str, got int$"):
        Credentials.resolve(12345678901234567890, None, parameter="worker_secret")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^tls must be a MutualTLS or None, got SSLContext$"):
        Credentials.resolve(None, ssl.create_default_context())  # type: ignore[arg-type]


def test_credentials_need_something() -> None:
    with pytest.raises(ValueError, match="a secret, tls, or both"):
        Credentials()


def test_repr_hides_the_secret(secret: bytes) -> None:
    text = repr(Credentials(secret))
    assert text == "Credentials(secret=<32 bytes>, tls=None)"
    assert secret.hex() not in text and repr(secret) not in text


def test_credentials_refuse_to_be_pickled(creds: Credentials, client_id: Identity) -> None:
    for credentials in (creds, Credentials(tls=client_id.tls())):
        for dumps in (pickle.dumps, cloudpickle.dumps):
            with pytest.raises(TypeError, match="credentials do not travel in pickles"):
                dumps(credentials)
    assert copy.copy(creds) is creds and copy.deepcopy(creds) is creds


def test_mutual_tls_pickles_as_its_paths(client_id: Identity) -> None:
    tls = MutualTLS(client_id.certfile, client_id.keyfile, cafile=client_id.cafile)
    assert tls.certfile == str(client_id.certfile) and isinstance(tls.cafile, str)
    assert pickle.loads(pickle.dumps(tls)) == tls


def test_mutual_tls_contexts_are_strict(client_id: Identity) -> None:
    tls = client_id.tls()
    server, client = tls.server_context(), tls.client_context()
    assert server.verify_mode == ssl.CERT_REQUIRED and client.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert client.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_mutual_tls_key_inside_the_certfile(tmp_path: Path, ca: trustme.CA) -> None:
    combined = tmp_path / "both.pem"
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(combined))
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    assert MutualTLS(combined, cafile=cafile).keyfile is None


def test_mutual_tls_refuses_wrong_types(client_id: Identity) -> None:
    with pytest.raises(TypeError, match="^certfile must be"):
        MutualTLS(3, cafile=client_id.cafile)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^keyfile must be"):
        MutualTLS(client_id.certfile, b"key.pem", cafile=client_id.cafile)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^cafile must be"):
        MutualTLS(client_id.certfile, client_id.keyfile, cafile=None)  # type: ignore[arg-type]


def test_mutual_tls_refuses_a_missing_file(tmp_path: Path, client_id: Identity) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ValueError, match=f"^keyfile '{missing}' does not exist$"):
        MutualTLS(client_id.certfile, missing, cafile=client_id.cafile)
    with pytest.raises(ValueError, match="^cafile .* is not a file$"):
        MutualTLS(client_id.certfile, client_id.keyfile, cafile=tmp_path)


@pytest.mark.parametrize("which", ["certfile", "keyfile", "cafile"])
def test_mutual_tls_refuses_a_bad_pem(tmp_path: Path, client_id: Identity, which: str) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    paths = {"certfile": client_id.certfile, "keyfile": client_id.keyfile, "cafile": client_id.cafile}
    paths[which] = garbage
    with pytest.raises(ValueError) as info:
        MutualTLS(paths["certfile"], paths["keyfile"], cafile=paths["cafile"])
    assert str(info.value).startswith(f"{which} {str(garbage)!r}: ")


def test_mutual_tls_refuses_a_key_of_another_certificate(client_id: Identity,
                                                         stranger_id: Identity) -> None:
    with pytest.raises(ValueError, match="^keyfile .*: cannot load a private key matching"):
        MutualTLS(client_id.certfile, stranger_id.keyfile, cafile=client_id.cafile)


def test_mutual_tls_refuses_an_encrypted_key(tmp_path: Path, client_id: Identity) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(client_id.keyfile.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass phrase")))
    with pytest.raises(ValueError, match="^keyfile .*: the private key is encrypted"):
        MutualTLS(client_id.certfile, encrypted, cafile=client_id.cafile)


async def test_renewed_certificate_files_are_picked_up(tmp_path: Path, ca: trustme.CA,
                                                      worker_id: Identity) -> None:
    client_id = issue(tmp_path, "client", ca)
    tls = client_id.tls()
    with anyio.fail_after(LIMIT):
        first, _ = await handshake(Credentials(tls=tls), Credentials(tls=worker_id.tls()))
        assert isinstance(first, TLSStream)
        other = trustme.CA()  # the client's files now hold another CA's certificate and trust
        (tmp_path / "renewed").mkdir()
        renewed = issue(tmp_path / "renewed", "client", other)
        for name in ("certfile", "keyfile", "cafile"):
            Path(getattr(tls, name)).write_bytes(getattr(renewed, name).read_bytes())
        second, _ = await handshake(Credentials(tls=tls), Credentials(tls=worker_id.tls()))
    assert isinstance(second, AuthenticationError)
    assert "does not verify" in second.reason


def test_a_str_secret_that_utf8_cannot_encode_is_refused_without_showing_it() -> None:
    with pytest.raises(ValueError, match="encodable as UTF-8") as info:
        Credentials.resolve("sixteen-or-more-\udc80-bytes", None)
    assert "sixteen" not in str(info.value) and info.value.__context__ is None
