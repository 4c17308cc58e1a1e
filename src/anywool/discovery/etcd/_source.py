"""The shared source of an etcd namespace: one watch per process, namespace and cluster.

An :class:`EtcdSource` is a source of :mod:`anywool.discovery._hub` like the local and LAN
ones: the hub gives it its consumers, fan-out, bounded buffers with overflow resynchronisation,
snapshots for late joiners, and stops it with its last consumer. What it adds is what it
follows: the namespace's key range, read once at revision R (the snapshot, taken by the first
iteration in its own event loop) and then watched from R + 1, so that nothing is missed and
nothing is seen twice. Its thread runs an asyncio event loop of its own for the watch (the hub's
sources are threads; consumers on any loop, asyncio or trio, share them).

The view is the namespace's workers while an owner key exists, and nothing while none does:
the owner's death (its lease lapsing) drops every worker it knew, and a successor's claim
(which deletes the stale workers in the same transaction) starts from none. Each watch message
holds one revision's changes in order; they become events one by one.

Liveness. A member that dies closes the stream at once; a frozen one is silent, so the watched
member is pinged (a serializable read of the owner key) every :data:`PING_INTERVAL` seconds,
and a ping that fails within :data:`PING_TIMEOUT` abandons it. Either way the watch resumes on
the next endpoint from the last revision seen + 1. A watch whose start was compacted away is
cancelled by etcd; the source then reads the range again and hands out the net difference.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import anyio

from anywool.discovery import _hub, _view
from anywool.discovery._protocols import DiscoveryEvent
from anywool.discovery.etcd._config import Config
from anywool.discovery.etcd._gateway import Gateway, header_revision
from anywool.discovery.etcd._http import TransportError, describe
from anywool.discovery.etcd._keys import Keys, b64, unb64
from anywool.errors import DiscoveryNamespaceNotFound, DiscoveryServiceError, DiscoveryUnavailable
from anywool.metadata import WorkerMetadata

log = logging.getLogger(__name__)

#: Seconds between pings of the watched member; a frozen member is left within
#: PING_INTERVAL + PING_TIMEOUT seconds.
PING_INTERVAL = 1.0
PING_TIMEOUT = 1.0
#: Longest pause between rounds of reconnection attempts when no member answers.
MAX_BACKOFF = 1.0
#: gRPC codes of a refusal for good (once a fresh token was refused too).
_REFUSED = (7, 16)

_SALT = secrets.token_bytes(16)


def source_key(namespace: str, config: Config) -> tuple[str, float]:
    """The hub key of ``namespace`` followed through ``config``: iterations share a watch only
    when they reach the same cluster the same way (salted: the key says nothing of a
    password)."""
    digest = hashlib.blake2b(namespace.encode("utf-8", "surrogatepass") + b"\0"
                             + config.identity(), key=_SALT, digest_size=8)
    return (f"etcd-{digest.hexdigest()}", PING_INTERVAL)


@dataclass
class Snapshot:
    """The namespace's keys at one revision."""

    revision: int
    values: dict[bytes, bytes]
    #: The owner key's create revision, ``None`` when it has no owner.
    generation: int | None

    @classmethod
    def read(cls, keys: Keys, answer: dict[str, Any]) -> Snapshot:
        values: dict[bytes, bytes] = {}
        generation = None
        for kv in answer.get("kvs", ()):
            key = unb64(kv.get("key", ""))
            values[key] = unb64(kv.get("value", ""))
            if key == keys.owner:
                generation = int(kv.get("create_revision", 0))
        return cls(header_revision(answer), values, generation)


async def read_snapshot(gateway: Gateway, keys: Keys) -> Snapshot:
    """The namespace's keys now (one linearizable range)."""
    answer = await gateway.call("/v3/kv/range", {"key": b64(keys.base),
                                                 "range_end": b64(keys.end)})
    return Snapshot.read(keys, answer)


