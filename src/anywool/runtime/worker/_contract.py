"""The contract between a worker process and its parent: every name, line and bound they share.

Both ends import their words from here, so that they cannot drift apart: the worker
(:mod:`anywool.runtime.worker._main`, :mod:`~anywool.runtime.worker._server`,
:mod:`~anywool.runtime.worker._nested`), and its parent, a :class:`~anywool.LocalWorker`
(so a pool, ``anywool worker``, and what the command line and the pytest plugin start), or the
pool's warm template for the workers it forks (:mod:`anywool.runtime.pool._template_process`).
What this module must never do: import anything of the worker's machinery, or anything at all
but the standard library. A pool's process imports it, and nothing else of
:mod:`anywool.runtime.worker`, to talk to its workers.

The protocol, in the order of a worker's life.

**Start.** The parent runs ``python -m anywool.worker --backend asyncio|trio`` with ``--home
DIR`` (a socket directory it chose, see :mod:`anywool.runtime._socket_dir`) or ``--address``,
and the options of :func:`~anywool.runtime.worker._main.main` (its ``--help``); or the template
forks a child that runs the same with the same arguments. The worker's stdin is a pipe the
parent holds for the worker's whole life (the *control* pipe), its stdout another (the
*notices*). Its environment is the parent's, plus (each taken out of the worker's environment
at its start, so that its routines' children do not inherit it):

* :data:`SYS_PATH_ENV`: the parent's ``sys.path``, a JSON list, put first on the worker's;
* :data:`PARENT_PID_ENV`: the parent's pid, which the worker's lifeline watches; a worker whose
  parent is gone already exits at once with :data:`ORPHANED_EXIT_CODE`;
* :data:`PARENT_PIDFD_ENV`: set by the template alone, in the workers it forks: the descriptor
  of a pidfd on the pool (their grandparent), which they inherit;
* :data:`UID_ENV` and :data:`NAMESPACE_ENV`: the worker's uid and namespace, for its spans;
* :data:`LIFESPAN_ENV`: the lifespan, as :func:`anywool.runtime._lifespan.encode` writes it;
* :data:`OUTPUT_LEVEL_ENV`: the level from which the worker's root logger passes records to
  the callers that forward output, as :func:`anywool.runtime._output.encode_level` writes it;
* :data:`SECRET_ENV`: the secret TCP peers must prove, as :func:`anywool._secret.for_child`
  writes it (never on the command line).

Two more the worker reads where the user set them (the parent passes them on with the rest of
its environment), and leaves in place: :data:`IMPORT_ENV` and :data:`PROXY_IDLE_TIMEOUT_ENV`.
(``$ANYWOOL_SECRET`` and ``$ANYWOOL_RUNTIME_DIR`` are every process's alike, pool and worker:
:mod:`anywool._secret` and :mod:`anywool._runtime_dir` read them.)

**Address.** Once it listens (and its lifespan is entered), the worker writes one line on
stdout: its address (``unix:/path`` or ``host:port``). A worker that cannot start writes
:data:`STARTUP_ERROR` and why instead, then exits 1 (one that exits without a line, on a usage
error say, is seen at end of file). The parent waits for that line, within its
``startup_timeout``, and raises the reason as a :class:`~anywool.errors.WorkerError`. From then
on the worker's own stdout goes to its stderr: the pipe carries notices only.

**Control lines**, parent to worker, one a line on the control pipe, in any order, at any time
(the pipe keeps what the worker has not read yet):

* :data:`SUPERVISED`: the parent acts on notices (it replaces a worker that must be recycled).
  Until it is said, the worker refuses a client's recycle request: nobody would act on it.
* :data:`IDLE_TIMEOUT` ``<seconds>``: say :data:`NOTICE_IDLE` once that long passes without a
  call in flight, and again every that long while none comes (seconds > 0, finite).
* :data:`REPORT_CALL`: say :data:`NOTICE_CALL` at the next call taken (once).
* :data:`STOP` ``<grace>`` (a float, as ``repr`` writes it): refuse new calls and drain those in
  flight for ``grace`` seconds; ``0`` cancels them now; negative drains for as long as they
  take. A later request may only hurry the stop: ``0`` cancels a drain under way, a grace > 0
  bounds, from when it comes, a drain that had none.

A line the worker does not know is logged and ignored. End of file on the control pipe (the
parent closed it, or died, even by SIGKILL) stops the worker as ``stop 0`` does.

**Notices**, worker to parent, one a line on the notices pipe, after the address:

* :data:`RETIRING` and why: the worker reached its ``max_calls`` or ``max_memory``; it takes no
  new call, finishes those it runs, and waits to be stopped. A pool replaces it, then stops it.
* :data:`NOTICE_RECYCLE`: a client asked for a rolling restart, which the worker accepted
  (only once :data:`SUPERVISED`); the pool replaces it, then stops it.
* :data:`NOTICE_IDLE` and :data:`NOTICE_CALL`: as asked above.

**Stop.** After its drain, the worker takes at most :data:`STOP_TAIL` seconds to cancel what
still runs, answer those calls and close its connections, and exits. The parent allows the
grace plus :data:`STOP_TAIL` (plus a margin for the interpreter's exit) before it sends
SIGTERM, then SIGKILL; it removes the socket directory once the worker is reaped. Signals,
from the parent or anyone: SIGTERM stops as ``stop 0`` does (and cancels the lifespan's exit
too), SIGINT as ``stop -1``.
"""

