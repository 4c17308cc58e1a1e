"""EtcdDiscovery's arguments: checked at construction with errors that name the parameter and
the value (never a password), and pickles that carry no secret. No etcd needed."""

from __future__ import annotations

import pickle
import ssl
from typing import Any

import pytest

from anywool import EtcdDiscovery
from anywool.discovery.etcd._config import Config
from anywool.discovery.etcd._keys import Keys, range_end
from anywool.errors import (
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryServiceError,
    DiscoveryUnavailable,
)


@pytest.mark.parametrize(("options", "error", "words"), [
    ({"endpoints": "127.0.0.1:2379"}, ValueError, "'127.0.0.1:2379'"),
    ({"endpoints": "ftp://h:1"}, ValueError, "ftp://h:1"),
    ({"endpoints": "http://h"}, ValueError, "'http://h'"),           # no port
    ({"endpoints": "http://h:1/v3"}, ValueError, "http://h:1/v3"),   # a path
    ({"endpoints": "http://u:p@h:1"}, ValueError, "endpoints"),
    ({"endpoints": "http://h:99999"}, ValueError, "endpoints"),
    ({"endpoints": []}, ValueError, "at least one"),
    ({"endpoints": ["http://a:1", "https://b:1"]}, ValueError, "all https"),
    ({"endpoints": [b"http://a:1"]}, TypeError, "endpoints"),
    ({"endpoints": 2379}, TypeError, "endpoints"),
    ({"prefix": "anywool"}, ValueError, "prefix"),
    ({"prefix": "/"}, ValueError, "prefix"),
    ({"prefix": "/" + "a" * 300}, ValueError, "256"),
    ({"prefix": b"/a"}, TypeError, "prefix"),
    ({"lease_ttl": 0}, ValueError, "lease_ttl"),
    ({"lease_ttl": 86_401}, ValueError, "lease_ttl"),
    ({"lease_ttl": 1.5}, TypeError, "lease_ttl"),
    ({"lease_ttl": True}, TypeError, "lease_ttl"),
    ({"tls": "ca.pem", "endpoints": "https://h:1"}, TypeError, "tls"),
    ({"tls": ssl.create_default_context()}, ValueError, "https://"),  # with http endpoints
    ({"password": "pw"}, ValueError, "username"),
    ({"username": ""}, ValueError, "username"),
    ({"username": 3}, TypeError, "username"),
    ({"connect_timeout": 0}, ValueError, "connect_timeout"),
    ({"request_timeout": -1}, ValueError, "request_timeout"),
    ({"teardown_timeout": float("nan")}, ValueError, "teardown_timeout"),
    ({"own": 1}, TypeError, "own"),
    ({"filter": 3}, TypeError, "filter"),
])
def test_bad_arguments_are_refused_naming_them(options: dict[str, Any], error: type[Exception],
                                               words: str) -> None:
    with pytest.raises(error, match=None) as caught:
        EtcdDiscovery("ns", **options)
    assert words in str(caught.value)


def test_borrowers_check_their_arguments_too() -> None:
    with pytest.raises(ValueError, match="endpoints"):
        EtcdDiscovery.Publisher("ns", endpoints="nope")
    with pytest.raises(ValueError, match="prefix"):
        EtcdDiscovery.Subscriber("ns", prefix="x")
    with pytest.raises(TypeError, match="namespace"):
        EtcdDiscovery.Subscriber(b"ns")  # type: ignore[arg-type]


def test_a_password_is_never_shown_nor_pickled() -> None:
    secretive = "pa55-w0rd-not-to-leak"
    with pytest.raises(TypeError) as caught:
        EtcdDiscovery("ns", username="u", password=b"pa55-w0rd-not-to-leak")  # type: ignore[arg-type]
    assert secretive not in str(caught.value)
    context = ssl.create_default_context()
    for obj in (EtcdDiscovery("ns", endpoints="https://h:1", username="u", password=secretive,
                              tls=context),
                EtcdDiscovery.Subscriber("ns", endpoints="https://h:1", username="u",
                                         password=secretive, tls=context)):
        data = pickle.dumps(obj)
        assert secretive.encode() not in data
        assert secretive not in repr(obj)
        copy = pickle.loads(data)
        assert copy._config.password is None and copy._config.tls is None
        assert copy._config.username == "u" and copy._config.endpoints == ("https://h:1",)


def test_endpoints_are_normalised_and_defaults_documented() -> None:
    d = EtcdDiscovery("ns", endpoints=["http://a:1/", "http://b:2"], prefix="/apps/x/")
    assert d.endpoints == ("http://a:1", "http://b:2")
    assert d.prefix == "/apps/x"
    default = EtcdDiscovery("ns")
    assert default.endpoints == ("http://127.0.0.1:2379",)
    assert default.prefix == "/anywool" and default.lease_ttl == 5
    c = default._config
    assert (c.connect_timeout, c.request_timeout, default._teardown_timeout) == (1.0, 2.0, 5.0)
    sub = EtcdDiscovery.Subscriber("ns")
    assert sub._config.endpoints == ("http://127.0.0.1:2379",)


def test_keys_hash_the_namespace_and_stay_under_the_prefix() -> None:
    keys = Keys("/p", "a/b\0c")
    assert keys.owner.startswith(b"/p/ns/") and b"a/b" not in keys.owner
    assert keys.base < keys.owner < keys.end and keys.base < keys.workers < keys.workers_end
    assert keys.workers_end <= keys.end
    assert range_end(b"a\xff\xff") == b"b" and range_end(b"\xff") == b"\0"
    assert Keys("/p", "x").base != Keys("/p", "y").base != Keys("/q", "x").base
    assert keys.uid_of(keys.owner) is None and keys.uid_of(keys.workers + b"zz") is None


def test_http_needs_no_tls_context_and_https_gets_one() -> None:
    assert Config.make("http://h:1", "/a", None, None, None, 1, 1).ssl_context() is False
    made = Config.make("https://h:1", "/a", None, None, None, 1, 1).ssl_context()
    assert isinstance(made, ssl.SSLContext) and made.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("error", [
    DiscoveryNamespaceInUse("ns", "etcd key /k", 12, "EtcdDiscovery"),
    DiscoveryNamespaceNotFound("ns", "EtcdDiscovery"),
    DiscoveryServiceError("http://h:1", 7, "permission denied"),
    DiscoveryUnavailable(("http://a:1", "http://b:2"), "ConnectError"),
])
def test_the_new_errors_rebuild_from_their_args(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and copy.args == error.args and str(copy) == str(error)
    assert "EtcdDiscovery" in str(error) or "discovery service" in str(error)
