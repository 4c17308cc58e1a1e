"""``anywool recycle NS`` (issue 24): a rolling restart of the ``anywool worker`` hosts of a
namespace, asked from another process through one of their workers, authenticated as a call
is. Real hosts, a real borrower calling all along, both backends."""

from __future__ import annotations

import hmac
import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from anywool.discovery.local import LocalDiscovery
from anywool.errors import AuthenticationError
from anywool.runtime.client._connection import WorkerConnection
from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._pool import POOL_EXTRA, WorkerPool
from anywool.runtime.wire import _auth

from .children import REPO, stop
from .routines import whoami
from .test_worker_command import host

pytestmark = pytest.mark.anyio


async def anywool_recycle(namespace: str, *args: str, secret: str | None = None
                          ) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("ANYWOOL_SECRET", None)
    if secret is not None:
        env["ANYWOOL_SECRET"] = secret
    return await anyio.run_process([sys.executable, "-m", "anywool.cli", "recycle", namespace,
                                    *args], check=False, cwd=REPO, env=env)


def pids_of(lines: list[str]) -> set[int]:
    return {int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("worker ")}


async def test_recycle_replaces_every_hosted_worker_while_calls_go_on(
        namespace: str, anyio_backend: str) -> None:
    with anyio.fail_after(90):
        first, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--workers", "2", "--backend", anyio_backend)
        try:
            before = pids_of(lines)
            assert len(before) == 2
            results: list[int] = []
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace), quorum=2,
                                  lazy=False) as borrower:
                async with anyio.create_task_group() as tg:
                    done = anyio.Event()

                    async def calls() -> None:
                        # A steady stream: any call that failed would fail the test here.
                        while not done.is_set():
                            results.append(await whoami())

                    tg.start_soon(calls)
                    tg.start_soon(calls)
                    result = await anywool_recycle(namespace, "--timeout", "60")
                    done.set()
                uids = {m.uid for m in borrower.proxy.workers}
            out = result.stdout.decode().splitlines()
            assert result.returncode == 0, (out, result.stderr.decode())
            # The host said what it did, as on SIGHUP.
            assert await first.readline() == "recycling"
            replaced = [await first.readline() for _ in range(2)]
            assert await first.readline() == "recycled"
            after = pids_of(replaced)
            assert len(after) == 2 and not after & before
            # The command's account: one host, both workers gone, two new ones, done.
            assert out[0] == f"recycling {namespace}: 1 host, 2 workers"
            assert re.fullmatch(r"host [0-9a-f]{8}: recycling its 2 workers \(asked unix:\S+\)",
                                out[1]), out
            assert len([line for line in out if ": - worker " in line]) == 2
            assert {int(line.rsplit(" ", 1)[1]) for line in out if ": + worker " in line} \
                == after
            assert out[-2].endswith(": recycled") and out[-1] == "recycled 1 host"
            # Every call succeeded, on the old workers and then on the new ones.
            assert results and set(results) <= before | after
            assert len(uids) == 2
            first.process.send_signal(signal.SIGTERM)
            assert [await first.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await first.wait() == 0
        finally:
            await stop([first])


async def test_hosts_are_recycled_one_after_the_other(namespace: str) -> None:
    # Two pools (two hosts) announcing into one namespace: the second is asked only once the
    # first has replaced all its workers.
    with anyio.fail_after(90):
        async with LocalDiscovery(namespace) as discovery, \
                WorkerPool(spawn=2, discovery=discovery) as one, \
                WorkerPool(spawn=1, discovery=discovery) as two:
            counts = {pool._pool_id[:8]: len(pool.workers) for pool in (one, two)}
            before = {w.metadata.uid for pool in (one, two) for w in pool.workers}
            assert {w.metadata.extra[POOL_EXTRA] for w in one.workers} == {one._pool_id}
            result = await anywool_recycle(namespace, "--timeout", "60")
            # The command says "recycled" once discovery shows the old workers withdrawn; each
            # pool then drains and stops them, and lists them until their processes exit (up
            # to the stop's tail): a pool that kept one more (a second recycle) fails here.
            with anyio.fail_after(30):
                while (sizes := [len(pool.workers) for pool in (one, two)]) != [2, 1]:
                    await anyio.sleep(0.05)
            after = {w.metadata.uid for pool in (one, two) for w in pool.workers}
    out = result.stdout.decode().splitlines()
    assert result.returncode == 0, (out, result.stderr.decode())
    assert out[0] == f"recycling {namespace}: 2 hosts, 3 workers"
    assert out[-1] == "recycled 2 hosts"
    # Each host's lines, asked to recycled, come together: the second starts after the first.
    names = [line.split(":", 1)[0] for line in out[1:-1]]
    first, second = dict.fromkeys(names)
    assert names == [first] * names.count(first) + [second] * names.count(second), out
    for name in (first, second):
        assert name.startswith("host ") and name[5:] in counts
        count = counts[name[5:]]
        assert out.count(f"{name}: recycled") == 1
        assert len([line for line in out if line.startswith(f"{name}: - worker ")]) == count
        assert len([line for line in out if line.startswith(f"{name}: + worker ")]) == count
    assert sizes == [2, 1] and len(after) == 3 and not after & before


async def test_a_wrong_secret_is_refused_and_nothing_is_recycled(
        namespace: str, tmp_path: Path, anyio_backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secrets.token_hex(16)
    path = tmp_path / "secret"
    path.write_text(secret)
    path.chmod(0o600)
    with anyio.fail_after(60):
        child, lines = await host("--discovery", "local", "--namespace", namespace,
                                  "--host", "127.0.0.1", "--secret-file", str(path),
                                  "--backend", anyio_backend)
        try:
            wrong = await anywool_recycle(namespace, "--timeout", "10",
                                          secret=secrets.token_hex(16))
            none = await anywool_recycle(namespace, "--timeout", "10")
            # Nor does a client that skips checking the worker's proof get anywhere: the
            # worker checks ours first, and reads no request before.
            [address] = [line.split()[1] for line in lines]
            fake_hmac = SimpleNamespace(**{name: getattr(hmac, name) for name in dir(hmac)
                                           if not name.startswith("__")})
            fake_hmac.compare_digest = lambda a, b: True
            with monkeypatch.context() as patched:
                patched.setattr(_auth, "hmac", fake_hmac)
                with pytest.raises(AuthenticationError) as refused:
                    async with WorkerConnection(address, credentials=_auth.Credentials.resolve(
                            secrets.token_hex(16), None)) as connection:
                        await connection.recycle(5)
            assert "the worker rejected our credentials" in str(refused.value)
            async with WorkerPool(discovery=LocalDiscovery.Subscriber(namespace),
                                  secret=secret):
                assert await whoami() == pids_of(lines).pop()  # the same worker serves
            # Nothing was recycled: the host's next lines are those of its stop.
            child.process.send_signal(signal.SIGTERM)
            assert [await child.readline() for _ in range(2)] == ["stopping", "stopped"]
            assert await child.wait() == 0
        finally:
            await stop([child])
    assert wrong.returncode == 1 and b"recycling its" not in wrong.stdout
    error = wrong.stderr.decode()
    assert re.search(r"host [0-9a-f]{8}: 127\.0\.0\.1:\d+ \(pid \d+\) refused our "
                     r"credentials: the worker rejected our credentials", error), error
    assert none.returncode == 1 and "we have no credentials" in none.stderr.decode()


async def test_a_worker_no_pool_runs_refuses(namespace: str) -> None:
    with anyio.fail_after(60):
        async with LocalDiscovery(namespace) as discovery, LocalWorker() as bare, \
                discovery.publisher as publisher:
            await publisher.publish("worker-added", bare.metadata)
            result = await anywool_recycle(namespace, "--timeout", "10")
    assert result.returncode == 1
    assert "refused to recycle: not run by a pool" in result.stderr.decode()
    assert f"(pid {bare.pid})" in result.stderr.decode()


def test_recycle_of_a_missing_namespace_is_exit_1(namespace: str) -> None:
    result = subprocess.run([sys.executable, "-m", "anywool.cli", "recycle", namespace],
                            capture_output=True, cwd=REPO, timeout=60, check=False)
    assert result.returncode == 1
    assert f"no generation of namespace {namespace!r}" in result.stderr.decode()
