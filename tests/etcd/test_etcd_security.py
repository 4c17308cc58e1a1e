"""EtcdDiscovery on a secured cluster: mutual TLS (a CN-less client certificate) and password
authentication, alone and together; refusals are clear errors. Both backends."""

from __future__ import annotations

import gc
import uuid
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from anywool import EtcdDiscovery, MutualTLS
from anywool.errors import DiscoveryServiceError, DiscoveryUnavailable
from tests.etcd.cluster import EtcdCluster, EtcdMember, EtcdTLSServer
from tests.etcd.gateway import authenticate, call, enable_auth
from tests.helpers import follow, take, worker

pytestmark = pytest.mark.anyio


async def round_trip(discovery: EtcdDiscovery) -> None:
    """Claim, publish, see it through a subscription, release."""
    async with discovery as owner, owner.publisher as publisher, anyio.create_task_group() as tg:
        events = await follow(tg, owner.subscriber)
        metadata = worker("10.0.0.1:1")
        await publisher.publish("worker-added", metadata)
        with anyio.fail_after(5):
            assert await take(events, 1) == [("worker-added", metadata.uid)]
        tg.cancel_scope.cancel()


async def test_mutual_tls_with_a_context_or_a_mutualtls(etcd_tls: EtcdTLSServer) -> None:
    with anyio.fail_after(15):
        await round_trip(EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_tls.url,
                                       tls=etcd_tls.ssl_context()))
        await round_trip(EtcdDiscovery(
            f"ns-{uuid.uuid4().hex}", endpoints=etcd_tls.url,
            tls=MutualTLS(etcd_tls.client_cert_path, etcd_tls.client_key_path,
                          cafile=etcd_tls.ca_path)))


async def test_a_client_without_a_certificate_is_refused_clearly(
        etcd_tls: EtcdTLSServer) -> None:
    with anyio.fail_after(10):
        with pytest.raises(DiscoveryUnavailable) as caught:
            async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_tls.url,
                                     tls=etcd_tls.ssl_context(client_cert=False)):
                pass
    # trio's TLS errors have an empty message: the type is always named.
    assert "ConnectError" in str(caught.value) or "ReadError" in str(caught.value)


async def test_password_authentication_and_a_wrong_password(etcd_private: EtcdMember,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    enable_auth(etcd_private.url, "app", "app-password")
    with anyio.fail_after(20):
        await round_trip(EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_private.url,
                                       username="app", password="app-password"))
        # The password may come from the environment (it never goes into a pickle).
        monkeypatch.setenv("ANYWOOL_ETCD_PASSWORD", "app-password")
        await round_trip(EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_private.url,
                                       username="app"))
        with pytest.raises(DiscoveryServiceError) as caught:
            async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_private.url,
                                     username="app", password="wrong"):
                pass
        assert "app-password" not in str(caught.value) and "wrong" not in repr(caught.value.args)
        with pytest.raises(DiscoveryServiceError):  # no credentials at all
            async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_private.url):
                pass


async def test_mutual_tls_and_a_password_together(etcd_tls: EtcdTLSServer) -> None:
    enable_auth(etcd_tls.url, "app", "app-password", ssl_context=etcd_tls.ssl_context())
    with anyio.fail_after(20):
        await round_trip(EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_tls.url,
                                       tls=etcd_tls.ssl_context(), username="app",
                                       password="app-password"))


