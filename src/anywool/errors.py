"""Every public exception of anywool.

Each error passes its fields positionally to ``Exception.__init__`` so that ``cls(*exc.args)``,
:mod:`pickle` and :mod:`copy` rebuild it with the same field values and types, exposes each field
as an attribute of the same name, and renders its message in ``__str__`` (never stored in
``args``). Nothing here imports the rest of the package.
"""

from __future__ import annotations

from uuid import UUID

__all__ = [
    "AuthenticationError",
    "DiscoveryBlockExhausted",
    "DiscoveryCapacityExhausted",
    "DiscoveryError",
    "DiscoveryNamespaceInUse",
    "DiscoveryNamespaceNotFound",
    "DiscoveryRegistryCorrupt",
    "DiscoveryServiceError",
    "DiscoveryUnavailable",
    "DiscoveryWorkerNotFound",
    "LoopbackAdvertisementWarning",
    "NoWorkersAvailable",
    "PayloadTooLarge",
    "RoutineAborted",
    "RoutineCancelled",
    "SerializationError",
    "WoolError",
    "WorkerError",
]


class WoolError(Exception):
    """Base class of every error anywool raises on purpose."""


class DiscoveryError(WoolError):
    """Base class of the discovery errors."""


class DiscoveryNamespaceInUse(DiscoveryError):
    """A namespace already has an owner, so it cannot be claimed.

    :param namespace: the namespace that was claimed.
    :param path: where the namespace lives: its directory on disk (``LocalDiscovery``), or its
        owner key and the owner's host (``EtcdDiscovery``).
    :param owner_pid: pid recorded by the incumbent owner, or ``None`` when the owner is dead but
        reclaiming was disabled (``reclaim=False``).
    :param kind: the discovery class whose borrowers the message suggests.
    """

    def __init__(self, namespace: str, path: str, owner_pid: int | None,
                 kind: str = "LocalDiscovery") -> None:
        super().__init__(namespace, path, owner_pid, kind)
        self.namespace = namespace
        self.path = path
        self.owner_pid = owner_pid
        self.kind = kind

    def __str__(self) -> str:
        if self.owner_pid is None:
            return (
                f"discovery namespace {self.namespace!r} is held by a dead owner at {self.path} "
                "and reclaim=False; remove that directory or claim with reclaim=True"
            )
        return (
            f"discovery namespace {self.namespace!r} is owned by live process {self.owner_pid} "
            f"({self.path}); borrow it with {self.kind}.Publisher or {self.kind}.Subscriber"
        )


class DiscoveryNamespaceNotFound(DiscoveryError):
    """No live owner holds the namespace a borrower tried to bind.

    :param namespace: the namespace that was looked up.
    :param kind: the discovery class that would create it, named in the message.
    """

    def __init__(self, namespace: str, kind: str = "LocalDiscovery") -> None:
        super().__init__(namespace, kind)
        self.namespace = namespace
        self.kind = kind

    def __str__(self) -> str:
        return (
            f"discovery namespace {self.namespace!r} has no live owner; "
            f"enter {self.kind}(namespace) somewhere to create it"
        )


class DiscoveryRegistryCorrupt(DiscoveryError):
    """A namespace's registry cannot be read or written as the format says (it was truncated,
    overwritten, replaced by another file or made impossible to open, or its change counter ran
    out), while its owner is alive.

    Binding raises it, so do publishes, and every iteration of a subscription to the namespace
    ends with it once its source sees the damage. Nothing repairs a registry: its owner has to
    exit (which removes it) and the namespace be claimed again.

    :param namespace: the namespace.
    :param path: the registry file.
    :param reason: what is wrong with it, in words.
    """

    def __init__(self, namespace: str, path: str, reason: str) -> None:
        super().__init__(namespace, path, reason)
        self.namespace = namespace
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"discovery namespace {self.namespace!r} has a live owner, but its registry "
            f"{self.path} is unusable ({self.reason}); the owner must exit (and claim again) to "
            "recreate it"
        )