from __future__ import annotations

# -- the environment ----------------------------------------------------------------------------

#: The parent's ``sys.path`` (JSON list), put first on the worker's.
SYS_PATH_ENV = "ANYWOOL_WORKER_SYS_PATH"
#: The parent's pid: the worker's lifeline ends it once that process has exited.
PARENT_PID_ENV = "ANYWOOL_WORKER_PARENT_PID"
#: Set by the pool's template in the workers it forks: the descriptor of the pidfd on the pool
#: they inherit (see :mod:`anywool.runtime.worker._lifeline`).
PARENT_PIDFD_ENV = "ANYWOOL_WORKER_PARENT_PIDFD"
#: The worker's uid, as its metadata announces it (for its spans and ``current_worker()``).
UID_ENV = "ANYWOOL_WORKER_UID"
#: The namespace the worker is announced in (for its spans and ``current_worker()``).
NAMESPACE_ENV = "ANYWOOL_WORKER_NAMESPACE"
#: The worker's lifespan (see :mod:`anywool.runtime._lifespan`).
LIFESPAN_ENV = "ANYWOOL_WORKER_LIFESPAN"
#: The level the worker's root logger passes (see :mod:`anywool.runtime._output`).
OUTPUT_LEVEL_ENV = "ANYWOOL_OUTPUT_LEVEL"
#: The secret a spawning pool hands its worker (see :mod:`anywool._secret`).
SECRET_ENV = "ANYWOOL_WORKER_SECRET"
#: Modules the worker imports before it serves (comma-separated; set by the user, inherited
#: and kept): where a user configures an OpenTelemetry SDK, say. One that fails to import
#: fails the start.
IMPORT_ENV = "ANYWOOL_WORKER_IMPORT"
#: Seconds a worker keeps the proxy of a nested call's origin without a call (set by the user;
#: see :mod:`anywool.runtime.worker._nested`).
PROXY_IDLE_TIMEOUT_ENV = "ANYWOOL_PROXY_IDLE_TIMEOUT"

# -- the lines on stdout ------------------------------------------------------------------------

#: What the line on stdout starts with when the worker cannot start, instead of an address.
STARTUP_ERROR = "error: "
#: The line a retiring worker writes to its parent, before the reason.
RETIRING = "retiring "
#: A client asked for a rolling restart, and the worker accepted.
NOTICE_RECYCLE = "recycle"
#: No call for the ``idle-timeout`` the parent set.
NOTICE_IDLE = "idle"
#: The worker took a call, as :data:`REPORT_CALL` asked.
NOTICE_CALL = "call"

# -- the control lines on stdin -----------------------------------------------------------------

#: ``stop <grace>``: stop, draining the calls in flight for ``grace`` seconds.
STOP = "stop"
#: The parent reads the worker's notices and acts on them: recycle requests are passed on.
SUPERVISED = "supervised"
#: ``idle-timeout <seconds>``: say :data:`NOTICE_IDLE` after that long without a call.
IDLE_TIMEOUT = "idle-timeout"
#: Say :data:`NOTICE_CALL` at the next call taken (once).
REPORT_CALL = "report-call"

# -- bounds -------------------------------------------------------------------------------------

#: Seconds a stopping worker spends after its drain, all steps together: cancelling the calls
#: still running (at most the server's ``REPLY_TIMEOUT`` of it), closing its nested proxies,
#: half-closing and lingering for its clients, then shutting down the connections of those that
#: stay. One budget, so that a client that never hangs up cannot stretch the stop past what the
#: parent waits for (LocalWorker allows the grace plus this, plus a margin, before SIGTERM).
STOP_TAIL = 2.0
#: The largest ``max_concurrency`` (``--max-concurrency``).
MAX_CONCURRENCY = 1 << 20
#: The exit code of a worker whose parent was gone already when it started.
ORPHANED_EXIT_CODE = 70
