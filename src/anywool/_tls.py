"""Mutual TLS settings: PEM paths checked once, and one SSL context per process and side.

Below discovery and the runtime alike (an etcd client and a worker connection both present
a certificate with it), so both import it downwards. No event loop and no I/O but reading the
PEM files. The public name is :class:`anywool.MutualTLS`.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

__all__ = ["MutualTLS", "context_for", "ssl_text"]


@dataclass(frozen=True, init=False)
class MutualTLS:
    """Mutual TLS from PEM files: each side presents a certificate from ``certfile`` (with its key
    in ``keyfile``, or in ``certfile`` when ``None``) and verifies the peer's against the CA
    bundle ``cafile`` (and only that bundle: the system's CAs are not trusted).

    Just paths: it pickles as such, and every process loads the files itself (a worker on another
    host needs them at the same paths). The files are read when it is made, to fail early, and
    again by the first handshake of each process and whenever one of them changes (its mtime,
    size or inode), so renewed certificates are used by the next connection.

    :param certfile: a PEM file holding our certificate (and its chain), ``str`` or
        ``os.PathLike``; stored as ``str``.
    :param keyfile: a PEM file holding its private key, unencrypted; ``None`` when it is in
        ``certfile``.
    :param cafile: a PEM bundle of the CA certificates a peer's certificate must chain to.
    :raises TypeError: a path is neither ``str`` nor ``os.PathLike[str]`` (``keyfile`` may also
        be ``None``); the message names the parameter.
    :raises ValueError: a file is missing, unreadable or does not load (no certificate in
        ``certfile``, a key that is missing, encrypted or does not match, an empty or garbled CA
        bundle); the message names the parameter, the path and what failed.
    """

    certfile: str
    keyfile: str | None
    cafile: str

    def __init__(
        self,
        certfile: str | os.PathLike[str],
        keyfile: str | os.PathLike[str] | None = None,
        *,
        cafile: str | os.PathLike[str],
    ) -> None:
        object.__setattr__(self, "certfile", _path(certfile, "certfile"))
        object.__setattr__(self, "keyfile", None if keyfile is None else _path(keyfile, "keyfile"))
        object.__setattr__(self, "cafile", _path(cafile, "cafile"))
        self.__post_init__()

    def __post_init__(self) -> None:
        for parameter, path in (("certfile", self.certfile), ("keyfile", self.keyfile),
                                ("cafile", self.cafile)):
            if path is not None and not os.path.isfile(path):
                what = "is not a file" if os.path.exists(path) else "does not exist"
                raise ValueError(f"{parameter} {path!r} {what}")
        for server_side in (True, False):
            _cache[(self, server_side)] = (self._stamp(), self._build(server_side))

    def server_context(self) -> ssl.SSLContext:
        """A fresh context for the worker side: TLS 1.2 or later, our certificate, and a
        certificate required from the client, verified against ``cafile``.

        :raises ValueError: a file no longer loads (as at construction).
        """
        return self._build(server_side=True)

    def client_context(self) -> ssl.SSLContext:
        """A fresh context for the client side: TLS 1.2 or later, our certificate, the worker's
        certificate required and verified against ``cafile``, its host name checked
        (``check_hostname``).

        :raises ValueError: a file no longer loads (as at construction).
        """
        return self._build(server_side=False)

    def _build(self, server_side: bool) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED  # the default on the client side already
        # Report a peer that vanishes without a close_notify (OpenSSL 3 may hide it), as anyio does.
        context.options &= ~getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
        try:
            context.load_verify_locations(cafile=self.cafile)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"cafile {self.cafile!r}: cannot load it as a PEM bundle of CA "
                             f"certificates ({ssl_text(exc)})") from None
        if not context.get_ca_certs():
            raise ValueError(f"cafile {self.cafile!r}: holds no CA certificate")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=self.certfile)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"certfile {self.certfile!r}: holds no PEM certificate "
                             f"({ssl_text(exc)})") from None
        try:
            context.load_cert_chain(self.certfile, self.keyfile, password=_no_password)
        except _EncryptedKey:
            parameter, path = ("keyfile", self.keyfile) if self.keyfile else ("certfile", self.certfile)
            raise ValueError(f"{parameter} {path!r}: the private key is encrypted; anywool needs "
                             "an unencrypted key file (readable by the user only)") from None
        except (ssl.SSLError, OSError) as exc:
            if self.keyfile is None:
                where = f"certfile {self.certfile!r} (keyfile=None)"
            else:
                where = f"keyfile {self.keyfile!r}"
            raise ValueError(f"{where}: cannot load a private key matching the certificate of "
                             f"{self.certfile!r} ({ssl_text(exc)})") from None
        return context

    def _stamp(self) -> tuple[object, ...]:
        stamp: list[object] = []
        for path in (self.certfile, self.keyfile, self.cafile):
            if path is not None:
                try:
                    info = os.stat(path)
                except OSError:
                    stamp.append(None)
                else:
                    stamp.append((info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(stamp)


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for the pass phrase.
    raise _EncryptedKey


def _path(value: object, parameter: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)  # pyright: ignore[reportUnknownArgumentType]
    if not isinstance(value, str):
        raise TypeError(f"{parameter} must be a str or os.PathLike[str], got {type(value).__name__}")
    return value


def ssl_text(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.library or 'SSL'}: {exc.reason}"
    return str(exc) or type(exc).__name__


# (tls, server side) -> (file stamp, context): one context per process, rebuilt when a file
# changes. Contexts stay in this process; a MutualTLS pickles as its paths only.
_cache: dict[tuple[MutualTLS, bool], tuple[tuple[object, ...], ssl.SSLContext]] = {}


def context_for(tls: MutualTLS, server_side: bool) -> ssl.SSLContext:
    """The cached context of ``tls`` for one side, rebuilt if a file changed.

    :raises ValueError: a file does not load.
    """
    stamp = tls._stamp()  # pyright: ignore[reportPrivateUsage]
    hit = _cache.get((tls, server_side))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    context = tls._build(server_side)  # pyright: ignore[reportPrivateUsage]
    _cache[(tls, server_side)] = (stamp, context)
    return context
