"""Fixtures that give tests real etcd servers (tests/etcd/cluster.py starts them).

* ``etcd`` (session scope, so one per xdist worker, started when a test first asks): one member
  shared by the tests of the worker. Tests keep out of each other's keys with ``etcd_prefix``;
  a test that kills, freezes, compacts or enables auth uses ``etcd_private`` instead.
* ``etcd_private``: a member of the test's own, stopped after the test.
* ``etcd_cluster3``: three members of one cluster, shared by the tests of a module; before each
  test, frozen members are thawed and stopped or killed ones restarted, and every member serves.
  Membership changes and auth do not carry over well: keep those tests on private members.
* ``etcd_prefix``: a key prefix of the test's own, whose keys are deleted after the test on the
  shared servers (``etcd``, ``etcd_cluster3``) the test used.
* ``etcd_tls``: a private member serving https that requires a client certificate.

Where no etcd binary can be run here, every test in this directory is skipped with the reason,
unless ``$ANYWOOL_REQUIRE_ETCD`` is set (CI sets it: it must run them), which makes it an error.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
from collections.abc import Iterator

import pytest

from tests.etcd import cluster, gateway
from tests.etcd.cluster import EtcdCluster, EtcdMember, EtcdTLSServer

# Seconds the deletion of a test's keys may take.
_CLEANUP_TIMEOUT = 2.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = config.rootpath / "tests" / "etcd"
    ours = [item for item in items if item.path.is_relative_to(here)]
    if not ours:
        return
    reason = cluster.unavailable_reason()
    if reason is None:
        return
    if os.environ.get("ANYWOOL_REQUIRE_ETCD"):
        raise pytest.UsageError(f"$ANYWOOL_REQUIRE_ETCD is set, but the etcd tests cannot run: "
                                f"{reason}")
    skip = pytest.mark.skip(reason=f"etcd tests need an etcd server binary: {reason}")
    for item in ours:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdMember]:
    # Module scope, not session: pytest tears a module's fixtures down before a test of
    # another module runs, so no test elsewhere ever sees this member among its children (many
    # count the test process's children). A start costs about 0.15 s.
    member = EtcdMember.start(name="module", service=True)
    try:
        yield member
    finally:
        member.close()


@pytest.fixture
def etcd_private() -> Iterator[EtcdMember]:
    member = EtcdMember.start(name="private")
    try:
        yield member
    finally:
        member.close()


@pytest.fixture(scope="module")
def _etcd_cluster3_of_module() -> Iterator[EtcdCluster]:
    three = EtcdCluster(3, service=True)
    try:
        yield three
    finally:
        three.close()


@pytest.fixture
def etcd_cluster3(_etcd_cluster3_of_module: EtcdCluster) -> EtcdCluster:
    # Healing before the test (not after the last one) costs one range per member when
    # nothing is wrong.
    _etcd_cluster3_of_module.heal()
    return _etcd_cluster3_of_module


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    prefix = "/anywool-test/" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    # The shared servers this test uses; asked for now, so they are torn down after us.
    member: EtcdMember | None = None
    three: EtcdCluster | None = None
    if "etcd" in request.fixturenames:
        member = request.getfixturevalue("etcd")
    if "etcd_cluster3" in request.fixturenames:
        three = request.getfixturevalue("etcd_cluster3")
    yield prefix
    key = prefix.encode()
    body = {"key": base64.b64encode(key).decode(),
            "range_end": base64.b64encode(gateway.range_end(key)).decode()}
    if member is not None:
        _delete(member.url, body, prefix)
    if three is not None:
        three.heal()  # the test may have left it without a quorum
        _delete(three.urls[0], body, prefix)


def _delete(url: str, body: dict[str, str], prefix: str) -> None:
    try:
        gateway.call(url, "/v3/kv/deleterange", body, timeout=_CLEANUP_TIMEOUT)
    except (gateway.GatewayError, OSError, http.client.HTTPException, ValueError) as exc:
        pytest.fail(f"could not delete the test's keys under {prefix!r} on {url}: "
                    f"{type(exc).__name__}: {exc}", pytrace=False)


@pytest.fixture
def etcd_tls() -> Iterator[EtcdTLSServer]:
    member = EtcdMember.start(name="tls", tls=True)
    try:
        yield EtcdTLSServer.of(member)
    finally:
        member.close()
