"""The private network namespace the test run plays its LAN in (DESIGN §6).

At start-up the test run moves itself into a fresh network namespace, before it starts any
worker process of xdist, any thread or any event loop: everything it starts afterwards (threads
and processes alike) is in that namespace too. There, loopback is up and multicast is routed
over it, so zeroconf restricted to ``127.0.0.1`` sends and receives mDNS between the processes
of the test run and nowhere else. ``10.213.0.1`` on loopback plays a host's routable address.

Where the namespace cannot be made (not root, no ``unshare``, no ``ip``) the run stays where it
is and the tests that multicast skip with the reason (:func:`lan_unavailable`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

#: Set in the environment of the test run (and so of xdist's workers): ``"1"`` once inside.
ENV = "ANYWOOL_TEST_NETNS"
#: Why the namespace could not be made, for the skip message.
REASON_ENV = "ANYWOOL_TEST_NETNS_UNAVAILABLE"
#: A non-loopback address of "this host" inside the namespace.
ROUTABLE = "10.213.0.1"

_CLONE_NEWNET = 0x40000000
_SETUP = (
    ("link", "set", "lo", "up"),
    ("link", "set", "lo", "multicast", "on"),
    ("route", "add", "224.0.0.0/4", "dev", "lo"),
    ("addr", "add", f"{ROUTABLE}/24", "dev", "lo"),
)


def enter() -> None:
    """Move this process into a private network namespace, once per test run."""
    if os.environ.get(ENV) or os.environ.get(REASON_ENV):
        return  # an xdist worker: its parent did it, and it inherited the namespace
    reason = _enter()
    if reason is None:
        os.environ[ENV] = "1"
    else:
        os.environ[REASON_ENV] = reason


def _enter() -> str | None:
    ip = shutil.which("ip")
    if ip is None:
        return "no `ip` command (iproute2) to configure a private network namespace"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        return f"cannot create a private network namespace: {os.strerror(ctypes.get_errno())}"
    for args in _SETUP:
        done = subprocess.run([ip, *args], capture_output=True, text=True)
        if done.returncode != 0:
            return f"`ip {' '.join(args)}` failed: {done.stderr.strip()}"
    return None


def lan_unavailable() -> str | None:
    """Why multicast tests cannot run here, or ``None`` when inside the private namespace."""
    if os.environ.get(ENV) == "1":
        return None
    return os.environ.get(REASON_ENV) or "the test run is not in a private network namespace"
