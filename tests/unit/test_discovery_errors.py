"""Discovery errors keep class, fields, field types and message across every boundary."""

from __future__ import annotations

import pickle
import threading
import warnings

import cloudpickle
import pytest
from hypothesis import given
from hypothesis import strategies as st

from anywool import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    DiscoveryNamespaceInUse,
    DiscoveryNamespaceNotFound,
    DiscoveryWorkerNotFound,
    SerializationWarning,
)
from anywool.runtime.wire import _exceptions as exceptions
from anywool.runtime.wire import _frames as wire

FIELDS = {
    DiscoveryNamespaceInUse: ("namespace", "path", "owner_pid"),
    DiscoveryNamespaceNotFound: ("namespace",),
    DiscoveryCapacityExhausted: ("capacity",),
    DiscoveryBlockExhausted: ("size",),
    DiscoveryWorkerNotFound: ("uid",),
}

errors = st.one_of(
    st.builds(DiscoveryNamespaceInUse, st.text(), st.text(), st.one_of(st.none(), st.integers(1, 2**22))),
    st.builds(DiscoveryNamespaceNotFound, st.text()),
    st.builds(DiscoveryCapacityExhausted, st.integers(1, 65_536)),
    st.builds(DiscoveryBlockExhausted, st.integers(0, 2**31)),
    st.builds(DiscoveryWorkerNotFound, st.uuids()),
)


def through_exception_frame(error: BaseException) -> BaseException:
    frame = wire.Frame(wire.Kind.EXCEPTION, 7, exceptions.dumps_exception(error))
    data = wire.encode(frame)
    decoded = wire.decode_body(data[4:])
    assert decoded.kind is wire.Kind.EXCEPTION and decoded.call_id == 7
    return exceptions.loads_exception(decoded.payload)


def assert_same(clone: BaseException, error: BaseException) -> None:
    assert type(clone) is type(error)
    for name in FIELDS[type(error)]:
        assert getattr(clone, name) == getattr(error, name)
        assert type(getattr(clone, name)) is type(getattr(error, name))
    assert clone.args == error.args
    assert str(clone) == str(error)


@given(error=errors)
@pytest.mark.parametrize("boundary", [
    lambda e: pickle.loads(pickle.dumps(e)),
    lambda e: cloudpickle.loads(cloudpickle.dumps(e)),
    through_exception_frame,
], ids=["pickle", "cloudpickle", "exception-frame"])
def test_discovery_errors_survive_every_boundary(boundary, error):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact copy must not warn
        assert_same(boundary(error), error)


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()


@given(error=errors)
def test_unpicklable_cause_falls_back_to_rebuild_with_a_warning(error):
    try:
        try:
            raise Unpicklable()
        except Unpicklable as cause:
            raise error from cause
    except type(error) as raised:
        with pytest.warns(SerializationWarning, match="rebuilt"):
            clone = through_exception_frame(raised)
    assert_same(clone, error)
    assert isinstance(clone.__cause__, BaseException)
    assert "holds a lock" in str(clone.__cause__)
