"""What the commands share when they reach an etcd cluster instead of this host: the ``--etcd``
options, the cluster they name, and the reads behind ``ls`` and ``show``.

The options (``--etcd URL`` repeatable, ``--etcd-prefix``, ``--etcd-user``, ``--etcd-ca``,
``--etcd-cert``, ``--etcd-key``) are defined here once, for ``worker``, ``ls``, ``show`` and
``watch``; their values become an :class:`EtcdCluster`, checked by the library's own rules
(:mod:`anywool.discovery.etcd._config`), a bad value being a usage error naming the option. A
password is never an option: the library reads ``$ANYWOOL_ETCD_PASSWORD`` when a user is given.

The reads go through anywool's own gateway (:mod:`anywool.discovery.etcd._gateway`) and key
layout (:mod:`anywool.discovery.etcd._keys`); they never write. ``ls`` is one keys-only range
of every namespace under the prefix, then the owners' records read at that range's revision
(one transaction per 64 owners): a consistent picture of one revision. ``show`` is one range of
the namespace's keys.

Nothing here imports the etcd backend (or h11) until a command uses etcd: ``anywool ls`` on this
host, or ``anywool worker --discovery local``, does not pay for them.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import click

from anywool.metadata import WorkerMetadata

if TYPE_CHECKING:
    from anywool._tls import MutualTLS
    from anywool.discovery._protocols import DiscoverySubscriberLike
    from anywool.discovery.etcd import EtcdDiscovery
    from anywool.discovery.etcd._gateway import Gateway

__all__ = [
    "DEFAULT_ENDPOINT",
    "EtcdCluster",
    "EtcdNamespace",
    "EtcdWorker",
    "cluster_for_reading",
    "etcd_options",
    "fetch",
    "given_options",
    "read_namespace",
    "survey",
]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Where ``anywool worker --discovery etcd`` looks without ``--etcd`` (the library's default;
#: a test pins that they agree, as importing it here would import the backend).
DEFAULT_ENDPOINT = "http://127.0.0.1:2379"

#: The options every command that reaches etcd takes, by parameter name (for usage errors).
OPTION_NAMES = {"etcd": "--etcd", "etcd_prefix": "--etcd-prefix", "etcd_user": "--etcd-user",
                "etcd_ca": "--etcd-ca", "etcd_cert": "--etcd-cert", "etcd_key": "--etcd-key"}

#: Owner records read per transaction (etcd refuses more than 128 operations in one).
_OWNERS_PER_TXN = 64
#: etcd's gRPC code for a revision compacted away (between ``ls``'s two reads): read again.
_OUT_OF_RANGE = 11
_ATTEMPTS = 3


def etcd_options(endpoint_help: str) -> Callable[[_F], _F]:
    """The ``--etcd*`` options (``endpoint_help`` says what ``--etcd`` does for the command)."""

    def decorate(command: _F) -> _F:
        path = click.Path(exists=True, dir_okay=False)
        for option in reversed([
            click.option("--etcd", "etcd", multiple=True, metavar="URL", help=endpoint_help),
            click.option("--etcd-prefix", default=None, metavar="PREFIX",
                         help="The key prefix anywool's keys live under (default: /anywool)."),
            click.option("--etcd-user", default=None, metavar="USER",
                         help="An etcd user to authenticate as; its password comes from "
                              "$ANYWOOL_ETCD_PASSWORD."),
            click.option("--etcd-ca", type=path, default=None,
                         help="https:// members: the CA bundle to verify them with (PEM; "
                              "default: the system's CAs)."),
            click.option("--etcd-cert", type=path, default=None,
                         help="https:// members: a client certificate (PEM, with its key "
                              "unless --etcd-key); needs --etcd-ca."),
            click.option("--etcd-key", type=path, default=None,
                         help="The client certificate's private key (PEM)."),
        ]):
            command = option(command)
        return command

    return decorate


def given_options(values: dict[str, Any]) -> list[str]:
    """The ``--etcd*`` options among a command's parameter ``values`` that were given."""
    return [option for name, option in OPTION_NAMES.items() if values.get(name)]


