"""The shared source of a LAN namespace: one zeroconf browser per process and key.

A :class:`LanSource` is a source of :mod:`anywool.discovery._hub` like a local one: the hub
gives it its consumers, fan-out, bounded buffers and overflow resynchronisation, snapshots for
late joiners, and stops it with its last consumer. What it adds is what it follows: a
``Zeroconf`` with an ``AsyncServiceBrowser`` for the namespace's service type, made when the
first iteration attaches (in that iteration's worker thread) and closed when the source's
thread ends. The browser's callbacks (in zeroconf's loop thread) only write a byte to a hint
pipe; the source's thread wakes on it, or every :data:`POLL_INTERVAL` seconds, reads the TXT
records of the service type from zeroconf's cache, and hands the difference from its view to
every consumer.

The view is the verified record the source holds for each instance name, not what the cache
shows: a record that does not verify changes nothing, not even for a name held. zeroconf's cache
obeys the mDNS cache flush (RFC 6762 §10.2): any record of a name sent with the cache-flush bit,
a forged one too, marks the cached record to expire within a second, and anyone may send a
goodbye for a name's PTR. So a held record leaves only on its publisher's goodbye (a TXT goodbye
of its very data, which a :class:`~._zeroconf.GoodbyeListener` collects), when its own TTL from
its latest announcement runs out, or for a verified record with a higher sequence number; the
source puts a held record that a flush cut short back into the cache with its own lifetime
(:func:`~._zeroconf.restore_txt`), so that its goodbye is still delivered.

Sources are keyed by the namespace's service type, the interfaces and the secret, so that
iterations with different secrets never share what they accept. The key holds a digest of the
interfaces and the secret made with a random salt of this process: it tells keys apart without
saying anything about the secret, also to whoever reads :func:`anywool.lowlevel.discovery_stats`.

What this module must never do: block zeroconf's loop (its callbacks only append to a list and
write to a pipe), or touch zeroconf from an event loop's thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple
from uuid import UUID

from zeroconf import Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser

from anywool.discovery import _hub, _view
from anywool.discovery._protocols import DiscoveryEvent
from anywool.discovery.lan import _service, _zeroconf
from anywool.metadata import WorkerMetadata

log = logging.getLogger(__name__)

#: Seconds between checks of record expiry (besides every browser callback): a worker whose
#: records expired leaves the view at most this long after their TTL.
POLL_INTERVAL = 0.5

_SALT = secrets.token_bytes(16)


def source_key(namespace: str, interfaces: tuple[str | int, ...] | None,
               secret: bytes | None) -> tuple[str, float]:
    """The hub key of a LAN namespace followed on ``interfaces`` with ``secret``. It holds the
    namespace's own digest, not only its service type's hash: two namespaces whose types
    collide get two sources, each accepting its own records only."""
    type_hash = _service.service_type(namespace)[4:16]
    variant = hashlib.blake2b(_service.namespace_digest(namespace) + repr(interfaces).encode()
                              + b"\0" + (secret or b""), key=_SALT, digest_size=6)
    variant.update(b"signed" if secret is not None else b"unsigned")
    return (f"lan-{type_hash}-{variant.hexdigest()}", POLL_INTERVAL)


class _Held(NamedTuple):
    """The verified record a source holds for an instance name, from its latest sighting."""

    sequence: int
    created: float  # milliseconds of zeroconf's clock, of the sighting that set ``expires``
    ttl: int  # seconds
    data: bytes
    metadata: WorkerMetadata

    @property
    def expires(self) -> float:
        return self.created + self.ttl * 1000


class LanSource(_hub.Source):
    """One browsed LAN namespace shared by every consumer in this process (see the module)."""

    def __init__(self, key: tuple[str, float], namespace: str,
                 interfaces: tuple[str | int, ...] | None, secret: bytes | None) -> None:
        super().__init__(key, namespace, POLL_INTERVAL)
        self.type = _service.service_type(namespace)
        self.digest = _service.namespace_digest(namespace)
        self.interfaces = interfaces
        self.secret = secret
        self.zc: Zeroconf | None = None
        self.browser: AsyncServiceBrowser | None = None
        # The hint pipe: written by browser callbacks in zeroconf's thread, read by ours.
        # Written and closed only under ``_hint_lock`` (a closed descriptor's number may be
        # reused at once by any file of the process).
        self._hint_lock = threading.Lock()
        self._hint_r = self._hint_w = -1
        self.listener: _zeroconf.GoodbyeListener | None = None
        # The verified record held for each instance name (lower case): see _refresh.
        self._held: dict[str, _Held] = {}
        # What each (instance, TXT data) decoded to last round, with its sequence number:
        # records are re-read every round, but decoded and verified once.
        self._decoded: dict[tuple[str, bytes], tuple[int, WorkerMetadata] | None] = {}
        # The address a record of the namespace that did not verify claims, from the latest
        # round (for a subscriber to explain an empty view; see unverified()).
        self.unverified: str | None = None
        self._unverified: dict[tuple[str, bytes], str] = {}

    def prime(self) -> list[DiscoveryEvent]:
        """Start zeroconf and the browser (in the attaching worker thread). The view is empty
        until the browser's first answers come in, so the first consumer's snapshot is empty
        and its workers arrive as ``worker-added`` changes.

        :raises OSError: zeroconf cannot use the interfaces.
        """
        self._hint_r, self._hint_w = os.pipe()
        os.set_blocking(self._hint_r, False)
        os.set_blocking(self._hint_w, False)
        self.zc = zc = _zeroconf.open_zeroconf(self.interfaces)
        self.listener = listener = _zeroconf.GoodbyeListener(self.type, self._on_change)
        _zeroconf.call(zc, zc.async_add_listener, listener, None)
        self.browser = _zeroconf.call(
            zc, lambda: AsyncServiceBrowser(zc, self.type, handlers=[self._on_change]))
        return []

    # -- in zeroconf's loop --

    def _on_change(self, **_: object) -> None:
        with self._hint_lock:
            if self._hint_w >= 0:
                try:
                    os.write(self._hint_w, b"\0")
                except OSError:
                    pass  # full: a wake-up is pending already

    # -- in the source's thread --

    def _open_hint(self) -> int | None:
        return self._hint_r

    def _drain_hint(self) -> None:
        try:
            os.read(self._hint_r, 4096)
        except OSError:
            pass

    def _refresh(self, probe: bool = False,
                 checkpoint: Callable[[], None] | None = None) -> list[DiscoveryEvent]:
        zc, listener = self.zc, self.listener
        if zc is None or listener is None:
            return []
        now, goodbyes, records = _zeroconf.call(zc, _zeroconf.txt_records, zc, self.type,
                                                listener, self._held)
        self.scans += 1
        withdrawn = set(goodbyes)
        decoded: dict[tuple[str, bytes], tuple[int, WorkerMetadata] | None] = {}
        held: dict[str, _Held] = {}
        flushed: list[tuple[str, _zeroconf.TxtRecord]] = []
        unverified: str | None = None
        for name, texts in records:
            current = self._held.get(name)
            floor = -1  # records of this sequence number or lower are not taken
            if current is not None and (name, current.data) in withdrawn:
                # Its publisher's goodbye: gone, and no record it superseded comes back.
                current, floor = None, current.sequence
            if current is not None:
                current = self._sighted(name, current, texts, flushed)
                if current.expires <= now:
                    current = None  # its TTL ran out: its publisher is gone
            # The record held stays until its goodbye, its TTL, or a verified record of a later
            # change (a higher sequence number: a cache flush can revive a superseded record,
            # and a replayed one must not undo a change). What does not verify changes nothing.
            best = current
            for created, ttl, data in texts:
                if created + ttl * 1000 <= now or (current is not None
                                                   and data == current.data):
                    continue
                found = self._decode(name, data, decoded)
                if found is None:
                    if unverified is None:
                        unverified = self._unverified.get((name, data))
                elif found[0] > floor and (best is None or (found[0], created) >
                                           (best.sequence, best.created)):
                    best = _Held(found[0], created, ttl, data, found[1])
            if best is not None:
                held[name] = best
        if flushed:
            log.debug("putting back %d verified LAN records of namespace %r that another "
                      "record flushed from the cache", len(flushed), self.namespace)
            _zeroconf.call(zc, _zeroconf.restore_txt, zc, listener, flushed)
        self._held = held
        self._decoded = decoded
        self._unverified = {key: where for key, where in self._unverified.items()
                            if key in decoded}
        self.unverified = unverified
        view: dict[UUID, WorkerMetadata] = {}
        for record in held.values():
            view.setdefault(record.metadata.uid, record.metadata)
        return self._deliver(_view.diff(self.view, view), view)

    @staticmethod
    def _sighted(name: str, current: _Held, texts: list[_zeroconf.TxtRecord],
                 flushed: list[tuple[str, _zeroconf.TxtRecord]]) -> _Held:
        """``current`` as the cache shows it now: refreshed if its publisher announced it
        again (a later expiry), unchanged if not; and noted in ``flushed`` if the cache cut
        its life short (a cache flush by another record of its name: see
        :func:`_zeroconf.restore_txt`)."""
        for created, ttl, data in texts:
            if data != current.data:
                continue
            expires = created + ttl * 1000
            if expires > current.expires:
                return _Held(current.sequence, created, ttl, data, current.metadata)
            if expires < current.expires:
                flushed.append((name, (current.created, current.ttl, data)))
        return current

    def _decode(self, name: str, data: bytes,
                decoded: dict[tuple[str, bytes], tuple[int, WorkerMetadata] | None]
                ) -> tuple[int, WorkerMetadata] | None:
        key = (name, data)
        if key in self._decoded:
            found = decoded[key] = self._decoded[key]
            return found
        try:
            entries = _service.parse_txt(data)
            found = (_service.sequence_of(entries),
                     _service.decode_txt(self.type, name, self.digest, entries, self.secret))
        except _service.UnverifiedRecord as exc:
            log.debug("ignoring the LAN record of %r in namespace %r: %s", name[:80],
                      self.namespace, exc)
            self._unverified[key] = exc.address
            found = None
        except _service.InvalidRecord as exc:
            log.debug("ignoring the LAN record of %r in namespace %r: %s", name[:80],
                      self.namespace, exc)
            found = None
        except Exception:
            # Whatever a hostile record makes decoding raise, it is one record ignored: never
            # a source that stops following its namespace.
            log.warning("ignoring a LAN record of namespace %r that failed to decode",
                        self.namespace, exc_info=True)
            found = None
        decoded[key] = found
        return found

    def _release(self) -> None:
        zc, self.zc = self.zc, None
        browser, self.browser = self.browser, None
        self.listener = None
        if self.forgotten:  # the lock may have been held by a thread the child does not have
            self._hint_lock = threading.Lock()
        if zc is not None and not self.forgotten:  # a forked child has no loop thread to ask
            try:
                if browser is not None:
                    _zeroconf.run(zc, browser.async_cancel())
            except Exception:
                log.warning("cancelling the zeroconf browser of %r failed", self.namespace,
                            exc_info=True)
            finally:
                _zeroconf.close(zc)
        with self._hint_lock:
            for fd in (self._hint_r, self._hint_w):
                if fd >= 0:
                    os.close(fd)
            self._hint_r = self._hint_w = -1


class LanOpener(_hub.Opener):
    """Attaches an iteration to the LAN source of its key (making it if need be)."""

    __slots__ = ("interfaces", "namespace", "secret")

    def __init__(self, namespace: str, interfaces: Sequence[str | int] | None,
                 secret: bytes | None) -> None:
        self.namespace = namespace
        self.interfaces = None if interfaces is None else tuple(interfaces)
        self.secret = secret

    def attach(self, consumer: _hub.Consumer, checkpoint: Callable[[], None]) -> _hub.Source:
        hub = _hub.hub()
        hub.drain_deferred()
        key = source_key(self.namespace, self.interfaces, self.secret)

        def build() -> tuple[_hub.Source, list[DiscoveryEvent]]:
            fresh = LanSource(key, self.namespace, self.interfaces, self.secret)
            try:
                return fresh, fresh.prime()
            except BaseException:
                fresh.close()
                raise

        return hub.join(key, consumer, build)


def unverified(namespace: str, interfaces: Sequence[str | int] | None,
               secret: bytes | None) -> str | None:
    """The address claimed by a record of ``namespace`` that the live source of this process
    (for ``interfaces`` and ``secret``) saw and could not verify in its latest round, if any."""
    key = source_key(namespace, None if interfaces is None else tuple(interfaces), secret)
    hub = _hub.hub()
    with hub.lock:
        source = hub.sources.get(key)
    return source.unverified if isinstance(source, LanSource) else None
