"""EtcdDiscovery: the single-owner namespace model on an etcd cluster.

Roles, as for :class:`~anywool.LocalDiscovery`, across every host that reaches the cluster:

- **owner**: ``async with EtcdDiscovery(ns, endpoints=...)`` claims the namespace with one
  transaction (its owner key absent -> put it, bound to the owner's lease, deleting what an
  earlier generation left); one owner in the whole cluster.
- **publisher**: ``async with EtcdDiscovery.Publisher(ns, ...)`` announces workers, each a key
  bound to the publisher's one lease; exiting revokes the lease, which withdraws them all at once.
- **subscriber**: ``async for event in EtcdDiscovery.Subscriber(ns, ...)`` follows the workers;
  iterations in one process share one watch per namespace and cluster (:mod:`._source`).

Keys and generations: :mod:`._keys`. Requests, failover and credentials: :mod:`._gateway`.
Leases: :mod:`._lease`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import anyio.lowlevel
import anyio.to_thread

from anywool import _validate
from anywool._owner import SingleUse
from anywool.discovery import _hub
from anywool.discovery._filter import afilter
from anywool.discovery._protocols import (
    Discovery,
    DiscoveryEvent,
    DiscoveryEventType,
    DiscoverySubscriberLike,
    PredicateFunction,
    check_event,
)
from anywool.discovery.etcd import _keys
from anywool.discovery.etcd._config import (
    DEFAULT_ENDPOINT,
    DEFAULT_LEASE_TTL,
    DEFAULT_PREFIX,
    TLS,
    Config,
    Endpoints,
    check_lease_ttl,
)
from anywool.discovery.etcd._gateway import NOT_FOUND, Gateway, header_revision
from anywool.discovery.etcd._http import describe
from anywool.discovery.etcd._keys import Keys, b64, unb64
from anywool.discovery.etcd._lease import LeaseKeeper, Replacement
from anywool.errors import (
    DiscoveryBlockExhausted,
    DiscoveryError,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryServiceError,
    DiscoveryUnavailable,
    DiscoveryWorkerNotFound,
)
from anywool.metadata import WorkerMetadata

log = logging.getLogger(__name__)

#: Seconds an exit waits for the lease thread once told to stop (it stops within milliseconds:
#: a renewal in flight is abandoned).
_JOIN_TIMEOUT = 1.0
_KIND = "EtcdDiscovery"
#: Lease ids are positive int64s; ours are drawn from [1, 2**62].
_MAX_LEASE_ID = 1 << 62


async def _grant(gateway: Gateway, ttl: int) -> tuple[int, int]:
    """A new lease: its id and the TTL etcd granted (it may raise a TTL below its floor of
    1.5 election timeouts)."""
    answer = await gateway.call("/v3/lease/grant", {"TTL": str(ttl)})
    lease, granted = int(answer.get("ID", 0)), int(answer.get("TTL", 0))
    if lease <= 0 or granted <= 0:
        raise DiscoveryServiceError(gateway.endpoint, None,
                                    f"a lease grant answered no lease: {answer!r}")
    return lease, granted


async def _revoke(gateway: Gateway, lease: int) -> None:
    """Revoke ``lease`` (deleting every key bound to it); one that is gone already is fine."""
    try:
        await gateway.call("/v3/lease/revoke", {"ID": str(lease)})
    except DiscoveryServiceError as exc:
        if exc.code != NOT_FOUND:
            raise


def _fenced(keys: Keys, generation: int, success: list[dict[str, Any]]) -> dict[str, Any]:
    """A transaction doing ``success`` only while the owner key is the one of ``generation``;
    otherwise it reads the owner key (absent: no owner; else: a successor's)."""
    return {"compare": [{"key": b64(keys.owner), "result": "EQUAL", "target": "CREATE",
                         "create_revision": str(generation)}],
            "success": success,
            "failure": [{"request_range": {"key": b64(keys.owner)}}]}


async def _owner_generation(gateway: Gateway, keys: Keys, namespace: str) -> int:
    """The namespace's generation now.

    :raises DiscoveryNamespaceNotFound: it has no owner.
    """
    kvs = (await gateway.call("/v3/kv/range", {"key": b64(keys.owner)})).get("kvs")
    if not kvs:
        raise DiscoveryNamespaceNotFound(namespace, _KIND)
    return int(kvs[0].get("create_revision", 0))


def _failed_owner(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The owner key a failed transaction read back first thing (``None``: absent)."""
    responses = answer.get("responses") or [{}]
    kvs = responses[0].get("response_range", {}).get("kvs")
    return kvs[0] if kvs else None


def _where(config: Config, keys: Keys, owner: bytes) -> str:
    record = _keys.read_owner(owner)
    host = record.get("host")
    at = f" on host {host}" if isinstance(host, str) else ""
    return f"etcd key {keys.owner.decode(errors='replace')} at {config.endpoints[0]}{at}"


def _connection(endpoints: Endpoints, prefix: str, tls: TLS | None, username: str | None,
                password: str | None, connect_timeout: float, request_timeout: float) -> Config:
    return Config.make(endpoints, prefix, tls, username, password, connect_timeout,
                       request_timeout)


class EtcdDiscovery(Discovery, SingleUse):
    """Own a discovery namespace in an etcd cluster for the lifetime of an ``async with`` block.

    Entering claims the namespace with one etcd transaction: of any number of claimants on any
    hosts, exactly one is admitted (the others raise :class:`DiscoveryNamespaceInUse`). The
    claim is a key bound to a lease this owner keeps alive from a thread of its own (every
    ``lease_ttl / 3`` seconds), so an owner that dies, even by SIGKILL, frees the namespace
    ``lease_ttl`` to ``lease_ttl + 0.5`` seconds after its last renewal, and a successor's claim
    then starts it afresh (deleting what the dead generation's publishers left). Exiting
    deletes every key of the namespace and revokes the lease.

    **What etcd changes.** A :class:`LocalDiscovery` owner is never displaced. An etcd owner
    that cannot renew its lease for ``lease_ttl`` seconds (frozen, partitioned from the
    cluster, or the cluster down that long) *is*: etcd drops the claim, subscribers see every
    worker dropped, and another process may claim the namespace. Such an owner logs the loss at
    error level and :attr:`displaced` becomes true; its writes are fenced by the claim's
    generation (the owner key's create revision), so nothing it or its publishers still try
    changes a successor's namespace.

    :param namespace: any string (it is hashed into the keys; the owner key holds it plainly).
    :param endpoints: the client URL of an etcd member (``http://host:2379`` or ``https://``),
        or a sequence of them: requests go to the member that answered last and move to the
        next on a failure or a timeout, and watches move when their member fails or stops
        answering pings.
    :param prefix: the key prefix every key of anywool's lives under (``/anywool``): give
        each application its own, and grant its etcd role that range only.
    :param lease_ttl: seconds (an int, 1 to 86 400) a dead owner's claim and a dead
        publisher's workers outlive their last renewal (etcd raises TTLs below 1.5 election
        timeouts to that floor; 2 s with etcd's defaults).
    :param tls: for ``https://`` endpoints: an ``ssl.SSLContext`` (it is used as given), or a
        :class:`~anywool.MutualTLS` (its CA bundle only, and its certificate as the client's);
        ``None``: the system's CAs, no client certificate.
    :param username: an etcd user to authenticate as (password authentication; the gateway
        does not map client certificates to users).
    :param password: its password; ``None``: ``$ANYWOOL_ETCD_PASSWORD`` when it is used. A
        password never goes into a pickle.
    :param connect_timeout: seconds a connection to a member may take.
    :param request_timeout: seconds a request may take; with several endpoints each member tried
        gets an equal share before the next one is (a member that died with the request never
        answers).
    :param teardown_timeout: seconds (>= 0) the exit may spend on requests; past that it gives
        up on them (logged) and the claim lapses with its lease.
    :param filter: what :attr:`subscriber` keeps (as for ``LocalDiscovery``).
    :param own: ``False``: entering claims nothing and only checks that the namespace has an
        owner (:class:`DiscoveryNamespaceNotFound` otherwise); the instance then hands out
        borrowers of another owner's namespace, e.g. for a pool that spawns workers on one
        more host: ``WorkerPool(spawn=4, discovery=EtcdDiscovery(ns, own=False), ...)``.
    :raises TypeError: an argument has the wrong type.
    :raises ValueError: an argument is out of range: an endpoint that is not an
        ``http(s)://host:port`` URL, endpoints of mixed schemes, ``tls`` with ``http://``
        endpoints, a prefix not starting with ``/``, a password without a username. The
        messages name the parameter and the value (never a password).
    """

    def __init__(
        self,
        namespace: str,
        *,
        endpoints: Endpoints = DEFAULT_ENDPOINT,
        prefix: str = DEFAULT_PREFIX,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        tls: TLS | None = None,
        username: str | None = None,
        password: str | None = None,
        connect_timeout: float = 1.0,
        request_timeout: float = 2.0,
        teardown_timeout: float = 5.0,
        filter: PredicateFunction | None = None,
        own: bool = True,
    ) -> None:
        self._namespace = _validate.namespace(namespace)
        if not isinstance(own, bool):
            raise TypeError(f"own must be a bool, got {own!r}")
        self._own = own
        self._config = _connection(endpoints, prefix, tls, username, password,
                                   connect_timeout, request_timeout)
        self._lease_ttl = check_lease_ttl(lease_ttl)
        self._teardown_timeout = _validate.duration("teardown_timeout", teardown_timeout,
                                                    allow_zero=True)
        if filter is not None and not callable(filter):
            raise TypeError(f"filter must be a callable or None, got {filter!r}")
        self._filter = filter
        self._keys = Keys(self._config.prefix, self._namespace)
        self._gateway: Gateway | None = None
        self._lease = 0
        self._keeper: LeaseKeeper | None = None
        self._generation: int | None = None

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._config.endpoints

    @property
    def prefix(self) -> str:
        return self._config.prefix

    @property
    def lease_ttl(self) -> int:
        return self._lease_ttl

    @property
    def claimed(self) -> bool:
        """Whether this instance is entered and holds its claim (it may have been
        :attr:`displaced` since)."""
        return self._generation is not None

    @property
    def generation(self) -> int | None:
        """The claim's generation (the owner key's create revision) while claimed."""
        return self._generation

    @property
    def displaced(self) -> bool:
        """Whether etcd dropped this owner's claim while it was entered (its lease lapsed)."""
        return self._keeper is not None and self._keeper.lost

    @property
    def publisher(self) -> EtcdDiscovery.Publisher:
        """A new publisher borrowing this namespace (enter it to use it), with this instance's
        cluster, credentials, timeouts and ``lease_ttl``."""
        c = self._config
        return EtcdDiscovery.Publisher(
            self._namespace, endpoints=c.endpoints, prefix=c.prefix, lease_ttl=self._lease_ttl,
            tls=c.tls, username=c.username, password=c.password,
            connect_timeout=c.connect_timeout, request_timeout=c.request_timeout,
            teardown_timeout=self._teardown_timeout)

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        """A subscription to this namespace, filtered by this instance's ``filter``."""
        return self.subscribe(self._filter)

    def subscribe(self, filter: PredicateFunction | None = None) -> DiscoverySubscriberLike:
        """A subscription to this namespace, optionally filtered by ``filter``."""
        c = self._config
        subscription = EtcdDiscovery.Subscriber(
            self._namespace, endpoints=c.endpoints, prefix=c.prefix, tls=c.tls,
            username=c.username, password=c.password, connect_timeout=c.connect_timeout,
            request_timeout=c.request_timeout)
        return subscription if filter is None else afilter(filter, subscription)

    async def __aenter__(self) -> EtcdDiscovery:
        """Claim the namespace (a lease grant and one transaction).

        :raises DiscoveryNamespaceInUse: another owner holds it (the error names its host and
            pid as it recorded them).
        :raises DiscoveryUnavailable: no member answered in time.
        :raises DiscoveryServiceError: the cluster refused (permissions, credentials).
        :raises RuntimeError: this instance was entered before.

        When entry fails because the cluster refused or the namespace is in use, the lease
        granted for the claim is revoked (shielded, within ``teardown_timeout``). When no
        member answered, or entry is cancelled with its request in flight, nothing more is
        asked of the cluster: a lease granted unseen lapses within ``lease_ttl`` seconds (and a
        claim made unseen with it).
        """
        self._enter_once()
        await anyio.lowlevel.checkpoint_if_cancelled()
        gateway = Gateway(self._config)
        if not self._own:
            try:
                self._generation = await _owner_generation(gateway, self._keys,
                                                           self._namespace)
            finally:
                await gateway.aclose()
            return self
        # A lease id of our choosing: the grant and the claim that binds it go in one round
        # trip (pipelined), and a claim retried elsewhere recognises its own lease.
        lease = secrets.randbelow(_MAX_LEASE_ID) + 1
        try:
            self._generation, ttl = await self._claim(gateway, lease)
            keeper = LeaseKeeper(self._config, lease, ttl,
                                 f"the owner of discovery namespace {self._namespace!r}",
                                 self._lost)
            keeper.start()
        except BaseException as exc:
            self._generation = None
            with anyio.CancelScope(shield=True):
                # Revoked when the cluster answered (the claim lost, was refused, or the lease
                # thread could not start). Not when it did not (no member answered, or the
                # entry was cancelled with the request in flight): waiting on that cluster
                # would stall the failure or the cancellation, and a lease granted unseen
                # lapses within lease_ttl, with the claim if that was made too.
                if isinstance(exc, Exception) and not isinstance(exc, DiscoveryUnavailable):
                    with anyio.move_on_after(self._teardown_timeout):
                        try:
                            await _revoke(gateway, lease)
                        except DiscoveryError as failure:
                            log.warning("revoking the lease of a failed claim of %r failed "
                                        "(it lapses within %d s): %s", self._namespace,
                                        self._lease_ttl, describe(failure))
                await gateway.aclose()
            raise
        self._gateway, self._lease, self._keeper = gateway, lease, keeper
        return self

    async def _claim(self, gateway: Gateway, lease: int) -> tuple[int, int]:
        """Grant ``lease`` and claim the namespace with it, in one round trip: the claim's
        generation and the lease's granted TTL."""
        keys = self._keys
        record = _keys.owner_record(self._namespace, self._lease_ttl)
        granted, answer = await gateway.call_batch([
            ("/v3/lease/grant", {"TTL": str(self._lease_ttl), "ID": str(lease)}),
            ("/v3/kv/txn", {
                "compare": [{"key": b64(keys.owner), "result": "EQUAL", "target": "CREATE",
                             "create_revision": "0"}],
                # What a dead generation left goes in the same revision as the claim.
                "success": [{"request_delete_range": {"key": b64(keys.workers),
                                                      "range_end": b64(keys.workers_end)}},
                            {"request_put": {"key": b64(keys.owner), "value": b64(record),
                                             "lease": str(lease)}}],
                "failure": [{"request_range": {"key": b64(keys.owner)}}]})])
        ttl = self._lease_ttl
        if isinstance(granted, DiscoveryServiceError):
            # "lease already exists": ours, granted by an attempt whose answer was lost (a
            # random 62-bit id is not someone else's).
            if "lease already exists" not in granted.message:
                raise granted
        else:
            ttl = max(int(granted.get("TTL", 0)), ttl)  # etcd may raise it to its floor
        if isinstance(answer, DiscoveryServiceError):
            raise answer
        if answer.get("succeeded"):
            return header_revision(answer), ttl
        owner = _failed_owner(answer)
        if owner is None:  # deleted between compare and read: never, they are one revision
            raise DiscoveryServiceError(gateway.endpoint, None, f"claim answered {answer!r}")
        if int(owner.get("lease", 0)) == lease:
            # Ours: an earlier attempt took effect, its answer was lost, and the gateway
            # retried on another member.
            return int(owner.get("create_revision", 0)), ttl
        value = unb64(owner.get("value", ""))
        pid = _keys.read_owner(value).get("pid")
        raise DiscoveryNamespaceInUse(self._namespace, _where(self._config, keys, value),
                                      pid if isinstance(pid, int) else -1, _KIND)

    async def _lost(self, gateway: Gateway) -> Replacement:
        log.error("discovery namespace %r: etcd dropped this owner's claim (its lease lapsed "
                  "without renewal for %d s); the namespace is displaced and may have another "
                  "owner now", self._namespace, self._lease_ttl)
        return None

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        """Delete every key of the namespace (fenced by the generation: a displaced owner
        deletes nothing of a successor's) and revoke the lease.

        Bounded: at most ``teardown_timeout`` seconds of requests (then logged; the claim
        lapses with its lease), plus the lease thread's end (milliseconds). Never raises an
        ``Exception``. Cancellation: an enclosing cancel scope or deadline cuts the requests
        short (the claim then lapses with its lease, within ``lease_ttl`` + 0.5 s); the lease
        thread is still stopped and the connections closed, then the cancellation propagates.
        """
        gateway, keeper, generation = self._gateway, self._keeper, self._generation
        self._gateway = None
        self._generation = None
        if gateway is None:
            return None
        if keeper is not None:
            keeper.stop()
        try:
            with anyio.move_on_after(self._teardown_timeout) as budget:
                try:
                    # In one round trip (pipelined, in order): the fenced delete first, since
                    # revoking deletes the owner key, which the fence reads.
                    steps: list[tuple[str, dict[str, Any]]] = []
                    if generation is not None:
                        steps.append(("/v3/kv/txn", _fenced(self._keys, generation, [
                            {"request_delete_range": {"key": b64(self._keys.workers),
                                                      "range_end": b64(self._keys.workers_end)}},
                            {"request_delete_range": {"key": b64(self._keys.owner)}}])))
                    steps.append(("/v3/lease/revoke", {"ID": str(self._lease)}))
                    for answer in await gateway.call_batch(steps):
                        if isinstance(answer, DiscoveryServiceError) and answer.code != NOT_FOUND:
                            raise answer
                except DiscoveryError as exc:
                    log.warning("releasing discovery namespace %r failed (its claim lapses "
                                "within %d s): %s", self._namespace, self._lease_ttl,
                                describe(exc))
            if budget.cancelled_caught:
                log.warning("releasing discovery namespace %r took longer than %.1f s; given "
                            "up (its claim lapses within %d s)", self._namespace,
                            self._teardown_timeout, self._lease_ttl)
        finally:
            with anyio.CancelScope(shield=True):
                if keeper is not None:
                    await anyio.to_thread.run_sync(keeper.join, _JOIN_TIMEOUT)
                await gateway.aclose()
        return None

    def __repr__(self) -> str:
        own = "" if self._own else ", own=False"
        return f"EtcdDiscovery({self._namespace!r}, endpoints={self._config.endpoints!r}{own})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A fresh instance, without the password or an SSLContext (see Config.portable).
        return (_make_discovery, (self._namespace, _portable(self._config), self._lease_ttl,
                                  self._teardown_timeout, self._own))

    # -- borrowers ----------------------------------------------------------------------------

    class Publisher(SingleUse):
        """Borrow an etcd namespace to announce workers in it.

        Entering checks that the namespace has an owner and takes a lease of this publisher's
        own, kept alive from a thread every ``lease_ttl / 3`` seconds; every worker announced
        is a key bound to it. So a publisher that dies, even by SIGKILL, loses its workers from
        every view ``lease_ttl`` to ``lease_ttl + 0.5`` seconds after its last renewal, and
        exiting withdraws them all with one revocation. Should etcd drop the lease while the
        publisher lives (it could not renew it for ``lease_ttl`` seconds), the publisher
        announces its workers again under a new one as soon as etcd answers.

        Every write is fenced by the namespace's generation it bound: when the owner is gone a
        publish raises :class:`DiscoveryNamespaceNotFound`; when a successor claimed the
        namespace meanwhile the publisher rebinds to it (the successor's claim removed the
        workers announced before, as a successor ``LocalDiscovery`` starts empty).

        Parameters as for :class:`EtcdDiscovery` (``teardown_timeout`` bounds the exit).

        :raises TypeError: an argument has the wrong type.
        :raises ValueError: an argument is out of range.
        """

        def __init__(
            self,
            namespace: str,
            *,
            endpoints: Endpoints = DEFAULT_ENDPOINT,
            prefix: str = DEFAULT_PREFIX,
            lease_ttl: int = DEFAULT_LEASE_TTL,
            tls: TLS | None = None,
            username: str | None = None,
            password: str | None = None,
            connect_timeout: float = 1.0,
            request_timeout: float = 2.0,
            teardown_timeout: float = 5.0,
        ) -> None:
            self.namespace = _validate.namespace(namespace)
            self._config = _connection(endpoints, prefix, tls, username, password,
                                       connect_timeout, request_timeout)
            self.lease_ttl = check_lease_ttl(lease_ttl)
            self.teardown_timeout = _validate.duration("teardown_timeout", teardown_timeout,
                                                       allow_zero=True)
            self._keys = Keys(self._config.prefix, self.namespace)
            self._gateway: Gateway | None = None
            self._generation = 0
            self._keeper: LeaseKeeper | None = None
            # What this publisher announced and did not drop, encoded: re-announced under a
            # new lease if etcd drops the lease. Read by the lease thread; a dict's single
            # operations are atomic, and the thread copies it before iterating.
            self._workers: dict[UUID, bytes] = {}
            self._released = False
            # This publisher's sequence key (see _write) and the value it last wrote there
            # (None: the key does not exist).
            self._seq_key = self._keys.sequences + secrets.token_hex(8).encode()
            self._sequence: str | None = None
            # One change at a time: concurrent changes would race on the sequence key, each
            # round letting one through, and the others would give up after eight rounds.
            self._changing = anyio.Lock()

        @property
        def generation(self) -> int:
            """The namespace's generation this publisher writes into (0 before entry)."""
            return self._generation

        async def __aenter__(self) -> EtcdDiscovery.Publisher:
            """Bind the namespace's owner and take this publisher's lease.

            :raises DiscoveryNamespaceNotFound: the namespace has no owner (nothing is
                created in etcd).
            :raises DiscoveryUnavailable: no member answered in time.
            :raises DiscoveryServiceError: the cluster refused (permissions, credentials).
            :raises RuntimeError: this publisher was entered before.

            Nothing is left behind when entry fails or is cancelled.
            """
            self._enter_once()
            await anyio.lowlevel.checkpoint_if_cancelled()
            gateway = Gateway(self._config)
            lease = 0
            try:
                self._generation = await _owner_generation(gateway, self._keys,
                                                           self.namespace)
                lease, ttl = await _grant(gateway, self.lease_ttl)
                keeper = LeaseKeeper(self._config, lease, ttl,
                                     f"a publisher of discovery namespace {self.namespace!r}",
                                     self._lost)
                keeper.start()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    with anyio.move_on_after(self.teardown_timeout):
                        try:
                            if lease:
                                await _revoke(gateway, lease)
                        except DiscoveryError as exc:
                            log.warning("revoking the lease of a publisher of %r that failed "
                                        "to start failed: %s", self.namespace, describe(exc))
                    await gateway.aclose()
                raise
            self._gateway, self._keeper = gateway, keeper
            return self

        async def __aexit__(self, exc_type: type[BaseException] | None,
                            exc: BaseException | None, tb: TracebackType | None) -> bool | None:
            """Withdraw every worker this publisher announced (one lease revocation).

            Bounded by ``teardown_timeout`` seconds of requests (past that, logged: the workers
            leave every view when the lease lapses, within ``lease_ttl + 0.5`` s). Never raises
            an ``Exception``. Cancellation: an enclosing cancel scope or deadline cuts the
            revocation short (the workers then leave as the lease lapses); the lease thread is
            still stopped and the connections closed, then the cancellation propagates.
            """
            self._released = True
            gateway, keeper = self._gateway, self._keeper
            self._gateway = None
            if gateway is None:
                return None
            assert keeper is not None
            keeper.stop()
            try:
                with anyio.CancelScope(shield=True):
                    # Stops within milliseconds; its lease is final once it has.
                    await anyio.to_thread.run_sync(keeper.join, _JOIN_TIMEOUT)
                with anyio.move_on_after(self.teardown_timeout) as budget:
                    try:
                        await _revoke(gateway, keeper.lease)
                    except DiscoveryError as exc:
                        log.warning("withdrawing the workers of a publisher of %r failed "
                                    "(they leave when its lease lapses, within %d s): %s",
                                    self.namespace, keeper.ttl, describe(exc))
                if budget.cancelled_caught:
                    log.warning("withdrawing the workers of a publisher of %r took longer "
                                "than %.1f s; given up (they leave when its lease lapses, "
                                "within %d s)", self.namespace, self.teardown_timeout,
                                keeper.ttl)
            finally:
                await gateway.aclose()
            return None

        async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
            """Announce a worker lifecycle change to every subscriber of the namespace.

            :param type: ``"worker-added"`` announces (or refreshes) a worker,
                ``"worker-updated"`` re-announces one this publisher announced,
                ``"worker-dropped"`` withdraws it (a no-op when unknown).
            :param metadata: the worker; at most 65 536 bytes encoded.
            :raises DiscoveryBlockExhausted: the metadata is larger than that.
            :raises DiscoveryWorkerNotFound: an update names a worker this publisher did not
                announce.
            :raises DiscoveryNamespaceNotFound: the namespace has no owner any more.
            :raises DiscoveryUnavailable: no member answered in time.
            :raises DiscoveryServiceError: the cluster refused.
            :raises RuntimeError: the publisher is not entered, or has exited.

            One transaction (about a millisecond and a half on loopback); concurrent publishes
            on one publisher are made one after the other. Cancellation: the
            request is abandoned, so the change may or may not have been made; the exit
            withdraws whatever this publisher announced either way.
            """
            check_event(type, metadata)
            gateway, keeper = self._gateway, self._keeper
            if gateway is None or keeper is None or self._released:
                raise RuntimeError("publish needs an entered publisher (inside its async with)")
            await anyio.lowlevel.checkpoint_if_cancelled()
            async with self._changing:
                if self._released:
                    raise RuntimeError("publish needs an entered publisher (inside its async "
                                       "with)")
                uid = metadata.uid
                key = self._keys.worker(uid)
                if type == "worker-dropped":
                    if self._workers.pop(uid, None) is None:
                        return
                    operation: dict[str, Any] = {"request_delete_range": {"key": b64(key)}}
                else:
                    if type == "worker-updated" and uid not in self._workers:
                        raise DiscoveryWorkerNotFound(uid)
                    encoded = metadata.to_bytes()
                    if len(encoded) > _keys.MAX_METADATA:
                        raise DiscoveryBlockExhausted(len(encoded))
                    self._workers[uid] = encoded
                    operation = {"request_put": {"key": b64(key), "value": b64(encoded),
                                                 "lease": str(keeper.lease)}}
                while True:
                    lease = keeper.lease
                    try:
                        outcome = await self._write(gateway, operation, lease)
                    except DiscoveryServiceError as exc:
                        if exc.code != NOT_FOUND:
                            raise
                        # The lease is gone (it lapsed): the lease thread is replacing it.
                        await self._next_lease(keeper, lease)
                        continue
                    if outcome == "orphaned":
                        self._workers.pop(uid, None)
                        raise DiscoveryNamespaceNotFound(self.namespace, _KIND)
                    if outcome == "rebound":
                        # A successor's namespace, which starts without the workers announced
                        # before; a drop is then done already.
                        self._workers = {uid: self._workers[uid]} if uid in self._workers else {}
                        if type == "worker-dropped":
                            return
                        continue
                    return

        async def _write(self, gateway: Gateway, operation: dict[str, Any],
                         lease: int) -> str:
            """Make one change of this publisher's: ``"done"``, ``"orphaned"`` (no owner) or
            ``"rebound"`` (a successor's generation, now this publisher's: the change was not
            made).

            Every change also moves this publisher's sequence key (bound to its lease) from the
            value it last wrote to a new random one, and is made only if the key still holds the
            former. So a request that took effect late (sent to a member that froze, retried
            on another, then applied when the frozen one woke up) changes nothing: the key has
            moved on. And an attempt whose answer was lost is known by the key holding its new
            value.

            :raises DiscoveryServiceError: with code 5 when the lease is gone.
            """
            for _ in range(8):
                current = self._sequence
                following = str(secrets.randbelow(_MAX_LEASE_ID) + 1)
                seq_key = b64(self._seq_key)
                expect: dict[str, Any] = {"key": seq_key, "result": "EQUAL"}
                expect.update({"target": "CREATE", "create_revision": "0"} if current is None
                              else {"target": "VALUE", "value": b64(current.encode())})
                if "request_put" in operation:
                    operation["request_put"]["lease"] = str(lease)
                body = _fenced(self._keys, self._generation, [operation, {"request_put": {
                    "key": seq_key, "value": b64(following.encode()), "lease": str(lease)}}])
                body["compare"].append(expect)
                body["failure"].append({"request_range": {"key": seq_key}})
                answer = await gateway.call("/v3/kv/txn", body)
                if answer.get("succeeded"):
                    self._sequence = following
                    return "done"
                owner = _failed_owner(answer)
                if owner is None:
                    return "orphaned"
                generation = int(owner.get("create_revision", 0))
                if generation != self._generation:
                    self._generation = generation
                    return "rebound"
                kvs = answer.get("responses", [{}, {}])[-1].get("response_range", {}).get("kvs")
                value = unb64(kvs[0].get("value", "")).decode() if kvs else None
                self._sequence = value  # (another attempt of ours, or the lease thread's)
                if value == following:
                    return "done"  # an earlier attempt of this change took effect
            raise DiscoveryServiceError(gateway.endpoint, None,
                                        "this publisher's sequence kept moving under it")

        async def _next_lease(self, keeper: LeaseKeeper, lost: int) -> int:
            """The lease the lease thread replaced ``lost`` with (within ``lease_ttl``; it may
            have done so already: the thread and this loop race). Polled: the thread has no
            way to wake an event loop of either backend."""
            with anyio.fail_after(max(1.0, float(keeper.ttl)) + self._config.request_timeout):
                while keeper.lease == lost:
                    await anyio.sleep(0.05)
            return keeper.lease

        async def _lost(self, gateway: Gateway) -> Replacement:
            """In the lease thread: etcd dropped our lease. Take a new one and announce every
            worker again under it (if the generation still stands)."""
            assert self._keeper is not None
            log.warning("a publisher of discovery namespace %r lost its lease (not renewed for "
                        "%d s); announcing its %d workers again", self.namespace,
                        self._keeper.ttl, len(self._workers))
            announced = dict(self._workers)
            try:
                lease, ttl = await _grant(gateway, self.lease_ttl)
                for uid, encoded in announced.items():
                    outcome = await self._write(gateway, {"request_put": {
                        "key": b64(self._keys.worker(uid)), "value": b64(encoded)}}, lease)
                    if outcome != "done":
                        break  # the owner changed: the next publish rebinds, or raises
                # A worker dropped meanwhile must not stay announced.
                for uid in set(announced) - set(self._workers):
                    await self._write(gateway, {"request_delete_range": {
                        "key": b64(self._keys.worker(uid))}}, lease)
            except DiscoveryError as exc:
                log.warning("re-announcing the workers of a publisher of %r failed (retrying): "
                            "%s", self.namespace, describe(exc))
                return self._keeper.lease, self._keeper.ttl
            return lease, ttl

        def __repr__(self) -> str:
            return (f"EtcdDiscovery.Publisher({self.namespace!r}, "
                    f"endpoints={self._config.endpoints!r})")

    class Subscriber:
        """Follow an etcd namespace's workers: an async iterable of events.

        Every ``async for`` yields ``worker-added`` for each worker of the namespace as one
        consistent read saw them, then every change in the order etcd made them, without gap
        or duplicate: a watch from the read's revision + 1, resumed after a member fails from
        the last revision seen + 1, and after a compaction (the history it needed is gone)
        with the net difference. ``worker-updated`` comes only when some field changed;
        ``worker-dropped`` when a publisher withdraws a worker, its lease lapses, or the owner
        goes (every worker then; a successor's workers follow as ``worker-added``).

        All iterations in one process of the same namespace and cluster (same endpoints,
        prefix, TLS and credentials) share one watch; each has its own bounded buffer (a
        consumer that falls far behind is brought up to date with the net change). The
        watched member is pinged every second and left when a ping takes more than a second.

        Pickles as its constructor call without the password or an ``SSLContext``.

        Parameters as for :class:`EtcdDiscovery`. Starting an iteration raises
        :class:`DiscoveryNamespaceNotFound` (no owner now), :class:`DiscoveryUnavailable`
        or :class:`DiscoveryServiceError`; a later step raises ``DiscoveryServiceError``
        when the cluster refuses the watch for good (permission denied). Closing or
        cancelling an iteration affects no other; the watch ends with the last one.

        :raises TypeError: an argument has the wrong type.
        :raises ValueError: an argument is out of range.
        """

        if TYPE_CHECKING:
            def __new__(cls, namespace: str, *, endpoints: Endpoints = DEFAULT_ENDPOINT,
                        prefix: str = DEFAULT_PREFIX, tls: TLS | None = None,
                        username: str | None = None, password: str | None = None,
                        connect_timeout: float = 1.0,
                        request_timeout: float = 2.0) -> DiscoverySubscriberLike: ...

        def __init__(
            self,
            namespace: str,
            *,
            endpoints: Endpoints = DEFAULT_ENDPOINT,
            prefix: str = DEFAULT_PREFIX,
            tls: TLS | None = None,
            username: str | None = None,
            password: str | None = None,
            connect_timeout: float = 1.0,
            request_timeout: float = 2.0,
        ) -> None:
            self.namespace = _validate.namespace(namespace)
            self._config = _connection(endpoints, prefix, tls, username, password,
                                       connect_timeout, request_timeout)

        def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            from anywool.discovery.etcd._source import EtcdOpener

            return _hub.iterate_with(EtcdOpener(self.namespace, self._config.with_env_password()))

        def __reduce__(self) -> tuple[Any, ...]:
            return (_make_subscriber, (self.namespace, _portable(self._config)))

        def __eq__(self, other: object) -> bool:
            if not isinstance(other, EtcdDiscovery.Subscriber):
                return NotImplemented
            return (self.namespace, self._config) == (other.namespace, other._config)

        def __hash__(self) -> int:
            return hash((self.namespace, self._config.endpoints, self._config.prefix))

        def __repr__(self) -> str:
            return (f"EtcdDiscovery.Subscriber({self.namespace!r}, "
                    f"endpoints={self._config.endpoints!r})")


def _portable(config: Config) -> dict[str, Any]:
    c = config.portable()
    return {"endpoints": c.endpoints, "prefix": c.prefix, "tls": c.tls, "username": c.username,
            "connect_timeout": c.connect_timeout, "request_timeout": c.request_timeout}


def _make_subscriber(namespace: str, connection: dict[str, Any]) -> DiscoverySubscriberLike:
    return EtcdDiscovery.Subscriber(namespace, **connection)


def _make_discovery(namespace: str, connection: dict[str, Any], lease_ttl: int,
                    teardown_timeout: float, own: bool) -> EtcdDiscovery:
    return EtcdDiscovery(namespace, lease_ttl=lease_ttl, teardown_timeout=teardown_timeout,
                         own=own, **connection)

