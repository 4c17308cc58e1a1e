"""Address: the one grammar of worker addresses, and its canonical text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anywool._address import Address

hosts = st.one_of(
    st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)


@given(host=hosts, port=st.integers(1, 65535))
def test_a_tcp_address_round_trips_through_its_text(host, port):
    address = Address.tcp(host, port)
    assert Address.parse(str(address)) == address
    assert (address.host, address.port, address.is_unix) == (host, port, False)


@given(path=st.from_regex(r"/[a-zA-Z0-9_./:-]{0,40}", fullmatch=True))
def test_a_unix_address_round_trips_through_its_text(path):
    address = Address.parse(f"unix:{path}")
    assert str(address) == f"unix:{path}"
    assert (address.path, address.host, address.is_unix) == (path, None, True)


def test_an_ipv6_host_is_written_in_brackets():
    address = Address.parse("[::1]:8080")
    assert (address.host, address.port, str(address)) == ("::1", 8080, "[::1]:8080")
    assert str(Address.tcp("fe80::1%eth0", 9)) == "[fe80::1%eth0]:9"


@pytest.mark.parametrize("text, problem", [
    ("", "expected 'unix:/absolute/path' or 'host:port'"),
    ("nowhere", "expected 'unix:/absolute/path' or 'host:port'"),
    ("unix:relative", "absolute path"),
    ("unix:", "absolute path"),
    ("host:", "decimal number"),
    ("host:http", "decimal number"),
    ("host:²", "decimal number"),
    (":80", "the host is empty"),
    ("::1:80", "IPv6 host goes in brackets"),
    ("[localhost]:80", "brackets are for IPv6 hosts only"),
    ("[::zz]:80", "neither a host name nor an IPv6 address"),
    ("a]:80", "bracket"),
])
def test_a_malformed_address_is_rejected_naming_the_text(text, problem):
    with pytest.raises(ValueError, match="address") as info:
        Address.parse(text)
    assert repr(text) in str(info.value) and problem in str(info.value)


@pytest.mark.parametrize("port", ["0", "65536", "70000"])
def test_a_port_outside_1_to_65535_is_rejected(port):
    with pytest.raises(ValueError, match="1 to 65535"):
        Address.parse(f"localhost:{port}")


def test_port_0_is_accepted_in_an_address_to_bind():
    assert Address.parse("127.0.0.1:0", bind=True) == Address.tcp("127.0.0.1", 0)
    assert Address.parse("127.0.0.1:65535").port == 65535


def test_an_address_has_exactly_one_form():
    with pytest.raises(ValueError, match="not both"):
        Address(path="/s", host="h", port=1)
    with pytest.raises(ValueError, match="the host is empty"):
        Address()
    with pytest.raises(ValueError, match="0 to 65535"):
        Address.tcp("h", 65536)
    with pytest.raises(TypeError, match="must be a str"):
        Address.parse(b"unix:/s")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", [
    "unix:/a/s", "unix:/", "unix:rel", "unix:", "host:80", "h:0", "h:70000", "[::1]:9",
    "::1:9", "[h]:9", ":80", "host:", "nowhere", "a b:1", "10.0.0.1:65535",
])
def test_is_valid_agrees_with_parse(text):
    from anywool._address import Address, is_valid

    try:
        Address.parse(text)
    except ValueError:
        parses = False
    else:
        parses = True
    assert is_valid(text) is parses
