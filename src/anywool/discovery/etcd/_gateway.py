"""An etcd cluster reached over its v3 JSON gateway, on whichever event loop runs it.

:class:`Gateway` makes the unary calls (``POST /v3/...`` with a JSON body; bytes are base64 and
int64 fields decimal strings, see the etcd notes in DESIGN §6) on kept-alive connections
(:mod:`._http`), and opens watch streams, each on a connection of its own: an open watch holds
its connection, and unary calls must never queue behind it.

Failover is the client's job (the gateway has no balancer): a call goes to the member that
answered last; a transport failure or a timeout moves it to the next endpoint, until every
endpoint was tried once, then :class:`~anywool.errors.DiscoveryUnavailable`. A member that
answers with an error is not failed over (every member would say the same):
:class:`~anywool.errors.DiscoveryServiceError` with etcd's gRPC code.

Password authentication: a token from ``/v3/auth/authenticate``, sent raw in
``Authorization`` (etcd refuses ``Bearer``); a token that expired (HTTP 401) is renewed once.

A gateway belongs to the event loop that first uses it (its connections do); every owner,
publisher, lease thread and shared source makes its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from anywool.discovery.etcd._config import PASSWORD_ENV, Config
from anywool.discovery.etcd._http import Connection, Pool, TransportError, describe
from anywool.errors import DiscoveryServiceError, DiscoveryUnavailable

log = logging.getLogger(__name__)

#: gRPC codes etcd answers with that callers look at.
NOT_FOUND = 5
UNAUTHENTICATED = 16
#: Codes of a member that cannot serve right now (no leader, leader changed, timed out):
#: another member may, so they fail over like a transport error.
TRANSIENT = frozenset({4, 14})


_RETRY_PAUSE = 0.05


#: Requests as ``(path, JSON body)``.
Steps = Sequence[tuple[str, dict[str, Any]]]


class _Transient(Exception):
    """A member answered that it cannot serve the request now."""


def refusal(endpoint: str, status: int, data: bytes) -> DiscoveryServiceError:
    """The error a member answered with (JSON ``{"error", "code", "message"}``, or plain text:
    the gateway answers some refusals in text)."""
    code: int | None = None
    message = data[:300].decode("utf-8", "replace").strip()
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if isinstance(body, dict):
        raw_code = body.get("code")  # pyright: ignore[reportUnknownMemberType]
        code = raw_code if isinstance(raw_code, int) else None
        text = body.get("message") or body.get("error")  # pyright: ignore[reportUnknownMemberType]
        if isinstance(text, str):
            message = text
    return DiscoveryServiceError(endpoint, code, f"HTTP {status}: {message}")


class Gateway:
    """Unary calls and watch streams to one cluster (see the module)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._current = 0
        self._token: str | None = None
        context = config.ssl_context()
        self._ssl_context = context if not isinstance(context, bool) else None
        self._pool = Pool(self._ssl_context, config.connect_timeout)

    @property
    def endpoint(self) -> str:
        """The member calls go to first."""
        return self.config.endpoints[self._current]

    def rotate(self) -> None:
        """Move to the next endpoint (after the current one failed)."""
        self._current = (self._current + 1) % len(self.config.endpoints)

    async def aclose(self) -> None:
        """Close every connection (shielded: closing never waits on a member)."""
        await self._pool.aclose()

    def forget_token(self) -> None:
        """Authenticate again before the next request (a watch refused with a token that
        expired: the gateway says so only as a permission refusal in the stream)."""
        self._token = None

    def _headers(self) -> dict[str, str]:
        return {} if self._token is None else {"Authorization": self._token}

    async def _post(self, endpoint: str, steps: Steps,
                    timeout: float) -> list[tuple[int, bytes]]:
        """Requests to one member (pipelined), bounded by ``timeout`` seconds in all (a new
        connection by ``connect_timeout`` too)."""
        with anyio.fail_after(timeout):
            return await self._pool.requests(
                endpoint, [(path, json.dumps(body).encode()) for path, body in steps],
                self._headers())

    async def _authenticate(self, endpoint: str, timeout: float) -> None:
        config = self.config.with_env_password()
        if config.username is None:
            return
        if config.password is None:
            # Not worth a request (etcd would only say "invalid user ID or password"): the
            # usual cause is a worker process without the variable, since a password never
            # travels in a pickle.
            raise DiscoveryServiceError(
                endpoint, None, f"no password for etcd user {config.username!r}: give "
                f"password= or set ${PASSWORD_ENV} (worker processes read it from there)")
        [(status, data)] = await self._post(endpoint, [("/v3/auth/authenticate", {
            "name": config.username, "password": config.password})], timeout)
        if status != 200:
            raise refusal(endpoint, status, data)
        try:
            token = json.loads(data).get("token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str):
            raise DiscoveryServiceError(endpoint, None, "authentication answered no token")
        self._token = token

    async def call(self, path: str, body: dict[str, Any], *, timeout: float | None = None,
                   endpoint: str | None = None) -> dict[str, Any]:
        """``POST path`` with ``body``; the decoded answer.

        :param timeout: seconds the call may take (default: the request timeout), shared
            equally by the members tried in a round; rounds are repeated only for members that
            answered that they cannot serve now, while the budget lasts.
        :param endpoint: this member only (no failover), e.g. to ping the member a watch
            reads from.
        :raises DiscoveryServiceError: a member answered with an error.
        :raises DiscoveryUnavailable: no member answered in time.

        Cancellation: the request is abandoned at once (its connection is closed, never
        reused).
        """
        [answer] = await self.call_batch([(path, body)], timeout=timeout, endpoint=endpoint)
        if isinstance(answer, DiscoveryServiceError):
            raise answer
        return answer

    async def call_batch(self, steps: Steps, *, timeout: float | None = None,
                         endpoint: str | None = None) -> list[dict[str, Any] | DiscoveryServiceError]:
        """Several requests to one member in one round trip (pipelined: they take effect in
        order, each after the one before); each one's decoded answer, or the error the member
        answered it with. Failover, budget and cancellation as for :meth:`call`; when the
        member cannot serve one of them now, the whole batch is tried again elsewhere (so
        each step must bear being repeated).

        :raises DiscoveryUnavailable: no member answered in time.
        """
        budget = self.config.request_timeout if timeout is None else timeout
        endpoints = self.config.endpoints
        failures: list[str] = []
        # A member that cannot serve now (an election) is retried, with the others, until the
        # budget is spent; one that cannot be reached is not (an unreachable cluster fails fast).
        deadline = anyio.current_time() + budget
        while True:
            order = [endpoint] if endpoint is not None else \
                [endpoints[(self._current + i) % len(endpoints)] for i in range(len(endpoints))]
            transient = False
            # Each member gets its share of the budget: a member that took the request and
            # died (a leader killed mid-request) never answers, and the next one must still
            # have time.
            share = budget / len(order)
            for url in order:
                try:
                    return await self._batch_one(url, steps, share)
                except (TransportError, TimeoutError, _Transient) as exc:
                    failures.append(f"{url}: {describe(exc)}")
                    transient = transient or isinstance(exc, _Transient)
                    if endpoint is None:
                        self.rotate()
            if not transient or anyio.current_time() + _RETRY_PAUSE >= deadline:
                break
            await anyio.sleep(_RETRY_PAUSE)
        raise DiscoveryUnavailable(tuple(order), "; ".join(failures[-len(order) * 2:]))

    async def _batch_one(self, url: str, steps: Steps,
                         budget: float) -> list[dict[str, Any] | DiscoveryServiceError]:
        if self._token is None and self.config.username is not None:
            await self._authenticate(url, budget)
        answers = await self._post(url, steps, budget)
        if self.config.username is not None and any(status == 401 for status, _ in answers):
            await self._authenticate(url, budget)  # the token expired: once more
            answers = await self._post(url, steps, budget)
        results: list[dict[str, Any] | DiscoveryServiceError] = []
        for status, data in answers:
            if status != 200:
                error = refusal(url, status, data)
                if error.code in TRANSIENT or status == 503:
                    raise _Transient(error.message)
                results.append(error)
                continue
            try:
                answer = json.loads(data)
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                results.append(DiscoveryServiceError(
                    url, None, f"answered something that is not a JSON object: {data[:200]!r}"))
            else:
                results.append(answer)  # pyright: ignore[reportUnknownArgumentType]
        return results

    @asynccontextmanager
    async def stream(self, path: str, body: dict[str, Any],
                     endpoint: str) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """A streaming ``POST`` to one member, on a connection of its own: its answer as
        decoded JSON lines. Its liveness is the caller's business (a silent member sends
        nothing; there is no read timeout once the stream is open).

        :raises DiscoveryServiceError: the member refused the stream.
        :raises TransportError: the connection failed.
        :raises TimeoutError: opening the stream took longer than the request timeout.
        """
        if self._token is None and self.config.username is not None:
            await self._authenticate(endpoint, self.config.request_timeout)
        connection: Connection | None = None
        try:
            with anyio.fail_after(self.config.request_timeout):
                connection = await Connection.open(endpoint, self._ssl_context,
                                                   self.config.connect_timeout)
                status, pieces = await connection.start_stream(
                    path, json.dumps(body).encode(), self._headers())
            if status != 200:
                data = b"".join([piece async for piece in pieces])
                if status == 401:
                    self._token = None  # renewed on the next attempt
                raise refusal(endpoint, status, data)

            async def lines() -> AsyncIterator[dict[str, Any]]:
                pending = b""
                async for piece in pieces:
                    pending += piece
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield json.loads(line)

            yield lines()
        finally:
            if connection is not None:
                await connection.aclose()


def header_revision(answer: dict[str, Any]) -> int:
    """The revision in an answer's header (0 when absent: zero values are omitted)."""
    return int(answer.get("header", {}).get("revision", 0))
