"""Peer authentication of a worker connection: mutual TLS, a shared-secret handshake, or both.

It runs once per TCP connection, right after connect (:func:`authenticate_client`) or accept
(:func:`authenticate_server`), before the first frame of :mod:`anywool.runtime.wire._frames`. It must
never unpickle anything, never read a length the peer chose, and never read more than the fixed
sizes below before the peer is authenticated: frames are cloudpickle, so a peer that may send one
may run code (DESIGN §8).

Layers. With ``tls``, TLS comes first (anyio's :class:`~anyio.streams.tls.TLSStream`, both sides
presenting a certificate from the same CA, the client checking the worker's host name); then the
anywool handshake runs inside it. Without a secret, the handshake is the two hellos only (they
carry the magic, the version and what each side is configured with, so a misconfiguration gets a
precise reason); with a secret, the HMAC challenge-response below follows.

Protocol, version 1. Every message has a fixed size; nothing a peer sends is ever a length::

    hello  = b"anywool" | version (1 byte, 1) | role (b"C" client, b"W" worker)
             | flags (1 byte: 0x01 a secret, 0x02 inside TLS) | nonce (32 random bytes)   42 bytes

    1. client -> worker   hello_c
    2. worker -> client   hello_w                       (sent once hello_c is well formed)
       -- without a secret both sides are done here --
    3. client -> worker   proof_c = HMAC-SHA256(K, L_C | hello_c | hello_w | A)        32 bytes
    4. worker -> client   ACCEPT (0x06) | proof_w = HMAC-SHA256(K, L_W | hello_c | hello_w
                          | A | proof_c)                                                33 bytes
                       or REJECT (0x15), then it hangs up                                1 byte

    L_C = b"anywool auth v1: client proof\\0", L_W = b"anywool auth v1: worker proof\\0"
    A   = len(address) (2 bytes) | address: the worker's address as it announces it, which is
          the address the client dialed (``"host:port"``, canonical)

The worker reads at most 42 + 32 = 74 bytes before the client is authenticated (exactly the
sizes above, with reads that never ask for more than what is missing, so a byte after the
handshake is never consumed here), and the client sends nothing after its proof until the worker
proved itself. Why it holds:

* Fresh nonces from both sides (``secrets.token_bytes(32)``) in both proofs: a transcript
  recorded on one connection fails on any other, whichever side replays it.
* Distinct labels ``L_C``/``L_W`` (and the role byte): a proof is never valid as the other
  side's, so a client proof reflected back as a worker proof fails, and a hello reflected back
  is refused at once (its role is wrong, or its nonce is ours).
* The hellos, flags included, are in both MACs: a downgrade of what either side announced
  breaks the proofs. Proofs are compared with :func:`hmac.compare_digest`.
* The client proves first. Whoever proves first hands an unauthenticated party a MAC over a
  transcript it can check guesses of the secret against offline. The worker is the party anyone
  on the network can reach (it listens); a client only dials addresses it chose (from signed
  discovery records, or given). So a worker answers an unauthenticated peer with nothing but a
  random nonce and a verdict, and never computes a proof for it; only a peer that makes a client
  connect to it can collect a client proof, and that proof covers the client's fresh nonce, so it
  is no use on any other connection (to a real worker, whose nonce is fresh too).
* The proofs cover the worker's address, the one the client dialed. A peer that gets a client to
  dial it (a port squatted after a worker died, say) and relays the handshake to a real worker
  gets nothing: the real worker computes the proof with its own address, which is not the one
  the client dialed, and rejects it.
* The verdict byte lets the client tell "the worker rejected our credentials" from "the worker
  could not prove it holds the secret" and from "not an anywool worker".

Limits, said plainly. Without TLS the handshake authenticates the peers, not the bytes after it:
an active attacker on the network path to the dialed address itself can let a handshake through
and then inject into the TCP stream. Use TLS where the network path is not trusted. A secret made of few
random bytes (a human passphrase) can be guessed offline from one recorded client proof; use
``secrets.token_hex(16)`` or longer.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import ssl
from dataclasses import dataclass

import anyio
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.tls import TLSStream

from anywool import _secret
from anywool._address import Address
from anywool._tls import MutualTLS, context_for, ssl_text
from anywool.errors import AuthenticationError, WorkerError

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "MAX_UNAUTHENTICATED_READ",
    "Credentials",
    "authenticate_client",
    "authenticate_server",
    "peer_address",
]

#: Seconds a client gives authentication (TLS included) from connect, by default. A worker gives
#: its peers less, from accept: see :data:`anywool.runtime.worker._gatekeeper.PENDING_HANDSHAKE_TIMEOUT`.
HANDSHAKE_TIMEOUT: float = 5.0

VERSION = 1
_MAGIC = b"anywool"
_PREFIX = len(_MAGIC) + 1  # magic and version: the part every version keeps
_CLIENT, _WORKER = b"C", b"W"
_FLAG_SECRET, _FLAG_TLS = 0x01, 0x02
_NONCE = 32
_HELLO = _PREFIX + 2 + _NONCE  # 42 bytes
_PROOF = hashlib.sha256().digest_size  # 32 bytes
_ACCEPT, _REJECT = b"\x06", b"\x15"
_CLIENT_LABEL = b"anywool auth v1: client proof\x00"
_WORKER_LABEL = b"anywool auth v1: worker proof\x00"
#: The most the worker reads before the client is authenticated, in bytes.
MAX_UNAUTHENTICATED_READ = _HELLO + _PROOF


# -- credentials -------------------------------------------------------------------------------


_process_tls: MutualTLS | None = None


def set_process_tls(tls: MutualTLS | None) -> None:
    """Make ``tls`` this process's own mutual TLS, which :meth:`Credentials.resolve` takes when
    given none: a worker started with TLS sets it, so that the proxies its routines' nested
    calls go through (rebuilt from pickles, which carry no credentials) present its
    certificate."""
    global _process_tls
    _process_tls = tls


@dataclass(frozen=True, eq=False, repr=False)
class Credentials:
    """What a side of a worker connection authenticates with: a shared secret, mutual TLS, or
    both (TLS first, then the secret's handshake inside it).

    The secret never shows and never travels: ``repr`` gives its length only, and pickling (or
    cloudpickling) a ``Credentials`` raises ``TypeError``; each process makes its own with
    :meth:`resolve`. Compared by identity (no ``==`` on secrets).

    :param secret: at least :data:`anywool._secret.MIN_LENGTH` bytes (a ``str`` is UTF-8
        encoded), or ``None``.
    :param tls: a :class:`MutualTLS`, or ``None``.
    :raises TypeError: ``secret`` is not bytes, str or ``None``, or ``tls`` not a
        :class:`MutualTLS` or ``None``.
    :raises ValueError: ``secret`` is too short, or neither is given.
    """

    secret: bytes | None = None
    tls: MutualTLS | None = None

    def __post_init__(self) -> None:
        if self.tls is not None and not isinstance(self.tls, MutualTLS):
            raise TypeError(f"tls must be a MutualTLS or None, got {type(self.tls).__name__}")
        if self.secret is not None:
            object.__setattr__(self, "secret", _secret.resolve(self.secret, "secret"))
        if self.secret is None and self.tls is None:
            raise ValueError("credentials need a secret, tls, or both")

    @classmethod
    def resolve(cls, secret: bytes | str | None, tls: MutualTLS | None, *,
                parameter: str = "secret") -> Credentials | None:
        """The credentials of ``secret=`` and ``tls=`` as a caller gave them, or ``None`` when
        there are none: no secret (neither given nor this process's own, see
        :func:`anywool._secret.resolve`) and no ``tls``.

        :param secret: the secret given, or ``None`` for this process's own (the one its
            spawning pool handed it, else ``$ANYWOOL_SECRET``).
        :param tls: mutual TLS, or ``None``.
        :param parameter: the name of the caller's secret parameter, for messages.
        :raises TypeError: ``secret`` is not bytes, str or ``None`` (the message names
            ``parameter``), or ``tls`` not a :class:`MutualTLS` or ``None`` (it names ``tls``).
        :raises ValueError: the secret is shorter than the minimum (naming ``parameter``, or
            ``$ANYWOOL_SECRET``); never showing its value.
        """
        if tls is not None and not isinstance(tls, MutualTLS):
            raise TypeError(f"tls must be a MutualTLS or None, got {type(tls).__name__}")
        if tls is None:
            tls = _process_tls
        key = _secret.resolve(secret, parameter)
        if key is None and tls is None:
            return None
        return cls(key, tls)

    def __repr__(self) -> str:
        secret = "None" if self.secret is None else f"<{len(self.secret)} bytes>"
        return f"Credentials(secret={secret}, tls={self.tls!r})"

    def __reduce__(self) -> str | tuple[object, ...]:
        raise TypeError("credentials do not travel in pickles: each process makes its own "
                        "(Credentials.resolve)")

    def __reduce_ex__(self, protocol: object) -> str | tuple[object, ...]:
        return self.__reduce__()

    def __copy__(self) -> Credentials:
        return self

    def __deepcopy__(self, memo: object) -> Credentials:
        return self


# -- the handshake -----------------------------------------------------------------------------


class _Failed(Exception):
    """The handshake failed; ``reason`` becomes the AuthenticationError's."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _OtherVersion(_Failed):
    """The peer's hello is of another version of the handshake."""


