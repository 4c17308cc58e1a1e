"""The command line against a real etcd: ``anywool worker --discovery etcd`` (owning, or
borrowing with ``--join``) as a real process a pool in this process dispatches to, ``ls`` and
``show --etcd`` listing what a real owner holds, ``watch --etcd`` following it, and the option
combinations that are usage errors.

``ls`` and ``show`` run in this process (click's runner, in a thread with an event loop of its
own): their output is what is tested, and an interpreter per run would cost half a second each.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner, Result

from anywool.cli import main
from anywool.discovery.etcd import EtcdDiscovery
from anywool.metadata import WorkerMetadata
from anywool.runtime.pool._pool import WorkerPool
from tests.etcd import gateway
from tests.etcd.cluster import EtcdMember
from tests.integration.children import REPO, Child, start, stop
from tests.integration.routines import parent_pid, whoami

pytestmark = pytest.mark.anyio

COMMAND = "from anywool.cli import main; main()"
#: Lease TTL of the owners here: a leftover lapses soon if a test fails midway.
TTL = 2
WORKER_KEYS = {"uid", "address", "pid", "version", "tags", "secure", "extra", "lease",
               "publisher_alive"}
NAMESPACE_KEYS = {"key", "name", "state", "owner_pid", "owner_host", "lease_ttl", "generation",
                  "worker_count", "leases", "error"}


@pytest.fixture
def secret(tmp_path: Path) -> tuple[str, str]:
    """A secret and the file (mode 600) that holds it."""
    value = secrets.token_hex(16)
    path = tmp_path / "secret"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value, str(path)


def etcd_args(etcd: EtcdMember, prefix: str) -> list[str]:
    return ["--etcd", etcd.url, "--etcd-prefix", prefix]


def keys_under(etcd: EtcdMember, prefix: str) -> list[str]:
    """Every key under ``prefix`` now, but the publishers' sequence keys (which live as long as
    their publisher)."""
    key = prefix.encode()
    answer = gateway.call(etcd.url, "/v3/kv/range", {
        "key": base64.b64encode(key).decode(),
        "range_end": base64.b64encode(gateway.range_end(key)).decode(), "keys_only": True})
    keys = [base64.b64decode(kv["key"]).decode() for kv in answer.get("kvs", ())]
    return [k for k in keys if "/seq/" not in k]


async def host(*args: str) -> tuple[Child, list[str]]:
    """Start ``anywool worker ARGS``; its worker lines once it says ``ready``."""
    child = await start(COMMAND, "worker", *args)
    try:
        assert await child.readline() == "starting"
        lines = []
        while (line := await child.readline()) != "ready":
            lines.append(line)
    except BaseException:
        await stop([child])  # it failed to start: reaped all the same
        raise
    return child, lines


async def sigterm(child: Child) -> None:
    """SIGTERM: the command says ``stopping`` then ``stopped`` and exits 0."""
    child.process.send_signal(signal.SIGTERM)
    assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
    assert await child.wait() == 0


def hosted_pids(lines: list[str]) -> set[int]:
    hosted = [re.fullmatch(r"worker (\S+:\d+) pid (\d+)", line) for line in lines]
    assert all(hosted), lines
    return {int(match[2]) for match in hosted if match}


async def test_worker_command_owns_the_namespace_and_withdraws_it_on_sigterm(
        etcd: EtcdMember, etcd_prefix: str, namespace: str, secret: tuple[str, str],
        anyio_backend: str) -> None:
    with anyio.fail_after(60):
        # No --host: every interface, as with lan, announcing a routable address.
        child, lines = await host("--discovery", "etcd", *etcd_args(etcd, etcd_prefix),
                                  "-n", namespace, "--workers", "2", "--etcd-lease-ttl", str(TTL),
                                  "--secret-file", secret[1], "--backend", anyio_backend)
        try:
            pids = hosted_pids(lines)
            assert len(pids) == 2
            async with WorkerPool(discovery=EtcdDiscovery.Subscriber(
                    namespace, endpoints=etcd.url, prefix=etcd_prefix), secret=secret[0],
                    quorum=2, lazy=False):
                assert {await parent_pid() for _ in range(4)} == {child.pid}
                assert {await whoami() for _ in range(8)} <= pids
            assert len(keys_under(etcd, etcd_prefix)) == 3  # the owner and two workers
            await sigterm(child)
            assert keys_under(etcd, etcd_prefix) == []
        finally:
            await stop([child])


async def test_join_hosts_workers_in_a_namespace_another_process_owns(
        etcd: EtcdMember, etcd_prefix: str, namespace: str, secret: tuple[str, str],
        anyio_backend: str) -> None:
    with anyio.fail_after(60):
        async with EtcdDiscovery(namespace, endpoints=etcd.url, prefix=etcd_prefix,
                                 lease_ttl=TTL) as owner:
            child, lines = await host("--discovery", "etcd", "--join",
                                      *etcd_args(etcd, etcd_prefix), "-n", namespace,
                                      "--host", "127.0.0.1", "--secret-file", secret[1],
                                      "--backend", anyio_backend)
            try:
                (pid,) = hosted_pids(lines)
                async with WorkerPool(discovery=owner.subscriber, secret=secret[0], lazy=False):
                    assert await parent_pid() == child.pid
                    assert await whoami() == pid
                await sigterm(child)
            finally:
                await stop([child])
            # Its workers withdrawn, the namespace still the test's.
            assert keys_under(etcd, etcd_prefix) == [
                f"{etcd_prefix}/ns/{_digest(namespace)}/owner"]
            assert owner.claimed and not owner.displaced


def _digest(namespace: str) -> str:
    import hashlib

    return hashlib.sha256(namespace.encode()).hexdigest()


def _run_worker(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "anywool.cli", "worker", *args],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env=env)


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("case", ["join without an owner", "no member answers"])
def test_what_the_command_cannot_use_is_one_line_of_error(
        case: str, etcd: EtcdMember, etcd_prefix: str, namespace: str,
        secret: tuple[str, str]) -> None:
    if case == "join without an owner":
        args, message = [*etcd_args(etcd, etcd_prefix), "--join"], \
            f"discovery namespace {namespace!r} has no live owner"
    else:
        args, message = ["--etcd", f"http://127.0.0.1:{_unused_port()}"], \
            "no member of the discovery service answered"
    done = _run_worker("--discovery", "etcd", *args, "-n", namespace, "--host", "127.0.0.1",
                       "--secret-file", secret[1])
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["starting"]
    assert done.stderr.startswith(f"Error: {message}") and done.stderr.count("\n") == 1, \
        done.stderr
    assert keys_under(etcd, etcd_prefix) == []  # nothing created, not even a lease's key


def test_a_namespace_in_use_is_one_line_of_error(
        etcd: EtcdMember, etcd_prefix: str, namespace: str, secret: tuple[str, str]) -> None:
    # Synchronous (the command is what runs under a backend, with its default here): the owner
    # is this process's, in an event loop of its own for the command's lifetime.
    async def owned() -> subprocess.CompletedProcess[str]:
        with anyio.fail_after(30):
            async with EtcdDiscovery(namespace, endpoints=etcd.url, prefix=etcd_prefix,
                                     lease_ttl=TTL):
                return await anyio.to_thread.run_sync(
                    lambda: _run_worker("--discovery", "etcd", *etcd_args(etcd, etcd_prefix),
                                        "-n", namespace, "--host", "127.0.0.1",
                                        "--secret-file", secret[1]))

    done = anyio.run(owned)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, done.stderr
    assert f"owned by live process {os.getpid()}" in done.stderr and namespace in done.stderr


# -- ls, show --------------------------------------------------------------------------------


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """Put SIGINT's and SIGTERM's handlers back afterwards: a command run in this process may
    leave them ignored (``watch`` and ``worker`` do once done), and every process this test
    process starts later would inherit that."""
    kept = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for number, handler in kept.items():
                signal.signal(number, handler)


def invoke(*args: str) -> Result:
    """``anywool ARGS`` in this process (click's runner), wide enough for the tables."""
    with signals_kept():
        return CliRunner(env={"COLUMNS": "250"}).invoke(main, list(args))


async def run_cli(*args: str) -> Result:
    """:func:`invoke` from an event loop: in a thread, where the command runs its own."""
    return await anyio.to_thread.run_sync(lambda: invoke(*args))


def _metadata(index: int) -> WorkerMetadata:
    return WorkerMetadata(uuid.uuid4(), f"127.0.0.1:{9000 + index}", os.getpid(), "9.9.9",
                          tags=frozenset({"gpu"}))


async def test_ls_and_show_list_the_owner_and_its_workers(
        etcd: EtcdMember, etcd_prefix: str, namespace: str, anyio_backend: str) -> None:
    workers = [_metadata(0), _metadata(1)]
    with anyio.fail_after(30):
        async with EtcdDiscovery(namespace, endpoints=etcd.url, prefix=etcd_prefix,
                                 lease_ttl=TTL) as owner, owner.publisher as publisher:
            for metadata in workers:
                await publisher.publish("worker-added", metadata)
            where = etcd_args(etcd, etcd_prefix)
            ls_json, show_json, ls_text, show_text = [
                await run_cli(*args) for args in (
                    ["ls", *where, "--json"], ["show", namespace, *where, "--json"],
                    ["ls", *where], ["show", namespace, *where])]
            generation = owner.generation
    for result in (ls_json, show_json, ls_text, show_text):
        assert result.exit_code == 0, result.output

    listing = json.loads(ls_json.stdout)
    assert listing["etcd"] == [etcd.url] and listing["prefix"] == etcd_prefix
    (document,) = listing["namespaces"]
    assert set(document) == NAMESPACE_KEYS
    (lease,) = document["leases"]
    assert re.fullmatch(r"[0-9a-f]{16}", lease["id"])
    assert {k: v for k, v in document.items() if k not in ("key", "leases")} == {
        "name": namespace, "state": "live", "owner_pid": os.getpid(),
        "owner_host": socket.gethostname(), "lease_ttl": TTL, "generation": generation,
        "worker_count": 2, "error": None}
    assert lease == {"id": lease["id"], "alive": True, "workers": 2}
    assert document["key"] == f"{etcd_prefix}/ns/{_digest(namespace)}"

    shown = json.loads(show_json.stdout)["namespace"]
    assert {k: v for k, v in shown.items() if k != "workers"} == document
    assert all(set(worker) == WORKER_KEYS for worker in shown["workers"])
    assert {(w["uid"], w["address"], w["lease"], w["publisher_alive"], tuple(w["tags"]))
            for w in shown["workers"]} == {
        (str(m.uid), m.address, lease["id"], True, ("gpu",)) for m in workers}

    (title, heading, _, row) = ls_text.stdout.strip().splitlines()
    assert title.strip() == f"namespaces in etcd at {etcd.url} under {etcd_prefix}"
    assert heading.split() == ["namespace", "state", "owner", "generation", "workers", "leases"]
    assert row.split() == [namespace, "live", "pid", str(os.getpid()), "on",
                           socket.gethostname(), str(generation), "2", "1", "alive"]

    lines = show_text.stdout.strip().splitlines()
    assert lines[0].strip() == (f"{namespace}  live · owner pid {os.getpid()} on "
                                f"{socket.gethostname()} · generation {generation} · "
                                f"lease ttl {TTL} s")
    assert lines[1].startswith("2 workers · leases 1 alive · key ")
    assert lines[2].split() == ["uid", "address", "pid", "tags", "version", "publisher"]
    assert sorted(line.split() for line in lines[4:]) == sorted(
        [m.uid.hex[:8], m.address, str(m.pid), "gpu", "9.9.9", lease["id"][:8], "alive"]
        for m in workers)


def test_ls_and_show_of_nothing(etcd: EtcdMember, etcd_prefix: str, namespace: str) -> None:
    where = etcd_args(etcd, etcd_prefix)
    assert json.loads(invoke("ls", *where, "--json").stdout)["namespaces"] == []
    assert invoke("ls", *where).stdout.strip() == (f"no namespaces in etcd at {etcd.url} under "
                                                   f"{etcd_prefix}")
    missing = invoke("show", namespace, *where, "--json")
    assert missing.exit_code == 1 and missing.stdout == ""
    assert f"no namespace {namespace!r} in etcd at {etcd.url}" in missing.stderr


def test_workers_without_an_owner_are_listed_orphaned(etcd: EtcdMember, etcd_prefix: str,
                                                      namespace: str) -> None:
    # What a displaced owner's publishers leave: worker keys, no owner key.
    metadata = _metadata(0)
    key = f"{etcd_prefix}/ns/{_digest(namespace)}/workers/{metadata.uid.hex}".encode()
    gateway.call(etcd.url, "/v3/kv/put", {"key": base64.b64encode(key).decode(),
                                          "value": base64.b64encode(metadata.to_bytes()).decode()})
    where = etcd_args(etcd, etcd_prefix)
    (listed,) = json.loads(invoke("ls", *where, "--json").stdout)["namespaces"]
    shown = json.loads(invoke("show", namespace, *where, "--json").stdout)["namespace"]
    assert {k: v for k, v in shown.items() if k != "workers"} == listed
    assert (listed["state"], listed["name"], listed["owner_pid"], listed["generation"],
            listed["worker_count"], listed["leases"]) == ("orphaned", None, None, None, 1, [])
    (worker,) = shown["workers"]
    assert (worker["uid"], worker["lease"], worker["publisher_alive"]) == (
        str(metadata.uid), None, None)
    row = invoke("ls", *where).stdout.strip().splitlines()[-1].split()
    assert row[1:] == ["orphaned", "none", "?", "1", "none"]


def test_ls_of_a_cluster_that_does_not_answer_is_one_line_of_error() -> None:
    url = f"http://127.0.0.1:{_unused_port()}"
    result = invoke("ls", "--etcd", url)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith(f"Error: no member of the discovery service answered ({url})")
    assert result.stderr.count("\n") == 1


# -- watch -----------------------------------------------------------------------------------


async def test_watch_json_prints_a_worker_added_then_dropped(
        etcd: EtcdMember, etcd_prefix: str, namespace: str, anyio_backend: str) -> None:
    metadata = _metadata(0)
    with anyio.fail_after(30):
        async with EtcdDiscovery(namespace, endpoints=etcd.url, prefix=etcd_prefix,
                                 lease_ttl=TTL) as owner, owner.publisher as publisher:
            child = await start(COMMAND, "watch", namespace, *etcd_args(etcd, etcd_prefix),
                                "--json", "--backend", anyio_backend)
            try:
                await publisher.publish("worker-added", metadata)
                added = json.loads(await child.readline())
                await publisher.publish("worker-dropped", metadata)
                dropped = json.loads(await child.readline())
                child.process.send_signal(signal.SIGINT)
                assert await child.wait() == 0
            finally:
                await stop([child])
    assert [added["type"], dropped["type"]] == ["worker-added", "worker-dropped"]
    for event in (added, dropped):
        assert set(event["worker"]) == WORKER_KEYS
        assert (event["worker"]["uid"], event["worker"]["address"]) == (
            str(metadata.uid), metadata.address)
        assert (event["worker"]["lease"], event["worker"]["publisher_alive"]) == (None, None)


def test_watch_of_a_namespace_without_owner_is_exit_1(etcd: EtcdMember, etcd_prefix: str,
                                                      namespace: str) -> None:
    result = invoke("watch", namespace, *etcd_args(etcd, etcd_prefix), "--json")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip() == (f"Error: namespace {namespace!r} has no live owner in "
                                     f"etcd at {etcd.url} under {etcd_prefix}")


# -- usage errors ----------------------------------------------------------------------------


@pytest.fixture
def never_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker command run in this process that gets as far as saying ``starting`` fails at
    once, rather than hosting workers until a signal that never comes."""
    from anywool.cli import _worker_command

    def refuse(line: str) -> None:
        raise AssertionError(f"the command went on to say {line!r}")

    monkeypatch.setattr(_worker_command, "_say", refuse)


@pytest.mark.parametrize("args, message", [
    (["worker", "--discovery", "local", "--etcd", "http://127.0.0.1:2379"],
     "--etcd is for --discovery etcd only"),
    (["worker", "--discovery", "lan", "--join", "--etcd-prefix", "/p"],
     "--etcd-prefix, --join are for --discovery etcd only"),
    (["worker", "--discovery", "local", "--etcd-lease-ttl", "2"],
     "--etcd-lease-ttl is for --discovery etcd only"),
    (["worker", "--discovery", "etcd", "--interface", "127.0.0.1"],
     "--interface applies to --discovery lan only"),
    (["worker", "--discovery", "etcd", "--etcd", "ftp://127.0.0.1:2379"], "'--etcd'"),
    (["worker", "--discovery", "etcd", "--etcd-prefix", "anywool"], "'--etcd-prefix'"),
    (["worker", "--discovery", "etcd", "--etcd-cert", __file__], "--etcd-cert needs --etcd-ca"),
    (["worker", "--discovery", "etcd", "--etcd-ca", __file__], "'--etcd-ca'"),
    (["worker", "--discovery", "etcd", "--etcd-lease-ttl", "0"], "--etcd-lease-ttl"),
    (["ls", "--etcd-prefix", "/p"], "--etcd-prefix needs --etcd URL"),
    (["show", "ns", "--etcd", "http://127.0.0.1:2379", "--runtime-dir", "/tmp"],
     "--runtime-dir is for this host's runtime directory, --etcd for a cluster"),
    (["watch", "ns", "--etcd-user", "u", "--etcd-ca", __file__],
     "--etcd-user, --etcd-ca need --etcd URL"),
])
def test_bad_option_combinations_are_usage_errors(args: list[str], message: str,
                                                  never_starts: None) -> None:
    if args[0] == "worker":
        args = [*args, "-n", "ns"]
    # A secret in the environment: the checks after the one for TCP credentials run too.
    with signals_kept():
        result = CliRunner(env={"ANYWOOL_SECRET": secrets.token_hex(16)}).invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stdout == ""  # refused before "starting"


def test_tcp_workers_in_etcd_need_credentials(never_starts: None) -> None:
    result = CliRunner(env={"ANYWOOL_SECRET": None}).invoke(
        main, ["worker", "--discovery", "etcd", "-n", "ns"])
    assert result.exit_code == 2
    assert "workers on TCP accept only peers that authenticate" in result.stderr


def test_the_default_endpoint_is_the_librarys() -> None:
    from anywool.cli._etcd_ops import DEFAULT_ENDPOINT
    from anywool.discovery.etcd._config import DEFAULT_ENDPOINT as LIBRARY_DEFAULT

    assert DEFAULT_ENDPOINT == LIBRARY_DEFAULT
