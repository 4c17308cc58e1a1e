"""How to reach an etcd cluster, checked once: endpoints, key prefix, TLS, credentials, timeouts.

A :class:`Config` is what every part of the etcd backend is built from (the owner, a publisher,
a subscription's shared source, a lease's keep-alive thread). It is immutable and checked at
construction, so that bad input fails where it is given, naming the parameter and the value.
It pickles without the password and without an ``ssl.SSLContext`` (neither may travel: a
context does not pickle, and a password is a secret); what is left is enough for another
process to build its own from its environment (see :func:`password_from_env`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from anywool import _validate
from anywool._tls import MutualTLS

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
DEFAULT_PREFIX = "/anywool"
#: Seconds a lease lives without a renewal: how long a dead owner's claim and a dead
#: publisher's workers stay visible (etcd detects expiry up to 0.5 s later).
DEFAULT_LEASE_TTL = 5
#: etcd takes TTLs in whole seconds; a lease of more than a day is a mistake here.
MAX_LEASE_TTL = 24 * 3600
PASSWORD_ENV = "ANYWOOL_ETCD_PASSWORD"
_MAX_PREFIX = 256

Endpoints = str | Sequence[str]
TLS = ssl.SSLContext | MutualTLS


def check_endpoints(endpoints: object) -> tuple[str, ...]:
    """One ``http://`` or ``https://`` URL of an etcd member's client port, or a sequence of
    them (at least one, all of one scheme), normalised without a trailing ``/``."""
    if isinstance(endpoints, str):
        items: tuple[object, ...] = (endpoints,)
    elif isinstance(endpoints, Sequence) and not isinstance(endpoints, (bytes, bytearray)):
        items = tuple(endpoints)  # pyright: ignore[reportUnknownArgumentType]
    else:
        raise TypeError("endpoints must be a URL (str) or a sequence of URLs, "
                        f"got {endpoints!r}")
    if not items:
        raise ValueError(f"endpoints must hold at least one URL, got {endpoints!r}")
    checked: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"endpoints must hold URLs (str), got {item!r} in {endpoints!r}")
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError as exc:
            # urllib's reason may quote the part before "@" too.
            reason = "" if "@" in item else f": {exc}"
            raise ValueError(f"endpoints holds a malformed URL {_without_userinfo(item)!r}"
                             f"{reason}") from None
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"endpoints must not carry credentials in a URL (give username= "
                             f"and password=), got {_without_userinfo(item)!r}")
        if parts.scheme not in ("http", "https") or not parts.hostname or not port \
                or parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(
                f"endpoints must hold URLs like 'http://127.0.0.1:2379' or "
                f"'https://etcd-1.example:2379' (scheme, host and port only), got {item!r}")
        checked.append(f"{parts.scheme}://{parts.netloc}")
    if len({url.split(":", 1)[0] for url in checked}) > 1:
        raise ValueError(f"endpoints must all use http or all https, got {endpoints!r}")
    return tuple(checked)


def _without_userinfo(url: str) -> str:
    """``url`` fit for an error message: what precedes an ``@`` in it may be a password."""
    return re.sub(r"//.*@", "//***@", url)


def check_prefix(prefix: object) -> str:
    """A key prefix: a ``str`` starting with ``/``, without a trailing ``/`` (``"/"`` alone
    is not a prefix of its own), at most 256 characters."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {prefix!r}")
    trimmed = prefix.rstrip("/")
    if not prefix.startswith("/") or not trimmed or len(prefix) > _MAX_PREFIX \
            or "\0" in prefix:
        raise ValueError(f"prefix must start with '/', name something after it and be at most "
                         f"{_MAX_PREFIX} characters without NUL, like '/anywool', got {prefix!r}")
    return trimmed


def check_lease_ttl(lease_ttl: object) -> int:
    return _validate.count("lease_ttl", lease_ttl, upper=MAX_LEASE_TTL)


