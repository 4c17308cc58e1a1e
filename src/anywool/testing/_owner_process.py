"""``owner_process``: a namespace owner in another interpreter, for cross-process tests.

The child (:mod:`anywool.testing._owner_main`) claims the namespace and optionally spawns
workers into it; the parent starts it, waits for it to report ready, hands the test a handle,
and at the end of the block stops it politely, then by force, and always reaps it. The child
takes this process's environment, so it uses the same runtime directory.

What this module must never do: leave the child running or unreaped, or block the event loop
on it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import IO

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

log = logging.getLogger("anywool.testing")

_MAX_SPAWN = 1024  # anywool.runtime.pool._pool.MAX_SPAWN, without importing the runtime
_KILL_TIMEOUT = 5.0  # seconds SIGKILL gets to end the child


class OwnerProcess:
    """A running :func:`owner_process` child.

    :ivar namespace: the namespace it owns.
    :ivar pid: its process id.
    :ivar worker_pids: the pids of the workers it spawned and published, as they were when it
        reported ready (its children; empty with ``spawn=0``).
    """

    def __init__(self, namespace: str, process: Process, worker_pids: tuple[int, ...]) -> None:
        self.namespace = namespace
        self.pid = process.pid
        self.worker_pids = worker_pids
        self._process = process

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited and been waited for (``-N``: killed by signal
        N), else ``None``."""
        return self._process.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the child (default ``SIGKILL``: it dies at once and leaves its
        namespace for the next claim to sweep). A no-op once it has been waited for."""
        if self._process.returncode is None:
            with suppress(ProcessLookupError):
                self._process.send_signal(signal.Signals(sig))

    def terminate(self) -> None:
        """Ask the child to exit now (SIGTERM): it leaves its scopes as at the end of the
        block, removing the namespace's files and stopping its workers."""
        self.kill(signal.SIGTERM)

    async def wait(self) -> int:
        """Wait until the child exits and return its exit status (see :attr:`returncode`).

        Cancellation: only the wait is cancelled; the child is unaffected.
        """
        return await self._process.wait()

    def __repr__(self) -> str:
        return f"<OwnerProcess pid={self.pid} namespace={self.namespace!r}>"


def _check(namespace: object, spawn: object, backend: object, env: Mapping[str, str] | None,
           ready_timeout: object, stop_timeout: object) -> None:
    from anywool import _validate  # here: the plugin's import loads nothing of anywool

    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {namespace!r}")
    _validate.count("spawn", spawn, lower=0, upper=_MAX_SPAWN)
    if backend not in ("asyncio", "trio"):
        raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                   for k, v in env.items()):
        raise TypeError("env must map str to str")
    _validate.duration("ready_timeout", ready_timeout, allow_zero=False)
    _validate.duration("stop_timeout", stop_timeout, allow_zero=True)


def _child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    from anywool._location import IMPORT_ROOT  # here: importing the plugin imports no more

    child = {**os.environ, **(env or {})}
    # The anywool this process runs, also when it runs from a source tree.
    child["PYTHONPATH"] = os.pathsep.join([IMPORT_ROOT,
                                           *filter(None, [child.get("PYTHONPATH")])])
    return child


def _stderr_text(stderr: IO[bytes]) -> str:
    # pread leaves the offset the child shares with us alone: its workers may still write.
    size = os.fstat(stderr.fileno()).st_size
    return os.pread(stderr.fileno(), size, 0).decode(errors="replace") if size else ""


def _rebuild(message: dict[str, object]) -> BaseException:
    """The anywool error the child reported, rebuilt from its fields (errors round-trip
    through ``cls(*args)``); a ``RuntimeError`` naming it if that fails."""
    from anywool import errors

    name, args = message.get("error"), message.get("args")
    cls = getattr(errors, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, errors.WoolError) and isinstance(args, list):
        try:
            return cls(*args)
        except Exception:
            pass
    return RuntimeError(f"the owner process failed: {name} {args!r}")


