"""The sans-IO wire format: round trips, byte-at-a-time feeding, and garbage that only ever raises
the protocol error."""

from __future__ import annotations

import contextlib
import dataclasses
import gc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorwire import LocalProtocolError, wire
from tensorwire.layout import COMPACT_FIELDS, MAX_DEPTH, RingLayout, plan_ring

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i63 = st.integers(0, 2**62)

messages = st.one_of(
    st.builds(wire.Hello, st.text(max_size=20), i63, st.text(max_size=30), st.binary(max_size=16)),
    st.builds(wire.Challenge, st.binary(max_size=16)),
    st.builds(wire.Auth, st.binary(max_size=32)),
    st.builds(
        wire.Welcome,
        i63,
        i63,
        st.text(max_size=10),
        st.binary(max_size=32),
        st.binary(max_size=32),
        st.dictionaries(st.text(max_size=5), st.dictionaries(st.text(max_size=5), i63)),
        i63,
        st.dictionaries(
            st.text(max_size=8),
            st.one_of(st.none(), st.booleans(), i63, st.floats(allow_nan=False), st.text()),
            max_size=4,
        ),
    ),
    st.builds(wire.Lookup, i63),
    st.builds(
        wire.AddressBook,
        i63,
        st.lists(st.tuples(st.text(), i63).map(list), max_size=3),
        st.lists(st.lists(i63, max_size=3), max_size=3),
    ),
    st.builds(wire.Claim, i63, u32, st.sampled_from(["shm", "tcp"])),
    st.builds(wire.Claimed, i63, u32, i63, i63, st.lists(i63, max_size=4), i63),
    st.builds(
        wire.Attach,
        i63,
        st.sampled_from(["nixl"]),
        st.dictionaries(st.text(max_size=8), st.binary(max_size=40)),
    ),
    st.builds(
        wire.Attached,
        i63,
        st.dictionaries(st.text(max_size=8), st.lists(st.lists(i63, max_size=2), max_size=3)),
    ),
    st.builds(wire.Heartbeat, i63, st.binary(max_size=32)),
    st.builds(wire.Resume, i63, st.binary(max_size=32)),
    st.builds(wire.Goodbye, i63),
    st.builds(wire.Ack, i63),
    st.builds(wire.ErrorReply, st.sampled_from(sorted(wire.ERROR_CODES)), st.text(max_size=40)),
)


@given(messages)
def test_control_round_trip(msg: wire.Message) -> None:
    assert wire.decode(wire.encode(msg)) == msg


def test_a_field_added_later_has_its_default_when_absent() -> None:
    """A welcome from a receiver that predates ``heartbeat_timeout_ms`` and ``info`` decodes
    with 0 (no timeout said) and {} (a dict of its own each time: a default shared by every
    welcome would be changed for all through one); a required field that is absent is still
    refused."""
    body = {
        "v": wire.VERSION,
        "t": "welcome",
        "generation": 1,
        "pid": 2,
        "host": "h",
        "proof": b"",
        "token": b"t",
        "transports": {},
    }
    old = wire.decode(msgpack.packb(body, use_bin_type=True))
    assert isinstance(old, wire.Welcome) and old.heartbeat_timeout_ms == 0
    again = wire.decode(msgpack.packb(body, use_bin_type=True))
    assert isinstance(again, wire.Welcome) and old.info == again.info == {}
    assert old.info is not again.info
    del body["token"]
    with pytest.raises(LocalProtocolError, match="'token' must be bytes, got None"):
        wire.decode(msgpack.packb(body, use_bin_type=True))


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_control_garbage_only_raises_protocol_error(data: bytes) -> None:
    with contextlib.suppress(LocalProtocolError):
        wire.decode(data)


@given(messages, st.data())
def test_control_truncated_or_corrupted_only_raises_protocol_error(
    msg: wire.Message, data: st.DataObject
) -> None:
    raw = bytearray(wire.encode(msg))
    cut = data.draw(st.integers(0, len(raw)))
    for blob in (bytes(raw[:cut]),):
        with contextlib.suppress(LocalProtocolError):
            wire.decode(blob)
    if raw:
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] ^= data.draw(st.integers(1, 255))
        with contextlib.suppress(LocalProtocolError):
            wire.decode(bytes(raw))


@pytest.mark.parametrize(
    "body",
    [
        {"v": 99, "t": "hello"},
        {"v": 1, "t": "nope"},
        {"v": 1, "t": "lookup", "generation": "x"},
        {"v": 1, "t": "lookup", "generation": True},
        {"v": 1, "t": "lookup"},
        {"v": 1, "t": [1, 2]},
        {"v": [1], "t": "lookup"},
        [1, 2, 3],
    ],
)
def test_control_wrong_version_type_or_field(body: object) -> None:
    with pytest.raises(LocalProtocolError):
        wire.decode(msgpack.packb(body))


headers = st.builds(
    wire.DataHeader,
    u32,
    u32,
    u64,
    u64,
    u64,
    st.none() | st.lists(u64, max_size=16).map(tuple),
)


