"""The programs of ``examples/``, each run as a user runs it: a real interpreter, its output and
exit status checked, under asyncio and under trio (the ``anyio_backend`` of each test is the
backend the example is asked to use).

Every wait is bounded; nothing sleeps to let something happen: a test waits for the line the
program prints once it has happened (or, for a batch's Ctrl-C, polls what its workers have
read). The suite's own after-test checks apply too: no process of the test left running, and
the runtime directory (which every example inherits through ``$ANYWOOL_RUNTIME_DIR``) empty.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import psutil
import pytest
from anyio.abc import Process

from anywool._address import Address
from tests import netns
from tests.helpers import wait_until

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def environment() -> dict[str, str]:
    """This test's environment (its runtime directory included), with this checkout's ``src``
    first on ``PYTHONPATH`` so that the examples import the code under test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


def example(name: str) -> str:
    return str(EXAMPLES / name)


async def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS...`` to its end (at most ``timeout`` seconds); stdout and stderr as
    text."""
    with anyio.fail_after(timeout):
        done = await anyio.run_process([sys.executable, *args], check=False, cwd=cwd,
                                       env=environment())
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),
                                       done.stderr.decode())


class Running:
    """A program started by :func:`started`: its stdout read line by line, its stderr in a
    file (read when a test fails, or at the end)."""

    def __init__(self, process: Process, stderr_path: Path) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self.lines: list[str] = []
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def readline(self) -> str:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            try:
                self._buffer += await self.process.stdout.receive()
            except anyio.EndOfStream:
                raise AssertionError(f"the program closed its stdout after {self.lines!r}; "
                                     f"stderr:\n{self.stderr()}") from None
        line, _, self._buffer = self._buffer.partition(b"\n")
        self.lines.append(line.decode())
        return self.lines[-1]

    async def lines_until(self, last: str) -> list[str]:
        """The lines before the first line that starts with ``last`` (read as well)."""
        before = []
        while not (line := await self.readline()).startswith(last):
            before.append(line)
        return before


@asynccontextmanager
async def started(*args: str, cwd: Path) -> AsyncIterator[Running]:
    """``python ARGS...`` running for the block; afterwards SIGTERM if it still runs, SIGKILL 10
    s later, reaped in any case (shielded)."""
    stderr_path = cwd / f"stderr-{len(list(cwd.glob('stderr-*')))}.txt"
    with open(stderr_path, "wb") as stderr:
        process = await anyio.open_process([sys.executable, *args], stdin=subprocess.DEVNULL,
                                           stderr=stderr, cwd=cwd, env=environment())
    try:
        yield Running(process, stderr_path)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await process.aclose()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pids_in(text: str) -> list[int]:
    return [int(pid) for pid in text.split()]


# -- cpu_batch.py --------------------------------------------------------------------------------


def make_tree(root: Path) -> int:
    """A small tree of files of various sizes (an empty one and one past a read chunk included),
    a symlink that is not followed, and a directory of its own; the number of regular files."""
    (root / "sub").mkdir(parents=True)
    sizes = [0, 1, 100, 5_000, 300_000]
    for index, size in enumerate(sizes * 5):
        where = root / "sub" if index % 3 == 0 else root
        (where / f"file{index}.bin").write_bytes(os.urandom(size))
    (root / "link").symlink_to(root / "file1.bin")
    return len(sizes) * 5


async def test_the_batch_hashes_every_file_on_its_workers_and_checks_each(
        tmp_path: Path, anyio_backend: str) -> None:
    count = make_tree(tmp_path / "tree")
    done = await run(example("cpu_batch.py"), str(tmp_path / "tree"), "--workers", "2",
                     "--backend", anyio_backend, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    first = re.fullmatch(rf"hashing {count} files \(1\.5 MB\) on 2 workers \({anyio_backend}\), "
                         r"pids (\d+) (\d+)", lines[0])
    assert first, lines[0]
    workers = {int(pid) for pid in first.groups()}
    per_worker = [re.fullmatch(r"worker (\d+): (\d+) files, [\d.]+ MB", line) for line in lines
                  if line.startswith("worker ")]
    assert per_worker and all(per_worker), lines
    assert {int(match[1]) for match in per_worker} <= workers  # type: ignore[index]
    assert sum(int(match[2]) for match in per_worker) == count  # type: ignore[index]
    assert re.fullmatch(rf"hashed {count} files in [\d.]+ s: \d+ files/s, [\d.]+ MB/s", lines[-2])
    assert lines[-1] == f"verified {count} digests here: 0 mismatched, 0 unreadable"


async def test_the_batch_takes_the_standard_library_by_default_and_a_limit(
        tmp_path: Path, anyio_backend: str) -> None:
    done = await run(example("cpu_batch.py"), "--limit", "25", "--workers", "1",
                     "--backend", anyio_backend, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("hashing 25 files ("), done.stdout
    assert done.stdout.splitlines()[-1] == "verified 25 digests here: 0 mismatched, 0 unreadable"


async def test_ctrl_c_interrupts_the_batch_mid_file_and_leaves_nothing_running(
        tmp_path: Path, anyio_backend: str) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "small").write_bytes(b"small")
    with open(tree / "huge", "wb") as huge:  # sparse: 64 GiB to read, no disk used
        huge.truncate(64 << 30)
    with anyio.fail_after(60):
        async with started(example("cpu_batch.py"), str(tree), "--workers", "2",
                           "--backend", anyio_backend, cwd=tmp_path) as batch:
            workers = pids_in((await batch.readline()).partition(", pids ")[2])
            assert len(workers) == 2, batch.lines

            def read_so_far() -> int:
                return max(psutil.Process(pid).io_counters().read_chars for pid in workers)

            # A worker is well into the huge file (no result yet): a count in /proc, with no
            # event to wait on.
            await wait_until(lambda: read_so_far() >= 256 << 20,
                             "a worker to read 256 MiB of the huge file", timeout=20)
            batch.process.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
            with anyio.fail_after(10):  # about cancel_grace at worst, here well under
                status = await batch.process.wait()
            assert status == 130, batch.stderr()
            assert batch.stderr().splitlines()[-1] == "interrupted"
            assert "Traceback" not in batch.stderr()
            assert not any(alive(pid) for pid in workers)


# -- durable_owner.py and borrower.py ------------------------------------------------------------


async def borrow(namespace: str, backend: str, cwd: Path, calls: int = 6) -> tuple[int, set[int]]:
    """Run borrower.py to its end: (its pid, the pids of the workers that answered)."""
    done = await run(example("borrower.py"), "--namespace", namespace, "--calls", str(calls),
                     "--backend", backend, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = re.fullmatch(rf"borrower pid (\d+) \(spawned 0 workers\): {calls} calls on the "
                          rf"workers of '{namespace}'", lines[0])
    assert header, lines[0]
    assert len([line for line in lines if line.startswith("call ")]) == calls
    summary = re.fullmatch(rf"{calls} calls answered by worker pids ([\d ]+)", lines[-1])
    assert summary, lines[-1]
    return int(header[1]), set(pids_in(summary[1]))


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_borrowers_come_and_go_while_the_owner_serves_until_a_signal(
        tmp_path: Path, namespace: str, anyio_backend: str, stop: signal.Signals) -> None:
    with anyio.fail_after(60):
        async with started(example("durable_owner.py"), "--namespace", namespace,
                           "--workers", "2", "--backend", anyio_backend, cwd=tmp_path) as owner:
            lines = await owner.lines_until("ready")
            assert lines[0] == f"owner of {namespace!r}: pid {owner.pid}, 2 workers"
            workers = {int(line.rpartition(" pid ")[2]) for line in lines[1:]}
            assert len(workers) == 2 and owner.pid not in workers, lines

            for backend in ("asyncio", "trio"):  # one borrower, then another, on each backend
                borrower, answered = await borrow(namespace, backend, tmp_path)
                assert answered and answered <= workers  # the owner's workers, none of its own
                assert borrower not in answered
                assert owner.process.returncode is None  # the owner keeps serving
                assert all(alive(pid) for pid in workers)

            # The namespace has its owner: a second one is refused, and nothing changes.
            second = await run(example("durable_owner.py"), "--namespace", namespace,
                               "--backend", anyio_backend, cwd=tmp_path)
            assert second.returncode == 1
            assert f"cannot own {namespace!r}" in second.stderr
            assert f"live process {owner.pid}" in second.stderr

            owner.process.send_signal(stop)
            assert await owner.readline() == f"stopping ({stop.name})"
            assert await owner.readline() == "stopped"
            assert await owner.process.wait() == 0, owner.stderr()
            assert not any(alive(pid) for pid in workers)


async def test_a_borrower_without_an_owner_says_so(tmp_path: Path, namespace: str,
                                                   anyio_backend: str) -> None:
    done = await run(example("borrower.py"), "--namespace", namespace,
                     "--backend", anyio_backend, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == (f"no live process owns {namespace!r}: start "
                                            "examples/durable_owner.py first")


# -- lan_hosts.py ------------------------------------------------------------------------------


def require_lan() -> None:
    """Skip unless inside the test run's private network namespace (fail instead with
    ``$ANYWOOL_REQUIRE_LAN`` set): multicast never leaves it."""
    reason = netns.lan_unavailable()
    if reason is None:
        return
    if os.environ.get("ANYWOOL_REQUIRE_LAN"):
        pytest.fail(f"$ANYWOOL_REQUIRE_LAN is set, but the LAN example cannot run: {reason}")
    pytest.skip(f"the LAN example needs a private network namespace: {reason}")


async def test_a_caller_finds_the_workers_a_lan_host_announces(
        tmp_path: Path, namespace: str, anyio_backend: str) -> None:
    require_lan()
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(16) + "\n")
    secret.chmod(0o600)
    common = ["--namespace", namespace, "--secret-file", str(secret), "--interface", "127.0.0.1",
              "--backend", anyio_backend]
    with anyio.fail_after(60):
        async with started(example("lan_hosts.py"), "serve", "--workers", "2", *common,
                           cwd=tmp_path) as host:
            lines = await host.lines_until("ready")
            assert lines[0].startswith(f"serving {namespace!r} on "), lines
            workers = {}
            for line in lines[1:]:
                _, address, _, pid = line.split()
                # Bound to every interface, announced at this "host's" routable address.
                assert Address.parse(address).host == netns.ROUTABLE, line
                workers[address] = int(pid)
            assert len(workers) == 2 and host.pid not in workers.values(), lines

            done = await run(example("lan_hosts.py"), "call", "--calls", "6", "--quorum", "2",
                             *common, cwd=tmp_path)
            assert done.returncode == 0, done.stdout + done.stderr
            calls = [re.fullmatch(r"(\d)² = (\d+) on host \S+, worker (\S+) pid (\d+)", line)
                     for line in done.stdout.splitlines()[:-1]]
            assert len(calls) == 6 and all(calls), done.stdout
            for match in calls:
                assert int(match[2]) == int(match[1]) ** 2  # type: ignore[index]
                assert workers[match[3]] == int(match[4])  # type: ignore[index]
            assert done.stdout.splitlines()[-1].startswith("6 calls answered by ")

            host.process.send_signal(signal.SIGTERM)
            assert await host.readline() == "stopping (SIGTERM)"
            assert await host.readline() == "stopped"
            assert await host.process.wait() == 0, host.stderr()
            assert not any(alive(pid) for pid in workers.values())


# -- test_with_anywool.py ------------------------------------------------------------------------


# What this adds to tests/unit/test_testing_plugin.py and the integration tests that use the
# plugin's fixtures under every Python: a project of its own, its pytest.ini, the plugin found
# through its entry point. CI runs it under 3.11 only.
@pytest.mark.once_per_ci
async def test_the_pytest_example_passes_in_a_project_of_its_own(
        tmp_path: Path, anyio_backend: str) -> None:
    # As in a user's project: the file at its root, the backends in its pytest configuration.
    shutil.copy(EXAMPLES / "test_with_anywool.py", tmp_path)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nanywool_backends = {anyio_backend}\n")
    done = await run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                     "test_with_anywool.py", cwd=tmp_path, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    # Five tests under the configured backend, and the one marked for trio under trio.
    assert re.search(r"^6 passed in ", done.stdout, re.MULTILINE), done.stdout
