"""LAN records without a network: service types, instance names, TXT split and signatures."""

from __future__ import annotations

import re
import uuid

import pytest

from anywool.discovery.lan import _service
from anywool.discovery.lan._service import InvalidRecord

from ..helpers import worker

SECRET = b"0123456789abcdef-lan"
TYPE = _service.service_type("jobs")
DIGEST = _service.namespace_digest("jobs")


def record(metadata, secret=SECRET, type_=TYPE, digest=DIGEST):
    name = _service.instance_name(type_, metadata.uid)
    return name, _service.encode_txt(type_, name, digest, metadata.to_bytes(), secret)


def decode(name, data, secret=SECRET, type_=TYPE, digest=DIGEST):
    return _service.decode_txt(type_, name, digest, _service.parse_txt(data), secret)


def test_a_service_type_is_a_valid_dns_sd_label_with_48_bits_of_hash():
    from zeroconf import ServiceInfo  # zeroconf's own check of the name

    for namespace in ("jobs", "", "a/b/../c", "\0", "é" * 10_000, "\udcff"):
        type_ = _service.service_type(namespace)
        assert re.fullmatch(r"_aw-[0-9a-f]{12}\._tcp\.local\.", type_)
        assert len(type_.split(".")[0]) - 1 <= 15  # the service name, without its underscore
        ServiceInfo(type_, f"{uuid.uuid4().hex}.{type_}")
    assert _service.service_type("jobs") != _service.service_type("jobs2")


def test_an_instance_name_stands_for_its_worker_uid():
    uid = uuid.uuid4()
    name = _service.instance_name(TYPE, uid)
    assert _service.uid_of(name, TYPE) == uid
    assert _service.uid_of(name.upper(), TYPE) == uid  # DNS names are case-insensitive
    assert _service.uid_of(name, _service.service_type("other")) is None
    assert _service.uid_of(f"printer.{TYPE}", TYPE) is None


@pytest.mark.parametrize("secret", [SECRET, None], ids=["signed", "unsigned"])
def test_metadata_larger_than_one_txt_value_is_split_and_reassembled(secret):
    big = worker("10.0.0.1:5000", tags={f"tag-{i}" for i in range(100)},
                 extra={"blob": "x" * 1500, "n": 1})
    assert len(big.to_bytes()) > 255
    name, data = record(big, secret)
    entries = _service.parse_txt(data)
    assert int(entries[b"n"]) == -(-len(big.to_bytes()) // _service.CHUNK)
    offset = 0
    while offset < len(data):  # every TXT string fits its one-byte length
        assert data[offset] <= 255
        offset += 1 + data[offset]
    assert decode(name, data, secret).same_as(big)


def test_metadata_over_the_record_limit_is_refused():
    huge = worker(extra={"blob": "x" * _service.MAX_METADATA})
    with pytest.raises(ValueError, match="bytes a LAN record carries"):
        record(huge)


def test_a_signed_record_verifies_only_with_its_secret():
    metadata = worker("10.0.0.1:5000")
    name, data = record(metadata)
    assert decode(name, data).same_as(metadata)
    with pytest.raises(InvalidRecord, match="signature"):
        decode(name, data, secret=b"another secret of 16+ bytes")
    assert decode(name, data, secret=None).same_as(metadata)  # nothing to verify it with


def test_a_subscriber_with_a_secret_ignores_unsigned_records():
    name, data = record(worker(), secret=None)
    with pytest.raises(InvalidRecord, match="unsigned"):
        decode(name, data)


def test_tampering_with_any_signed_part_fails_verification():
    metadata = worker("10.0.0.1:5000")
    name, data = record(metadata)
    # Another worker's address in the same record, re-chunked but with the old signature.
    forged = worker("10.6.6.6:5000", uid=metadata.uid, pid=metadata.pid)
    entries = _service.parse_txt(data)
    forged_data = _service.encode_txt(TYPE, name, DIGEST, forged.to_bytes(), None)
    tampered = {**_service.parse_txt(forged_data), b"sig": entries[b"sig"]}
    with pytest.raises(InvalidRecord, match="signature"):
        _service.decode_txt(TYPE, name, DIGEST, tampered, SECRET)
    # The same record moved to another instance name.
    other = _service.instance_name(TYPE, uuid.uuid4())
    with pytest.raises(InvalidRecord):
        decode(other, data)


def test_an_instance_name_must_match_the_metadata_uid_even_unsigned():
    metadata = worker()
    _, data = record(metadata, secret=None)
    with pytest.raises(InvalidRecord, match="announces worker"):
        decode(_service.instance_name(TYPE, uuid.uuid4()), data, secret=None)


def test_records_of_a_namespace_whose_service_type_collides_are_ignored():
    metadata = worker()
    name, data = record(metadata, secret=None, digest=_service.namespace_digest("other"))
    with pytest.raises(InvalidRecord, match="another namespace"):
        decode(name, data, secret=None)


@pytest.mark.parametrize("data", [
    b"",
    b"\x05v=1",  # cut short
    b"\x03v=2",
    b"\x03v=1\x05junk!",
    bytes([255]) + b"x" * 10,
])
def test_malformed_records_are_rejected_not_raised_through(data):
    with pytest.raises(InvalidRecord):
        decode(_service.instance_name(TYPE, uuid.uuid4()), data, secret=None)


def test_missing_chunks_and_undecodable_metadata_are_rejected():
    metadata = worker(extra={"blob": "x" * 600})
    name, data = record(metadata, secret=None)
    entries = _service.parse_txt(data)
    del entries[b"1"]
    with pytest.raises(InvalidRecord, match="chunk"):
        _service.decode_txt(TYPE, name, DIGEST, entries, None)
    garbage = _service.encode_txt(TYPE, name, DIGEST, b"\xc1not msgpack", SECRET)
    with pytest.raises(InvalidRecord, match="not an encoded WorkerMetadata"):
        decode(name, garbage)


def test_the_first_of_a_repeated_txt_key_wins():
    assert _service.parse_txt(b"\x03a=1\x03a=2\x01b") == {b"a": b"1", b"b": b""}


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:80", True),
    ("127.9.9.9:80", True),
    ("[::1]:80", True),
    ("[::ffff:127.0.0.1]:80", True),
    ("localhost:80", True),
    ("LocalHost.:80", True),
    ("10.213.0.1:80", False),
    ("[fe80::1]:80", False),
    ("worker.example:80", False),
    ("unix:/tmp/w.sock", True),  # a Unix socket reaches this host only, too
])
def test_loopback_addresses_are_recognised(address, loopback):
    assert _service.is_loopback(address) is loopback


