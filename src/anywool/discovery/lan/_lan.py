"""LanDiscovery: workers announced to, and found on, the local network over mDNS/DNS-SD.

Roles, as for :class:`~anywool.LocalDiscovery`, but with no single owner: any number of hosts
publish into a LAN namespace and any number follow it.

- ``async with LanDiscovery(ns) as d`` is the :class:`~anywool.DiscoveryLike` a pool owns: it
  claims nothing (entering it only marks it in use) and hands out borrowers.
- **publisher**: ``async with LanDiscovery.Publisher(ns) as p`` starts a ``Zeroconf`` of its own
  and announces workers with ``await p.publish(...)`` (see :mod:`._announcer` for the records'
  lifetime); exiting withdraws them with goodbyes.
- **subscriber**: ``async for event in LanDiscovery.Subscriber(ns)`` follows the namespace's
  workers; iterations in one process share one browser per namespace, interfaces and secret
  (see :mod:`._source`).

Signing. With a secret (``secret=``, else the process's own: ``$ANYWOOL_SECRET`` or what a
spawning pool handed a worker), every record is signed and a subscriber ignores records that do
not verify, so that a spoofed advert cannot redirect calls. Without one, records are unsigned
and a subscriber accepts every record of the namespace: fine for looking at a LAN, while
dispatch over TCP still authenticates its peer (DESIGN §8). A secret never goes into a pickle.

zeroconf is only ever constructed and called in worker threads (:mod:`._zeroconf`); no event
loop of the caller's ever blocks on it. It is imported when first used: every worker process
imports anywool, and most never go near a LAN.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import warnings
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import anyio.lowlevel
import anyio.to_thread

from anywool import _secret, _validate
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
from anywool.discovery.lan import _service
from anywool.errors import DiscoveryBlockExhausted, LoopbackAdvertisementWarning
from anywool.metadata import WorkerMetadata

if TYPE_CHECKING:
    from anywool.discovery.lan import _announcer

log = logging.getLogger(__name__)

Interfaces = Iterable[str | int]


def _check_interfaces(interfaces: object) -> tuple[str | int, ...] | None:
    """``None`` (every interface), or IP addresses (``str``) and IPv6 interface indexes
    (``int``), at least one."""
    if interfaces is None:
        return None
    if isinstance(interfaces, (str, bytes)):
        raise TypeError("interfaces must be None or an iterable of IP addresses (str) and "
                        f"interface indexes (int), not a single {type(interfaces).__name__}: "
                        f"{interfaces!r}")
    try:
        items = tuple(interfaces)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError("interfaces must be None or an iterable of IP addresses (str) and "
                        f"interface indexes (int), got {interfaces!r}") from None
    if not items:
        raise ValueError("interfaces must name at least one interface (None: all of them), "
                         f"got {interfaces!r}")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise TypeError(f"interfaces must hold IP addresses (str) and interface indexes "
                            f"(int), got {item!r} in {interfaces!r}")
        if isinstance(item, int):
            if item < 0:
                raise ValueError(f"an interface index must be >= 0, got {item!r} in "
                                 f"interfaces={interfaces!r}")
        else:
            try:
                ipaddress.ip_address(item)
            except ValueError:
                raise ValueError(f"interfaces must hold IP addresses, got {item!r} in "
                                 f"{interfaces!r}") from None
    return items


def _check_secret(secret: object) -> bytes | None:
    """An explicit secret as bytes (checked now); ``None`` stays ``None``: the process's own
    secret is taken at use."""
    return None if secret is None else _secret.resolve(secret, "secret")


class LanDiscovery(Discovery, SingleUse):
    """A discovery namespace on the local network (mDNS/DNS-SD through zeroconf).

    A :class:`~anywool.DiscoveryLike`: ``publisher``, ``subscriber`` and :meth:`subscribe`
    return borrowers whether or not this instance is entered. Unlike a
    :class:`~anywool.LocalDiscovery` nothing is claimed: entering only marks the instance in use
    (so that ``WorkerPool(discovery=d)`` leaves an instance its caller entered to its caller),
    and any number of hosts and processes publish into the same namespace.

    :param namespace: any string; it is hashed into the DNS-SD service type
        ``_aw-<48-bit hash>._tcp.local.``, and a 128-bit digest of it in every record keeps
        namespaces whose hashes collide apart.
    :param interfaces: the IP addresses (``str``) or IPv6 interface indexes (``int``) to
        multicast on, as ``zeroconf.Zeroconf(interfaces=...)`` takes them; ``None``: zeroconf's
        default (every interface).
    :param secret: ``bytes`` or ``str`` of at least 16 bytes to sign records with and to verify
        them by; ``None``: the process's own secret when it is used (``$ANYWOOL_SECRET``, or
        the one a spawning pool handed a worker), unsigned records when it has none.
    :raises TypeError: an argument has the wrong type.
    :raises ValueError: ``interfaces`` is empty or holds something that is not an IP address
        or an interface index; ``secret`` is shorter than 16 bytes. The messages name the
        parameter and the value (never a secret's value).
    :raises ImportError: zeroconf is not installed (the message names
        ``pip install 'anywool[lan]'``); so do :class:`Publisher` and :class:`Subscriber`.
    """

    def __init__(self, namespace: str, *, interfaces: Interfaces | None = None,
                 secret: bytes | str | None = None) -> None:
        _validate.installed("zeroconf", needed_by="LanDiscovery", extra="lan")
        self._namespace = _validate.namespace(namespace)
        self._interfaces = _check_interfaces(interfaces)
        self._secret = _check_secret(secret)
        self._claimed = False

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def interfaces(self) -> tuple[str | int, ...] | None:
        return self._interfaces

    @property
    def claimed(self) -> bool:
        """Whether this instance is entered and not yet exited (nothing is claimed on the LAN;
        the name is the one a pool looks for to leave an entered discovery to its caller)."""
        return self._claimed

    @property
    def publisher(self) -> LanDiscovery.Publisher:
        """A new publisher for this namespace (enter it to use it), with this instance's
        interfaces and secret."""
        return LanDiscovery.Publisher(self._namespace, interfaces=self._interfaces,
                                      secret=self._secret)

    @property
    def subscriber(self) -> DiscoverySubscriberLike:
        """A subscription to this namespace."""
        return self.subscribe()

    def subscribe(self, filter: PredicateFunction | None = None) -> DiscoverySubscriberLike:
        """A subscription to this namespace, optionally filtered by ``filter``."""
        subscription = LanDiscovery.Subscriber(self._namespace, interfaces=self._interfaces,
                                               secret=self._secret)
        return subscription if filter is None else afilter(filter, subscription)

    async def __aenter__(self) -> LanDiscovery:
        """Mark the instance in use (no I/O: nothing is claimed on a LAN).

        :raises RuntimeError: this instance was entered before.
        """
        self._enter_once()
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._claimed = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        """Mark the instance no longer in use. Never raises; the borrowers it handed out are
        unaffected (each withdraws or stops by itself)."""
        self._claimed = False
        return None

    def __repr__(self) -> str:
        return f"LanDiscovery({self._namespace!r}, interfaces={self._interfaces!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # As a fresh instance, and without the secret: a secret never goes into a pickle (the
        # process that unpickles it uses its own).
        return (_make_discovery, (self._namespace, self._interfaces))

    # -- borrowers ----------------------------------------------------------------------------

    class Publisher(SingleUse):
        """Announce workers in a LAN namespace for the lifetime of an ``async with`` block.

        Entering starts a ``Zeroconf`` of this publisher's own (in a worker thread). Each
        worker becomes a service instance named after its uid whose TXT record carries its
        metadata (signed when there is a secret). Its records have a TTL of 10 s and are
        re-announced every 2.5 s from zeroconf's own thread, so they live in every cache as
        long as this process does: a SIGKILLed publisher's workers leave every view within
        about 10 s. Exiting withdraws every worker still announced with goodbyes, which
        subscribers see as ``worker-dropped`` within a second.

        :param namespace: the namespace to publish into.
        :param interfaces: as for :class:`LanDiscovery`.
        :param secret: as for :class:`LanDiscovery`; ``None`` is resolved as the publisher
            is entered.
        :raises TypeError: an argument has the wrong type.
        :raises ValueError: an argument is out of range (see :class:`LanDiscovery`).
        """

        def __init__(self, namespace: str, *, interfaces: Interfaces | None = None,
                     secret: bytes | str | None = None) -> None:
            _validate.installed("zeroconf", needed_by="LanDiscovery", extra="lan")
            self.namespace = _validate.namespace(namespace)
            self.interfaces = _check_interfaces(interfaces)
            self._secret = _check_secret(secret)
            self._type = _service.service_type(self.namespace)
            self._digest = _service.namespace_digest(self.namespace)
            self._signing: bytes | None = None
            # Each worker's latest sequence number (see _service): raised with every change.
            self._sequences: dict[UUID, int] = {}
            self._lock = threading.Lock()  # orders publishes and the exit (worker threads)
            self._zc: Any = None
            self._announcer: _announcer.Announcer | None = None
            self._released = False

        async def __aenter__(self) -> LanDiscovery.Publisher:
            """Start zeroconf on the interfaces.

            :raises RuntimeError: this publisher was entered before.
            :raises ValueError: ``$ANYWOOL_SECRET`` (taken when no ``secret`` was given) is
                too short.
            :raises OSError: zeroconf cannot use the interfaces; nothing is left behind.

            Cancellation: a cancelled entry closes whatever it started before the
            cancellation propagates.
            """
            self._enter_once()
            await anyio.lowlevel.checkpoint_if_cancelled()
            self._signing = _secret.resolve(self._secret)
            try:
                await anyio.to_thread.run_sync(self._open)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    try:
                        await anyio.to_thread.run_sync(self._close)
                    except Exception:  # the entry's own error is the one to see
                        log.exception("closing a LAN publisher of %r that failed to start "
                                      "failed too", self.namespace)
                raise
            return self

        async def __aexit__(self, exc_type: type[BaseException] | None,
                            exc: BaseException | None, tb: TracebackType | None) -> bool | None:
            """Withdraw every worker still announced (goodbyes, sent three times over 250 ms)
            and close zeroconf, joining its thread.

            Shielded, and bounded by zeroconf's own timeouts (a wedged zeroconf loop costs at
            most a few seconds). Never raises an ``Exception`` (failures are logged).
            Cancellation: an enclosing cancellation waits for the exit, then propagates.
            """
            self._released = True
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(self._close)
                except Exception:
                    log.exception("closing the LAN publisher of %r failed", self.namespace)
            return None

        async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
            """Announce a worker lifecycle change to every subscriber of the namespace.

            :param type: ``"worker-added"`` announces (or refreshes in place),
                ``"worker-updated"`` re-announces a worker this publisher announced,
                ``"worker-dropped"`` withdraws it with goodbyes (no-op when unknown).
            :param metadata: the worker; its encoding is at most 6000 bytes (it travels in
                TXT values of 250 bytes, all in one mDNS packet). An address on the loopback
                (``127.0.0.0/8``, ``::1``, ``localhost``) or a Unix socket warns with
                :class:`~anywool.errors.LoopbackAdvertisementWarning`: no other host can reach
                it.
            :raises DiscoveryBlockExhausted: the metadata is larger than 6000 bytes encoded.
            :raises DiscoveryWorkerNotFound: an update names a worker this publisher did not
                announce.
            :raises TimeoutError: zeroconf's loop did not take the change within 5 s.
            :raises RuntimeError: the publisher is not entered, or has exited.

            Returns once the first announcement is sent; two more follow within a second.
            Cancellation: a publish in progress completes (it takes milliseconds), then the
            cancellation propagates: the change was made.
            """
            check_event(type, metadata)
            if not self._entered or self._released:
                raise RuntimeError("publish needs an entered publisher (inside its async with)")
            await anyio.lowlevel.checkpoint_if_cancelled()
            info = None
            if type != "worker-dropped":
                if _service.is_loopback(metadata.address):
                    warnings.warn(
                        f"worker {metadata.uid} is announced to the LAN with the address "
                        f"{metadata.address!r}, which no other host can reach (a pool's "
                        "workers listen on TCP with host=, e.g. '0.0.0.0')",
                        LoopbackAdvertisementWarning, stacklevel=2)
                encoded = metadata.to_bytes()
                if len(encoded) > _service.MAX_METADATA:
                    raise DiscoveryBlockExhausted(len(encoded))
                name = _service.instance_name(self._type, metadata.uid)
                sequence = self._sequences[metadata.uid] = \
                    self._sequences.get(metadata.uid, 0) + 1
                txt = _service.encode_txt(self._type, name, self._digest, encoded,
                                          self._signing, sequence)
                from anywool.discovery.lan import _announcer

                info = _announcer.service_info(self._type, name, metadata.address, txt)
            await anyio.to_thread.run_sync(self._publish, type, metadata.uid, info)

        def _open(self) -> None:
            from anywool.discovery.lan import _announcer, _zeroconf

            with self._lock:
                zc = self._zc = _zeroconf.open_zeroconf(self.interfaces)
                announcer = self._announcer = _announcer.Announcer(zc)
                _zeroconf.call(zc, announcer.start)

        def _publish(self, type: str, uid: UUID, info: Any) -> None:
            from anywool.discovery.lan import _zeroconf

            with self._lock:
                zc, announcer = self._zc, self._announcer
                if zc is None or announcer is None:
                    raise RuntimeError("the publisher has exited")
                if info is None:
                    _zeroconf.call(zc, announcer.drop, uid)
                else:
                    _zeroconf.call(zc, lambda: announcer.put(uid, info,
                                                             update=type == "worker-updated"))

        def _close(self) -> None:
            from anywool.discovery.lan import _zeroconf

            with self._lock:
                zc, announcer = self._zc, self._announcer
                self._zc = self._announcer = None
                if zc is None:
                    return
                try:
                    if announcer is not None:
                        _zeroconf.call(zc, announcer.stop)
                finally:
                    _zeroconf.close(zc)  # goodbyes for every worker still registered

        def __repr__(self) -> str:
            return f"LanDiscovery.Publisher({self.namespace!r}, interfaces={self.interfaces!r})"

    class Subscriber:
        """Follow a LAN namespace's workers: an async iterable of events.

        Every ``async for`` yields ``worker-added`` for each worker known, then every change:
        ``worker-updated`` only when some field changed, ``worker-dropped`` when a publisher
        withdraws a worker (within about a second), or when the last record of a worker that
        verified expires (its host died, or announces it only unverified: within about 10 s).
        Records that do not verify change nothing, also for a worker known (see
        :mod:`anywool.discovery.lan._source`). All iterations in one
        process over the same namespace, interfaces and secret share one zeroconf browser; each
        has its own bounded buffer (a consumer that falls far behind is resynchronised with the
        net change). A fresh browser learns the LAN's workers within about 0.1 s, at worst
        about 1.2 s (mDNS multicasts an answer to a record at most once a second): its first iteration gets them as ``worker-added`` changes, later ones
        start from what it knows.

        With a secret (``secret=``, else the process's own when iteration starts) only records
        signed with it are accepted; without one, every record of the namespace is.

        Pickles as its constructor call **without the secret**: unpickled, it takes the
        secret of the process that iterates it.

        :param namespace: the namespace to follow.
        :param interfaces: as for :class:`LanDiscovery`.
        :param secret: as for :class:`LanDiscovery`.
        :raises TypeError: an argument has the wrong type.
        :raises ValueError: an argument is out of range (see :class:`LanDiscovery`).

        Starting an iteration raises ``ValueError`` if ``$ANYWOOL_SECRET`` (taken when no
        ``secret`` was given) is too short, and (from the first step) ``OSError`` if zeroconf
        cannot use the interfaces. Closing or cancelling an iteration affects no other; the
        browser stops with the last one.
        """

        if TYPE_CHECKING:
            def __new__(cls, namespace: str, *, interfaces: Interfaces | None = None,
                        secret: bytes | str | None = None) -> DiscoverySubscriberLike: ...

        def __init__(self, namespace: str, *, interfaces: Interfaces | None = None,
                     secret: bytes | str | None = None) -> None:
            _validate.installed("zeroconf", needed_by="LanDiscovery", extra="lan")
            self.namespace = _validate.namespace(namespace)
            self.interfaces = _check_interfaces(interfaces)
            self._secret = _check_secret(secret)

        def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
            from anywool.discovery.lan._source import LanOpener

            secret = _secret.resolve(self._secret)
            return _hub.iterate_with(LanOpener(self.namespace, self.interfaces, secret))

        def _unverified(self) -> str | None:
            """The address a record of the namespace claims that this subscription's shared
            source saw in its latest round and could not verify with its secret (another
            secret's worker, or a forgery), or ``None``. A proxy that found no worker asks,
            to say that authentication is what failed."""
            from anywool.discovery.lan._source import unverified

            secret = _secret.resolve(self._secret)
            return None if secret is None else unverified(self.namespace, self.interfaces,
                                                          secret)

        def __reduce__(self) -> tuple[Any, ...]:
            return (_make_subscriber, (self.namespace, self.interfaces))

        def __eq__(self, other: object) -> bool:
            if not isinstance(other, LanDiscovery.Subscriber):
                return NotImplemented
            return (self.namespace, self.interfaces, self._secret) == \
                (other.namespace, other.interfaces, other._secret)

        def __hash__(self) -> int:
            return hash((self.namespace, self.interfaces))

        def __repr__(self) -> str:
            secret = "" if self._secret is None else ", secret=<given>"
            return (f"LanDiscovery.Subscriber({self.namespace!r}, "
                    f"interfaces={self.interfaces!r}{secret})")


def _make_subscriber(namespace: str,
                     interfaces: tuple[str | int, ...] | None) -> DiscoverySubscriberLike:
    return LanDiscovery.Subscriber(namespace, interfaces=interfaces)


def _make_discovery(namespace: str,
                    interfaces: tuple[str | int, ...] | None) -> LanDiscovery:
    return LanDiscovery(namespace, interfaces=interfaces)


def share_secret(discovery: object, secret: bytes) -> None:
    """Give ``discovery`` (a :class:`LanDiscovery`, its ``Publisher`` or ``Subscriber``, not yet
    entered or iterated) ``secret`` when it was given none of its own: a pool's ``secret=``
    signs and verifies its namespace's records too, so that the records its workers' nested
    proxies verify with the secret they inherited are signed with it."""
    if isinstance(discovery, (LanDiscovery, LanDiscovery.Publisher, LanDiscovery.Subscriber)) \
            and discovery._secret is None:  # pyright: ignore[reportPrivateUsage]
        discovery._secret = secret  # pyright: ignore[reportPrivateUsage]
