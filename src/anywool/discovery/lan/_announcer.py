"""A publisher's workers as zeroconf services, kept alive on the LAN while its process lives.

Each worker is one service instance registered in its publisher's ``Zeroconf`` (so zeroconf
answers queries for it). Its records carry a TTL of :data:`RECORD_TTL` seconds and the
announcer re-announces every worker every :data:`REFRESH_INTERVAL` seconds from zeroconf's own
event loop thread (the workers in :data:`SLICES` groups by uid, one group every
``REFRESH_INTERVAL / SLICES`` seconds, each group's records packed into as few packets as hold
them: a burst of one packet per worker overflowed receivers' socket buffers beyond about 150
workers, and the same workers, last in every burst, expired while alive), so that a worker stays in every cache exactly as long as its publisher's
process runs (whatever the publisher's own event loop is doing), and leaves every view within
``RECORD_TTL`` seconds of a SIGKILL. A change is announced at once and again after each of
:data:`RESEND_DELAYS` (mDNS is multicast over UDP: one packet may be lost); a withdrawal sends
goodbyes (TTL 0), which make subscribers drop the worker at once.

Registration does not probe for conflicting names (RFC 6762 §8.1): an instance is named after a
worker's uid, a random 128-bit value, so no other responder can claim it except by forging it,
which probing would not stop either. Skipping the probe saves 1.2 to 1.7 s per worker.

What this module must never do: touch an announcer outside zeroconf's loop (every method but
the constructor runs there, through :func:`anywool.discovery.lan._zeroconf.call`).
"""

from __future__ import annotations

import ipaddress
from uuid import UUID

from zeroconf import (
    DNSOutgoing,  # pyright: ignore[reportPrivateImportUsage]
    ServiceInfo,
    Zeroconf,
)
from zeroconf.const import _FLAGS_AA, _FLAGS_QR_RESPONSE

from anywool._address import Address
from anywool.errors import DiscoveryWorkerNotFound

#: Seconds a worker's records live in a cache without being refreshed. A SIGKILLed publisher's
#: workers leave every view within about this long (DESIGN §6 asks for 15 s at most).
RECORD_TTL = 10
#: Seconds between re-announcements of every live worker: four chances per TTL, so that a live
#: worker never expires unless three announcements in a row are lost.
REFRESH_INTERVAL = 2.5
#: Seconds after a change at which it is announced again (RFC 6762 §8.3: at least twice).
RESEND_DELAYS = (0.25, 1.0)
#: The groups a refresh interval is spread over.
SLICES = 10


def service_info(type_: str, name: str, address: str, txt: bytes) -> ServiceInfo:
    """The zeroconf service of one worker: its TXT record, and an SRV (and A/AAAA record) for
    DNS-SD tools when the worker listens on TCP at an IP address (port 0 otherwise)."""
    parsed = Address.parse(address)
    addresses: list[str] = []
    if parsed.host is not None:
        try:
            ipaddress.ip_address(parsed.host)
            addresses.append(parsed.host)
        except ValueError:
            pass  # a host name: the SRV's target stays the instance name, without an address
    return ServiceInfo(type_, name, port=parsed.port or 0, properties=txt,
                       host_ttl=RECORD_TTL, other_ttl=RECORD_TTL, parsed_addresses=addresses)


class Announcer:
    """The workers one publisher announced and has not withdrawn (see the module docstring)."""

    def __init__(self, zc: Zeroconf) -> None:
        self._zc = zc
        self._infos: dict[UUID, ServiceInfo] = {}
        self._stopped = False
        self._tick: object = None
        self._turn = 0

    # -- in zeroconf's loop --

    def start(self) -> None:
        """Start the periodic re-announcement."""
        self._schedule_refresh()

    def put(self, uid: UUID, info: ServiceInfo, *, update: bool) -> None:
        """Register or replace the worker ``uid`` and announce it.

        :param update: the worker must be registered already (a ``worker-updated``).
        :raises DiscoveryWorkerNotFound: ``update`` and this publisher did not announce ``uid``.
        :raises RuntimeError: the announcer was stopped.
        """
        if self._stopped:
            raise RuntimeError("the publisher is closing")
        registry = self._zc.registry
        info.set_server_if_missing()
        if uid in self._infos:
            registry.async_update(info)
        elif update:
            raise DiscoveryWorkerNotFound(uid)
        else:
            registry.async_add(info)
        self._infos[uid] = info
        self._send([info], None)
        for delay in RESEND_DELAYS:
            self._zc.loop.call_later(delay, self._resend, uid)  # type: ignore[union-attr]

    def drop(self, uid: UUID) -> bool:
        """Withdraw the worker ``uid`` with goodbyes; ``False`` if it was not announced here."""
        info = self._infos.pop(uid, None)
        if info is None or self._stopped:
            return False
        self._zc.registry.async_remove(info)
        self._send([info], 0)
        for delay in RESEND_DELAYS:
            self._zc.loop.call_later(delay, self._resend_goodbye, uid, info)  # type: ignore[union-attr]
        return True

    def stop(self) -> None:
        """Stop announcing; the workers stay registered, for ``Zeroconf.close`` to send their
        goodbyes."""
        self._stopped = True
        if self._tick is not None:
            self._tick.cancel()  # type: ignore[attr-defined]
            self._tick = None

    # -- scheduled --

    def _schedule_refresh(self) -> None:
        assert self._zc.loop is not None
        self._tick = self._zc.loop.call_later(REFRESH_INTERVAL / SLICES, self._refresh)

    def _refresh(self) -> None:
        if self._stopped or self._zc.done:
            return
        self._turn = (self._turn + 1) % SLICES
        group = [info for uid, info in self._infos.items() if uid.int % SLICES == self._turn]
        if group:
            self._send(group, None)
        self._schedule_refresh()

    def _resend(self, uid: UUID) -> None:
        info = self._infos.get(uid)
        if info is not None and not self._stopped:
            self._send([info], None)

    def _resend_goodbye(self, uid: UUID, info: ServiceInfo) -> None:
        if uid not in self._infos and not self._stopped:
            self._send([info], 0)

    def _send(self, infos: list[ServiceInfo], ttl: int | None) -> None:
        """Announce ``infos`` (``ttl`` 0: goodbyes), their records packed into as few packets
        as hold them (zeroconf splits an outgoing message that a packet cannot hold)."""
        if self._zc.done:
            return
        out = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
        for info in infos:
            out.add_answer_at_time(info.dns_pointer(override_ttl=ttl), 0)
            out.add_answer_at_time(info.dns_service(override_ttl=ttl), 0)
            out.add_answer_at_time(info.dns_text(override_ttl=ttl), 0)
            for record in info.get_address_and_nsec_records(override_ttl=ttl):
                out.add_answer_at_time(record, 0)
        self._zc.async_send(out)