@pytest.mark.parametrize("label", ["é" * 32, "\udcff" * 32, "g" * 32, "x"])
@pytest.mark.parametrize("secret", [SECRET, None])
def test_an_instance_name_that_is_no_uid_is_refused_before_anything_else(label, secret):
    # A hostile name must never make decoding raise anything but InvalidRecord (a name that
    # signing could not encode once froze every signed subscriber's view).
    _, data = record(worker("10.0.0.1:1"))
    with pytest.raises(InvalidRecord, match="not named after a worker uid"):
        decode(f"{label}.{TYPE}", data, secret=secret)


def test_the_sequence_number_travels_signed():
    metadata = worker("10.0.0.1:1")
    name = _service.instance_name(TYPE, metadata.uid)
    data = _service.encode_txt(TYPE, name, DIGEST, metadata.to_bytes(), SECRET, sequence=7)
    entries = _service.parse_txt(data)
    assert _service.sequence_of(entries) == 7
    assert decode(name, data).uid == metadata.uid
    tampered = {**entries, b"q": b"8"}
    with pytest.raises(InvalidRecord, match="signature"):
        _service.decode_txt(TYPE, name, DIGEST, tampered, SECRET)


@pytest.mark.parametrize("text", [b"", b"-1", b"1.5", b"9" * 21, b"18446744073709551616"])
def test_a_malformed_sequence_number_is_refused(text):
    with pytest.raises(InvalidRecord, match="sequence number"):
        _service.sequence_of({b"q": text})


def test_a_source_ignores_whatever_a_hostile_record_makes_decoding_raise(monkeypatch):
    from anywool.discovery.lan import _source

    source = _source.LanSource(("key", 0.5), "jobs", ("127.0.0.1",), SECRET)
    name, data = record(worker("10.0.0.1:1"))
    assert source._decode(name, data, {}) is not None

    def broken(*args, **kwargs):
        raise UnicodeEncodeError("ascii", "é", 0, 1, "a bug in decoding")

    monkeypatch.setattr(_service, "decode_txt", broken)
    source._decoded = {}
    assert source._decode(name, data, {}) is None


def test_namespaces_whose_service_types_collide_get_sources_of_their_own(monkeypatch):
    from anywool.discovery.lan import _source

    monkeypatch.setattr(_service, "service_type", lambda namespace: TYPE)
    assert _source.source_key("a", None, SECRET) != _source.source_key("b", None, SECRET)


