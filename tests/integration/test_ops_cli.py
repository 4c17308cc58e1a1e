"""The operations commands (``anywool ls``, ``show``, ``watch``, ``reclaim``): the real command in
another interpreter, reading what real owners and publishers (this process, or children killed
with SIGKILL) left in the runtime directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from anywool.discovery.local import LocalDiscovery
from anywool.testing import owner_process, suspended

from ..helpers import leftover, owned, worker
from .children import REPO, Child, start, stop

pytestmark = pytest.mark.anyio

#: The keys of a worker document (show, watch).
WORKER_KEYS = {"uid", "address", "pid", "version", "tags", "secure", "extra", "lease",
               "publisher_alive"}
NAMESPACE_KEYS = {"entry", "key", "name", "state", "reclaimable", "owner_pid", "capacity",
                  "block_size", "changes", "worker_count", "leases", "error"}

# Announces argv[2] workers in namespace argv[1], as its owner (argv[3] == "owner") or as a
# publisher borrowing it, says "ready", and stays until its stdin closes.
ANNOUNCER = """
import os, sys, uuid, anyio
from anywool.discovery.local import LocalDiscovery
from anywool.metadata import WorkerMetadata

async def main(namespace, count, role):
    async def announce(publisher):
        for index in range(count):
            await publisher.publish("worker-added", WorkerMetadata(
                uuid.uuid4(), f"unix:/tmp/child-{index}.sock", os.getpid(), "child"))
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
    if role == "owner":
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            await announce(publisher)
    else:
        async with LocalDiscovery.Publisher(namespace) as publisher:
            await announce(publisher)

anyio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""