def password_from_env() -> str | None:
    return os.environ.get(PASSWORD_ENV) or None


@dataclass(frozen=True)
class Config:
    """Everything needed to reach the cluster (see :class:`~anywool.EtcdDiscovery`)."""

    endpoints: tuple[str, ...]
    prefix: str
    tls: TLS | None
    username: str | None
    password: str | None
    connect_timeout: float
    request_timeout: float

    @classmethod
    def make(cls, endpoints: object, prefix: object, tls: object, username: object,
             password: object, connect_timeout: object, request_timeout: object) -> Config:
        urls = check_endpoints(endpoints)
        if tls is not None and not isinstance(tls, (ssl.SSLContext, MutualTLS)):
            raise TypeError(f"tls must be None, an ssl.SSLContext or an anywool.MutualTLS, "
                            f"got {tls!r}")
        if tls is not None and not urls[0].startswith("https:"):
            raise ValueError(f"tls={tls!r} needs https:// endpoints, got {urls!r}")
        if username is not None and not isinstance(username, str):
            raise TypeError(f"username must be a str or None, got {username!r}")
        if password is not None and not isinstance(password, str):
            raise TypeError("password must be a str or None, got a "
                            f"{type(password).__name__}")
        if username == "":
            raise ValueError("username must not be empty (None: no password authentication)")
        if password is not None and username is None:
            raise ValueError("password needs a username")
        connect = _validate.duration("connect_timeout", connect_timeout, allow_zero=False)
        request = _validate.duration("request_timeout", request_timeout, allow_zero=False)
        return cls(urls, check_prefix(prefix), tls, username, password, connect, request)

    def portable(self) -> Config:
        """This configuration as it may travel to another process: no password, no
        ``SSLContext`` (the receiving process supplies its own, see
        :func:`password_from_env`)."""
        tls = self.tls if isinstance(self.tls, MutualTLS) else None
        return replace(self, tls=tls, password=None)

    def with_env_password(self) -> Config:
        """The password from ``$ANYWOOL_ETCD_PASSWORD`` when a username is set and none was
        given."""
        if self.username is not None and self.password is None:
            password = password_from_env()
            if password is not None:
                return replace(self, password=password)
        return self

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What the members are verified with: ``False`` for ``http://`` endpoints (no TLS:
        and making a context costs tens of milliseconds), the given context, one made from a
        :class:`~anywool.MutualTLS` (its CA bundle only, and our certificate), else the
        system's CAs. Made contexts are cached per process (per file versions)."""
        if not self.endpoints[0].startswith("https:"):
            return False
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        if isinstance(self.tls, MutualTLS):
            paths = (self.tls.certfile, self.tls.keyfile, self.tls.cafile)
            return _mutual_context(paths, tuple(_version(p) for p in paths))
        return _default_context()

    def identity(self) -> bytes:
        """What tells two configurations apart for sharing a watch (never the password
        itself: its digest)."""
        tls: Any = self.tls if not isinstance(self.tls, ssl.SSLContext) else id(self.tls)
        password = b"" if self.password is None else \
            hashlib.sha256(self.password.encode()).digest()
        return repr((self.endpoints, self.prefix, tls, self.username, password,
                     self.connect_timeout, self.request_timeout)).encode()

    def __repr__(self) -> str:
        return (f"Config(endpoints={self.endpoints!r}, prefix={self.prefix!r}, "
                f"tls={self.tls!r}, username={self.username!r})")


def _version(path: str | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=8)
def _mutual_context(paths: tuple[str, str | None, str],
                    versions: tuple[object, ...]) -> ssl.SSLContext:
    certfile, keyfile, cafile = paths
    context = ssl.create_default_context(cafile=cafile)
    context.load_cert_chain(certfile, keyfile)
    return context


@functools.lru_cache(maxsize=1)
def _default_context() -> ssl.SSLContext:
    return ssl.create_default_context()
