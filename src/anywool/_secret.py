"""The shared secret: where it comes from, what it must be, how a spawned worker gets it.

One rule for every place that takes ``secret=`` (pools, proxies, workers, LAN discovery):
``bytes`` or ``str`` (UTF-8 encoded) of at least :data:`MIN_LENGTH` bytes; ``None`` means the
process's own secret, which is the one its spawning pool handed it (a worker) or else
``$ANYWOOL_SECRET``. Messages name the parameter and the secret's length, never its value.

A secret never travels inside a pickle: a proxy or a subscriber that is reduced (to go with a
nested call, say) leaves it behind, and the worker that rebuilds one uses its own. A spawning
pool hands its secret to a worker in the worker's environment (the variable is named by the
worker contract, :mod:`anywool.runtime.worker._contract`, which this module is below), and the
worker takes it out at start-up, so that its routines' children never see it.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "MIN_LENGTH", "for_child", "inherit", "resolve"]

#: The environment variable a secret is read from when none is given.
ENV = "ANYWOOL_SECRET"
#: The shortest secret accepted, in bytes.
MIN_LENGTH = 16

_inherited: bytes | None = None


def resolve(secret: object, parameter: str = "secret") -> bytes | None:
    """``secret`` as bytes, or this process's own secret when it is ``None`` (``None`` if it has
    none).

    :raises TypeError: ``secret`` is neither ``bytes``, ``str`` nor ``None``.
    :raises ValueError: it is shorter than :data:`MIN_LENGTH` bytes (``$ANYWOOL_SECRET``
        included, named as such).
    """
    if secret is None:
        if _inherited is not None:
            return _inherited
        text = os.environ.get(ENV)
        if not text:
            return None
        secret, parameter = os.fsencode(text), f"${ENV}"
    if isinstance(secret, str):
        try:
            encoded: bytes | None = secret.encode()
        except UnicodeEncodeError:
            encoded = None
        if encoded is None:  # raised outside the handler: the error quotes the secret
            raise ValueError(f"{parameter} must be encodable as UTF-8 (a str with lone "
                             "surrogates is not); pass bytes instead")
        secret = encoded
    elif isinstance(secret, (bytearray, memoryview)):
        secret = bytes(secret)
    elif not isinstance(secret, bytes):
        raise TypeError(f"{parameter} must be bytes or str, got {type(secret).__name__}")
    if len(secret) < MIN_LENGTH:
        raise ValueError(f"{parameter} must be at least {MIN_LENGTH} bytes long, got "
                         f"{len(secret)} bytes; for example secrets.token_hex(16)")
    return secret


def for_child(secret: bytes) -> str:
    """``secret`` as a spawning pool hands it to a worker, in its environment (hex: a secret
    may hold any byte; the variable is the worker contract's ``SECRET_ENV``)."""
    return secret.hex()


def inherit(text: str | None) -> None:
    """In a worker at start-up: take the secret its parent handed it (what :func:`for_child`
    made; ``None`` or empty: none) as this process's own."""
    global _inherited
    if text:
        _inherited = bytes.fromhex(text)