def _environment(runtime_dir: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("COLUMNS", None)  # off a terminal the commands choose their own width
    if runtime_dir is not None:
        env["ANYWOOL_RUNTIME_DIR"] = runtime_dir
    return env


def run(*args: str, runtime_dir: str | None = None) -> subprocess.CompletedProcess[str]:
    """``anywool ARGS`` to completion (for the synchronous tests)."""
    return subprocess.run([sys.executable, "-m", "anywool.cli", *args], capture_output=True,
                          text=True, timeout=30, cwd=REPO, env=_environment(runtime_dir))


async def anywool(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``anywool ARGS`` to completion, from an event loop."""
    return await anyio.run_process([sys.executable, "-m", "anywool.cli", *args], check=False,
                                   cwd=REPO, env=_environment())


async def document(*args: str) -> dict:
    """The one JSON document ``anywool ARGS --json`` prints (it must exit 0)."""
    result = await anywool(*args, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


async def human(*args: str) -> str:
    result = await anywool(*args)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    return result.stdout.decode()


@asynccontextmanager
async def announced(namespace: str, count: int, role: str) -> AsyncIterator[Child]:
    """An :data:`ANNOUNCER` child, ready, for the block; stopped (or reaped) afterwards."""
    child = await start(ANNOUNCER, namespace, str(count), role)
    try:
        assert await child.readline() == "ready"
        yield child
    finally:
        await stop([child])


# -- ls ------------------------------------------------------------------------------------------


def test_ls_of_an_empty_or_missing_runtime_directory_lists_nothing(runtime_dir: Path,
                                                                     tmp_path: Path) -> None:
    result = run("ls")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.strip() == f"no namespaces in {runtime_dir}"
    result = run("ls", "--json")
    assert json.loads(result.stdout) == {"runtime_dir": str(runtime_dir), "exists": True,
                                         "namespaces": [], "sockets": []}
    missing = tmp_path / "missing"
    result = run("ls", runtime_dir=str(missing))
    assert (result.returncode, result.stderr) == (0, "")
    assert "no runtime directory" in result.stdout and str(missing) in result.stdout
    assert not missing.exists()  # a reader never creates it


async def test_ls_and_show_a_live_owner_its_workers_and_a_sigkilled_publisher(
        namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace, reap_interval=3600) as owner, \
                owner.publisher as publisher:
            ours = [worker(tags={"gpu"}), worker()]
            for metadata in ours:
                await publisher.publish("worker-added", metadata)
            async with announced(namespace, 1, "publisher") as child:
                listed = await document("ls")
                (state,) = listed["namespaces"]
                assert set(state) == NAMESPACE_KEYS
                assert (state["name"], state["state"], state["reclaimable"]) == \
                    (namespace, "live", False)
                assert state["entry"] == os.path.basename(str(owner.path))
                assert (state["owner_pid"], state["capacity"], state["worker_count"]) == \
                    (os.getpid(), 128, 3)
                assert sorted((lease["workers"], lease["alive"]) for lease in state["leases"]) \
                    == [(1, True), (2, True)]
                table = await human("ls")
                row = next(line for line in table.splitlines() if namespace in line)
                assert "live" in row and "3 / 128" in row and "2 alive" in row

                shown = (await document("show", namespace))["namespace"]
                by_uid = {w["uid"]: w for w in shown["workers"]}
                assert all(set(w) == WORKER_KEYS for w in shown["workers"])
                mine = by_uid[str(ours[0].uid)]
                assert (mine["address"], mine["pid"], mine["tags"], mine["version"]) == \
                    (ours[0].address, os.getpid(), ["gpu"], "test")
                assert mine["publisher_alive"] is True
                (theirs,) = [w for w in shown["workers"] if w["pid"] == child.pid]
                assert theirs["publisher_alive"] is True and theirs["lease"] != mine["lease"]
                assert {w["lease"] for w in shown["workers"]} == \
                    {lease["id"] for lease in shown["leases"]}

                child.kill()
                await child.wait()
                # The owner reaps once an hour: the dead publisher's worker is still there.
                shown = (await document("show", namespace))["namespace"]
                states = {w["uid"]: w["publisher_alive"] for w in shown["workers"]}
                assert states == {str(ours[0].uid): True, str(ours[1].uid): True,
                                  theirs["uid"]: False}
                assert {lease["id"]: lease["alive"] for lease in shown["leases"]} == \
                    {mine["lease"]: True, theirs["lease"]: False}
                page = await human("show", namespace)
                assert f"{namespace}  live · owner pid {os.getpid()} · capacity 128" in page
                assert "3 workers · leases 1 alive, 1 dead" in page
                assert f"{theirs['lease'][:8]} dead" in page
                assert f"{mine['lease'][:8]} alive" in page


async def test_piped_tables_keep_each_worker_on_one_line(namespace: str) -> None:
    # Off a terminal rich would fold at 80 columns, splitting an address over lines that
    # grep and awk then read apart.
    address = "unix:/tmp/" + "d" * 120 + "/worker.sock"
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            metadata = worker(address, tags={"gpu", "fast"})
            await publisher.publish("worker-added", metadata)
            page = await human("show", namespace)
    (row,) = [line for line in page.splitlines() if metadata.uid.hex[:8] in line]
    assert address in row and str(os.getpid()) in row and "fast, gpu" in row


async def test_a_sigkilled_owner_is_listed_dead_and_reclaimed(namespace: str,
                                                               runtime_dir: Path) -> None:
    with anyio.fail_after(30):
        async with announced(namespace, 2, "owner") as child:
            child.kill()
            await child.wait()
            socket = leftover(runtime_dir, "w-")  # a killed worker's socket directory
            listed = await document("ls")
            (state,) = listed["namespaces"]
            assert (state["name"], state["state"], state["reclaimable"]) == \
                (namespace, "dead", True)
            assert (state["owner_pid"], state["worker_count"]) == (child.pid, 2)
            assert [lease["alive"] for lease in state["leases"]] == [False]
            assert listed["sockets"] == [{"entry": socket, "alive": False, "reclaimable": True}]
            table = await human("ls")
            assert "dead — reclaimable" in table
            assert "worker socket directories: 0 live, 1 dead (1 reclaimable)" in table

            reclaimed = await document("reclaim", namespace)
            assert reclaimed == {"runtime_dir": str(runtime_dir), "namespace": namespace,
                                 "state": "dead",
                                 "removed": [{"entry": state["entry"], "kind": "dead-namespace",
                                              "namespace": namespace}]}
            assert os.listdir(runtime_dir) == [socket]  # only that namespace's generation
            said = await human("reclaim")
            assert f"removed {socket} (worker-socket)" in said
            assert os.listdir(runtime_dir) == []
            assert "nothing to remove" in await human("reclaim")


async def test_reclaim_never_touches_a_live_owner_even_a_stopped_one(namespace: str,
                                                                     runtime_dir: Path) -> None:
    with anyio.fail_after(30):
        async with owner_process(namespace) as owner:
            (entry,) = os.listdir(runtime_dir)
            with suspended(owner.pid):
                reclaimed = await document("reclaim", namespace)
                assert (reclaimed["state"], reclaimed["removed"]) == ("live", [])
                said = await human("reclaim", namespace)
                assert f"{namespace} is live (owner pid {owner.pid}): left alone" in said
                assert (await document("reclaim"))["removed"] == []
                assert os.listdir(runtime_dir) == [entry]


def test_an_unknown_namespace_is_exit_1(namespace: str) -> None:
    for command in (["show", namespace], ["reclaim", namespace], ["watch", namespace],
                    ["show", namespace, "--json"]):
        result = run(*command)
        assert result.returncode == 1, command
        assert result.stdout == ""
        assert namespace in result.stderr and "Traceback" not in result.stderr


def test_python_dash_m_anywool_runs_the_same_command(runtime_dir: Path) -> None:
    def module(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "anywool", *args], capture_output=True,
                              text=True, timeout=30, cwd=REPO, env=_environment())

    result = module("ls", "--json")
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout) == json.loads(run("ls", "--json").stdout)
    result = module("no-such-command")
    assert result.returncode == 2
    assert "Usage: python -m anywool " in result.stderr


# -- watch ---------------------------------------------------------------------------------------


async def watching(*args: str, runtime_dir: str | None = None) -> Child:
    process = await anyio.open_process([sys.executable, "-m", "anywool.cli", "watch", *args],
                                       cwd=REPO, env=_environment(runtime_dir),
                                       stderr=subprocess.PIPE)
    return Child(process)


async def test_watch_json_follows_workers_until_sigint(namespace: str, runtime_dir: Path,
                                                        tmp_path: Path,
                                                        anyio_backend: str) -> None:
    first, second = worker(tags={"b", "a"}), worker()
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", first)
            # The option, not the environment, says where to look (for the subscription too).
            child = await watching(namespace, "--json", "--backend", anyio_backend,
                                   "--runtime-dir", str(runtime_dir),
                                   runtime_dir=str(tmp_path / "elsewhere"))
            try:
                line = json.loads(await child.readline())
                assert set(line) == {"type", "time", "worker"}
                assert set(line["worker"]) == WORKER_KEYS
                assert (line["type"], line["worker"]["uid"], line["worker"]["tags"]) == \
                    ("worker-added", str(first.uid), ["a", "b"])
                assert isinstance(line["time"], float)
                await publisher.publish("worker-added", second)
                line = json.loads(await child.readline())
                assert (line["type"], line["worker"]["uid"]) == ("worker-added", str(second.uid))
                await publisher.publish("worker-dropped", first)
                line = json.loads(await child.readline())
                assert (line["type"], line["worker"]["uid"]) == ("worker-dropped", str(first.uid))
                child.process.send_signal(signal.SIGINT)
                assert await child.wait() == 0
                assert await child.read_stderr() == b""
            finally:
                await stop([child])
    assert not (tmp_path / "elsewhere").exists()


async def test_watch_off_a_terminal_prints_a_line_per_event_until_sigterm(
        namespace: str, anyio_backend: str) -> None:
    metadata = worker(tags={"gpu"})
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", metadata)
            child = await watching(namespace, "--backend", anyio_backend)
            try:
                fields = (await child.readline()).split()
                assert fields[1:] == ["worker-added", str(metadata.uid), metadata.address,
                                      "pid", str(os.getpid()), "tags", "gpu"]
                child.process.send_signal(signal.SIGTERM)
                assert await child.wait() == 0
                assert await child.read_stderr() == b""
            finally:
                await stop([child])


@pytest.fixture
def watch_in_process():
    """``watch``'s module, for tests that run it in this process: the signal handlers it
    installs and the signals it noted are this process's, and are undone afterwards."""
    from anywool.cli import _watch_command

    saved = {number: signal.getsignal(number) for number in _watch_command._SIGNALS}
    try:
        yield _watch_command
    finally:
        _watch_command._noted.clear()
        for number, handler in saved.items():
            signal.signal(number, handler)


def test_once_the_watch_has_stopped_further_signals_are_ignored(
        namespace: str, anyio_backend: str, watch_in_process) -> None:
    # A second Ctrl-C or SIGTERM while the command exits must not kill it by that signal:
    # Python's shutdown restores the default handlers, except for ignored signals.
    from click.testing import CliRunner

    watch_in_process._noted.append(signal.SIGTERM)  # as if the first one came at once
    result = CliRunner().invoke(watch_in_process.watch, [namespace, "--json",
                                                         "--backend", anyio_backend])
    assert result.exit_code == 0, result.output
    assert all(signal.getsignal(number) is signal.SIG_IGN
               for number in watch_in_process._SIGNALS)


async def test_a_signal_ignored_when_the_watch_starts_stays_ignored(namespace: str,
                                                                   anyio_backend: str) -> None:
    # As in a shell's background job, started with SIGINT ignored: SIGINT does not stop it.
    ignoring = "import signal, runpy, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); " \
               "sys.argv[1:1] = ['watch']; runpy.run_module('anywool.cli', run_name='__main__')"
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker())
            process = await anyio.open_process(
                [sys.executable, "-c", ignoring, namespace, "--json", "--backend",
                 anyio_backend], cwd=REPO,
                env=_environment(), stderr=subprocess.PIPE)
            child = Child(process)
            try:
                assert json.loads(await child.readline())["type"] == "worker-added"
                process.send_signal(signal.SIGINT)
                later = worker()
                await publisher.publish("worker-added", later)
                line = json.loads(await child.readline())  # still following
                assert line["worker"]["uid"] == str(later.uid)
                process.send_signal(signal.SIGTERM)
                assert await child.wait() == 0
            finally:
                await stop([child])


async def test_watch_ends_when_its_reader_goes_even_in_a_quiet_namespace(
        namespace: str, anyio_backend: str) -> None:
    # `anywool watch NS | head -1`: nothing more is published after the first line, so no
    # write would ever fail; the watch must notice the reader is gone all the same.
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as owner, owner.publisher as publisher:
            await publisher.publish("worker-added", worker())
            # A plain pipe the test can close for real (a subprocess's stdout under asyncio
            # stays open in its transport).
            child = subprocess.Popen(
                [sys.executable, "-m", "anywool.cli", "watch", namespace, "--json",
                 "--backend", anyio_backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=REPO, env=_environment())
            try:
                assert child.stdout is not None and child.stderr is not None
                # Abandoned if the deadline passes: it holds only this pipe's reader, and ends
                # when the finally kills the child.
                line = await anyio.to_thread.run_sync(child.stdout.readline,
                                                      abandon_on_cancel=True)
                assert json.loads(line)["type"] == "worker-added"
                child.stdout.close()
                assert await anyio.to_thread.run_sync(child.wait, 20) == 0
                assert child.stderr.read() == b""
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
                child.stderr.close()


def test_a_signal_before_the_watch_follows_stops_it(namespace: str, anyio_backend: str,
                                                    watch_in_process) -> None:
    # A signal noted while the command starts (before the event loop's receiver is open) is
    # honoured as soon as it is: the watch ends at once, without reading the namespace.
    watch_in_process._noted.append(signal.SIGINT)
    view = watch_in_process._JsonLines()
    assert anyio.run(watch_in_process._follow, namespace, view, backend=anyio_backend) is None


def test_a_reader_that_stops_early_ends_the_command_quietly(namespace: str) -> None:
    with owned(namespace):
        read, write = os.pipe()
        os.close(read)  # nobody will ever read: the first write fails
        try:
            result = subprocess.run([sys.executable, "-m", "anywool.cli", "show", namespace],
                                    stdout=write, stderr=subprocess.PIPE, text=True,
                                    timeout=30, cwd=REPO, env=_environment())
        finally:
            os.close(write)
        assert (result.returncode, result.stderr) == (0, "")


def test_readers_leave_the_runtime_directory_as_they_find_it(runtime_dir: Path,
                                                             namespace: str) -> None:
    with owned(namespace):
        runtime_dir.chmod(0o750)  # readable by the group: the user's choice, not ours to undo
        try:
            for args in (["ls"], ["show", namespace], ["reclaim", namespace]):
                assert run(*args).returncode == 0
                assert runtime_dir.stat().st_mode & 0o777 == 0o750
        finally:
            runtime_dir.chmod(0o700)


def test_names_and_paths_are_shown_escaped_and_visible(runtime_dir: Path) -> None:
    with owned(""):
        listed = run("ls").stdout.splitlines()
        assert any(line.startswith("''") for line in listed), listed  # the empty name
    odd = str(runtime_dir / "a\nb\x1b[31mred")
    result = run("ls", "--runtime-dir", odd)
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and "\\x1b" in result.stdout
    assert "\n" not in result.stdout.rstrip("\n")


# -- usage ---------------------------------------------------------------------------------------


@pytest.fixture
def symlink(tmp_path: Path, runtime_dir: Path) -> str:
    path = tmp_path / "link"
    path.symlink_to(runtime_dir)
    return str(path)


@pytest.mark.parametrize("args, environment, message", [
    (["ls", "--bogus"], None, "No such option"),
    (["ls", "--runtime-dir", "relative/dir"], None, "'--runtime-dir': must be an absolute path"),
    (["show", "x", "--runtime-dir", "SYMLINK"], None, "'--runtime-dir': refusing"),
    (["reclaim"], "relative/dir", "ANYWOOL_RUNTIME_DIR must be an absolute path"),
    (["watch"], None, "Missing argument"),
    (["ls", "--runtime-dir", "FILE/x"], None, "'--runtime-dir': [Errno 20] Not a directory"),
    (["ls"], "FILE/x", "Not a directory"),
])
def test_usage_errors_are_exit_2(args: list[str], environment: str | None, message: str,
                                 symlink: str, tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.touch()

    def resolve(arg: str) -> str:
        return symlink if arg == "SYMLINK" else arg.replace("FILE", str(file))

    result = run(*map(resolve, args),
                 runtime_dir=None if environment is None else resolve(environment))
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_the_runtime_dir_option_overrides_the_environment(namespace: str, runtime_dir: Path,
                                                          tmp_path: Path) -> None:
    with owned(namespace):
        empty = tmp_path / "empty"
        empty.mkdir(mode=0o700)
        result = run("ls", "--json", "--runtime-dir", str(runtime_dir), runtime_dir=str(empty))
        assert [ns["name"] for ns in json.loads(result.stdout)["namespaces"]] == [namespace]
        result = run("show", namespace, "--runtime-dir", str(empty))
        assert result.returncode == 1 and str(empty) in result.stderr