def test_a_pickled_lan_discovery_leaves_its_secret_behind():
    import pickle

    import cloudpickle

    from anywool import LanDiscovery

    discovery = LanDiscovery("jobs", interfaces=["127.0.0.1"], secret=SECRET)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        blob = dumps(discovery)
        assert SECRET not in blob
        copy = pickle.loads(blob)
        assert (copy.namespace, copy.interfaces) == ("jobs", ("127.0.0.1",))
        assert copy._secret is None and not copy.claimed


@pytest.mark.parametrize("signing", [None, b"another secret of 16+ bytes"])
def test_a_record_that_does_not_verify_says_what_address_it_claims(signing):
    name, data = record(worker("10.0.0.7:4000"), secret=signing)
    with pytest.raises(_service.UnverifiedRecord) as info:
        decode(name, data)
    assert info.value.address == "10.0.0.7:4000"


def _flushed(name: str, created: float):
    """A zeroconf cache that took a TXT record of ``name`` at ``created`` (ms, TTL 10 s), then,
    5 s later, another record of the name with the cache-flush bit (RFC 6762 §10.2): zeroconf's
    own steps for such a packet."""
    from zeroconf import DNSCache, DNSText
    from zeroconf.const import _CLASS_IN, _CLASS_UNIQUE, _TYPE_TXT

    cache = DNSCache()
    cache.async_add_records([DNSText(name, _TYPE_TXT, _CLASS_IN | _CLASS_UNIQUE, 10,
                                     b"genuine", created=created)])
    now = created + 5000
    forged = DNSText(name, _TYPE_TXT, _CLASS_IN | _CLASS_UNIQUE, 10, b"forged", created=now)
    cache.async_mark_unique_records_older_than_1s_to_expire({(name, _TYPE_TXT, _CLASS_IN)},
                                                            [forged], now)
    cache.async_add_records([forged])
    return cache


def _expiries(cache, name: str) -> dict[bytes, float]:
    from zeroconf.const import _CLASS_IN, _TYPE_TXT

    return {record.text: record.get_expiration_time(100)
            for record in cache.async_all_by_details(name, _TYPE_TXT, _CLASS_IN)}


def test_a_held_record_that_a_cache_flush_cut_short_is_put_back_with_its_own_lifetime():
    from types import SimpleNamespace

    from anywool.discovery.lan import _zeroconf

    name, created = _service.instance_name(TYPE, uuid.uuid4()), 1_000_000.0
    cache = _flushed(name, created)
    assert _expiries(cache, name) == {b"genuine": created + 6000, b"forged": created + 15000}
    listener = _zeroconf.GoodbyeListener(TYPE, lambda: None)
    _zeroconf.restore_txt(SimpleNamespace(cache=cache), listener,
                          [(name, (created, 10, b"genuine"))])
    assert _expiries(cache, name) == {b"genuine": created + 10000, b"forged": created + 15000}


def test_a_record_withdrawn_by_its_goodbye_is_never_put_back():
    from types import SimpleNamespace

    from zeroconf import DNSText, RecordUpdate
    from zeroconf.const import _CLASS_IN, _CLASS_UNIQUE, _TYPE_TXT

    from anywool.discovery.lan import _zeroconf

    woken = []
    listener = _zeroconf.GoodbyeListener(TYPE, lambda: woken.append(True))
    name, created = _service.instance_name(TYPE, uuid.uuid4()), 1_000_000.0
    # A goodbye waiting in the listener: the record stays as the flush left it.
    cache = _flushed(name, created)
    goodbye = DNSText(name, _TYPE_TXT, _CLASS_IN | _CLASS_UNIQUE, 0, b"genuine")
    listener.async_update_records(None, created + 5500, [RecordUpdate(goodbye, None)])
    listener.async_update_records_complete()
    assert woken == [True] and listener.goodbyes == [(name, b"genuine")]
    _zeroconf.restore_txt(SimpleNamespace(cache=cache), listener,
                          [(name, (created, 10, b"genuine"))])
    assert _expiries(cache, name)[b"genuine"] == created + 6000
    # A record gone from the cache (its goodbye removed it) does not come back either.
    cache.async_remove_records([goodbye])
    listener.goodbyes.clear()
    _zeroconf.restore_txt(SimpleNamespace(cache=cache), listener,
                          [(name, (created, 10, b"genuine"))])
    assert b"genuine" not in _expiries(cache, name)
