"""The etcd servers the suite runs (tests/etcd/cluster.py) serve, fail and recover as etcd does,
and leave no process behind.

Synchronous tests: the fixtures and helpers under test are synchronous, and httpx's sync client
talks to the same JSON gateway as the async one.
"""

from __future__ import annotations

import base64
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import psutil
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from tests.etcd import cluster
from tests.etcd.cluster import EtcdCluster, EtcdMember, EtcdTLSServer
from tests.etcd.gateway import authenticate, enable_auth

_T = TypeVar("_T")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _until(probe: Callable[[], _T | None], timeout: float, what: str) -> _T:
    """Poll ``probe`` every 5 ms until it returns something; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (value := probe()) is None:
        if time.monotonic() >= deadline:
            pytest.fail(f"no {what} within {timeout} s", pytrace=False)
        time.sleep(0.005)
    return value


def _gone(pid: int) -> bool:
    """The process has exited: no such pid, or a zombie its new parent has yet to reap."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_shared_member_stores_and_returns_a_key(etcd: EtcdMember, etcd_prefix: str) -> None:
    key = _b64(f"{etcd_prefix}/greeting")
    with httpx.Client(base_url=etcd.url, timeout=5) as client:
        put = client.post("/v3/kv/put", json={"key": key, "value": _b64("hello")})
        got = client.post("/v3/kv/range", json={"key": key})
    assert put.status_code == 200
    assert [base64.b64decode(kv["value"]) for kv in got.json()["kvs"]] == [b"hello"]


def test_a_one_second_lease_is_granted_as_asked(etcd: EtcdMember) -> None:
    # The fast election timeout lowers etcd's TTL floor (1.5 x election timeout) below 1 s.
    with httpx.Client(base_url=etcd.url, timeout=5) as client:
        lease = client.post("/v3/lease/grant", json={"TTL": "1"}).json()
        client.post("/v3/lease/revoke", json={"ID": lease["ID"]}).raise_for_status()
    assert lease["TTL"] == "1"


def test_the_cluster_elects_a_new_leader_when_the_leader_is_killed(
        etcd_cluster3: EtcdCluster, etcd_prefix: str) -> None:
    leader = _until(etcd_cluster3.leader, 5, "leader")
    killed_pid = leader.pid
    leader.kill()
    assert _gone(killed_pid)
    successor = _until(etcd_cluster3.leader, 2, "new leader after the leader was killed")
    assert successor is not leader
    key = _b64(f"{etcd_prefix}/written-while-down")
    with httpx.Client(timeout=5) as client:
        client.post(f"{successor.url}/v3/kv/put",
                    json={"key": key, "value": _b64("v")}).raise_for_status()
        leader.restart()
        # A serializable range answers from the member's own copy: it has caught up.
        local = client.post(f"{leader.url}/v3/kv/range", json={"key": key, "serializable": True})
    assert [kv["key"] for kv in local.json()["kvs"]] == [key]
    assert leader.status()["leader"] in {member.member_id for member in etcd_cluster3.members}


def test_a_frozen_member_times_out_while_the_others_answer(etcd_cluster3: EtcdCluster) -> None:
    leader = _until(etcd_cluster3.leader, 5, "leader")
    frozen = next(member for member in etcd_cluster3.members if member is not leader)
    others = [member for member in etcd_cluster3.members if member is not frozen]
    body = {"key": _b64("/anywool-test/any")}
    frozen.freeze()
    with httpx.Client(timeout=5) as client:
        with pytest.raises(httpx.TimeoutException):
            client.post(f"{frozen.url}/v3/kv/range", json=body, timeout=0.3)
        statuses = [client.post(f"{member.url}/v3/kv/range", json=body).status_code
                    for member in others]
    assert statuses == [200, 200]


def test_heal_brings_back_killed_and_frozen_members(etcd_cluster3: EtcdCluster) -> None:
    killed, frozen, _ = etcd_cluster3.members
    killed.kill()
    frozen.freeze()
    etcd_cluster3.heal(timeout=10)
    body = {"key": _b64("/anywool-test/any"), "serializable": True}
    with httpx.Client(timeout=2) as client:
        statuses = [client.post(f"{url}/v3/kv/range", json=body).status_code
                    for url in etcd_cluster3.urls]
    assert statuses == [200, 200, 200]


