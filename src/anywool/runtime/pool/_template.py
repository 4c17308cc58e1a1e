"""The warm template, the pool's end: a process a :class:`~anywool.WorkerPool` owns, from which
it forks workers.

A worker started as ``python -m anywool.worker`` pays for an interpreter and its imports
(anyio, the backend, the worker's machinery: most of its start) every time; a pool that starts
many, replaces them or recycles them pays it again and again. The template pays once: it
starts as ``python -m anywool.runtime._template BACKEND``, imports what a worker on that
backend runs, and then forks one child per request. The child becomes the worker
(:func:`anywool.runtime.worker._main.main`) with the request's arguments, environment and working
directory, in a session of its own: the worker ``python -m anywool.worker`` would have been,
without the start-up.

Forking is safe here because the template never starts a thread or an event loop (forking the
pool's own process, with its threads and its loop, is not).

Three modules, one a process: this one runs in the pool's process (:class:`Template`, the
:class:`ForkedProcess` each fork gives, the pipes to it); the template's process runs
:mod:`anywool.runtime.pool._template_process`, and neither imports the other; the frames they
exchange, and their codec, are :mod:`anywool.runtime.pool._template_frames`, below both.

Lifetimes. The pool kills the template once its workers have stopped; at end-of-file on its
socket (the pool died) the template exits by itself. Its
workers do not depend on it: their lifeline watches the pool through a pidfd the template
opened on it and they inherit (:mod:`anywool.runtime.worker._lifeline`), and their stdin is the
pool's pipe, so a pool that dies takes them along. The pool signals them through their pidfds
(never another process, whoever reaps them) and learns their exit codes from the template. A
worker that outlives the template, or whose end a stopped or wedged template does not say, is
seen to end on its pidfd; its code is then unknown (:data:`UNKNOWN_CODE`).

Needs pidfds (Linux 5.3+); without them a pool starts its workers as processes of their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel

from anywool._location import IMPORT_ROOT
from anywool.runtime.pool._template_frames import Frames, ancillary_space, encode, rights

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

# Named as before the runtime was split by side: users configure logging by this name.
log = logging.getLogger("anywool.runtime._template")

#: What the pool's end reports as the exit code of a worker that outlived the template (it
#: ended, but nobody could tell how).
UNKNOWN_CODE = 255
# How long the pool waits for a fork (seconds): a template that takes longer is wedged.
_SPAWN_TIMEOUT = 5.0
# Once a forked worker's pidfd says it ended: how long the template has to say its code
# (seconds); a template that does not (stopped, wedged) leaves it unknown.
_CODE_TIMEOUT = 2.0


class TemplateUnavailable(Exception):
    """The template cannot fork a worker (it failed to start, or ended): start it directly."""


class _PipeEnd:
    """Our end of a pipe to a worker (non-blocking from here on), closed once."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd: int | None = fd

    async def aclose(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            anyio.notify_closing(fd)  # a task waiting on it gets ClosedResourceError
            os.close(fd)
        await anyio.lowlevel.checkpoint()


class _PipeSend(_PipeEnd, anyio.abc.ByteSendStream):
    """Our end of a worker's stdin (a pipe's write end)."""

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            fd = self._fd
            if fd is None:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                await anyio.wait_writable(fd)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise anyio.BrokenResourceError from exc
        await anyio.lowlevel.checkpoint_if_cancelled()

    async def send_eof(self) -> None:
        await self.aclose()


class _PipeReceive(_PipeEnd, anyio.abc.ByteReceiveStream):
    """Our end of a worker's stdout (a pipe's read end)."""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            fd = self._fd
            if fd is None:
                raise anyio.ClosedResourceError
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            if not data:
                raise anyio.EndOfStream
            await anyio.lowlevel.checkpoint_if_cancelled()
            return data


class ForkedProcess:
    """A worker the template forked, as :class:`LocalWorker` uses an :class:`anyio.abc.Process`:
    ``pid``, ``returncode``, ``stdin``, ``stdout``, :meth:`wait`, :meth:`send_signal`,
    :meth:`aclose`. Signals go through a pidfd: never to another process, even once the
    template has reaped this one."""

    stderr = None

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = _PipeSend(stdin)
        self.stdout = _PipeReceive(stdout)
        self._pidfd: int | None = pidfd
        self._ended = anyio.Event()

    def _exited(self, code: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            self.returncode = code
            pidfd, self._pidfd = self._pidfd, None
            if pidfd is not None:
                anyio.notify_closing(pidfd)  # _watch may be waiting on it
                os.close(pidfd)
            self._ended.set()

    async def _watch(self) -> None:
        """Wait for the end on the pidfd, then for the template to say the code, within
        ``_CODE_TIMEOUT``: a template that has ended, or is stopped, or wedged, reaps nothing
        and says nothing, and the end alone is known (the code is then unknown)."""
        pidfd = self._pidfd
        if pidfd is not None:
            try:
                await anyio.wait_readable(pidfd)
            except anyio.ClosedResourceError:
                return  # its code was said meanwhile
            with anyio.move_on_after(_CODE_TIMEOUT):
                await self._ended.wait()
            self._exited(UNKNOWN_CODE)

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """:raises ProcessLookupError: the process has ended."""
        pidfd = self._pidfd
        if pidfd is None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.stdin.aclose()
            await self.stdout.aclose()
        await self.wait()


class Template:
    """The pool's template process (see the module's description), for ``async with``.

    Entering starts it and waits until it is warm, within ``startup_timeout`` seconds;
    :raises TemplateUnavailable: it could not start, or cannot fork here. Exiting kills it and
    reaps it; workers still running are killed too (they are the pool's, and the pool has
    stopped them by then). Cancelled, the exit still does all that, shielded and bounded.
    """

    def __init__(self, backend: str, startup_timeout: float) -> None:
        self.backend = backend
        self._startup_timeout = startup_timeout
        self._socket: socket.socket | None = None
        self._process: anyio.abc.Process | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._replies: tuple[MemoryObjectSendStream[dict[str, Any] | ForkedProcess],
                             MemoryObjectReceiveStream[dict[str, Any] | ForkedProcess]] | None \
            = None
        # Our ends of the pipes of the fork under way: the reader gives them to its process.
        self._pending: tuple[int, int] | None = None
        self._live: dict[int, ForkedProcess] = {}
        # The scopes shielding this template's tasks (see _shielded): cancelled by _close only.
        self._shields: set[anyio.CancelScope] = set()
        self.ended = False

    async def __aenter__(self) -> Template:
        if not (hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")):
            raise TemplateUnavailable("no pidfds here")
        # As LocalWorker starts a worker: this anywool importable, whatever sys.path says.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([IMPORT_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with anyio.CancelScope(shield=True):  # recorded before a cancellation is taken
                self._process = await anyio.open_process(
                    [sys.executable, "-m", "anywool.runtime._template", self.backend],
                    stdin=theirs.fileno(), stdout=None, stderr=None, cwd=os.getcwd(), env=env,
                    start_new_session=True)
        except OSError as exc:
            ours.close()
            raise TemplateUnavailable(f"could not start: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self._socket = ours
        send, receive = anyio.create_memory_object_stream[dict[str, Any] | ForkedProcess](1)
        self._replies = send, receive
        tasks = self._tasks = anyio.create_task_group()
        await tasks.__aenter__()
        try:
            tasks.start_soon(self._shielded, self._read)
            with anyio.fail_after(self._startup_timeout):
                message = await receive.receive()
            if isinstance(message, ForkedProcess) or "ready" not in message:
                raise TemplateUnavailable(str(message if isinstance(message, ForkedProcess)
                                              else message.get("failed", message)))
        except BaseException as exc:
            await self._close()
            if isinstance(exc, TimeoutError):
                raise TemplateUnavailable(
                    f"not warm within {self._startup_timeout} seconds") from None
            if isinstance(exc, anyio.EndOfStream):
                raise TemplateUnavailable("exited before it was warm") from None
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close()

    async def _shielded(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run ``task`` shielded from the caller's cancellation (the pool's, which cancels
        the task group these tasks run in): what they hear (how workers end) is what the pool's
        exit waits for; :meth:`_close` ends them."""
        with anyio.CancelScope(shield=True) as scope:
            self._shields.add(scope)
            try:
                await task()
            finally:
                self._shields.discard(scope)

    async def _close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._end()
        for scope in list(self._shields):
            scope.cancel()
        tasks, self._tasks = self._tasks, None
        if tasks is not None:  # exited where it was entered: outside the shield
            tasks.cancel_scope.cancel()
            await tasks.__aexit__(None, None, None)
        for child in list(self._live.values()):
            child._exited(UNKNOWN_CODE)  # survived SIGKILL for 5 s: nobody will know more
        self._live.clear()

    async def _end(self) -> None:
        """Close the socket, reap the template, kill and wait for what it leaves (bounded)."""
        ours, self._socket = self._socket, None
        if ours is not None:
            anyio.notify_closing(ours)
            ours.close()
        process = self._process
        if process is not None:
            # Killed, not asked: it holds nothing to flush or remove (its workers, stopped by
            # now, are reaped or watched on their pidfds), and an interpreter's orderly exit,
            # or a warm-up that has not reached its loop, would only lengthen the pool's exit.
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            with anyio.move_on_after(5.0):
                await process.wait()
            with anyio.move_on_after(1.0):
                await process.aclose()
        for child in list(self._live.values()):  # none, unless a stop failed: nothing outlives
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        if self._live:
            with anyio.move_on_after(5.0):
                for child in list(self._live.values()):
                    await child.wait()
        if self._replies is not None:
            for stream in self._replies:
                stream.close()

    async def _read(self) -> None:
        """Route what the template says: a fork's reply to the request under way (the process
        recorded here, before any later frame, its exit say, is read), exits to their processes.
        Each process is also watched on its pidfd (:meth:`ForkedProcess._watch`): its end is
        seen even when the template says nothing (it died, or is stopped)."""
        frames = Frames()
        assert self._replies is not None
        replies = self._replies[0]
        warm = False
        try:
            while (ours := self._socket) is not None:
                try:
                    data, ancillary, _, _ = ours.recvmsg(1 << 16, ancillary_space())
                except BlockingIOError:
                    try:
                        await anyio.wait_readable(ours)
                    except anyio.ClosedResourceError:
                        break  # closed by _close
                    continue
                except OSError:
                    break
                frames.feed(data, ancillary)
                if not data:
                    break
                while (frame := frames.next()) is not None:
                    message, fds = frame
                    if "exited" in message:
                        child = self._live.pop(message["exited"], None)
                        if child is not None:
                            child._exited(int(message["code"]))
                        continue
                    reply: dict[str, Any] | ForkedProcess = message
                    pending, self._pending = self._pending, None
                    if pending is None and warm:  # a late answer nobody waits for: never block
                        for fd in fds:
                            os.close(fd)
                        continue
                    warm = True  # (the first reply: the entry's)
                    if "forked" in message and len(fds) == 1 and pending is not None:
                        reply = ForkedProcess(int(message["forked"]), fds[0], *pending)
                        self._live[reply.pid] = reply
                        assert self._tasks is not None  # this task runs in them
                        self._tasks.start_soon(self._shielded, reply._watch)
                    else:
                        for fd in fds:
                            os.close(fd)
                        if pending is not None:
                            self._pending = pending  # still the spawner's to close
                    await replies.send(reply)
        except (ValueError, TypeError, KeyError) as exc:
            log.error("the pool's template said something that is not its protocol: %r", exc)
        finally:
            frames.close()
            self.ended = True
            replies.close()

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str
                    ) -> ForkedProcess:
        """Fork a worker running ``python -m anywool.worker`` ``argv``, with ``env`` and ``cwd``.

        Call it shielded (a process forked but not recorded would be nobody's); bounded by 5 s.

        :raises TemplateUnavailable: the template has ended, or did not fork.
        """
        if self.ended or self._socket is None or self._replies is None:
            raise TemplateUnavailable("it has ended")
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            with anyio.fail_after(_SPAWN_TIMEOUT):
                async with self._lock:
                    if self.ended:  # while we waited for the lock
                        raise TemplateUnavailable("it has ended")
                    self._pending = (stdin_w, stdout_r)
                    await self._send({"argv": list(argv), "env": dict(env), "cwd": cwd, "fds": 3},
                                     [stdin_r, stdout_w, 2])
                    try:
                        reply = await self._replies[1].receive()
                    except anyio.EndOfStream:
                        raise TemplateUnavailable("it has ended") from None
            if isinstance(reply, ForkedProcess):
                return reply
            raise TemplateUnavailable(str(reply.get("failed", reply)))
        except TimeoutError:
            self._abandon()
            raise TemplateUnavailable(f"no answer within {_SPAWN_TIMEOUT} seconds") from None
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
            pending, self._pending = self._pending, None
            for fd in pending or ():  # not taken by a process
                os.close(fd)

    def _abandon(self) -> None:
        """Wedged (stopped, or too slow): no more requests, and the template killed, so that
        none is answered late: the late fork would be a worker nobody runs, started with the
        arguments (the socket directory too) of the one started instead. The workers it forked
        are watched on their pidfds; :meth:`_end` reaps it."""
        self.ended = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def _send(self, message: dict[str, Any], fds: Sequence[int]) -> None:
        ours = self._socket
        if ours is None:
            raise TemplateUnavailable("it has ended")
        data = memoryview(encode(message))
        ancillary = rights(fds)
        while data:
            try:
                sent = ours.sendmsg([data], ancillary)
            except BlockingIOError:
                await anyio.wait_writable(ours)
                continue
            except OSError as exc:
                self.ended = True
                raise TemplateUnavailable(f"it has ended: {exc}") from None
            data, ancillary = data[sent:], []