class DiscoveryCapacityExhausted(DiscoveryError):
    """Every slot of the namespace registry holds another worker.

    :param capacity: the number of slots the owner stamped.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.capacity = capacity

    def __str__(self) -> str:
        return f"the discovery registry is full ({self.capacity} workers)"


class DiscoveryBlockExhausted(DiscoveryError):
    """A worker's encoded metadata does not fit one discovery record: a block of a local
    namespace's registry, a LAN advert (6000 bytes), or an etcd worker key (65 536 bytes).

    :param size: the encoded size in bytes that did not fit.
    """

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size

    def __str__(self) -> str:
        return (f"worker metadata of {self.size} bytes does not fit a discovery record (a local "
                "registry block, a LAN advert of 6000 bytes, or an etcd key of 65536 bytes)")


class DiscoveryWorkerNotFound(DiscoveryError):
    """An update named a worker the registry does not hold.

    :param uid: the worker's uid.
    """

    def __init__(self, uid: UUID) -> None:
        super().__init__(uid)
        self.uid = uid

    def __str__(self) -> str:
        return f"worker {self.uid} is not registered in the discovery registry"


class DiscoveryServiceError(DiscoveryError):
    """A discovery service (an etcd cluster) answered a request with an error: permission
    denied, a bad password, a request it refused.

    :param endpoint: the URL of the member that answered.
    :param code: the gRPC status code it gave (``7`` permission denied, ``16``
        unauthenticated, ...), or ``None`` when its answer carried none.
    :param message: its error message (or the start of its answer when it was not JSON).
    """

    def __init__(self, endpoint: str, code: int | None, message: str) -> None:
        super().__init__(endpoint, code, message)
        self.endpoint = endpoint
        self.code = code
        self.message = message

    def __str__(self) -> str:
        code = "" if self.code is None else f" (gRPC code {self.code})"
        return f"discovery service at {self.endpoint} refused the request{code}: {self.message}"


class DiscoveryUnavailable(DiscoveryError):
    """No member of a discovery service (an etcd cluster) answered in time.

    :param endpoints: the URLs tried, in order.
    :param reason: what went wrong with each (connection refused, timed out, ...).
    """

    def __init__(self, endpoints: tuple[str, ...], reason: str) -> None:
        super().__init__(endpoints, reason)
        self.endpoints = endpoints
        self.reason = reason

    def __str__(self) -> str:
        return (f"no member of the discovery service answered ({', '.join(self.endpoints)}): "
                f"{self.reason}")


class NoWorkersAvailable(WoolError):
    """No admitted worker could take a call.

    :param reason: why, in words (for example: this pool spawns none and none are published in
        its namespace; the namespace's owner went away; every worker slot was given up).
    :param namespace: the namespace the workers were looked for in (``None``: not known, e.g.
        a subscriber that has none).
    """

    def __init__(self, reason: str = "no admitted worker can take the call",
                 namespace: str | None = None) -> None:
        super().__init__(reason, namespace)
        self.reason = reason
        self.namespace = namespace

    def __str__(self) -> str:
        where = "" if self.namespace is None else f" in namespace {self.namespace!r}"
        return f"no workers available{where}: {self.reason}"


class WorkerError(WoolError):
    """A worker failed to start, answer or stay connected.

    :param address: the worker's address (``"unix:/path"`` or ``"host:port"``).
    :param reason: what went wrong, in words.
    """

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(address, reason)
        self.address = address
        self.reason = reason

    def __str__(self) -> str:
        return f"worker {self.address}: {self.reason}"


class AuthenticationError(WorkerError):
    """A worker connection failed peer authentication, on either side.

    Raised by the client when the worker rejected its credentials (it hung up during the
    handshake) or could not prove its own (wrong HMAC proof, a TLS certificate that does not
    verify). Nothing was unpickled on either side: authentication ends before the first frame.

    :param address: the worker's address (``"host:port"``).
    :param reason: what failed, in words.
    """

    def __str__(self) -> str:
        return f"worker {self.address}: authentication failed: {self.reason}"


class LoopbackAdvertisementWarning(UserWarning):
    """A worker was announced to a LAN with a loopback address, which no other host can reach."""


class RoutineCancelled(WoolError):
    """A routine was cancelled on its worker (for example by the worker shutting down).

    Raised identically under asyncio and trio, instead of either backend's cancellation
    exception, so that remote cancellation never cancels the caller's own scope.

    :param routine: the routine's qualified name.
    :param address: the address of the worker that cancelled it.
    """

    def __init__(self, routine: str, address: str) -> None:
        super().__init__(routine, address)
        self.routine = routine
        self.address = address

    def __str__(self) -> str:
        return f"routine {self.routine} was cancelled on worker {self.address}"


class RoutineAborted(WoolError):
    """A routine ended with a ``BaseException`` that is not an ``Exception``: ``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``, a ``BaseExceptionGroup`` holding one, or a
    cancellation exception that no cancel scope on its worker had asked for (under asyncio, a
    stray ``CancelledError`` from a future something else cancelled).

    Re-raised as it is, it would exit, interrupt or cancel the caller; it arrives as this
    instead, with the original as ``__cause__``. Only the call fails: the worker and the
    connection go on serving.

    :param routine: the routine's qualified name.
    :param address: the address of the worker it ran on.
    :param kind: the name of the original exception's class.
    """

    def __init__(self, routine: str, address: str, kind: str) -> None:
        super().__init__(routine, address, kind)
        self.routine = routine
        self.address = address
        self.kind = kind

    def __str__(self) -> str:
        return (f"routine {self.routine} on worker {self.address} ended with {self.kind}, "
                "which is not re-raised in the caller")


class PayloadTooLarge(WoolError):
    """A call's arguments, or a routine's result, pickle to more than one frame can carry.

    :param what: what was too large, in words (e.g. ``"the call to mod.fn"``).
    :param size: its pickled size in bytes.
    :param limit: the largest payload a frame carries, in bytes.
    """

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(what, size, limit)
        self.what = what
        self.size = size
        self.limit = limit

    def __str__(self) -> str:
        return (f"{self.what} pickles to {self.size} bytes, over the {self.limit}-byte limit "
                "of one frame; pass a path or a handle to the data instead")


class SerializationError(WoolError, TypeError):
    """Something a call carries could not be pickled where it was sent, or unpickled where it
    arrived: its arguments, a context variable's value, a value the routine returned, yielded or
    was sent. Raised on the side that failed (the caller's arguments and context values in the
    caller, before anything is sent; the worker's failures reach the caller as the call's
    exception); only that call fails and the connection goes on. A ``TypeError``, like the
    standard library's pickling errors.

    :param routine: the routine's qualified name.
    :param what: what failed, in words (``"the arguments"``, ``"context variable 'x'"``, ...).
    :param reason: how it failed, in words, with the underlying error.
    """

    def __init__(self, routine: str, what: str, reason: str) -> None:
        super().__init__(routine, what, reason)
        self.routine = routine
        self.what = what
        self.reason = reason

    def __str__(self) -> str:
        return f"calling {self.routine}: {self.what} {self.reason}"
