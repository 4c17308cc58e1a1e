import copy
import pickle
import uuid

import cloudpickle
import pytest

import anywool
from anywool.errors import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryRegistryCorrupt,
    DiscoveryServiceError,
    DiscoveryUnavailable,
    DiscoveryWorkerNotFound,
    NoWorkersAvailable,
)

CASES = [
    (DiscoveryNamespaceInUse, ("jobs", "/dev/shm/anywool-0/ns-abc", 4242, "LocalDiscovery"),
     ("namespace", "path", "owner_pid", "kind")),
    (DiscoveryNamespaceInUse, ("jobs", "/x/ns-abc", None, "LocalDiscovery"),
     ("namespace", "path", "owner_pid", "kind")),
    (DiscoveryNamespaceInUse, ("jobs", "etcd key /anywool/ns/ab/owner", 7, "EtcdDiscovery"),
     ("namespace", "path", "owner_pid", "kind")),
    (DiscoveryNamespaceNotFound, ("jobs", "LocalDiscovery"), ("namespace", "kind")),
    (DiscoveryNamespaceNotFound, ("jobs", "EtcdDiscovery"), ("namespace", "kind")),
    (DiscoveryServiceError, ("http://etcd:2379", 7, "permission denied"),
     ("endpoint", "code", "message")),
    (DiscoveryServiceError, ("http://etcd:2379", None, "HTTP 400: not JSON"),
     ("endpoint", "code", "message")),
    (DiscoveryUnavailable, (("http://a:1", "http://b:2"), "ConnectError"),
     ("endpoints", "reason")),
    (DiscoveryRegistryCorrupt, ("jobs", "/x/ns-abc/registry", "truncated"),
     ("namespace", "path", "reason")),
    (DiscoveryCapacityExhausted, (128,), ("capacity",)),
    (DiscoveryBlockExhausted, (1025,), ("size",)),
    (DiscoveryWorkerNotFound, (uuid.UUID(int=7),), ("uid",)),
    (NoWorkersAvailable, ("quorum wait timed out", "jobs"), ("reason", "namespace")),
    (NoWorkersAvailable, ("quorum wait timed out", None), ("reason", "namespace")),
]


@pytest.mark.parametrize(("cls", "args", "names"), CASES)
@pytest.mark.parametrize("roundtrip", [
    lambda e: pickle.loads(pickle.dumps(e)),
    lambda e: cloudpickle.loads(cloudpickle.dumps(e)),
    lambda e: type(e)(*e.args),
    copy.copy,
], ids=["pickle", "cloudpickle", "from-args", "copy"])
def test_error_fields_survive_round_trip(cls, args, names, roundtrip):
    error = cls(*args)
    clone = roundtrip(error)
    assert type(clone) is cls
    assert clone.args == args
    for name, value in zip(names, args):
        assert getattr(clone, name) == value
        assert type(getattr(clone, name)) is type(value)
    assert str(clone) == str(error)


@pytest.mark.parametrize(("cls", "args", "names"), CASES)
def test_errors_are_wool_errors_with_fields_in_message(cls, args, names):
    error = cls(*args)
    assert isinstance(error, anywool.WoolError)
    first = args[0] if isinstance(args[0], tuple) else (args[0],)
    assert all(str(part) in str(error) for part in first)


def test_namespace_in_use_says_when_the_owner_is_dead():
    assert "dead" in str(DiscoveryNamespaceInUse("jobs", "/p", None))
    assert "4242" in str(DiscoveryNamespaceInUse("jobs", "/p", 4242))