async def authenticate_client(
    stream: ByteStream,
    credentials: Credentials,
    *,
    address: str,
    server_hostname: str | None,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> ByteStream:
    """Authenticate a fresh connection to a worker, both ways, and return the stream to frame
    over (``stream`` itself, or a :class:`~anyio.streams.tls.TLSStream` around it with ``tls``).

    With ``credentials.tls``: a TLS handshake presenting our certificate and verifying the
    worker's, and its host name against ``server_hostname``. Then the hellos, and with
    ``credentials.secret`` the challenge-response (see the module docstring). Nothing beyond
    the handshake is read from ``stream``, and nothing beyond our proof is sent before the
    worker proved itself.

    The returned TLS stream closes without a TLS closing handshake (``standard_compatible`` is
    off: frames are length-prefixed, so a truncation is seen anyway) and does not support
    ``send_eof`` (anyio raises ``NotImplementedError``).

    :param stream: a connected byte stream (TCP), nothing sent or read on it yet.
    :param credentials: ours; the worker must hold the same secret and/or a certificate from
        our CA.
    :param address: the worker's address as discovery announced it and we dialed it
        (``"host:port"``): the proofs cover it, and the error names it.
    :param server_hostname: the host name or IP address the worker's certificate must name;
        required with ``tls``, ignored without.
    :param timeout: seconds (> 0, ``math.inf`` for none) for the whole handshake, TLS included.
    :raises AuthenticationError: (with ``address`` and a reason) the worker rejected our
        credentials (it sent a rejection or hung up: another secret, or it announces another
        address than ``address``), could not prove it holds the secret, is configured otherwise
        (a secret on one side only), presented a certificate that does not verify, or is not an
        anywool worker or speaks another version of the handshake.
    :raises WorkerError: the worker did not finish the handshake within ``timeout`` (a worker
        whose event loop is blocked does that; it says nothing about our credentials).
    :raises TypeError: ``credentials`` is not a :class:`Credentials`, or ``timeout`` not a
        number.
    :raises ValueError: ``tls`` without ``server_hostname``, or ``timeout`` is not > 0.

    On any exception, cancellation included, ``stream`` is closed (forcefully) before it
    propagates. Cancellation: safe at any point.
    """
    try:
        _check(credentials, timeout)
        if credentials.tls is not None and not server_hostname:
            raise ValueError("server_hostname is required with tls (the name the worker's "
                             "certificate must hold)")
        with anyio.move_on_after(timeout):
            return await _client(stream, credentials, server_hostname, address)
        raise WorkerError(address, f"did not complete the authentication handshake within "
                                   f"{timeout:g} s (its event loop may be blocked or "
                                   f"overloaded)")
    except _Failed as exc:
        await anyio.aclose_forcefully(stream)
        raise AuthenticationError(address, exc.reason) from exc.__cause__
    except BaseException:
        await anyio.aclose_forcefully(stream)
        raise


async def authenticate_server(
    stream: ByteStream,
    credentials: Credentials,
    *,
    address: str,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> ByteStream:
    """Authenticate a freshly accepted connection, both ways (the mirror of
    :func:`authenticate_client`), and return the stream to frame over: ``stream`` itself, or a
    :class:`~anyio.streams.tls.TLSStream` around it with ``tls``.

    Before the client is authenticated at most :data:`MAX_UNAUTHENTICATED_READ` (74) bytes of
    the handshake are read (with ``tls``, beyond the TLS handshake records themselves), never a
    length the client chose; a peer that fails is disconnected before anything else it sent is
    read, and it is never sent a proof.

    :param stream: an accepted byte stream (TCP), nothing sent or read on it yet.
    :param credentials: ours; the client must hold the same secret and/or a certificate from
        our CA.
    :param address: the address this worker announces (``"host:port"``): the client's proof
        must be over the address it dialed, and that must be this one.
    :param timeout: seconds (> 0, ``math.inf`` for none) for the whole handshake, TLS included.
    :raises AuthenticationError: (with the peer's address, ``"host:port"``, and a reason) the
        client's proof is wrong, its certificate is missing or does not verify, it is configured
        otherwise, is not an anywool client or speaks another version, hung up, or did not
        finish within ``timeout``. The caller logs it; the stream is already closed.
    :raises TypeError: ``credentials`` is not a :class:`Credentials`, or ``timeout`` not a
        number.
    :raises ValueError: ``timeout`` is not > 0.

    On any exception, cancellation included, ``stream`` is closed (forcefully) before it
    propagates. Cancellation: safe at any point.
    """
    peer = peer_address(stream)  # while the socket is open
    try:
        _check(credentials, timeout)
        with anyio.move_on_after(timeout):
            return await _server(stream, credentials, address)
        raise _Failed(f"the client did not complete authentication within {timeout:g} s")
    except _Failed as exc:
        await anyio.aclose_forcefully(stream)
        raise AuthenticationError(peer, exc.reason) from exc.__cause__
    except BaseException:
        await anyio.aclose_forcefully(stream)
        raise


def _check(credentials: object, timeout: object) -> None:
    if not isinstance(credentials, Credentials):
        raise TypeError(f"credentials must be Credentials, got {type(credentials).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")


async def _client(stream: ByteStream, credentials: Credentials,
                  server_hostname: str | None, address: str) -> ByteStream:
    channel = stream
    if credentials.tls is not None:
        channel = await _wrap(stream, credentials.tls, server_side=False, hostname=server_hostname)
    ours = _hello(_CLIENT, credentials)
    await _send(channel, ours, "the worker hung up before our hello")
    theirs = await _receive_hello(channel, ours, peer="worker")
    _compare_flags(ours, theirs, peer="worker")
    if credentials.secret is None:
        return channel
    proof = _mac(credentials.secret, _CLIENT_LABEL, ours, theirs, address)
    await _send(channel, proof, "the worker hung up before our proof")
    verdict = await _read(channel, 1, "the worker rejected our credentials (it hung up after "
                                      "our proof: it holds another secret)")
    if verdict != _ACCEPT:
        if verdict == _REJECT:
            raise _Failed("the worker rejected our credentials (our proof is wrong: it holds "
                          "another secret, or announces another address than the one we "
                          "dialed)")
        raise _Failed(f"the worker answered our proof with {verdict!r}, not a verdict")
    their_proof = await _read(channel, _PROOF, "the worker hung up inside its proof")
    expected = _mac(credentials.secret, _WORKER_LABEL, ours, theirs, address, proof)
    if not hmac.compare_digest(their_proof, expected):
        raise _Failed("the worker could not prove it holds the secret (its proof is wrong)")
    return channel


async def _server(stream: ByteStream, credentials: Credentials, address: str) -> ByteStream:
    channel = stream
    if credentials.tls is not None:
        channel = await _wrap(stream, credentials.tls, server_side=True, hostname=None)
    ours = _hello(_WORKER, credentials)
    try:
        theirs = await _receive_hello(channel, ours, peer="client")
    except _OtherVersion:
        with anyio.move_on_after(0.1):  # so that the client can say which version we speak
            try:
                await _send(channel, ours, "")
            except _Failed:
                pass
        raise
    await _send(channel, ours, "the client hung up before our hello")
    _compare_flags(ours, theirs, peer="client")
    if credentials.secret is None:
        return channel
    their_proof = await _read(channel, _PROOF, "the client hung up before its proof")
    expected = _mac(credentials.secret, _CLIENT_LABEL, theirs, ours, address)
    if not hmac.compare_digest(their_proof, expected):
        with anyio.move_on_after(0.1):  # a courtesy; the client copes with a hang-up too
            try:
                await channel.send(_REJECT)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, ssl.SSLError):
                pass
        raise _Failed("the client's proof is wrong: it does not hold this worker's secret, or "
                      f"it dialed another address than {address}")
    proof = _mac(credentials.secret, _WORKER_LABEL, theirs, ours, address, their_proof)
    await _send(channel, _ACCEPT + proof, "the client hung up before our proof")
    return channel


async def _wrap(stream: ByteStream, tls: MutualTLS, *, server_side: bool,
                hostname: str | None) -> TLSStream:
    peer = "client" if server_side else "worker"
    try:
        context = context_for(tls, server_side)
    except ValueError as exc:
        raise _Failed(f"our TLS files do not load: {exc}") from exc
    try:
        return await TLSStream.wrap(stream, server_side=server_side, hostname=hostname,
                                    ssl_context=context, standard_compatible=False)
    except ssl.SSLCertVerificationError as exc:
        raise _Failed(f"the {peer}'s certificate does not verify: "
                      f"{exc.verify_message or ssl_text(exc)}") from exc
    except ssl.SSLError as exc:
        raise _Failed(f"the TLS handshake failed: {ssl_text(exc)}"
                      f"{_not_tls_hint(exc, peer)}") from exc
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
        why = ("it may have rejected our certificate, or not speak TLS" if server_side else
               "it may not speak TLS: is it configured with tls?")
        raise _Failed(f"the {peer} hung up during the TLS handshake ({why})") from exc


def _not_tls_hint(exc: ssl.SSLError, peer: str) -> str:
    if exc.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL",
                      "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return f" (the {peer} does not speak TLS: is it configured with tls?)"
    return ""


def _hello(role: bytes, credentials: Credentials) -> bytes:
    flags = (_FLAG_SECRET if credentials.secret is not None else 0) | (
        _FLAG_TLS if credentials.tls is not None else 0)
    return _MAGIC + bytes((VERSION,)) + role + bytes((flags,)) + secrets.token_bytes(_NONCE)


async def _receive_hello(channel: ByteStream, ours: bytes, *, peer: str) -> bytes:
    gone = f"the {peer} closed the connection without a hello"
    if peer == "worker":
        gone += (" (with TLS 1.3, that is how a worker rejects our certificate)"
                 if ours[_PREFIX + 1] & _FLAG_TLS else
                 " (a worker configured with tls does that to a client without; or it is not "
                 "anywool)")
    prefix = await _read(channel, _PREFIX, gone)
    if prefix[:len(_MAGIC)] != _MAGIC:
        if prefix[0] in (0x15, 0x16) and prefix[1] == 0x03:  # a TLS alert or handshake record
            raise _Failed(f"the {peer} speaks TLS and we do not: configure tls on both sides")
        raise _Failed(f"the {peer} is not anywool: it sent {prefix!r} where an anywool hello "
                      "starts")
    if prefix[-1] != VERSION:
        raise _OtherVersion(f"the {peer} speaks version {prefix[-1]} of the anywool handshake, we "
                      f"speak version {VERSION}: run the same anywool on both sides")
    rest = await _read(channel, _HELLO - _PREFIX, f"the {peer} hung up inside its hello")
    theirs = prefix + rest
    role = theirs[_PREFIX:_PREFIX + 1]
    if role not in (_CLIENT, _WORKER):
        raise _Failed(f"the {peer} sent a garbled hello (role {role!r})")
    if role == ours[_PREFIX:_PREFIX + 1] or theirs[-_NONCE:] == ours[-_NONCE:]:
        raise _Failed(f"the {peer} sent back a hello like ours (a reflection): wrong role or "
                      "our own nonce")
    return theirs


def _compare_flags(ours: bytes, theirs: bytes, *, peer: str) -> None:
    mine, other = ours[_PREFIX + 1], theirs[_PREFIX + 1]
    if other & ~(_FLAG_SECRET | _FLAG_TLS):
        raise _Failed(f"the {peer} sent a garbled hello (flags {other:#04x})")
    if mine & _FLAG_SECRET and not other & _FLAG_SECRET:
        raise _Failed(f"the {peer} has no shared secret but we do: give both sides the same "
                      "secret (secret= or $ANYWOOL_SECRET), or neither")
    if other & _FLAG_SECRET and not mine & _FLAG_SECRET:
        raise _Failed(f"the {peer} requires a shared secret and we have none: pass secret= or "
                      "set $ANYWOOL_SECRET")
    if (mine ^ other) & _FLAG_TLS:  # only a peer that lies gets here: TLS would have failed
        raise _Failed(f"the {peer}'s hello disagrees with ours about TLS")


def _mac(secret: bytes, label: bytes, hello_c: bytes, hello_w: bytes, address: str,
         proof_c: bytes = b"") -> bytes:
    # The client's hello first, whichever side computes it; every part has a fixed size or its
    # length in front, so the concatenation is unambiguous.
    where = address.encode()
    return hmac.digest(secret, label + hello_c + hello_w + len(where).to_bytes(2, "big") + where
                       + proof_c, "sha256")


async def _send(channel: ByteStream, data: bytes, gone: str) -> None:
    try:
        await channel.send(data)
    except ssl.SSLError as exc:  # before OSError, its base class
        raise _Failed(f"{gone} ({ssl_text(exc)})") from exc
    except (anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
        raise _Failed(gone) from exc


async def _read(channel: ByteStream, size: int, gone: str) -> bytes:
    """Exactly ``size`` bytes, never asking the stream for more than is still missing (so a
    byte after the handshake stays in the stream).

    :raises _Failed: the peer hung up first (reason ``gone``, with the count when some came).
    """
    data = b""
    try:
        while len(data) < size:
            data += await channel.receive(size - len(data))
    except ssl.SSLError as exc:  # a TLS alert (before OSError, its base class)
        raise _Failed(f"{gone} (TLS alert: {ssl_text(exc)})") from exc
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
        raise _Failed(gone + (f" ({len(data)} of {size} bytes came)" if data else "")) from exc
    return data


def peer_address(stream: ByteStream) -> str:
    """The peer's address as ``"host:port"`` (``"unknown peer"`` when not an IP socket)."""
    try:
        remote = stream.extra(SocketAttribute.remote_address)
    except Exception:
        return "unknown peer"
    if isinstance(remote, tuple) and len(remote) >= 2:  # pyright: ignore[reportUnknownArgumentType]
        host, port = remote[0], remote[1]  # pyright: ignore[reportUnknownVariableType]
        if isinstance(host, str) and isinstance(port, int):
            try:
                return str(Address.tcp(host, port))
            except ValueError:
                pass
    return str(remote)  # pyright: ignore[reportUnknownArgumentType]
