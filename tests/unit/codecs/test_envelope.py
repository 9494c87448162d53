"""Strict decoding: each kind of wrong input names the message type and the field."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pytest

from sparkbus.codecs import (
    Compression,
    DecodeError,
    EncodeError,
    EnvelopeCodec,
    Header,
    LimitExceeded,
    Limits,
    Registry,
)

from .messages import TEST_REGISTRY, Choice, Chunk, Color, Everything, Inner, Ping, Plain, Tagged

codec = EnvelopeCodec(TEST_REGISTRY)


def sample(**changes: object) -> Everything:
    fields: dict[str, object] = dict(
        count=3,
        ratio=0.5,
        label="x",
        raw=b"r",
        flag=True,
        maybe=None,
        items=(1, 2),
        pair=("a", 1),
        table={"k": 1},
        color=Color.RED,
        inner=Inner(name="n", weight=1.0),
        tree={"op": "scan"},
        data=b"blob",
    )
    fields.update(changes)
    return Everything(**fields)  # type: ignore[arg-type]


def body_of(frames: list[bytes]) -> dict[str, object]:
    return msgpack.unpackb(frames[1])  # type: ignore[no-any-return]


def with_body(frames: list[bytes], body: dict[str, object]) -> list[bytes]:
    return [frames[0], msgpack.packb(body), *frames[2:]]


def test_header_carries_session_seq_and_stream() -> None:
    frames = codec.encode(Ping(nonce=7), session=42, seq=9, stream="q1/e2")
    env = codec.decode(frames)
    assert env.header == Header(type=0x7002, session=42, seq=9, stream="q1/e2", zmask=0)
    assert env.message == Ping(nonce=7)


def test_unknown_type_is_named() -> None:
    frames = codec.encode(Ping(nonce=1))
    other = EnvelopeCodec(Registry())
    with pytest.raises(DecodeError) as err:
        other.decode(frames)
    assert err.value.field == "<header>.type"
    assert "unknown message type" in str(err.value)


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (lambda b: b.pop("count"), "count", "missing field"),
        (lambda b: b.update(bogus=1), "bogus", "unexpected field"),
        (lambda b: b.update(count="3"), "count", "expected int"),
        (lambda b: b.update(count=True), "count", "expected int"),
        (lambda b: b.update(flag=1), "flag", "expected bool"),
        (lambda b: b.update(items=[1, "2"]), "items[1]", "expected int"),
        (lambda b: b.update(pair=["a"]), "pair", "array of 2"),
        (lambda b: b.update(color=9), "color", "not a valid Color"),
        (lambda b: b.update(inner={"name": "n"}), "weight", "missing field"),
        (lambda b: b.update(table={"k": "v"}), "table['k']", "expected int"),
    ],
)
def test_wrong_field_is_named(mutate: object, field: str, reason: str) -> None:
    frames = codec.encode(sample())
    body = body_of(frames)
    mutate(body)  # type: ignore[operator]
    with pytest.raises(DecodeError) as err:
        codec.decode(with_body(frames, body))
    assert err.value.field == field
    assert reason in err.value.reason
    assert err.value.message_type.startswith("Everything")


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (lambda b: b.pop("count"), "count", "missing field"),
        (lambda b: b.update(bogus=1), "bogus", "unexpected field"),
        (lambda b: (b.pop("count"), b.update(bogus=1)), "bogus", "unexpected field"),
        (lambda b: b.update(count="3"), "count", "expected int"),
        (lambda b: b.update(count=True), "count", "expected int"),
        (lambda b: b.update(flag=1), "flag", "expected bool"),
        (lambda b: b.update(label=b"x"), "label", "expected str"),
        (lambda b: b.update(raw="r"), "raw", "expected bytes"),
    ],
)
def test_a_message_of_plain_fields_is_checked_like_any_other(mutate: object, field: str, reason: str) -> None:
    """Its body map goes to the constructor as it is, once every value has its field's exact type;
    anything else takes the field-by-field path, which names the field."""
    frames = codec.encode(Plain(count=3, label="x", raw=b"r", flag=False))
    assert codec.decode(frames).message == Plain(count=3, label="x", raw=b"r", flag=False)
    body = body_of(frames)
    mutate(body)  # type: ignore[operator]
    with pytest.raises(DecodeError) as err:
        codec.decode(with_body(frames, body))
    assert (err.value.message_type, err.value.field) == ("Plain", field)
    assert reason in err.value.reason


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"op": ["eq"], "level": 1}, "op"),
        ({"op": {"eq": 1}, "level": 1}, "op"),
        ({"op": "lt", "level": 1}, "op"),
        ({"op": b"eq", "level": 1}, "op"),
        ({"op": "eq", "level": [1]}, "level"),
        ({"op": "eq", "level": {1: 1}}, "level"),
        ({"op": "eq", "level": True}, "level"),
        ({"op": "eq", "level": 1.0}, "level"),
        ({"op": "eq", "level": 3}, "level"),
    ],
)
def test_a_literal_field_takes_only_its_values_with_their_types(body: dict[str, object], field: str) -> None:
    """An array or a map is not hashable, and True or 1.0 equal 1: each is refused, naming the field."""
    frames = codec.encode(Choice(op="ne", level=None))
    assert codec.decode(frames).message == Choice(op="ne", level=None)
    assert codec.decode(with_body(frames, {"op": "eq", "level": 2})).message == Choice(op="eq", level=2)
    with pytest.raises(DecodeError) as err:
        codec.decode(with_body(frames, body))
    assert (err.value.message_type, err.value.field) == ("Choice", field)


def test_constructor_validation_applies_to_decoded_messages() -> None:
    frames = codec.encode(Ping(nonce=1))
    with pytest.raises(DecodeError) as err:
        codec.decode(with_body(frames, {"nonce": -1}))
    assert err.value.message_type == "Ping"
    assert err.value.field == "nonce"


def test_trailing_bytes_are_refused() -> None:
    frames = codec.encode(Ping(nonce=1))
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec.decode([frames[0], bytes(frames[1]) + b"\x00"])
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec.decode([bytes(frames[0]) + b"\xc0", frames[1]])


def test_extension_types_are_refused() -> None:
    frames = codec.encode(Ping(nonce=1))
    ext = msgpack.packb({"nonce": msgpack.ExtType(5, b"x")})
    with pytest.raises(DecodeError, match="extension"):
        codec.decode([frames[0], ext])


def test_wrong_header_shape_is_refused() -> None:
    for header in (
        [1, 2, 3],
        [2, 0x7002, 0, 0, None, 0],
        [True, 0x7002, 0, 0, None, 0],
        [1.0, 0x7002, 0, 0, None, 0],
        [1, 0x7002, -1, 0, None, 0],
        [1, 0x7002, 0, 0, 5, 0],
    ):
        with pytest.raises(DecodeError, match="header"):
            codec.decode([msgpack.packb(header), msgpack.packb({"nonce": 1})])


def test_zmask_beyond_frames_is_refused() -> None:
    with pytest.raises(DecodeError, match="zmask"):
        codec.decode([msgpack.packb([1, 0x7002, 0, 0, None, 0b10]), msgpack.packb({"nonce": 1})])


def test_blob_travels_as_its_own_frame_and_can_stay_zero_copy() -> None:
    frames = codec.encode(sample(data=b"z" * 100_000))
    assert len(frames) == 3 and frames[2] == b"z" * 100_000
    view = [frames[0], frames[1], memoryview(frames[2])]
    env = codec.decode(view, copy_blobs=False)
    assert isinstance(env.message.data, memoryview)
    assert codec.decode(view).message.data == b"z" * 100_000


def test_a_blob_must_be_a_buffer() -> None:
    assert codec.encode(sample(data=bytearray(b"ab")))[2] == bytearray(b"ab")
    with pytest.raises(EncodeError, match=r"\.data: a blob must be bytes-like, not str"):
        codec.encode(sample(data="not bytes"))


def test_compression_sets_the_mask_and_round_trips() -> None:
    zc = EnvelopeCodec(TEST_REGISTRY, compression=Compression(level=3, min_size=1024))
    frames = zc.encode(sample(data=b"a" * 50_000))
    assert zc.decode_header(frames).zmask == 0b10  # body small and raw, blob compressed
    assert len(frames[2]) < 1000
    assert zc.decode(frames).message.data == b"a" * 50_000
    # A receiver without compression configured still inflates, within its limits.
    assert EnvelopeCodec(TEST_REGISTRY).decode(frames).message.data == b"a" * 50_000


def test_a_compressed_frame_with_bytes_after_its_zstd_frame_is_refused() -> None:
    """As a raw frame holds exactly one msgpack value, a compressed one holds exactly one zstd frame."""
    zc = EnvelopeCodec(TEST_REGISTRY, compression=Compression(level=3, min_size=1024))
    frames = zc.encode(sample(data=b"a" * 50_000))
    assert zc.decode_header(frames).zmask == 0b10
    with pytest.raises(DecodeError) as err:
        zc.decode([*frames[:2], bytes(frames[2]) + b"hidden payload"])
    assert (err.value.message_type, err.value.field) == ("Everything", "<frame 2>")


def test_decompression_bomb_is_refused_before_allocation() -> None:
    zc = EnvelopeCodec(TEST_REGISTRY, compression=Compression(min_size=0))
    frames = zc.encode(sample(data=b"\x00" * (8 << 20)))
    assert len(frames[2]) < 2048
    strict = EnvelopeCodec(TEST_REGISTRY, limits=Limits(max_decompressed_bytes=1 << 20))
    with pytest.raises(DecodeError, match="limit"):
        strict.decode(frames)


@pytest.mark.parametrize(
    ("limit", "setting", "bound"),
    [(1 << 20, 64 << 20, 1 << 20), (64 << 20, 1 << 20, 1 << 20), (1 << 20, 1 << 20, 1 << 20)],
    ids=["limits-smaller", "compression-smaller", "equal"],
)
def test_a_codec_that_compresses_holds_frames_to_the_smaller_bound(
    limit: int, setting: int, bound: int
) -> None:
    """A node's limits hold whether or not it compresses what it sends (its Compression defaults to 64 MiB)."""
    frames = EnvelopeCodec(TEST_REGISTRY, compression=Compression()).encode(sample(data=b"\x00" * (8 << 20)))
    assert sum(map(len, frames)) < 4096
    codec = EnvelopeCodec(
        TEST_REGISTRY,
        limits=Limits(max_decompressed_bytes=limit),
        compression=Compression(max_decompressed=setting),
    )
    with pytest.raises(LimitExceeded, match=f"declares {8 << 20} bytes decompressed, limit is {bound}"):
        codec.decode(frames)
    fits = EnvelopeCodec(TEST_REGISTRY, compression=Compression()).encode(sample(data=b"\x00" * bound))
    assert codec.decode(fits).message.data == b"\x00" * bound


