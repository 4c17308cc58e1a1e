import pickle
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anywool import WorkerMetadata

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=20),
                    st.binary(max_size=20), st.floats(allow_nan=False))
extras = st.dictionaries(st.text(max_size=10), scalars, max_size=5)


@given(
    uid=st.uuids(),
    address=st.one_of(st.just("unix:/tmp/w.sock"), st.integers(1, 65535).map(lambda p: f"127.0.0.1:{p}")),
    pid=st.integers(0, 2**31 - 1),
    version=st.text(max_size=20),
    tags=st.frozensets(st.text(max_size=10), max_size=5),
    extra=extras,
    secure=st.booleans(),
)
def test_codec_round_trips_every_field(uid, address, pid, version, tags, extra, secure):
    metadata = WorkerMetadata(uid, address, pid, version, tags, extra, secure)
    decoded = WorkerMetadata.from_bytes(metadata.to_bytes())
    assert decoded.same_as(metadata)
    assert (decoded.uid, decoded.address, decoded.pid, decoded.version, decoded.tags,
            dict(decoded.extra), decoded.secure) == (uid, address, pid, version, tags, extra, secure)
    assert pickle.loads(pickle.dumps(metadata)).same_as(metadata)


def test_equality_and_hash_follow_uid_only():
    uid = uuid.uuid4()
    a = WorkerMetadata(uid, "unix:/a", 1, "1")
    b = WorkerMetadata(uid, "unix:/b", 2, "2")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert not a.same_as(b)


def test_metadata_is_frozen():
    metadata = WorkerMetadata(uuid.uuid4(), "unix:/a", 1, "1")
    with pytest.raises(AttributeError):
        metadata.pid = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        metadata.extra["x"] = 1  # type: ignore[index]


@pytest.mark.parametrize("address", ["", "nowhere", "unix:relative", "host:", ":80", "h:70000"])
def test_bad_address_is_rejected(address):
    with pytest.raises(ValueError, match="address"):
        WorkerMetadata(uuid.uuid4(), address, 1, "1")


def test_garbage_bytes_are_rejected():
    with pytest.raises(ValueError):
        WorkerMetadata.from_bytes(b"\x93\x01\x02")


@pytest.mark.parametrize("fields", [
    [1, b"short", "unix:/a", 1, "1", [], {}, False],  # a uid of the wrong length
    [1, uuid.uuid4().bytes, "nowhere", 1, "1", [], {}, False],  # not an address
    [1, uuid.uuid4().bytes, "unix:/a", "1", "1", [], {}, False],  # pid not an int
    [1, uuid.uuid4().bytes, "unix:/a", True, "1", [], {}, False],  # pid a bool
    [1, uuid.uuid4().bytes, "unix:/a", 1, 1, [], {}, False],  # version not a str
    [1, uuid.uuid4().bytes, "unix:/a", 1, "1", [1], {}, False],  # a tag not a str
    [1, uuid.uuid4().bytes, "unix:/a", 1, "1", "ab", {}, False],  # tags a str
    [1, uuid.uuid4().bytes, "unix:/a", 1, "1", [], [], False],  # extra not a map
    [2, uuid.uuid4().bytes, "unix:/a", 1, "1", [], {}, False],  # an unknown codec version
    [1, uuid.uuid4().bytes, "unix:/a", 1, "1", [], {}],  # a field missing
])
def test_records_of_the_wrong_shape_are_rejected(fields):
    import msgpack

    with pytest.raises(ValueError, match="WorkerMetadata"):
        WorkerMetadata.from_bytes(msgpack.packb(fields, use_bin_type=True))


def test_a_record_decodes_from_a_memoryview_as_from_bytes():
    metadata = WorkerMetadata(uuid.uuid4(), "unix:/a", 1, "1", {"t"}, {"k": [1, "x"]}, True)
    decoded = WorkerMetadata.from_bytes(memoryview(b"pad" + metadata.to_bytes())[3:])
    assert decoded.same_as(metadata) and isinstance(decoded.tags, frozenset)
    with pytest.raises(TypeError):
        decoded.extra["k"] = 2  # type: ignore[index]


@pytest.mark.parametrize("uid", ["0123456789abcdef", list(range(16)), 16, None, b"\0" * 15])
def test_a_uid_of_the_wrong_kind_is_a_value_error(uid):
    import msgpack

    record = msgpack.packb([1, uid, "unix:/a", 1, "1", [], {}, False], use_bin_type=True)
    with pytest.raises(ValueError, match="WorkerMetadata"):
        WorkerMetadata.from_bytes(record)


def test_extra_with_a_bytes_key_is_refused():
    import msgpack

    record = msgpack.packb([1, uuid.uuid4().bytes, "unix:/a", 1, "1", [], {b"k": 1}, False],
                           use_bin_type=True)
    with pytest.raises(ValueError, match="WorkerMetadata"):
        WorkerMetadata.from_bytes(record)