@given(headers)
def test_data_header_round_trip_in_two_reads(header: wire.DataHeader) -> None:
    raw = wire.encode_data_header(header)
    reader = wire.HeaderReader()
    first = reader.feed(raw[: reader.need])
    if header.shape:  # dynamic with dims: the fixed part asks for the dims next
        assert first is None
        first = reader.feed(raw[wire.DATA_HEADER.size :])
    assert first == header


@given(headers)
def test_data_header_byte_at_a_time(header: wire.DataHeader) -> None:
    raw = wire.encode_data_header(header)
    reader = wire.HeaderReader()
    decoded = []
    for i in range(len(raw)):
        out = reader.feed(raw[i : i + 1])
        if out is not None:
            decoded.append((i, out))
    assert decoded == [(len(raw) - 1, header)]
    assert reader.need == wire.DATA_HEADER.size  # ready for the next header


@given(st.lists(headers, min_size=1, max_size=4))
def test_data_headers_back_to_back_in_needed_chunks(hs: list[wire.DataHeader]) -> None:
    stream = b"".join(wire.encode_data_header(h) for h in hs)
    reader = wire.HeaderReader()
    out = []
    pos = 0
    while pos < len(stream):
        need = reader.need
        got = reader.feed(stream[pos : pos + need])
        pos += need
        if got is not None:
            out.append(got)
    assert out == hs


@settings(max_examples=300)
@given(st.binary(min_size=1, max_size=300))
def test_data_header_garbage_only_raises_protocol_error(data: bytes) -> None:
    reader = wire.HeaderReader()
    try:
        pos = 0
        while pos < len(data):
            need = reader.need
            reader.feed(data[pos : pos + need])
            pos += need
    except LocalProtocolError:
        pass


def test_data_header_overfeed_is_a_protocol_error() -> None:
    reader = wire.HeaderReader()
    with pytest.raises(LocalProtocolError, match="framing"):
        reader.feed(b"x" * (wire.DATA_HEADER.size + 1))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b"XXXX" + b[4:],  # wrong magic
        lambda b: b[:4] + bytes([9]) + b[5:],  # wrong version
        lambda b: b[:5] + bytes([0x80]) + b[6:],  # unknown flag
        lambda b: b[:6] + (3).to_bytes(2, "little") + b[8:],  # rank without the dynamic flag
    ],
)
def test_data_header_bad_fields(mutate: object) -> None:
    raw = wire.encode_data_header(wire.DataHeader(1, 0, 5, 1, 16, None))
    reader = wire.HeaderReader()
    with pytest.raises(LocalProtocolError):
        reader.feed(mutate(raw))  # type: ignore[operator]


@given(u64, st.binary(min_size=32, max_size=32))
def test_data_hello_round_trip(gen: int, token: bytes) -> None:
    assert wire.decode_data_hello(wire.encode_data_hello(gen, token)) == wire.DataHello(gen, token)


@given(u32, u64)
def test_credit_round_trip(tid: int, released: int) -> None:
    assert wire.decode_credit(wire.encode_credit(tid, released)) == wire.Credit(tid, released)


@given(u64, st.lists(headers, min_size=1, max_size=wire.MAX_NOTIFICATION_HEADERS))
def test_notification_round_trip(counter: int, many: list[wire.DataHeader]) -> None:
    raw = wire.encode_notification(counter, *many)
    assert wire.decode_notification(raw) == (counter, many)
    # a byte more begins a header that ends there, or is one header too many
    with pytest.raises(LocalProtocolError, match=r"inside a header|after its"):
        wire.decode_notification(raw + b"x")
    with pytest.raises(LocalProtocolError):
        wire.decode_notification(raw[:-1])


def test_a_notification_refuses_too_many_headers_and_a_goodbye_among_others() -> None:
    one = wire.DataHeader(1, 0, 3, 7, 16, None)
    bye = wire.DataHeader(0, 0, 0, 0, 0, None, bye=True)
    with pytest.raises(ValueError, match="1 to"):
        wire.encode_notification(5, *[one] * (wire.MAX_NOTIFICATION_HEADERS + 1))
    with pytest.raises(ValueError, match="1 to"):
        wire.encode_notification(5)
    full = wire.encode_notification(5, *[one] * wire.MAX_NOTIFICATION_HEADERS)
    extra = wire.encode_notification(5, one)[wire.NOTIFICATION_COUNTER.size :]
    most = wire.MAX_NOTIFICATION_HEADERS
    with pytest.raises(LocalProtocolError, match=f"after its {most} headers"):
        wire.decode_notification(full + extra)
    mixed = wire.encode_notification(5, one) + wire.encode_notification(6, bye)[8:]  # 8: counter
    with pytest.raises(LocalProtocolError, match="goodbye shares"):
        wire.decode_notification(mixed)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_notification_garbage_only_raises_protocol_error(data: bytes) -> None:
    with contextlib.suppress(LocalProtocolError):
        wire.decode_notification(data)