def test_registering_twice_or_non_frozen_is_an_error() -> None:
    reg = Registry()

    @reg.register(1)
    @dataclass(frozen=True, kw_only=True)
    class A:
        x: int

    with pytest.raises(ValueError, match="taken"):

        @reg.register(1)
        @dataclass(frozen=True, kw_only=True)
        class B:
            x: int

    with pytest.raises(TypeError, match="frozen"):

        @reg.register(2)
        @dataclass(kw_only=True)
        class C:
            x: int

    with pytest.raises(EncodeError):
        EnvelopeCodec(reg).encode(Ping(nonce=1))


def test_a_plain_message_decoded_without_its_constructor_is_the_same_message() -> None:
    """Plain has no __post_init__: it is rebuilt from its checked body map, as pickle would rebuild it."""
    sent = Plain(count=3, label="x", raw=b"r", flag=False)
    got = codec.decode(codec.encode(sent, session=4, seq=5)).message
    assert type(got) is Plain
    assert got == sent and hash(got) == hash(sent) and repr(got) == repr(sent)
    assert codec.encode(got, session=4, seq=5) == codec.encode(sent, session=4, seq=5)


def test_a_plain_message_encodes_its_fields_only_and_converts_what_needs_it() -> None:
    reference = codec.encode(Plain(count=1, label="x", raw=b"r", flag=True))
    extra = Plain(count=1, label="x", raw=b"r", flag=True)
    object.__setattr__(extra, "_cached", 7)  # an attribute that is not a field never goes on the wire
    assert codec.encode(extra) == reference
    assert codec.encode(Plain(count=Color.RED, label="x", raw=bytearray(b"r"), flag=True)) == reference
    with pytest.raises(EncodeError):
        codec.encode(Plain(count=1, label=object(), raw=b"r", flag=True))  # type: ignore[arg-type]


