"""LocalWorker: spawn one worker process on this host, learn its address, stop and reap it.

The child is ``python -m anywool.worker`` started with :func:`anyio.open_process`, in our working
directory and with our ``sys.path``, so routines defined in our modules (and ``__main__``, which
cloudpickle sends by value) run there. Its stdin is a pipe we hold open for its whole life: a
stop request is a line on it, and if we die (even by SIGKILL) the pipe closes and the worker
stops by itself; it also watches our pid (``$ANYWOOL_WORKER_PARENT_PID``), and its lifeline
kills it if it does not stop (see :mod:`anywool.runtime.worker._lifeline`). So a worker never outlives
its parent.

What this module must never do: leave a process unreaped, or a socket file behind.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from anywool import _secret, _validate
from anywool._address import Address
from anywool._duration import seconds
from anywool._location import IMPORT_ROOT
from anywool._owner import SingleUse
from anywool._teardown import graceful_then_forceful
from anywool._tls import MutualTLS
from anywool._version import __version__
from anywool.errors import WorkerError
from anywool.metadata import WorkerMetadata
from anywool.runtime import _lifespan, _output, _socket_dir
from anywool.runtime.pool._template import ForkedProcess, Template, TemplateUnavailable
from anywool.runtime.wire import _auth
from anywool.runtime.wire._peer import PEER_GONE
from anywool.runtime.worker._contract import (
    LIFESPAN_ENV,
    MAX_CONCURRENCY,
    NAMESPACE_ENV,
    OUTPUT_LEVEL_ENV,
    PARENT_PID_ENV,
    RETIRING,
    SECRET_ENV,
    STARTUP_ERROR,
    STOP,
    STOP_TAIL,
    SYS_PATH_ENV,
    UID_ENV,
)

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._local_worker")

# After the grace period: how long SIGTERM, then SIGKILL, get to end the process (seconds).
_TERM_TIMEOUT = 3.0
# Beyond a stopping worker's grace and its STOP_TAIL: the exit of its interpreter and, for a
# worker forked from the template, the template reaping it and reporting its code. Idle, that
# is 0.05-0.2 s; on a loaded two-core machine (the suite under 3.13) it once passed 0.5 s, and
# a worker that was about to exit by itself got SIGTERM. The margin only delays the SIGTERM of
# a worker that is really stuck.
_STOP_MARGIN = 1.5
_KILL_TIMEOUT = 5.0


def current_backend() -> str:
    """The name of the AnyIO backend running the current task (``"asyncio"`` or ``"trio"``)."""
    try:
        import sniffio
    except ImportError:  # pragma: no cover - sniffio comes with trio; without trio it is asyncio
        trio = sys.modules.get("trio")
        if trio is not None and trio.lowlevel.in_trio_run():
            return "trio"
        return "asyncio"
    return sniffio.current_async_library()

def tcp_endpoint(host: object, secret: object, tls: object
                 ) -> tuple[Address | None, _auth.Credentials | None]:
    """The TCP address to bind (port 0) for ``host`` and the credentials (``None`` for a Unix
    socket, where credentials are still resolved if given, for the proxy's TCP workers).

    :raises TypeError: ``host`` is not a ``str``; ``secret`` or ``tls`` has the wrong type.
    :raises ValueError: ``host`` is not a host name or IP address, or TCP has no credentials.
    """
    credentials = _auth.Credentials.resolve(secret, tls)  # type: ignore[arg-type]
    if host is None:
        return None, credentials
    if not isinstance(host, str):
        raise TypeError(f"host must be a str (a host name or IP address), got {host!r}")
    if not host:
        raise ValueError("host must be a host name or IP address (\"0.0.0.0\" for every "
                         "interface), got ''")
    try:
        bind = Address.tcp(host, 0)
    except ValueError as exc:
        raise ValueError(f"host must be a host name or IP address, got {host!r}: {exc}") from None
    if credentials is None:
        raise ValueError(
            f"host={host!r} makes workers listen on TCP, where any peer could send code: pass "
            f"secret= (bytes or str, at least {_secret.MIN_LENGTH} bytes; or set "
            f"${_secret.ENV}) or tls=anywool.MutualTLS(certfile, keyfile, cafile=...)")
    return bind, credentials


#: The least ``max_memory`` (bytes): an interpreter alone takes more than half of it.
MIN_MAX_MEMORY = 1 << 20
#: The most ``max_calls``.
MAX_MAX_CALLS = 1 << 62


def check_recycling(max_calls: object, max_memory: object) -> tuple[int | None, int | None]:
    """``max_calls`` and ``max_memory`` checked (see :class:`LocalWorker`).

    :raises TypeError: one is not an ``int`` (or is a ``bool``).
    :raises ValueError: ``max_calls`` < 1, or ``max_memory`` < 1 MiB.
    """
    calls = None if max_calls is None else _validate.count("max_calls", max_calls,
                                                           upper=MAX_MAX_CALLS)
    memory = None if max_memory is None else _validate.count(
        "max_memory", max_memory, lower=MIN_MAX_MEMORY, upper=MAX_MAX_CALLS)
    return calls, memory


class LocalWorker(SingleUse):
    """A worker process on this host, alive for the duration of an ``async with`` block.

    :param backend: ``"asyncio"`` or ``"trio"``, the event loop the worker runs; ``None`` picks
        the backend of the task entering this context manager. ``"trio"`` needs the
        ``anywool[trio]`` extra.
    :param tags: labels published in the worker's metadata.
    :param extra: msgpack-serialisable values published in the worker's metadata.
    :param startup_timeout: seconds (> 0) allowed for the worker to report its address.
    :param shutdown_timeout: seconds the worker gets to drain its in-flight calls when stopped
        (``0``: cancel them at once); after that it gets SIGTERM, then SIGKILL.
    :param max_concurrency: the most calls the worker runs at once (``int`` ≥ 1; ``None``: no
        bound). A call beyond it is refused before it runs, and a proxy tries another worker
        or waits for room.
    :param host: listen on TCP at this address, on a port the system picks (``None``: a Unix
        socket in the runtime directory, for this user only). ``"0.0.0.0"`` or ``"::"`` binds
        every interface and announces a routable address of this host. TCP requires
        credentials.
    :param secret: the shared secret TCP peers authenticate with, ``bytes`` or ``str`` of at
        least 16 bytes (``None``: ``$ANYWOOL_SECRET``, if set). Handed to the worker in its
        environment, never on its command line.
    :param tls: mutual TLS for TCP peers (:class:`~anywool.MutualTLS`), instead of or besides
        the secret.
    :param namespace: the namespace the worker is announced in, which its spans name
        (``None``: none).
    :param output_level: the level from which the worker's root logger passes records (to
        callers that forward output: see :mod:`anywool.runtime._output`); ``None``: the
        worker's own (WARNING), for callers that forward nothing.
    :param lifespan: an async context manager factory (or ``"module:name"`` naming one) the
        worker enters before it takes calls and exits after its last one; routines reach what
        it yields as ``anywool.current_worker().state`` (see
        :mod:`anywool.runtime._lifespan`). Its entry counts in ``startup_timeout``; one that
        raises there fails the start with a :class:`~anywool.errors.WorkerError` saying why.
    :param max_calls: the worker retires after taking this many calls (``int`` ≥ 1;
        ``None``: never): it refuses new calls (its callers try another worker), finishes
        those it runs, and says so (:meth:`retiring`); whoever runs it replaces and stops it.
    :param max_memory: the worker retires, likewise, once its resident set passes this many
        bytes (``int`` ≥ 1 MiB; ``None``: never), looked at ten times a second.
    :raises ValueError: ``host`` is given without any credentials (the message says what to
        pass), an argument is out of range, or a ``lifespan`` string cannot be imported.
    :raises TypeError: an argument has the wrong type, or ``lifespan`` cannot be pickled.
    :raises ImportError: ``backend="trio"`` where trio is not installed (the message names
        ``pip install 'anywool[trio]'``).

    Entering raises :class:`~anywool.errors.WorkerError` when the process does not start or
    report its address within ``startup_timeout`` (the process is killed and reaped first), and
    ``RuntimeError`` on a second entry. A cancelled entry, even one cancelled while the process
    is being spawned, kills and reaps the process (and removes its socket) before the
    cancellation propagates. Exiting is :meth:`stop` with ``shutdown_timeout``: the
    drain may be cut short by the caller's cancellation, and then the process is terminated,
    killed if need be, and always reaped and its socket file removed, bounded in time; it never
    raises an ``Exception``.
    """

    def __init__(
        self,
        *,
        backend: str | None = None,
        tags: Iterable[str] = (),
        extra: Mapping[str, Any] | None = None,
        startup_timeout: float = 30.0,
        shutdown_timeout: float = 10.0,
        max_concurrency: int | None = None,
        host: str | None = None,
        secret: bytes | str | None = None,
        tls: MutualTLS | None = None,
        namespace: str | None = None,
        output_level: int | None = logging.NOTSET,
        lifespan: Callable[[], AbstractAsyncContextManager[Any]] | str | None = None,
        max_calls: int | None = None,
        max_memory: int | None = None,
    ) -> None:
        self._max_calls, self._max_memory = check_recycling(max_calls, max_memory)
        factory = _lifespan.check(lifespan, "lifespan")
        self._lifespan = None if factory is None else _lifespan.encode(factory, "lifespan")
        self._backend = _validate.backend(backend)
        self._namespace = namespace
        self._output_level = output_level
        self._uid = uuid.uuid4()  # made here: the worker learns it (for its spans)
        self._bind, self._credentials = tcp_endpoint(host, secret, tls)
        self._tags = _validate.tag_set("tags", tags)
        self._extra = dict(extra or {})
        self._startup_timeout = _validate.duration("startup_timeout", startup_timeout,
                                                   allow_zero=False)
        self._shutdown_timeout = _validate.duration("shutdown_timeout", shutdown_timeout,
                                                    allow_zero=True)
        self._max_concurrency = None if max_concurrency is None else _validate.count(
            "max_concurrency", max_concurrency, upper=MAX_CONCURRENCY)
        self._process: Process | ForkedProcess | None = None
        # A pool's warm template, which forks the worker (see _fork_from).
        self._template: Template | None = None
        self._stdout: BufferedByteReceiveStream | None = None  # after the address: notices
        self._metadata: WorkerMetadata | None = None
        self._home: Path | None = None

    @property
    def metadata(self) -> WorkerMetadata:
        """The worker's metadata (uid, address, pid, version, tags, extra).

        :raises RuntimeError: the worker has not started.
        """
        if self._metadata is None:
            raise RuntimeError("the LocalWorker has not been entered")
        return self._metadata

    @property
    def pid(self) -> int:
        return self.metadata.pid

    @property
    def address(self) -> str:
        return self.metadata.address

    def _fork_from(self, template: Template | None) -> None:
        """Have the worker forked from ``template`` (a pool's warm template, see
        :mod:`anywool.runtime.pool._template`) when it starts, if the template still runs and
        runs its backend; ``None``, or a template that cannot fork it: it starts as a process
        of its own. Call before entering. For the package (a pool's supervision), not part of
        the public API."""
        self._template = template

    async def __aenter__(self) -> LocalWorker:
        self._enter_once()
        backend = self._backend or current_backend()
        env = dict(os.environ)
        env[SYS_PATH_ENV] = json.dumps([p for p in sys.path if isinstance(p, str)])
        env[PARENT_PID_ENV] = str(os.getpid())  # its lifeline watches us (see _lifeline)
        env[UID_ENV] = str(self._uid)
        env[OUTPUT_LEVEL_ENV] = _output.encode_level(self._output_level)
        env.pop(NAMESPACE_ENV, None)
        env.pop(LIFESPAN_ENV, None)
        if self._lifespan is not None:
            env[LIFESPAN_ENV] = self._lifespan
        if self._namespace is not None and "\0" not in self._namespace:
            env[NAMESPACE_ENV] = self._namespace
        env["PYTHONPATH"] = os.pathsep.join(
            [IMPORT_ROOT, *filter(None, [env.get("PYTHONPATH")])]
        )
        command = [sys.executable, "-m", "anywool.worker", "--backend", backend]
        if self._bind is None:
            try:
                # Chosen here, so that whatever happens to the worker its directory can be
                # removed.
                self._home = _socket_dir.choose()
            except OSError as exc:
                raise WorkerError("unstarted", str(exc)) from exc
            command += ["--home", str(self._home)]
        else:
            command += ["--address", str(self._bind)]
        credentials = self._credentials
        if credentials is not None:
            env.pop(_secret.ENV, None)  # the worker takes exactly the pool's credentials
            if credentials.secret is not None:
                env[SECRET_ENV] = _secret.for_child(credentials.secret)
            if credentials.tls is not None:
                tls = credentials.tls
                command += ["--tls-cert", tls.certfile, "--tls-ca", tls.cafile]
                if tls.keyfile is not None:
                    command += ["--tls-key", tls.keyfile]
        if self._max_concurrency is not None:
            command += ["--max-concurrency", str(self._max_concurrency)]
        if self._max_calls is not None:
            command += ["--max-calls", str(self._max_calls)]
        if self._max_memory is not None:
            command += ["--max-memory", str(self._max_memory)]
        try:
            # A session of its own: a terminal's Ctrl-C (SIGINT to the whole foreground process
            # group) reaches the caller only, which cancels its calls and stops its workers;
            # reaching the workers too, it would make each drain and exit by itself, racing the
            # pool's own exit (which would see them exit and start replacements).
            # Shielded: a cancellation taken while the process is being set up would leave it
            # unrecorded, so unreaped (asyncio kills it there but does not wait for it).
            # Creating it is local and bounded; the cancellation is taken at the next
            # checkpoint, below, where the process is killed and reaped.
            process: Process | ForkedProcess | None = None
            with anyio.CancelScope(shield=True):
                process = await self._fork(command, env)
                if process is None:
                    process = await anyio.open_process(
                        command, stdin=-1, stdout=-1, stderr=None, cwd=os.getcwd(), env=env,
                        start_new_session=True)
        except OSError as exc:
            raise WorkerError("unstarted", f"could not start {command}: {exc}") from exc
        assert process is not None  # a shield is never cancelled: it swallows nothing
        self._process = process
        try:
            address = await self._read_address(process)
            self._metadata = WorkerMetadata(
                uid=self._uid,
                address=address,
                pid=process.pid,
                version=__version__,
                tags=self._tags,
                extra=self._extra,
                secure=self._bind is not None,
            )
        except BaseException:
            self._process = None
            with anyio.CancelScope(shield=True):
                await self._kill(process, term=False)
            raise
        return self

    async def _fork(self, command: list[str], env: dict[str, str]) -> ForkedProcess | None:
        """The worker forked from the pool's template, if there is one that can (``command``
        is ``python -m anywool.worker ARGS``); ``None``: start it as a process of its own."""
        template = self._template
        if template is None or template.ended or template.backend != command[4]:
            return None
        try:
            return await template.spawn(command[3:], env, os.getcwd())
        except TemplateUnavailable as exc:
            log.warning("the pool's template cannot fork workers (%s); starting them as "
                        "processes of their own", exc)
            return None

    async def _read_address(self, process: Process | ForkedProcess) -> str:
        assert process.stdout is not None
        reader = self._stdout = BufferedByteReceiveStream(process.stdout)
        try:
            with anyio.fail_after(self._startup_timeout):
                line = await reader.receive_until(b"\n", 4096)
        except TimeoutError:
            raise WorkerError(
                f"pid {process.pid}",
                f"did not report its address within {self._startup_timeout} seconds",
            ) from None
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.DelimiterNotFound):
            with anyio.move_on_after(1.0):
                await process.wait()
            raise WorkerError(
                f"pid {process.pid}",
                f"exited (code {process.returncode}) before reporting its address; see its stderr",
            ) from None
        text = line.decode(errors="replace").strip()
        if text.startswith(STARTUP_ERROR):
            with anyio.move_on_after(1.0):
                await process.wait()
            raise WorkerError(f"pid {process.pid}", text[len(STARTUP_ERROR):])
        try:
            return str(Address.parse(text))
        except ValueError as exc:
            raise WorkerError(f"pid {process.pid}", f"reported a malformed address: {exc}") \
                from None

    async def retiring(self) -> str | None:
        """Wait until the worker says it retires (its ``max_calls`` or ``max_memory``
        reached: it takes no new calls, finishes those it runs, and waits to be stopped); the
        reason, in words. ``None``: its process ended first, or it was stopped.

        :raises RuntimeError: the worker has not started.

        Cancellation: only the wait is cancelled. One waiter at a time.
        """
        while True:
            text = await self.notice()
            if text is None:
                return None
            if text.startswith(RETIRING):
                return text[len(RETIRING):]

    async def notice(self) -> str | None:
        """Wait for the worker's next notice, a line it writes to its parent after its address
        (``retiring <reason>``; to a pool that supervises it, see :meth:`tell`, ``recycle``,
        ``idle`` and ``call``: see :class:`~anywool.runtime.worker._server.Server`); ``None``: its
        process ended first, or it was stopped.

        :raises RuntimeError: the worker has not started.

        Cancellation: only the wait is cancelled (a line half read is kept). One waiter at a
        time (:meth:`retiring` included).
        """
        reader = self._stdout
        if reader is None:
            raise RuntimeError("the LocalWorker is not running")
        try:
            line = await reader.receive_until(b"\n", 4096)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound,
                anyio.ClosedResourceError, anyio.BrokenResourceError):
            return None
        return line.decode(errors="replace")

    async def tell(self, line: str) -> None:
        """Send the worker one control line (see :class:`~anywool.runtime.worker._server.Server`:
        ``supervised``, ``idle-timeout <seconds>``, ``report-call``), within a second; a
        worker that is gone, or does not read it within that, is not told (never raises an
        ``Exception``).

        Cancellation: the line may or may not have been sent.
        """
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            return
        await self._send_control(process, f"{line}\n")

    # One writer at a time on the worker's stdin (a stop request and a control line may race,
    # and trio refuses concurrent sends); made at first use, in the event loop.
    _stdin_lock: anyio.Lock | None = None

    async def _send_control(self, process: Process | ForkedProcess, line: str) -> None:
        """Write ``line`` to the worker's stdin within a second (what is not sent by then, or
        to a worker that is gone, is dropped)."""
        if process.stdin is None:
            return
        if self._stdin_lock is None:
            self._stdin_lock = anyio.Lock()
        try:
            with anyio.move_on_after(1.0):
                async with self._stdin_lock:
                    await process.stdin.send(line.encode())
        except PEER_GONE:
            pass  # already exiting

    async def drain(self) -> int:
        """Ask the worker to stop once its calls in flight have ended, however long they take
        (it refuses new ones meanwhile), and wait until it exits; its exit code. A later
        :meth:`stop` bounds that drain by its own ``grace``, and reaps the process.

        :raises RuntimeError: the worker has not started, or was already stopped and reaped.

        Cancellation: only the wait is cancelled; the worker goes on draining.
        """
        process = self._process
        if process is None:
            raise RuntimeError("the LocalWorker is not running")
        if process.returncode is None:
            await self._request_stop(process, -1.0)
        return await process.wait()

    async def wait(self) -> int:
        """Wait until the worker process exits, however it ends, and return its exit code.

        :raises RuntimeError: the worker has not started, or was already stopped and reaped.

        Cancellation: only the wait is cancelled; the process is unaffected.
        """
        process = self._process
        if process is None:
            raise RuntimeError("the LocalWorker is not running")
        return await process.wait()

    def kill(self) -> None:
        """Send the worker SIGKILL now, if it runs (its exit, :meth:`stop` or leaving the
        ``async with`` block still reap it and remove its socket). Never raises."""
        process = self._process
        if process is not None and process.returncode is None:
            try:
                process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop(self._shutdown_timeout)

    async def stop(self, grace: float) -> None:
        """Stop the worker and reap it; a no-op once it was stopped.

        First the stop request: the worker refuses new calls and drains the ones in flight for
        ``grace`` seconds (``0``: cancels them at once). This part waits on the worker and runs
        in the caller's cancel scopes: cancelling it (or an enclosing deadline) cuts the drain
        short. Then, shielded and whatever happened before: SIGTERM (the worker cancels its
        calls; 3 s), SIGKILL (5 s), reaping, and removal of the socket file.

        :param grace: seconds (≥ 0) the worker may drain its in-flight calls.

        Never raises an ``Exception`` (failures are logged); re-raises the caller's cancellation
        after the process is reaped.
        """
        process, self._process = self._process, None
        if process is None:
            return

        async def drain() -> None:
            if process.returncode is None:
                await self._request_stop(process, grace)
                await process.wait()

        async def kill() -> None:
            await self._kill(process)

        await graceful_then_forceful(
            drain, kill, timeout=grace + STOP_TAIL + _STOP_MARGIN,
            what=f"stopping worker pid {process.pid}",
            log=log, forceful_timeout=_TERM_TIMEOUT + _KILL_TIMEOUT + 2.0,
        )

    async def _kill(self, process: Process | ForkedProcess, *, term: bool = True) -> None:
        """SIGTERM (unless ``term`` is false), then SIGKILL, until reaped; remove the socket."""
        try:
            for sig, timeout in ((signal.SIGTERM, _TERM_TIMEOUT), (signal.SIGKILL, _KILL_TIMEOUT)):
                if process.returncode is not None:
                    break
                if sig == signal.SIGTERM and not term:
                    continue
                try:
                    process.send_signal(sig)
                except ProcessLookupError:
                    pass
                with anyio.move_on_after(timeout):
                    await process.wait()
            if process.returncode is None:
                log.error("worker pid %s survived SIGKILL for %s", process.pid,
                          seconds(_KILL_TIMEOUT))
        finally:
            with anyio.move_on_after(1.0):
                await process.aclose()
            self._remove_socket()

    async def _request_stop(self, process: Process | ForkedProcess, grace: float) -> None:
        await self._send_control(process, f"{STOP} {grace!r}\n")

    def _remove_socket(self) -> None:
        # A worker that was killed could not remove its socket; its directory is ours to clean
        # once it is reaped (we chose it, so we know it even if it never reported an address).
        if self._home is not None:
            _socket_dir.remove(self._home)