class _Silent(Exception):
    """The watched member did not answer a ping in time."""


class EtcdSource(_hub.Source):
    """One watched etcd namespace shared by every consumer in this process (see the module)."""

    def __init__(self, key: tuple[str, float], namespace: str, config: Config,
                 snapshot: Snapshot) -> None:
        super().__init__(key, namespace, PING_INTERVAL)
        self.config = config
        self.keys = Keys(config.prefix, namespace)
        self.revision = snapshot.revision
        #: The generation whose workers the view holds (``None``: orphaned); written under
        #: ``lock`` (attaching threads read it).
        self.owner_generation: int | None = snapshot.generation
        # Every worker key's metadata, whether or not an owner exists now (the view shows them
        # only while one does).
        self._workers: dict[UUID, WorkerMetadata] = {}
        self._snapshot: Snapshot | None = snapshot
        self._undecodable: set[bytes] = set()
        self.resyncs = 0
        # Whether the last watch was refused with a token since forgotten: the next refusal
        # comes with a fresh token, so it is for good.
        self._refused = False

    def prime(self) -> list[DiscoveryEvent]:
        """Take the snapshot the first iteration read as the view (no I/O): the first
        consumer's ``worker-added`` events."""
        snapshot, self._snapshot = self._snapshot, None
        assert snapshot is not None
        return self._deliver(*self._replace(snapshot))

    # -- views --

    def _decode(self, key: bytes, value: bytes) -> WorkerMetadata | None:
        try:
            return WorkerMetadata.from_bytes(value)
        except Exception:
            if key not in self._undecodable:
                self._undecodable.add(key)
                log.warning("etcd key %r of discovery namespace %r does not hold worker "
                            "metadata; ignored", key, self.namespace)
            return None

    def _replace(self, snapshot: Snapshot) -> tuple[list[DiscoveryEvent],
                                                     dict[UUID, WorkerMetadata]]:
        """The events from the current view to ``snapshot``'s, and that view."""
        workers: dict[UUID, WorkerMetadata] = {}
        for key, value in snapshot.values.items():
            uid = self.keys.uid_of(key)
            if uid is not None:
                metadata = self._decode(key, value)
                if metadata is not None and metadata.uid == uid:
                    workers[uid] = metadata
        self._workers = workers
        with self.lock:
            self.owner_generation = snapshot.generation
        self.revision = max(self.revision, snapshot.revision)
        view = dict(workers) if snapshot.generation is not None else {}
        return _view.diff(self.view, view), view

    def _apply(self, changes: list[dict[str, Any]]) -> list[DiscoveryEvent]:
        """The events of one watch message's changes, in order."""
        events: list[DiscoveryEvent] = []
        owned = self.owner_generation is not None
        for change in changes:
            kv = change.get("kv", {})
            key = unb64(kv.get("key", ""))
            deleted = change.get("type") == "DELETE"  # absent: a PUT
            if key == self.keys.owner:
                if deleted:
                    events += [DiscoveryEvent("worker-dropped", m)
                               for m in self._visible(owned).values()]
                    owned, generation = False, None
                else:
                    generation = int(kv.get("create_revision", 0))
                    if owned and generation == self.owner_generation:
                        continue  # the same owner's record rewritten
                    events += [DiscoveryEvent("worker-dropped", m)
                               for m in self._visible(owned).values()]
                    owned = True
                    events += [DiscoveryEvent("worker-added", m) for m in self._workers.values()]
                with self.lock:
                    self.owner_generation = generation
                continue
            uid = self.keys.uid_of(key)
            if uid is None:
                continue
            known = self._workers.get(uid)
            new = None if deleted else self._decode(key, unb64(kv.get("value", "")))
            if new is not None and new.uid != uid:
                new = None
            if new is None:
                self._workers.pop(uid, None)
            else:
                self._workers[uid] = new
            if owned:
                event = _view.event_for(known, new)
                if event is not None:
                    events.append(event)
        return events

    def _visible(self, owned: bool) -> dict[UUID, WorkerMetadata]:
        return self._workers if owned else {}

    # -- the thread --

    def _serve(self) -> None:
        anyio.run(self._follow, backend="asyncio")

    async def _follow(self) -> None:
        gateway = Gateway(self.config)
        refused: DiscoveryServiceError | None = None
        try:
            async with anyio.create_task_group() as tg:

                async def stop_on_request() -> None:
                    await anyio.wait_readable(self.stop_r)
                    tg.cancel_scope.cancel()

                tg.start_soon(stop_on_request)
                try:
                    await self._watch_forever(gateway)
                except DiscoveryServiceError as exc:
                    refused = exc  # raised below, not wrapped in the task group's group
                tg.cancel_scope.cancel()
        finally:
            await gateway.aclose()
        if refused is not None:
            raise refused

    async def _watch_forever(self, gateway: Gateway) -> None:
        failures = 0
        last_failure: str | None = None
        while True:
            endpoint = gateway.endpoint
            try:
                await self._watch(gateway, endpoint)
                failures = 0
                continue
            except DiscoveryServiceError as exc:
                if exc.code in _REFUSED:  # permission denied, unauthenticated: for good
                    raise
                reason = describe(exc)
            except (TransportError, DiscoveryUnavailable, _Silent, TimeoutError,
                    ValueError) as exc:
                reason = describe(exc)
            if reason != last_failure:
                log.warning("the watch of discovery namespace %r on %s failed, resuming on the "
                            "next member: %s", self.namespace, endpoint, reason)
                last_failure = reason
            gateway.rotate()
            failures += 1
            if failures >= len(self.config.endpoints):  # a round without any member
                rounds = failures // len(self.config.endpoints)
                await anyio.sleep(min(MAX_BACKOFF, 0.05 * 2 ** rounds))

    async def _watch(self, gateway: Gateway, endpoint: str) -> None:
        """Follow the namespace on ``endpoint`` until the stream fails (raises) or etcd
        cancels it after a compaction (returns, resynchronised)."""
        body = {"create_request": {
            "key": b64(self.keys.base), "range_end": b64(self.keys.end),
            "start_revision": str(self.revision + 1), "prev_kv": True, "progress_notify": True}}
        silent = False
        failure: BaseException | None = None
        refused: DiscoveryServiceError | None = None
        async with anyio.create_task_group() as tg:

            async def ping() -> None:
                nonlocal silent, refused
                body = {"key": b64(self.keys.owner), "serializable": True, "keys_only": True}
                while True:
                    await anyio.sleep(PING_INTERVAL)
                    _hub.hub().drain_deferred()
                    with self.lock:
                        if self.unlisted and not self.consumers:
                            tg.cancel_scope.cancel()  # a stop that could not be delivered
                            return
                    try:
                        await gateway.call("/v3/kv/range", body, endpoint=endpoint,
                                           timeout=PING_TIMEOUT)
                    except DiscoveryServiceError as exc:
                        # A unary call renews an expired token itself: a refusal is for good.
                        if exc.code in _REFUSED:
                            refused = exc
                        else:
                            silent = True
                        tg.cancel_scope.cancel()
                        return
                    except DiscoveryUnavailable:
                        silent = True
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(ping)
            try:
                async with gateway.stream("/v3/watch", body, endpoint) as messages:
                    async for message in messages:
                        if "error" in message:
                            error = message["error"]
                            raise DiscoveryServiceError(endpoint, error.get("grpc_code"),
                                                        str(error.get("message", error)))
                        result = message.get("result", {})
                        if result.get("canceled"):
                            if result.get("compact_revision"):
                                await self._resync(gateway)
                                break
                            reason = str(result.get("cancel_reason", "no reason given"))
                            code = 7 if "PermissionDenied" in reason else \
                                16 if "Unauthenticated" in reason else None
                            if code is not None and self.config.username is not None \
                                    and not self._refused:
                                # An expired token (the member was out of reach longer than
                                # the token's TTL) is refused like a missing permission: try
                                # once more with a fresh one.
                                self._refused = True
                                gateway.forget_token()
                                code = None
                            raise DiscoveryServiceError(
                                endpoint, code, "the watch was cancelled: " + reason)
                        self._refused = False
                        changes = result.get("events")
                        if changes:
                            self._deliver(self._apply(changes))
                            # Not the header's revision: a watch catching up on its history
                            # gets it in batches of 1 000 revisions (and its "created" message
                            # first), each headed with the *current* revision; resuming from
                            # that after a failure mid-way would skip the rest.
                            last = changes[-1].get("kv", {}).get("mod_revision", 0)
                            self.revision = max(self.revision, int(last))
                        elif not result.get("created"):
                            # A progress notification: etcd sends one only to a watch that is
                            # up to date.
                            self.revision = max(self.revision, header_revision(result))
            except (TransportError, DiscoveryServiceError, DiscoveryUnavailable, TimeoutError,
                    ValueError) as exc:
                failure = exc
            tg.cancel_scope.cancel()
        if refused is not None:
            raise refused
        if silent:
            raise _Silent(f"{endpoint} did not answer a ping within {PING_TIMEOUT} s")
        if failure is not None:
            raise failure
        if not self._listed():
            raise anyio.get_cancelled_exc_class()()  # the source was stopped meanwhile

    def _listed(self) -> bool:
        with self.lock:
            return not (self.unlisted and not self.consumers)

    async def _resync(self, gateway: Gateway) -> None:
        """After a compaction: read the range again and hand out the net difference."""
        self.resyncs += 1
        snapshot = await read_snapshot(gateway, self.keys)
        events, view = self._replace(snapshot)
        self._deliver(events, replacement=view)
        self.revision = snapshot.revision
        log.info("discovery namespace %r resynchronised after a compaction at revision %d",
                 self.namespace, snapshot.revision)