@settings(max_examples=200)
@given(st.binary(max_size=60))
def test_fixed_frames_garbage_only_raises_protocol_error(data: bytes) -> None:
    for decoder in (wire.decode_data_hello, wire.decode_credit):
        with contextlib.suppress(LocalProtocolError):
            decoder(data)


def test_goodbye_frame_round_trip_and_no_payload() -> None:
    bye = wire.DataHeader(0, 0, 0, 0, 0, None, bye=True)
    reader = wire.HeaderReader()
    assert reader.feed(wire.encode_data_header(bye)) == bye
    bad = bytearray(wire.encode_data_header(bye))
    bad[-8:] = (5).to_bytes(8, "little")  # a goodbye may not announce a payload
    with pytest.raises(LocalProtocolError, match="goodbye"):
        wire.HeaderReader().feed(bytes(bad))


@pytest.mark.parametrize("depth", [1, 2, 32])
@pytest.mark.parametrize("on_device", [False, True])
def test_a_compact_ring_layout_is_the_same_layout_in_a_fifth_of_the_bytes(
    depth: int, on_device: bool
) -> None:
    """What a sender that asks for compact layouts reads (``Lookup.compact``): the same ring as
    every slot's offsets say; a layout whose slots are not evenly spaced goes whole."""
    planned = plan_ring(8192, depth, 16, 1, False, 4096 if on_device else None)
    layout = dataclasses.replace(planned, region=0, payload_region=1 if on_device else -1)
    sizes = [1 << 20, 1 << 20]
    compact, full = layout.to_wire(compact=True), layout.to_wire()
    assert len(compact) == COMPACT_FIELDS
    assert RingLayout.from_wire(compact, sizes) == layout == RingLayout.from_wire(full, sizes)
    if depth == 32:
        assert len(msgpack.packb(compact)) * 5 < len(msgpack.packb(full))
    uneven = dataclasses.replace(layout, headers=(8320, 8400, 8448), payloads=(12288, 12352, 12800))
    assert uneven.to_wire(compact=True) == uneven.to_wire()
    # A receiver's compact layout is checked as its full form is, and bounded before expanded.
    region, ctrl, _, h0, hstep, p0, pstep, capacity, payload_region = compact
    for bad in (
        [region, ctrl, 0, h0, hstep, p0, pstep, capacity, payload_region],
        [region, ctrl, MAX_DEPTH + 1, h0, hstep, p0, pstep, capacity, payload_region],
        [region, ctrl, 1 << 62, h0, hstep, p0, pstep, capacity, payload_region],
        [region, ctrl, 3, h0, 0, p0, pstep, capacity, payload_region],
        [region, ctrl, depth, h0, hstep, p0 + (1 << 20), pstep, capacity, payload_region],
        [region, ctrl, depth, h0, hstep, p0, pstep, capacity, 7],
        [region, ctrl, "x", h0, hstep, p0, pstep, capacity, payload_region],
        [region, ctrl, depth, h0 + 4, hstep, p0, pstep, capacity, payload_region],  # unaligned
        [region, ctrl, max(depth, 2), h0, hstep + 4, p0, pstep, capacity, payload_region],
        [region, ctrl, depth, 64, hstep, p0, pstep, capacity, payload_region],  # in the header
        [region, ctrl, depth, (1 << 20) - 32, hstep, p0, pstep, capacity, payload_region],
    ):
        with pytest.raises(LocalProtocolError):
            RingLayout.from_wire(bad, sizes)
    # and the full form, its offsets in any order, as an older receiver may send them
    region, ctrl, headers, payloads, capacity, *rest = full
    for bad in (
        [region, ctrl, [*headers[:-1], headers[-1] + 4], payloads, capacity, *rest],
        [region, ctrl, [*headers[1:], 64], payloads, capacity, *rest],
        [region, ctrl, headers, [*payloads[1:], 1 << 20], capacity, *rest],
        [region, ctrl, headers, payloads[:-1], capacity, *rest],
    ):
        with pytest.raises(LocalProtocolError):
            RingLayout.from_wire(bad, sizes)
    shuffled = [region, ctrl, headers[::-1], payloads[::-1], capacity, *rest]
    assert list(RingLayout.from_wire(shuffled, sizes).headers) == headers[::-1]


def test_a_lookup_from_a_sender_that_predates_compact_layouts_asks_for_every_offset() -> None:
    body = {"v": wire.VERSION, "t": "lookup", "generation": 3}
    old = wire.decode(msgpack.packb(body, use_bin_type=True))
    assert old == wire.Lookup(3) and old.compact is False


def test_a_large_message_decodes_with_the_garbage_collector_as_it_was() -> None:
    book = wire.AddressBook(1, [], [[i, {"name": f"t{i}"}, list(range(40))] for i in range(20000)])
    data = wire.encode(book)
    assert len(data) >= wire.LARGE_MESSAGE
    assert wire.decode(data) == book and gc.isenabled()
    gc.disable()
    try:
        assert wire.decode(data) == book and not gc.isenabled()
    finally:
        gc.enable()
