"""One request to etcd's v3 JSON gateway, and password auth through it, for tests.

Synchronous and standard library only (``http.client``): fixtures, :mod:`tests.etcd.cluster`'s
readiness probes and ``benchmarks/`` scripts use it without an event loop or httpx. What it must
never do: retry, or hide an error status (:class:`GatewayError` carries it). Tests that pin
the gateway's behaviour for EtcdDiscovery use httpx, as the backend does.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from typing import Any
from urllib.parse import urlsplit


class GatewayError(Exception):
    """The JSON gateway answered with an HTTP error status.

    :ivar status: the HTTP status.
    :ivar code: the gRPC code of a JSON error body, ``None`` for a plain-text one.
    :ivar message: the error text.
    """

    def __init__(self, status: int, code: int | None, message: str) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        code = "" if self.code is None else f" (gRPC code {self.code})"
        return f"etcd gateway answered HTTP {self.status}{code}: {self.message}"


def call(url: str, path: str, body: dict[str, Any], *, ssl_context: ssl.SSLContext | None = None,
         token: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """POST ``body`` as JSON to ``url + path`` on etcd's JSON gateway and return the JSON answer.

    :param url: a member's client URL, ``http://`` or ``https://`` (then ``ssl_context`` is used).
    :param path: e.g. ``"/v3/kv/range"``.
    :param token: sent raw in ``Authorization`` (the gateway refuses ``Bearer``).
    :param timeout: seconds for the connection and for each read.
    :raises GatewayError: an HTTP status other than 200.
    :raises OSError: the connection failed or timed out (``TimeoutError``), TLS errors included.
    :raises http.client.HTTPException: the server closed the connection or answered garbage.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl_context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = token
    try:
        connection.request("POST", path, body=json.dumps(body), headers=headers)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    if response.status != 200:
        try:
            error = json.loads(data)
            raise GatewayError(response.status, error.get("code"), error.get("error", ""))
        except (ValueError, AttributeError):
            raise GatewayError(response.status, None, data.decode(errors="replace")) from None
    return json.loads(data)


def range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"  # every key from ``prefix`` on
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def enable_auth(url: str, user: str, password: str, *, ssl_context: ssl.SSLContext | None = None,
                timeout: float = 5.0) -> None:
    """Turn password authentication on, with ``user`` able to read and write every key.

    Creates user ``root`` with role ``root`` (etcd requires both before auth can be enabled);
    when ``user`` is ``"root"`` it gets ``password``, else ``user`` is created too, with
    ``password`` and a role of its own name granted read-write on every key, and ``root`` gets
    the same password. Then enables auth: from then on every kv request needs a token
    (:func:`authenticate`) in ``Authorization``.

    :raises ValueError: an empty ``user`` or ``password``.
    :raises GatewayError: etcd refused a step (e.g. auth is already enabled).
    :raises OSError: the member could not be reached within ``timeout`` seconds per request.
    """
    if not user:
        raise ValueError(f"user must not be empty, got {user!r}")
    if not password:
        raise ValueError("password must not be empty")

    def post(path: str, body: dict[str, Any]) -> None:
        call(url, path, body, ssl_context=ssl_context, timeout=timeout)

    post("/v3/auth/user/add", {"name": "root", "password": password})
    post("/v3/auth/role/add", {"name": "root"})
    post("/v3/auth/user/grant", {"user": "root", "role": "root"})
    if user != "root":
        post("/v3/auth/user/add", {"name": user, "password": password})
        post("/v3/auth/role/add", {"name": user})
        every_key = {"permType": "READWRITE", "key": _b64(b"\0"), "range_end": _b64(b"\0")}
        post("/v3/auth/role/grant", {"name": user, "perm": every_key})
        post("/v3/auth/user/grant", {"user": user, "role": user})
    post("/v3/auth/enable", {})


def authenticate(url: str, user: str, password: str, *, ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 5.0) -> str:
    """A token for ``user``, to send raw in ``Authorization``.

    :raises GatewayError: wrong credentials (400) or auth not enabled.
    :raises OSError: the member could not be reached within ``timeout`` seconds.
    """
    answer = call(url, "/v3/auth/authenticate", {"name": user, "password": password},
                  ssl_context=ssl_context, timeout=timeout)
    return answer["token"]
