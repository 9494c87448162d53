"""Every decoder, fed valid input, damaged input and noise: a result or ``DecodeError``, nothing else."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgpack
import pyarrow as pa
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbus.codecs import (
    Compression,
    DecodeError,
    EnvelopeCodec,
    LimitExceeded,
    Limits,
    decode_batch,
    encode_batch,
)
from sparkbus.codecs.compression import decompress_bounded

from .conftest import count
from .strategies import CODEC, REGISTRY, instances, message_classes, mutated_frames

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
CLASSES = message_classes()


def _decode(codec: EnvelopeCodec, frames: list[bytes]) -> None:
    count("envelope")
    with contextlib.suppress(DecodeError):
        codec.decode(frames)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{REGISTRY.code_of(c):#06x}-{c.__name__}")
@FUZZ
@given(data=st.data())
def test_each_registered_message_round_trips_and_damage_is_refused(cls: type, data: st.DataObject) -> None:
    msg = data.draw(instances(cls))
    frames = CODEC.encode(msg, session=7, seq=3)
    assert CODEC.decode(frames).message == msg
    count("envelope")
    _decode(CODEC, data.draw(mutated_frames(st.just([bytes(f) for f in frames]))))


@FUZZ
@given(frames=st.lists(st.binary(max_size=80), max_size=6))
def test_noise_is_refused(frames: list[bytes]) -> None:
    _decode(CODEC, frames)


def _wrapped(plain: Any) -> Iterator[Any]:
    """``plain`` with one of its values, at any depth, put in an array or in a map: each way in turn."""
    yield [plain]
    yield {"k": plain}
    if isinstance(plain, dict):
        for key, value in plain.items():
            for inner in _wrapped(value):
                yield {**plain, key: inner}
    elif isinstance(plain, list):
        for i, value in enumerate(plain):
            for inner in _wrapped(value):
                yield [*plain[:i], inner, *plain[i + 1 :]]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{REGISTRY.code_of(c):#06x}-{c.__name__}")
@settings(FUZZ, max_examples=5)
@given(data=st.data())
def test_any_value_of_a_body_put_in_an_array_or_a_map_is_refused(cls: type, data: st.DataObject) -> None:
    """A container where a field wants a scalar (a Literal's values are looked up in a set: an array or a
    map is not hashable) is a DecodeError, at every depth of the body."""
    frames = [bytes(f) for f in CODEC.encode(data.draw(instances(cls)))]
    for body in _wrapped(msgpack.unpackb(frames[1], strict_map_key=False)):
        _decode(CODEC, [frames[0], msgpack.packb(body, use_bin_type=True), *frames[2:]])


header_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=6), st.binary(max_size=6)
)


@FUZZ
@given(
    header=st.lists(header_values, min_size=0, max_size=8),
    body=st.dictionaries(st.text(max_size=10), header_values, max_size=5),
    extra=st.lists(st.binary(max_size=16), max_size=3),
)
def test_well_formed_msgpack_with_wrong_contents_is_refused(
    header: list, body: dict, extra: list[bytes]
) -> None:
    if len(header) >= 2 and isinstance(header[1], bool):
        header[1] = int(header[1])
    frames = [msgpack.packb(header), msgpack.packb(body), *extra]
    _decode(CODEC, frames)


#: Below the size some messages' compressed frames inflate to.
INFLATE_LIMIT = 128


@FUZZ
@given(data=st.data(), cls=st.sampled_from(CLASSES))
def test_compressed_frames_are_held_to_the_limit_and_damaged_ones_refused(
    data: st.DataObject, cls: type
) -> None:
    """Both sides compress, and the receiver's Compression would allow 64 MiB: its limits'
    ``max_decompressed_bytes`` holds all the same. A frame that inflates past it is refused (the sender's
    own, or one replaced by a zstd frame of a drawn size), any other decodes, and damage is refused."""
    compression = Compression(level=1, min_size=0, enabled=True)
    sender = EnvelopeCodec(REGISTRY, compression=compression)
    codec = EnvelopeCodec(
        REGISTRY, compression=compression, limits=Limits(max_decompressed_bytes=INFLATE_LIMIT)
    )
    msg = data.draw(instances(cls))
    frames = [bytes(f) for f in sender.encode(msg)]
    raw = CODEC.encode(msg)
    header = msgpack.unpackb(frames[0])
    if any(header[5] >> i & 1 and len(raw[i + 1]) > INFLATE_LIMIT for i in range(len(raw) - 1)):
        with pytest.raises(LimitExceeded, match=f"limit is {INFLATE_LIMIT}"):
            codec.decode(frames)
    else:
        assert codec.decode(frames).message == msg
    count("envelope")
    # One payload frame replaced by a zstd frame of any size around the limit.
    i = data.draw(st.integers(min_value=0, max_value=len(frames) - 2))
    size = data.draw(st.integers(min_value=0, max_value=4 * INFLATE_LIMIT))
    header[5] |= 1 << i
    inflating = list(frames)
    inflating[0] = msgpack.packb(header)
    inflating[i + 1] = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(size))
    if size > INFLATE_LIMIT:
        count("envelope")
        with pytest.raises(
            LimitExceeded, match=f"declares {size} bytes decompressed, limit is {INFLATE_LIMIT}"
        ):
            codec.decode(inflating)
    else:
        _decode(codec, inflating)
    _decode(codec, data.draw(mutated_frames(st.just(frames))))


def _batch(n: int) -> bytes:
    return encode_batch(
        pa.RecordBatch.from_pydict(
            {"k": pa.array(range(n), pa.int64()), "s": pa.array([str(i) for i in range(n)], pa.string())}
        )
    ).to_pybytes()


@FUZZ
@given(data=st.data(), n=st.integers(min_value=0, max_value=20))
def test_row_batches_damaged_are_refused(data: st.DataObject, n: int) -> None:
    frames = data.draw(mutated_frames(st.just([_batch(n)])))
    for frame in frames or [b""]:
        count("batch")
        with contextlib.suppress(DecodeError):
            decode_batch(frame)


@FUZZ
@given(data=st.data(), payload=st.binary(max_size=2000))
def test_zstd_frames_damaged_are_refused(data: st.DataObject, payload: bytes) -> None:
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(payload)
    dctx = zstandard.ZstdDecompressor()
    for damaged in data.draw(mutated_frames(st.just([frame]))) or [b""]:
        count("zstd")
        try:
            out = decompress_bounded(dctx, damaged, 4096, "Fuzz", "<frame>")
        except DecodeError:
            continue
        assert len(out) <= 4096
