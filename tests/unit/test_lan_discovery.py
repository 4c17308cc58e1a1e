"""LanDiscovery without a network: its parameters, its shapes, its pickles."""

from __future__ import annotations

import pickle

import anyio
import pytest

import anywool
from anywool import (
    DiscoveryLike,
    DiscoveryPublisherLike,
    DiscoverySubscriberLike,
    LanDiscovery,
)

pytestmark = pytest.mark.anyio

SECRET = b"a secret of sixteen bytes or more"


@pytest.mark.parametrize("make", [LanDiscovery, LanDiscovery.Publisher, LanDiscovery.Subscriber],
                         ids=["owner", "publisher", "subscriber"])
@pytest.mark.parametrize("kwargs, error, words", [
    ({"namespace": 42}, TypeError, "namespace must be a str, got 42"),
    ({"interfaces": "127.0.0.1"}, TypeError, "not a single str: '127.0.0.1'"),
    ({"interfaces": 3}, TypeError, "interfaces must be None or an iterable"),
    ({"interfaces": []}, ValueError, "at least one interface"),
    ({"interfaces": ["eth0"]}, ValueError, "IP addresses, got 'eth0'"),
    ({"interfaces": [True]}, TypeError, "got True in [True]"),
    ({"interfaces": [-1]}, ValueError, "index must be >= 0, got -1"),
    ({"secret": b"short"}, ValueError, "secret must be at least 16 bytes long, got 5 bytes"),
    ({"secret": 1234}, TypeError, "secret must be bytes or str, got int"),
])
def test_every_parameter_is_checked_at_construction(make, kwargs, error, words):
    arguments = {"namespace": "jobs", **kwargs}
    with pytest.raises(error) as info:
        make(arguments.pop("namespace"), **arguments)
    assert words in str(info.value)


def test_a_secret_never_shows_in_a_message():
    with pytest.raises(ValueError) as info:
        LanDiscovery("jobs", secret="hunter2")
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in repr(LanDiscovery.Subscriber("jobs", secret="hunter2" * 3))


def test_interfaces_accept_addresses_and_indexes():
    assert LanDiscovery("jobs", interfaces=("127.0.0.1", "::1", 2)).interfaces == \
        ("127.0.0.1", "::1", 2)
    assert LanDiscovery("jobs").interfaces is None


def test_the_owner_and_its_borrowers_satisfy_the_protocols():
    discovery = LanDiscovery("jobs", interfaces=["127.0.0.1"])
    assert isinstance(discovery, DiscoveryLike)
    assert isinstance(discovery.publisher, DiscoveryPublisherLike)
    assert isinstance(discovery.subscriber, DiscoverySubscriberLike)
    assert isinstance(discovery.subscribe(lambda m: True), DiscoverySubscriberLike)
    assert isinstance(LanDiscovery.Subscriber("jobs"), DiscoverySubscriberLike)
    assert anywool.discovery.LanDiscovery is anywool.LanDiscovery is LanDiscovery


def test_a_subscriber_pickles_as_its_constructor_call_without_the_secret():
    subscriber = LanDiscovery.Subscriber("jobs", interfaces=["127.0.0.1"], secret=SECRET)
    data = pickle.dumps(subscriber)
    assert SECRET not in data
    clone = pickle.loads(data)
    assert isinstance(clone, LanDiscovery.Subscriber)
    assert clone == LanDiscovery.Subscriber("jobs", interfaces=["127.0.0.1"])
    assert clone != subscriber  # the original still has its secret, the clone does not
    assert (clone.namespace, clone.interfaces) == ("jobs", ("127.0.0.1",))
    assert SECRET not in pickle.dumps(LanDiscovery("jobs", secret=SECRET).subscriber)


async def test_the_owner_is_single_use_and_claims_nothing():
    discovery = LanDiscovery("jobs")
    assert not discovery.claimed
    with anyio.fail_after(5):
        async with discovery:
            assert discovery.claimed
            async with LanDiscovery("jobs"):  # no single owner on a LAN
                pass
        assert not discovery.claimed
        with pytest.raises(RuntimeError, match="single-use"):
            async with discovery:
                pass


async def test_publishing_needs_an_entered_publisher():
    from ..helpers import worker

    publisher = LanDiscovery.Publisher("jobs")
    with anyio.fail_after(5):
        with pytest.raises(RuntimeError, match="entered publisher"):
            await publisher.publish("worker-added", worker())
        with pytest.raises(ValueError, match="type must be one of"):
            await publisher.publish("worker-born", worker())  # type: ignore[arg-type]


async def test_a_bad_secret_in_the_environment_is_named_when_iteration_starts(monkeypatch):
    monkeypatch.setenv("ANYWOOL_SECRET", "short")
    subscriber = LanDiscovery.Subscriber("jobs")  # constructing reads no environment
    with pytest.raises(ValueError, match=r"\$ANYWOOL_SECRET must be at least 16 bytes"):
        aiter(subscriber)
