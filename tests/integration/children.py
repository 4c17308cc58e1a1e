"""Real interpreters for cross-process tests: started together, read line by line, killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
from anyio.abc import Process

REPO = Path(__file__).resolve().parents[2]


class Child:
    """A ``python -c`` child whose stdout is read as lines; stdin kept open as its lifeline."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.detached_pid: int | None = None
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.detached_pid if self.detached_pid is not None else self.process.pid

    async def wait_eof(self) -> None:
        """Read stdout until every holder of it (the child and its children) has exited."""
        assert self.process.stdout is not None
        try:
            while True:
                await self.process.stdout.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def readline(self) -> str:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    def kill(self, group: bool = False) -> None:
        if group:
            os.killpg(self.process.pid, signal.SIGKILL)
        else:
            self.process.kill()

    async def wait(self) -> int:
        return await self.process.wait()

    async def read_stderr(self) -> bytes:
        """Everything the child wrote to stderr (call after it exited; needs capture_stderr)."""
        assert self.process.stderr is not None
        data = b""
        try:
            while True:
                data += await self.process.stderr.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return data


LAUNCHER = """
import subprocess, sys
# Start the real child in a new session and leave at once: it is re-parented away from the
# test process (so it is no descendant of it) while keeping our stdin and stdout pipes.
subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], start_new_session=True)
"""


async def start_detached(code: str, *args: str) -> Child:
    """Like :func:`start`, but the child is not a descendant of this process.

    Its first stdout line must be its pid; :attr:`Child.pid` is set from it.
    """
    launcher = await start(LAUNCHER, code, *args)
    await launcher.wait()
    child = Child(launcher.process)
    child.detached_pid = int(await child.readline())
    return child


async def start(code: str, *args: str, new_group: bool = False,
                capture_stderr: bool = False) -> Child:
    """Start ``python -c code args...`` in the repository with this test's environment."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    process = await anyio.open_process(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE if capture_stderr else None,
        start_new_session=new_group,
    )
    return Child(process)


async def stop(children: list[Child]) -> None:
    """Close every child's stdin and reap it, killing it if it lingers (shielded)."""
    with anyio.CancelScope(shield=True):
        for child in children:
            try:
                await child.close_stdin()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        for child in children:
            if child.detached_pid is not None:
                with anyio.move_on_after(10):
                    await child.wait_eof()
                try:
                    os.kill(child.detached_pid, signal.SIGKILL)  # only if it lingered
                except ProcessLookupError:
                    pass
            with anyio.move_on_after(10):
                await child.wait()
            if child.process.returncode is None:
                child.kill()
                await child.wait()
            await child.process.aclose()


# Holds flock(LOCK_EX) on the file named by argv[1] until its stdin closes.
LOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


async def hold_registry_lock(discovery: object) -> Child:
    """A child process holding the registry lock of an entered ``LocalDiscovery`` until
    :func:`stop`."""
    path = getattr(discovery, "path", None)
    assert path is not None, "the discovery must be entered"
    child = await start(LOCK_HOLDER, os.path.join(str(path), "registry"))
    assert await child.readline() == "locked"
    return child