async def _ready(namespace: str, process: Process, stderr: IO[bytes],
                 timeout: float) -> OwnerProcess:
    assert process.stdout is not None
    what = f"the owner process of {namespace!r} (pid {process.pid})"
    reader = BufferedByteReceiveStream(process.stdout)
    try:
        with anyio.fail_after(timeout):
            line = await reader.receive_until(b"\n", 1 << 20)
    except TimeoutError:
        raise TimeoutError(f"{what} did not report ready within {timeout} s") from None
    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
        with anyio.move_on_after(_KILL_TIMEOUT):
            await process.wait()
        raise RuntimeError(f"{what} exited (status {process.returncode}) before it was ready; "
                           f"its stderr:\n{_stderr_text(stderr)}") from None
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise RuntimeError(f"{what} printed {line[:200]!r} instead of reporting ready")
    if "error" in message:
        raise _rebuild(message)
    return OwnerProcess(namespace, process, tuple(message["workers"]))


async def _stop(process: Process, what: str, timeout: float) -> None:
    """Close the child's stdin and wait up to ``timeout`` s; then SIGKILL it; always reap."""
    from anywool._teardown import graceful_then_forceful

    async def politely() -> None:
        if process.stdin is not None:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await process.stdin.aclose()
        await process.wait()

    async def forcefully() -> None:
        if process.returncode is None:
            with suppress(ProcessLookupError):
                process.kill()
            with anyio.move_on_after(_KILL_TIMEOUT):
                await process.wait()
            if process.returncode is None:
                from anywool._duration import seconds  # here: importing the plugin costs nothing

                log.error("%s survived SIGKILL for %s", what, seconds(_KILL_TIMEOUT))
        with suppress(Exception):
            await process.aclose()

    await graceful_then_forceful(politely, forcefully, timeout=timeout, what=f"stopping {what}",
                                 log=log, forceful_timeout=_KILL_TIMEOUT + 2.0)


@asynccontextmanager
async def owner_process(
    namespace: str,
    *,
    spawn: int = 0,
    backend: str = "asyncio",
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 30.0,
    stop_timeout: float = 10.0,
) -> AsyncIterator[OwnerProcess]:
    """Own ``namespace`` from another interpreter for the duration of an ``async with`` block.

    The child runs ``async with LocalDiscovery(namespace)`` and, with ``spawn`` > 0, a
    ``WorkerPool(spawn=spawn, discovery=...)`` that publishes its workers there, on
    ``backend``. It inherits this process's environment (so the same runtime directory) plus
    ``env``. Entry returns an :class:`OwnerProcess` once the child owns the namespace and its
    workers are published.

    :param namespace: any string.
    :param spawn: workers (0 to 1024) the child spawns and publishes.
    :param backend: ``"asyncio"`` or ``"trio"``, the child's event loop (and its workers').
    :param env: variables to add to, or override in, the child's environment.
    :param ready_timeout: seconds (> 0) the child gets to report ready.
    :param stop_timeout: seconds (≥ 0) the child gets to exit politely at the end.
    :raises TypeError: an argument has the wrong type (nothing is started).
    :raises ValueError: an argument is out of range (nothing is started).
    :raises DiscoveryNamespaceInUse: another process owns the namespace (the child's error,
        rebuilt here; likewise any other anywool error raised while it starts).
    :raises RuntimeError: the child exited before it was ready; the message holds its stderr.
    :raises TimeoutError: it did not report ready within ``ready_timeout`` seconds.

    On exit, also when the block raises or is cancelled: the child's stdin is closed, which
    makes it leave its scopes (removing the namespace's files, stopping its workers) and exit;
    after ``stop_timeout`` seconds it is killed (SIGKILL). It is always reaped, and whatever it
    wrote to stderr is copied to this process's stderr. This teardown is shielded from
    cancellation and takes at most ``stop_timeout`` plus about 5 seconds. Since the child also
    exits when its stdin closes because this process died, it never outlives the test run.
    """
    _check(namespace, spawn, backend, env, ready_timeout, stop_timeout)
    command = [sys.executable, "-m", "anywool.testing._owner_main",
               json.dumps(namespace), str(spawn), backend]
    with tempfile.TemporaryFile() as stderr:
        process = await anyio.open_process(command, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=stderr,
                                           cwd=os.getcwd(), env=_child_env(env))
        what = f"the owner process of {namespace!r} (pid {process.pid})"
        try:
            yield await _ready(namespace, process, stderr, ready_timeout)
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, what, stop_timeout)
            text = _stderr_text(stderr)
            if text:
                sys.stderr.write(f"--- stderr of {what} ---\n{text}")
