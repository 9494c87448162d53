"""Replication messages round-trip through the envelope; bad fields are refused by name."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from sparkbus.bus.contract import RemoteProtocolError
from sparkbus.codecs import DecodeError, EnvelopeCodec, LimitExceeded
from sparkbus.roles.replication.layout import SplitTarget
from sparkbus.roles.replication.messages import (
    DeclineReason,
    JoinFinalized,
    ReplicaHello,
    ReplicaRejoin,
    SegmentAccepted,
    SegmentAcked,
    SegmentDeclined,
    SegmentOffered,
    SegmentTransited,
    SplitFinalized,
    parse_stream,
    stream_key,
)

CODEC = EnvelopeCodec()
OFFER: dict[str, Any] = dict(
    partition="t/0",
    segment_id="1.2",
    base_id="1.1",
    included=("1.0",),
    major=False,
    rows=3,
    max_lsn=9,
    size=900,
    checksum=b"\x01" * 16,
    sender=1,
    target=2,
)
SAMPLES = [
    SegmentOffered(**OFFER),
    SegmentAccepted(partition="t/0", segment_id="1.2", stream=stream_key("t/0", "1.2", 1), credit=1024),
    SegmentDeclined(partition="t/0", segment_id="1.2", reason=DeclineReason.INFLIGHT, detail="busy"),
    SegmentTransited(partition="t/0", segment_id="1.2", size=900, chunks=3),
    SegmentAcked(partition="t/0", segment_id="1.2", placement=2, ok=True),
    SegmentAcked(partition="t/0", segment_id="1.2", placement=2, ok=False, error="checksum"),
    JoinFinalized(partition="t/0", placement=4),
    JoinFinalized(partition="t/0", placement=4, epoch=b"\x07" * 8),
    ReplicaHello(partition="t/0", placement=4, epoch=b"\x07" * 8),
    ReplicaHello(partition="t/0", placement=4, epoch=b"\x07" * 8, state="rejoining"),
    ReplicaRejoin(partition="t/0", placement=4, epoch=b"\x07" * 8),
    SplitFinalized(
        partition="t/0", targets=(SplitTarget(partition="t/1", high=10), SplitTarget(partition="t/2", low=10))
    ),
    SplitFinalized(partition="t/0", targets=(SplitTarget(partition="t/1"),), placement=4, epoch=b"\x07" * 8),
    SplitFinalized(partition="t/0", targets=(SplitTarget(partition="t/1"),), lamport=2**62),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Any) -> None:
    assert CODEC.decode(CODEC.encode(msg)).message == msg


def test_codes_are_in_the_family_range() -> None:
    for msg in SAMPLES:
        assert 0x0120 <= CODEC.registry.code_of(type(msg)) <= 0x013F
    assert CODEC.registry.code_of(SegmentOffered) == 0x0120
    assert CODEC.registry.code_of(SegmentAcked) == 0x0124


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"base_id": None}, "base_id"),
        ({"size": -1}, "size"),
        ({"segment_id": "a/b"}, "segment_id"),
        ({"partition": ""}, "partition"),
    ],
)
def test_invalid_offers_are_refused(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SegmentOffered(**{**OFFER, **change})


def test_a_decoded_offer_with_a_bad_field_names_it() -> None:
    frames = CODEC.encode(SAMPLES[0])
    body = msgpack.unpackb(frames[1])
    body["rows"] = "three"
    with pytest.raises(DecodeError, match="rows"):
        CODEC.decode([frames[0], msgpack.packb(body)])


def test_an_unknown_decline_reason_is_refused() -> None:
    frames = CODEC.encode(SAMPLES[2])
    body = msgpack.unpackb(frames[1])
    body["reason"] = 42
    with pytest.raises(DecodeError, match="reason"):
        CODEC.decode([frames[0], msgpack.packb(body)])


def test_accept_must_name_the_segment_stream() -> None:
    with pytest.raises(ValueError, match="stream"):
        SegmentAccepted(partition="t/0", segment_id="1.2", stream="replication/t/0/9.9/1", credit=1)
    with pytest.raises(ValueError, match="attempt"):
        SegmentAccepted(partition="t/0", segment_id="1.2", stream="replication/t/0/1.2", credit=1)


def test_stream_keys_carry_an_attempt_and_parse_back() -> None:
    assert parse_stream(stream_key("t/0", "1.2", 7)) == ("t/0", "1.2", 7)
    for bad in ("replication/t/0/1.2", "query/t/0/1.2/1", "replication//1", "replication/t/0/1.2/x"):
        with pytest.raises(RemoteProtocolError):
            parse_stream(bad)


def test_ack_is_either_ok_or_an_error() -> None:
    with pytest.raises(ValueError):
        SegmentAcked(partition="t/0", segment_id="1.2", placement=2, ok=True, error="x")
    with pytest.raises(ValueError):
        SegmentAcked(partition="t/0", segment_id="1.2", placement=2, ok=False)


@pytest.mark.parametrize("epoch", [b"", b"\x01" * 7, b"\x01" * 9])
def test_an_epoch_of_another_length_is_refused(epoch: bytes) -> None:
    for kind in (ReplicaHello, ReplicaRejoin):
        with pytest.raises(ValueError, match="epoch"):
            kind(partition="t/0", placement=1, epoch=epoch)
    if epoch:  # empty is a layout join's finalize
        with pytest.raises(ValueError, match="epoch"):
            JoinFinalized(partition="t/0", placement=1, epoch=epoch)


def test_a_decoded_hello_with_a_short_epoch_is_refused() -> None:
    frames = CODEC.encode(ReplicaHello(partition="t/0", placement=1, epoch=b"\x01" * 8))
    body = msgpack.unpackb(frames[1])
    body["epoch"] = b"\x01"
    with pytest.raises(DecodeError, match="epoch"):
        CODEC.decode([frames[0], msgpack.packb(body)])


def test_a_hello_names_a_state_it_knows() -> None:
    with pytest.raises(ValueError, match="state"):
        ReplicaHello(partition="t/0", placement=1, epoch=b"\x01" * 8, state="leader")


@pytest.mark.parametrize("lamport", [-1, 2**62 + 1])
def test_a_split_finalize_clock_beyond_the_versions_is_refused(lamport: int) -> None:
    # Taken, it set a target's clock where no write could be versioned any more (MAX_LSN).
    frames = CODEC.encode(SplitFinalized(partition="t/0", targets=(SplitTarget(partition="t/1"),)))
    body = msgpack.unpackb(frames[1])
    body["lamport"] = lamport
    with pytest.raises(DecodeError, match="lamport"):
        CODEC.decode([frames[0], msgpack.packb(body)])


def test_a_split_finalize_without_its_clock_is_refused_and_with_it_taken() -> None:
    # The spec does not name the field: sparkbus adds it (docs/REPLICATION.md, split). It is required on the
    # wire like every field; taking a finalize without it as 0 would let a target version its writes below
    # the rows the split still brings it. The bus refuses what does not decode as MALFORMED.
    frames = CODEC.encode(SplitFinalized(partition="t/0", targets=(SplitTarget(partition="t/1"),), lamport=7))
    body = msgpack.unpackb(frames[1])
    assert CODEC.decode([frames[0], msgpack.packb(body)]).message.lamport == 7
    del body["lamport"]
    with pytest.raises(DecodeError, match="lamport: missing field") as refused:
        CODEC.decode([frames[0], msgpack.packb(body)])
    assert not isinstance(refused.value, LimitExceeded)