@asynccontextmanager
async def silent_listener() -> AsyncIterator[tuple[int, list[anyio.abc.SocketStream]]]:
    """A TCP listener that accepts and never answers (a TLS handshake with it waits until
    cancelled): its port and the connections it accepted, closed on the way out."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)  # type: ignore[attr-defined]
        accepted: list[anyio.abc.SocketStream] = []

        async def hold(stream: anyio.abc.SocketStream) -> None:
            accepted.append(stream)
            await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, hold)
            try:
                yield port, accepted
            finally:
                for stream in accepted:
                    await stream.aclose()
                tg.cancel_scope.cancel()


async def test_a_cancelled_tls_handshake_leaves_no_socket_behind(etcd_tls: EtcdTLSServer) -> None:
    async with silent_listener() as (port, accepted):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = anyio.current_time()
            with anyio.move_on_after(0.3):
                async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}",
                                         endpoints=f"https://127.0.0.1:{port}",
                                         tls=etcd_tls.ssl_context()):
                    pytest.fail("claimed through a server that never answered")
            assert anyio.current_time() - started < 1.0  # cancelled promptly
            gc.collect()
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
        assert accepted  # the handshake had started


async def test_a_member_that_never_finishes_the_handshake_costs_connect_timeout(
        etcd_tls: EtcdTLSServer) -> None:
    async with silent_listener() as (port, _):
        started = anyio.current_time()
        with anyio.fail_after(10):
            with pytest.raises(DiscoveryUnavailable) as caught:
                async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}",
                                         endpoints=f"https://127.0.0.1:{port}",
                                         tls=etcd_tls.ssl_context(), connect_timeout=0.3,
                                         request_timeout=8.0):
                    pass
        # connect_timeout, not the request budget, bounds a connection being made.
        assert anyio.current_time() - started < 0.3 + 1.0
        assert "TimeoutError" in str(caught.value)



async def test_a_subscription_authenticates_again_when_it_fails_over() -> None:
    # A member resets a token's idle TTL only when the token is used there: after watching
    # one member for longer than that TTL, the token is expired on the others, and a watch
    # opened there with it is refused in the stream as a permission refusal (not HTTP 401).
    # The subscription must authenticate again, not retry the dead token for ever.
    with EtcdCluster(3, flags=("--auth-token-ttl", "1")) as three:
        enable_auth(three.urls[0], "app", "app-password")
        with anyio.fail_after(40):
            async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=three.urls,
                                     username="app", password="app-password",
                                     lease_ttl=60) as owner, \
                    owner.publisher as publisher, anyio.create_task_group() as tg:
                events = await follow(tg, owner.subscriber)
                first, second = worker("10.0.0.1:1"), worker("10.0.0.1:2")
                await publisher.publish("worker-added", first)
                assert await take(events, 1) == [("worker-added", first.uid)]
                # Watching members[0] (the first endpoint) outlives the token elsewhere:
                # etcd drops expired tokens on a one-second tick. Time passing is what this
                # test is about, not a wait for an event: etcd says nothing when a token
                # lapses, and asking a member with the token would renew it there.
                await anyio.sleep(2.5)
                three.members[0].freeze()
                try:
                    await publisher.publish("worker-added", second)
                    with anyio.fail_after(8):
                        assert await take(events, 1) == [("worker-added", second.uid)]
                finally:
                    three.members[0].thaw()
                tg.cancel_scope.cancel()


async def test_a_subscription_refused_for_good_raises(etcd_private: EtcdMember) -> None:
    enable_auth(etcd_private.url, "app", "app-password")
    every_key = {"role": "app", "key": "AA==", "range_end": "AA=="}  # b"\0" .. b"\0"

    def revoke() -> None:
        token = authenticate(etcd_private.url, "root", "app-password")
        call(etcd_private.url, "/v3/auth/role/revoke", every_key, token=token)

    with anyio.fail_after(20):
        async with EtcdDiscovery(f"ns-{uuid.uuid4().hex}", endpoints=etcd_private.url,
                                 username="app", password="app-password",
                                 teardown_timeout=1) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker("10.0.0.1:1"))
            with pytest.raises(DiscoveryServiceError) as caught:
                async for _ in owner.subscriber:
                    await anyio.to_thread.run_sync(revoke)
            assert caught.value.code == 7, caught.value


async def test_a_user_without_a_password_anywhere_is_told_where_to_put_it(
        etcd: EtcdMember, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a worker making nested calls meets when the pool's password was given as an
    # argument: the pickled subscriber has none, and neither has the environment.
    monkeypatch.delenv("ANYWOOL_ETCD_PASSWORD", raising=False)
    with anyio.fail_after(10):
        with pytest.raises(DiscoveryServiceError) as caught:
            async for _ in EtcdDiscovery.Subscriber(f"ns-{uuid.uuid4().hex}", endpoints=etcd.url,
                                                    username="app"):
                pass
    assert "$ANYWOOL_ETCD_PASSWORD" in str(caught.value) and "'app'" in str(caught.value)


@pytest.mark.parametrize("url", ["http://app:s3cr3t@127.0.0.1:2379", "http://app:s3/cr3t@127.0.0.1:2379",
                                 "http://app:s3cr3t@127.0.0.1:99999"])
def test_an_endpoint_with_credentials_is_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        EtcdDiscovery("ns", endpoints=url)
    assert "endpoints" in str(caught.value) and "s3" not in str(caught.value)


def test_an_endpoint_on_port_0_is_refused() -> None:
    # Port 0 is nobody's client port (and would be "any port" to a listener).
    with pytest.raises(ValueError, match="endpoints"):
        EtcdDiscovery("ns", endpoints="http://127.0.0.1:0")
