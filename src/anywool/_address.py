"""Address: where a worker listens, ``unix:/absolute/path`` or ``host:port``, parsed once.

Every place that reads or writes a worker address (metadata validation, connecting, listening,
announcing, cleaning up a socket file) goes through :class:`Address`, so there is one grammar and
one canonical text for it.

It lives beside :mod:`anywool.metadata` rather than in :mod:`anywool.runtime`: metadata sits
below the runtime layer and validates addresses with it, and importing any module of
``anywool.runtime`` first imports the whole runtime package. Pure data: no I/O, no event loop,
nothing imported but the standard library.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os

_UNIX = "unix:"
_FORMS = "expected 'unix:/absolute/path' or 'host:port'"


@dataclasses.dataclass(frozen=True)
class Address:
    """A worker address: a Unix socket path, or a TCP host and port.

    Build one with :meth:`parse`, :meth:`unix` or :meth:`tcp`; ``str()`` gives the canonical text
    back (``parse(str(a)) == a``). Exactly one form is set: ``path`` for a Unix socket, ``host``
    and ``port`` for TCP.

    :param path: the absolute path of a Unix socket, or ``None``.
    :param host: a host name or IP address (IPv6 without brackets), or ``None``.
    :param port: ``0`` to ``65535``, or ``None``; ``0`` ("any port") only in an address to bind.
    :raises ValueError: not exactly one form is set, or a field is out of its range.
    """

    path: str | None = None
    host: str | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        why = _problem(self.path, self.host, self.port)
        if why is not None:
            raise ValueError(f"address {str(self)!r}: {why}")

    @classmethod
    def unix(cls, path: str | os.PathLike[str]) -> Address:
        """The address of the Unix socket at ``path``.

        :raises ValueError: ``path`` is not absolute.
        """
        return cls(path=os.fspath(path))

    @classmethod
    def tcp(cls, host: str, port: int) -> Address:
        """The TCP address of ``host`` (an IPv6 address without brackets) and ``port``.

        :raises ValueError: ``host`` is empty, holds a bracket, or holds a colon without being
            an IPv6 address; ``port`` is outside ``0`` to ``65535``.
        """
        return cls(host=host, port=port)

    @classmethod
    def parse(cls, text: str, *, bind: bool = False) -> Address:
        """Parse ``"unix:/absolute/path"``, ``"host:port"`` or ``"[ipv6]:port"``.

        :param text: the address as published in :class:`~anywool.WorkerMetadata`.
        :param bind: accept port ``0`` (the system picks one), as in an address to listen on.
        :raises ValueError: ``text`` is neither form; the message names ``text`` and what is
            wrong with it.
        :raises TypeError: ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"an address must be a str, got {text!r}")
        if text.startswith(_UNIX):
            return cls(path=text[len(_UNIX):])
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"address {text!r}: {_FORMS}")
        if not (port.isascii() and port.isdigit()):
            raise ValueError(f"address {text!r}: the port must be a decimal number")
        number = int(port)
        if not (0 if bind else 1) <= number <= 65535:
            raise ValueError(f"address {text!r}: the port must be 1 to 65535")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                raise ValueError(f"address {text!r}: brackets are for IPv6 hosts only")
        elif ":" in host:
            raise ValueError(f"address {text!r}: an IPv6 host goes in brackets, as "
                             f"'[{host}]:{port}'")
        return cls(host=host, port=number)

    @property
    def is_unix(self) -> bool:
        """Whether this is a Unix socket address (``path`` is set, ``host`` and ``port`` not)."""
        return self.path is not None

    def __str__(self) -> str:
        if self.path is not None:
            return f"{_UNIX}{self.path}"
        if ":" in (host := self.host or ""):
            return f"[{host}]:{self.port}"
        return f"{host}:{self.port}"


def is_valid(text: str) -> bool:
    """Whether ``text`` parses as an address (one to connect to: port ``0`` is not valid).

    The same grammar as :meth:`Address.parse`, without building an :class:`Address` for the
    common Unix form: snapshots check one address per worker.
    """
    if text.startswith(_UNIX):
        return text.startswith(_UNIX + "/")  # all a unix: address needs (see _problem)
    try:
        Address.parse(text)
    except ValueError:
        return False
    return True


def _problem(path: str | None, host: str | None, port: int | None) -> str | None:
    """What is wrong with these fields as an address, or ``None``."""
    if path is not None:
        if host is not None or port is not None:
            return "a unix path or a host and port, not both"
        return None if path.startswith("/") else "a unix: address needs an absolute path"
    if not host:
        return "the host is empty"
    if "[" in host or "]" in host:
        return "a bracket in the host"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is neither a host name nor an IPv6 address"
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        return "the port must be 0 to 65535"
    return None