def test_frames_over_one_limit_are_checked_against_each() -> None:
    """Below both size limits nothing is counted twice; above the smaller one every limit is checked."""
    frames = codec.encode(Plain(count=1, label="y" * 60, raw=b"r" * 60, flag=True))
    assert len(frames[1]) < 150 < sum(map(len, frames))
    roomy_message = EnvelopeCodec(TEST_REGISTRY, limits=Limits(max_frame_bytes=150, max_message_bytes=10_000))
    assert roomy_message.decode(frames).message.label == "y" * 60
    tight_message = EnvelopeCodec(TEST_REGISTRY, limits=Limits(max_frame_bytes=10_000, max_message_bytes=150))
    with pytest.raises(DecodeError, match="in all, limit is 150"):
        tight_message.decode(frames)
    tight_frame = EnvelopeCodec(TEST_REGISTRY, limits=Limits(max_frame_bytes=100))
    with pytest.raises(DecodeError, match="limit is 100"):
        tight_frame.decode(frames)


def test_a_message_of_plain_fields_and_a_blob_keeps_its_checks_and_its_zero_copy() -> None:
    frames = codec.encode(Chunk(ordinal=2, last=True, data=b"d" * 1000), session=1, seq=1)
    view = [frames[0], frames[1], memoryview(frames[2])]
    kept = codec.decode(view, copy_blobs=False).message
    assert isinstance(kept.data, memoryview) and kept == Chunk(ordinal=2, last=True, data=b"d" * 1000)
    copied = codec.decode(view).message
    assert type(copied.data) is bytes and copied.data == b"d" * 1000
    for body, field, reason in (
        ({"ordinal": -1, "last": True}, "ordinal", "ordinal must be >= 0"),  # the constructor's own check
        ({"ordinal": 1, "last": 1}, "last", "expected bool"),
        ({"ordinal": 1, "last": True, "data": b"x"}, "data", "unexpected field"),  # a blob in the body
        ({"ordinal": 1}, "last", "missing field"),
    ):
        with pytest.raises(DecodeError) as err:
            codec.decode(with_body(view, body))
        assert (err.value.message_type, err.value.field) == ("Chunk", field)
        assert reason in err.value.reason


def test_a_decoded_message_runs_its_post_init_as_its_constructor_would() -> None:
    """Rebuilt from its body map, a message still gets its class's normalisation and checks."""
    frames = codec.encode(Tagged(name="Ab", weight=2))
    assert msgpack.unpackb(frames[1]) == {"name": "ab", "weight": 2}  # fields only, never the cached _key
    wire = with_body(frames, {"name": "XY", "weight": 3})
    got = codec.decode(wire).message
    assert got == Tagged(name="xy", weight=3) and got._key == ("xy", 3)
    with pytest.raises(DecodeError) as err:
        codec.decode(with_body(frames, {"name": "a", "weight": -1}))
    assert (err.value.message_type, err.value.field) == ("Tagged", "weight")