def test_a_member_whose_port_is_taken_starts_on_fresh_ports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    picked: list[list[int]] = []
    free_ports = cluster._free_ports

    def the_first_client_port_taken(count: int) -> list[int]:
        ports = free_ports(count)
        if not picked:
            ports[0] = taken
        picked.append(ports)
        return ports

    monkeypatch.setattr(cluster, "_free_ports", the_first_client_port_taken)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))  # bound, not listening: etcd's bind fails, probes refused
        taken = blocker.getsockname()[1]
        with EtcdMember.start(name="race") as member:
            log = member.log_path.read_text()
            assert (len(picked), member.client_port) == (2, picked[1][0])
    assert "address already in use" in log


def test_the_tls_member_refuses_a_client_without_a_certificate(etcd_tls: EtcdTLSServer) -> None:
    with httpx.Client(verify=etcd_tls.ssl_context(client_cert=False), timeout=5) as client:
        with pytest.raises(httpx.ConnectError):
            client.post(f"{etcd_tls.url}/v3/kv/range", json={"key": _b64("k")})


def test_the_tls_member_accepts_the_cn_less_client_certificate_with_and_without_auth(
        etcd_tls: EtcdTLSServer) -> None:
    subject = x509.load_pem_x509_certificate(etcd_tls.client_cert_path.read_bytes()).subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []
    body = {"key": _b64("k")}
    with httpx.Client(base_url=etcd_tls.url, verify=etcd_tls.ssl_context(), timeout=5) as client:
        before_auth = client.post("/v3/kv/range", json=body).status_code
        enable_auth(etcd_tls.url, "root", "root-password", ssl_context=etcd_tls.ssl_context())
        token = authenticate(etcd_tls.url, "root", "root-password",
                             ssl_context=etcd_tls.ssl_context())
        with_auth = client.post("/v3/kv/range", json=body, headers={"Authorization": token})
    assert before_auth == 200
    assert with_auth.status_code == 200, with_auth.text


def test_enable_auth_refuses_requests_without_a_token(etcd_private: EtcdMember) -> None:
    enable_auth(etcd_private.url, "anywool", "a-password")
    body = {"key": _b64("k")}
    with httpx.Client(base_url=etcd_private.url, timeout=5) as client:
        anonymous = client.post("/v3/kv/range", json=body)
        token = client.post("/v3/auth/authenticate",
                            json={"name": "anywool", "password": "a-password"}).json()["token"]
        authenticated = client.post("/v3/kv/range", json=body, headers={"Authorization": token})
    assert (anonymous.status_code, anonymous.json()["error"]) == (
        400, "etcdserver: user name is empty")
    assert authenticated.status_code == 200, authenticated.text


def test_stopping_a_frozen_member_leaves_no_process(etcd_private: EtcdMember) -> None:
    etcd_private.freeze()
    pid = etcd_private.pid
    etcd_private.stop()
    etcd_private.stop()  # idempotent
    assert etcd_private.returncode in (0, -15)
    assert not psutil.pid_exists(pid)


def test_closing_a_cluster_leaves_no_process_even_of_a_frozen_member() -> None:
    with EtcdCluster(3) as three:
        three.members[0].freeze()
        pids = [member.pid for member in three.members]
    assert [psutil.pid_exists(pid) for pid in pids] == [False] * 3


@pytest.mark.skipif(not cluster._pdeathsig_prefix(), reason="no `setpriv --pdeathsig` here")
def test_a_test_process_killed_outright_leaves_no_etcd_behind() -> None:
    # A process that starts a member and is then SIGKILLed runs no finalizer and no atexit.
    script = ("from tests.etcd.cluster import EtcdMember\n"
              "member = EtcdMember.start(name='orphan')\n"
              "print(member.pid, member.directory, flush=True)\n"
              "input()\n")
    root = Path(__file__).parents[2]
    etcd_pid = 0
    with subprocess.Popen([sys.executable, "-c", script], cwd=root, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as runner:
        try:
            assert runner.stdout is not None
            readable, _, _ = select.select([runner.stdout], [], [], 30)
            assert readable, "the runner did not report its member within 30 s"
            pid_text, directory = runner.stdout.readline().split()
            etcd_pid = int(pid_text)
            assert not _gone(etcd_pid)
            runner.kill()
            runner.wait()
            _until(lambda: True if _gone(etcd_pid) else None, 5, "end of the orphaned member")
            # The next member started removes the directory of the dead process.
            cluster._sweep(Path(directory).parent)
            assert not Path(directory).exists()
        finally:
            runner.kill()
            if etcd_pid and not _gone(etcd_pid):
                psutil.Process(etcd_pid).kill()  # the etcd this test started, left running