class EtcdOpener(_hub.Opener):
    """Attaches an iteration to its namespace's shared source (making it if need be)."""

    def __init__(self, namespace: str, config: Config) -> None:
        self.namespace = namespace
        self.config = config
        self.snapshot: Snapshot | None = None

    async def prepare(self) -> None:
        """Read the namespace now, in the iteration's own event loop.

        :raises DiscoveryNamespaceNotFound: it has no owner now.
        :raises DiscoveryUnavailable: no member answered.
        :raises DiscoveryServiceError: a member refused the read.
        """
        gateway = Gateway(self.config)
        try:
            self.snapshot = await read_snapshot(gateway, Keys(self.config.prefix,
                                                              self.namespace))
        finally:
            await gateway.aclose()
        if self.snapshot.generation is None:
            raise DiscoveryNamespaceNotFound(self.namespace, "EtcdDiscovery")

    def attach_in_loop(self, consumer: _hub.Consumer) -> _hub.Source | None:
        snapshot = self.snapshot
        assert snapshot is not None
        hub = _hub.hub()
        key = source_key(self.namespace, self.config)

        def build() -> tuple[_hub.Source, list[DiscoveryEvent]]:
            fresh = EtcdSource(key, self.namespace, self.config, snapshot)
            return fresh, fresh.prime()

        def current(source: _hub.Source) -> bool:
            # A source that follows an earlier generation (or none: orphaned) is left to its
            # consumers; a new iteration sees the owner it found.
            return isinstance(source, EtcdSource) and \
                source.owner_generation == snapshot.generation

        return hub.join(key, consumer, build, current=current)

    def attach(self, consumer: _hub.Consumer, checkpoint: Callable[[], None]) -> _hub.Source:
        source = self.attach_in_loop(consumer)
        assert source is not None
        return source
