"""The sandbox itself: the test run's network is private, and multicast works inside it."""

from __future__ import annotations

import socket
import struct

from tests import netns


def test_the_run_sees_only_its_private_loopback() -> None:
    # The machine's real interfaces are out of reach: no mDNS can leave the sandbox.
    assert [name for _, name in socket.if_nameindex()] == ["lo"]


def test_multicast_loops_back_between_sockets() -> None:
    group, port = "224.0.0.251", 53530
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with receiver, sender:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        receiver.bind(("", port))
        membership = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton("127.0.0.1"))
        receiver.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        receiver.settimeout(5)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        sender.sendto(b"anywool", (group, port))
        data, _ = receiver.recvfrom(64)
    assert data == b"anywool"


def test_a_routable_address_is_local() -> None:
    with socket.create_server((netns.ROUTABLE, 0)) as server:
        with socket.create_connection(server.getsockname()[:2], timeout=5):
            pass
