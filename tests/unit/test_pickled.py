"""Values pickled for the wire (issue 20): large buffers by reference or out of band, read back
from views of what arrived, byte for byte."""

from __future__ import annotations

import pickle

import pytest

from anywool.runtime.wire import _envelope
from anywool.runtime.wire._frames import FrameError
from anywool.runtime.wire._serializer import Pickled, dump, dumps, loads, loads_value

BIG = 256 * 1024


class Blob:
    """A holder of bytes that pickles them as a PickleBuffer, as NumPy arrays do."""

    def __init__(self, data: object) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: int) -> tuple[object, ...]:
        if protocol >= 5:
            return _blob_from, (pickle.PickleBuffer(self.data),)  # type: ignore[arg-type]
        return _blob_from, (bytes(self.data),)  # type: ignore[call-overload]


def _blob_from(buffer: object) -> Blob:
    return Blob(buffer)


def _received(pickled: Pickled) -> Pickled:
    """What a receiver gets for ``pickled``: views of one payload received in place."""
    payload = bytearray(_envelope.encode_reply(pickled).join())
    value, _ = _envelope.decode_reply(payload)
    return value


def _through(value: object) -> object:
    return loads_value(_received(dump(value)), "f", "the value")


def test_large_bytes_and_bytearrays_are_pickled_by_reference() -> None:
    data, array = b"b" * BIG, bytearray(b"a" * BIG)
    pickled = dump((data, array))
    assert any(chunk is data for chunk in pickled.chunks)
    assert any(chunk is array for chunk in pickled.chunks)
    assert not pickled.buffers
    assert _through((data, array)) == (data, array)


def test_a_memoryview_goes_out_of_band_and_arrives_as_bytes() -> None:
    # As cloudpickle delivers a memoryview (bytes), without its copy on the way out.
    source = bytearray(range(256)) * 1024
    view = memoryview(source)[1:-1]
    pickled = dump(view)
    assert [bytes(buffer) for buffer in pickled.buffers] == [bytes(view)]
    assert _through(view) == bytes(view)
    strided = memoryview(source)[::3]  # not contiguous: copied in band
    assert _through(strided) == bytes(strided)


def test_a_buffer_object_goes_out_of_band_and_loads_from_a_view_of_the_frame() -> None:
    data = bytes(range(256)) * 1024
    pickled = dump(Blob(data))
    assert len(pickled.buffers) == 1
    received = _received(pickled)
    blob = loads_value(received, "f", "the value")
    assert isinstance(blob, Blob) and bytes(blob.data) == data
    assert isinstance(blob.data, memoryview)  # no copy: a view of what was received
    assert blob.data.obj is received.buffers[0].obj


def test_without_out_of_band_buffers_everything_is_in_the_stream() -> None:
    data = bytes(range(256)) * 1024
    blob = loads(dumps(Blob(data)))
    assert isinstance(blob, Blob) and bytes(blob.data) == data


def test_main_inside_a_large_payload_does_not_send_it_to_cloudpickle() -> None:
    # The "__main__" check reads what the pickler wrote itself, not the payloads it passed on.
    data = b"__main__" * (BIG // 8)
    pickled = dump(data)
    assert any(chunk is data for chunk in pickled.chunks)
    assert _through(data) == data


class Nested:
    """Pickling it pickles something else first (the pickler in use is not reused)."""

    def __reduce__(self) -> tuple[object, ...]:
        return loads, (dumps([1, 2, 3]),)


def test_a_reducer_that_pickles_does_not_disturb_the_pickle_it_is_part_of() -> None:
    assert _through([Nested(), b"z" * BIG, Nested()]) == [[1, 2, 3], b"z" * BIG, [1, 2, 3]]


@pytest.mark.parametrize("value", [None, 0, "", b"", (1, "two", 3.0), {"k": [b"v"] * 3}])
def test_small_values_round_trip(value: object) -> None:
    assert _through(value) == value


def _call(pickled: Pickled, context: Pickled | None = None) -> bytes:
    return _envelope.encode_call(_envelope.CallRequest(pickled, "f", 1.5, 7, None, context,
                                                       True)).join()


def test_a_call_carries_its_pickles_as_sections_after_its_header() -> None:
    arguments, context = dump(("f", (b"a" * BIG,), {})), dump({"var": bytearray(b"c" * BIG)})
    request = _envelope.decode_call(_call(arguments, context))
    assert (request.name, request.timeout, request.caller, request.plain) == ("f", 1.5, 7, True)
    assert loads_value(request.call, "f", "") == ("f", (b"a" * BIG,), {})
    assert request.context is not None
    assert loads_value(request.context, "f", "") == {"var": bytearray(b"c" * BIG)}


@pytest.mark.parametrize(("cut", "error"), [
    (lambda payload: payload[:-1], "not the"),
    (lambda payload: payload + b"x", "not the"),
    (lambda payload: b"\xff\xff\xff\xff" + payload[4:], "overruns"),
    (lambda payload: payload[:3], "no header"),
])
def test_sections_that_do_not_end_the_payload_exactly_are_an_error(cut, error) -> None:
    payload = _call(dump(b"a" * 100))
    with pytest.raises(FrameError, match=error):
        _envelope.decode_call(cut(payload))


def test_a_step_and_an_end_carry_their_pickles_too() -> None:
    step = _envelope.decode_step(_envelope.encode_step(
        _envelope.Step(dump(b"s" * BIG), 2.0, dump({"v": 1}))).join())
    assert loads_value(step.value, "f", "") == b"s" * BIG and step.timeout == 2.0
    assert step.context is not None and loads_value(step.context, "f", "") == {"v": 1}
    close = _envelope.decode_step(_envelope.encode_step(_envelope.Step(_envelope.NOTHING)).join())
    assert bytes(close.value.stream()) == b""
    assert _envelope.decode_end(_envelope.encode_end(None).join()) is None
    changes = _envelope.decode_end(_envelope.encode_end(dump({"v": b"e" * BIG})).join())
    assert changes is not None and loads_value(changes, "f", "") == {"v": b"e" * BIG}


TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
         "tracestate": "k=v"}


def test_a_call_and_a_step_carry_the_forward_flag_and_the_trace_context() -> None:
    request = _envelope.decode_call(_envelope.encode_call(_envelope.CallRequest(
        dump(1), "f", forward=False, trace=TRACE)).join())
    assert (request.forward, request.trace) == (False, TRACE)
    default = _envelope.decode_call(_envelope.encode_call(_envelope.CallRequest(
        dump(1), "f")).join())
    assert (default.forward, default.trace) == (True, None)
    step = _envelope.decode_step(_envelope.encode_step(
        _envelope.Step(dump(1), trace=TRACE)).join())
    assert step.trace == TRACE


@pytest.mark.parametrize("trace", [
    ["traceparent"], {"traceparent": 1}, {1: "x"}, {f"k{i}": "v" for i in range(9)},
    {"baggage": "b" * 8193},
])
def test_a_malformed_trace_context_is_an_error_of_its_call(trace: object) -> None:
    payload = _envelope.encode_call(_envelope.CallRequest(dump(1), "f", trace=trace)).join()  # type: ignore[arg-type]
    with pytest.raises(FrameError, match="trace context|undecodable"):
        _envelope.decode_call(payload)
    # At the limits: eight fields, a value of 8192 characters.
    fine = {f"k{i}": "v" for i in range(7)} | {"baggage": "b" * 8192}
    assert _envelope.decode_call(_envelope.encode_call(
        _envelope.CallRequest(dump(1), "f", trace=fine)).join()).trace == fine