@dataclass(frozen=True)
class EtcdCluster:
    """A cluster as the options name it, checked (see :meth:`from_options`)."""

    endpoints: tuple[str, ...]
    prefix: str
    tls: ssl.SSLContext | MutualTLS | None
    username: str | None

    @classmethod
    def from_options(cls, etcd: tuple[str, ...], etcd_prefix: str | None,
                     etcd_user: str | None, etcd_ca: str | None, etcd_cert: str | None,
                     etcd_key: str | None) -> EtcdCluster:
        """The cluster the options name; without ``--etcd``, the default endpoint.

        :raises click.UsageError: a value the library refuses, or a certificate without its CA
            (the message names the option).
        """
        from anywool._tls import MutualTLS
        from anywool.discovery.etcd import _config

        endpoints = etcd or (_config.DEFAULT_ENDPOINT,)
        try:
            urls = _config.check_endpoints(list(endpoints))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--etcd'") from None
        try:
            prefix = _config.check_prefix(etcd_prefix if etcd_prefix is not None
                                          else _config.DEFAULT_PREFIX)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--etcd-prefix'") from None
        if etcd_user == "":
            raise click.BadParameter("must not be empty", param_hint="'--etcd-user'")
        if etcd_key and not etcd_cert:
            raise click.UsageError("--etcd-key needs --etcd-cert")
        tls: ssl.SSLContext | MutualTLS | None = None
        if etcd_cert:
            if not etcd_ca:
                raise click.UsageError("--etcd-cert needs --etcd-ca (the CA the members' "
                                       "certificates chain to)")
            try:
                tls = MutualTLS(etcd_cert, etcd_key, cafile=etcd_ca)
            except (TypeError, ValueError) as exc:
                raise click.UsageError(str(exc)) from None
        elif etcd_ca:
            try:
                tls = ssl.create_default_context(cafile=etcd_ca)
            except (ssl.SSLError, OSError) as exc:
                raise click.BadParameter(f"cannot load a CA bundle from {etcd_ca}: {exc}",
                                         param_hint="'--etcd-ca'") from None
        if tls is not None and not urls[0].startswith("https:"):
            raise click.UsageError("--etcd-ca and --etcd-cert are for https:// members, got "
                                   + ", ".join(urls))
        return cls(urls, prefix, tls, etcd_user)

    def where(self) -> str:
        """``etcd at URL, URL under /prefix``: how messages and titles name the cluster."""
        return f"etcd at {', '.join(self.endpoints)} under {self.prefix}"

    def connection(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~anywool.EtcdDiscovery` and its borrowers."""
        return {"endpoints": self.endpoints, "prefix": self.prefix, "tls": self.tls,
                "username": self.username}

    def discovery(self, namespace: str, *, lease_ttl: int | None, own: bool) -> EtcdDiscovery:
        """An owner of ``namespace`` (``own=False``: a borrower of another owner's).

        :raises TypeError, ValueError: as :class:`~anywool.EtcdDiscovery` raises them.
        """
        from anywool.discovery.etcd import EtcdDiscovery

        extra: dict[str, Any] = {} if lease_ttl is None else {"lease_ttl": lease_ttl}
        return EtcdDiscovery(namespace, own=own, **extra, **self.connection())

    def subscriber(self, namespace: str) -> DiscoverySubscriberLike:
        from anywool.discovery.etcd import EtcdDiscovery

        return EtcdDiscovery.Subscriber(namespace, **self.connection())

    def gateway(self) -> Gateway:
        from anywool.discovery.etcd._config import Config
        from anywool.discovery.etcd._gateway import Gateway

        return Gateway(Config.make(self.endpoints, self.prefix, self.tls, self.username, None,
                                   1.0, 2.0))


@dataclass(frozen=True)
class EtcdWorker:
    """A worker key: its metadata and the lease of the publisher that announced it (0: none)."""

    metadata: WorkerMetadata
    lease: int


@dataclass
class EtcdNamespace:
    """What etcd holds of one namespace under the prefix, at one revision.

    ``state`` is ``live`` while an owner key exists, ``orphaned`` when only worker keys are left
    (a displaced owner's publishers: no subscriber sees them, and the next claim deletes them).
    """

    #: The namespace's key directory (``<prefix>/ns/<sha256 of the name>``).
    key: str
    state: str
    #: As the owner recorded them (``None``: no owner, or not recorded).
    name: str | None = None
    owner_pid: int | None = None
    owner_host: str | None = None
    lease_ttl: int | None = None
    #: The owner key's create revision.
    generation: int | None = None
    worker_count: int = 0
    #: Publishers' leases and how many workers are bound to each.
    leases: dict[int, int] = field(default_factory=dict[int, int])
    #: ``show`` only: the workers, in key order.
    workers: list[EtcdWorker] | None = None
    #: Keys that do not hold what they should (an owner record or worker metadata).
    error: str | None = None


def _owner(state: EtcdNamespace, kv: dict[str, Any], record: dict[str, Any]) -> None:
    state.state = "live"
    state.generation = int(kv.get("create_revision", 0))
    name, pid, host, ttl = (record.get(k) for k in ("namespace", "pid", "host", "lease_ttl"))
    state.name = name if isinstance(name, str) else None
    state.owner_pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
    state.owner_host = host if isinstance(host, str) else None
    state.lease_ttl = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None
    if not record:
        state.error = "the owner key does not hold an owner record"


def _count_lease(state: EtcdNamespace, lease: int) -> None:
    if lease:  # 0: a key bound to no lease (the library never writes one)
        state.leases[lease] = state.leases.get(lease, 0) + 1


async def survey(cluster: EtcdCluster) -> list[EtcdNamespace]:
    """Every namespace under the cluster's prefix, as of one revision, in key order.

    :raises DiscoveryUnavailable: no member answered in time.
    :raises DiscoveryServiceError: the cluster refused (permissions, credentials).
    """
    from anywool.errors import DiscoveryServiceError

    gateway = cluster.gateway()
    try:
        for attempt in range(_ATTEMPTS):
            try:
                return await _survey(gateway, cluster.prefix)
            except DiscoveryServiceError as exc:
                if exc.code != _OUT_OF_RANGE or attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")
    finally:
        await gateway.aclose()


async def _survey(gateway: Gateway, prefix: str) -> list[EtcdNamespace]:
    from anywool.discovery.etcd import _keys
    from anywool.discovery.etcd._gateway import header_revision

    start, end = _keys.namespaces_range(prefix)
    answer = await gateway.call("/v3/kv/range", {"key": _keys.b64(start),
                                                 "range_end": _keys.b64(end),
                                                 "keys_only": True})
    revision = header_revision(answer)
    found: dict[bytes, EtcdNamespace] = {}
    owners: list[tuple[bytes, dict[str, Any]]] = []
    for kv in answer.get("kvs", ()):
        key = _keys.unb64(kv.get("key", ""))
        digest, _, rest = key[len(start):].partition(b"/")
        if rest.startswith(b"seq/"):
            continue  # a publisher's sequence key (bookkeeping of its writes)
        base = start + digest
        state = found.get(base)
        if state is None:
            state = found[base] = EtcdNamespace(base.decode(errors="replace"), "orphaned")
        if rest == b"owner":
            owners.append((base, kv))
        elif rest.startswith(b"workers/"):
            state.worker_count += 1
            _count_lease(state, int(kv.get("lease", 0)))
    for first in range(0, len(owners), _OWNERS_PER_TXN):
        batch = owners[first:first + _OWNERS_PER_TXN]
        answer = await gateway.call("/v3/kv/txn", {"success": [
            {"request_range": {"key": kv["key"], "revision": str(revision)}}
            for _, kv in batch]})
        for (base, kv), response in zip(batch, answer.get("responses", ()), strict=True):
            values = response.get("response_range", {}).get("kvs") or [{}]
            _owner(found[base], kv, _keys.read_owner(_keys.unb64(values[0].get("value", ""))))
    return list(found.values())


async def read_namespace(cluster: EtcdCluster, namespace: str) -> EtcdNamespace | None:
    """``namespace``'s owner and workers, as of one revision; ``None`` when etcd holds no key
    of it.

    :raises DiscoveryUnavailable: no member answered in time.
    :raises DiscoveryServiceError: the cluster refused (permissions, credentials).
    """
    from anywool.discovery.etcd import _keys

    keys = _keys.Keys(cluster.prefix, namespace)
    gateway = cluster.gateway()
    try:
        answer = await gateway.call("/v3/kv/range", {"key": _keys.b64(keys.base),
                                                     "range_end": _keys.b64(keys.end)})
    finally:
        await gateway.aclose()
    kvs = answer.get("kvs")
    if not kvs:
        return None
    workers: list[EtcdWorker] = []
    state = EtcdNamespace(keys.base.rstrip(b"/").decode(errors="replace"), "orphaned",
                          workers=workers)
    undecodable = 0
    for kv in kvs:
        key = _keys.unb64(kv.get("key", ""))
        value = _keys.unb64(kv.get("value", ""))
        if key == keys.owner:
            _owner(state, kv, _keys.read_owner(value))
            continue
        if key.startswith(keys.sequences):
            continue  # a publisher's sequence key (bookkeeping of its writes)
        uid = keys.uid_of(key)
        try:
            metadata = WorkerMetadata.from_bytes(value)
        except Exception:  # anything that is not metadata: counted, never trusted
            metadata = None
        if uid is None or metadata is None or metadata.uid != uid:
            undecodable += 1
            continue
        lease = int(kv.get("lease", 0))
        workers.append(EtcdWorker(metadata, lease))
        state.worker_count += 1
        _count_lease(state, lease)
    if undecodable:
        problem = f"{undecodable} key(s) do not hold worker metadata"
        state.error = problem if state.error is None else f"{state.error}; {problem}"
    return state


def cluster_for_reading(runtime_dir: str | None, values: dict[str, Any]) -> EtcdCluster | None:
    """The cluster ``ls``, ``show`` or ``watch`` reads (given ``--etcd``), else ``None``: this
    host's runtime directory.

    :raises click.UsageError: another ``--etcd*`` option without ``--etcd``, or ``--etcd``
        with ``--runtime-dir``.
    """
    if not values.get("etcd"):
        given = given_options(values)
        if given:
            raise click.UsageError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} "
                                   "--etcd URL")
        return None
    if runtime_dir is not None:
        raise click.UsageError("--runtime-dir is for this host's runtime directory, --etcd for "
                               "a cluster: give one of them")
    return EtcdCluster.from_options(**values)


def fetch(read: Callable[..., Any], *args: Any) -> Any:
    """Run the read ``read(*args)`` to completion; an etcd that does not answer, or refuses,
    is one line of error (exit 1)."""
    import anyio

    from anywool.errors import DiscoveryServiceError, DiscoveryUnavailable

    try:
        return anyio.run(read, *args, backend="asyncio")
    except (DiscoveryUnavailable, DiscoveryServiceError) as exc:
        raise click.ClickException(str(exc)) from None
