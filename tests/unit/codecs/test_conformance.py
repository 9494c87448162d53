"""The one conformance suite every codec passes: round trip, size accounting, truncated input,
foreign bytes, oversized input."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.codecs import BatchCodec, Compression, DecodeError, EnvelopeCodec, Limits

from .messages import TEST_REGISTRY, Color, Everything, Inner, Ping

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
text = st.text(max_size=20)
plain_tree = st.recursive(
    st.none() | st.booleans() | i64 | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)

everything = st.builds(
    Everything,
    count=i64,
    ratio=st.floats(allow_nan=False),
    label=text,
    raw=st.binary(max_size=40),
    flag=st.booleans(),
    maybe=st.none() | i64,
    items=st.lists(i64, max_size=6).map(tuple),
    pair=st.tuples(text, i64),
    table=st.dictionaries(text, i64, max_size=4),
    color=st.sampled_from(Color),
    inner=st.builds(Inner, name=text, weight=st.floats(allow_nan=False)),
    tree=plain_tree.map(lambda t: [t] if isinstance(t, list) else t),
    data=st.binary(max_size=9000),
)
messages = st.one_of(everything, st.builds(Ping, nonce=u32))


def _column_batches() -> st.SearchStrategy[pa.RecordBatch]:
    def build(rows: list[tuple[int, float, str | None]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {
                "key": pa.array([r[0] for r in rows], pa.int64()),
                "value": pa.array([r[1] for r in rows], pa.float64()),
                "name": pa.array([r[2] for r in rows], pa.string()),
            }
        )

    return st.lists(st.tuples(i64, st.floats(allow_nan=False), st.none() | text), max_size=50).map(build)


@dataclass
class Case:
    name: str
    make: Callable[[Limits], Any]
    values: st.SearchStrategy[Any]
    unwrap: Callable[[Any], Any]
    equal: Callable[[Any, Any], bool]
    truncatable: Callable[[Sequence[Any]], list[int]]


def _env(limits: Limits) -> EnvelopeCodec:
    return EnvelopeCodec(TEST_REGISTRY, limits=limits)


def _env_z(limits: Limits) -> EnvelopeCodec:
    return EnvelopeCodec(
        TEST_REGISTRY, limits=limits, compression=Compression(level=1, min_size=0, max_decompressed=1 << 20)
    )


CASES = [
    # Blob frames are opaque bytes, so only the header and body frames can be detected as truncated;
    # a ZeroMQ message never arrives with a frame cut short, only whole frames missing.
    Case("envelope", _env, messages, lambda e: e.message, lambda a, b: a == b, lambda f: [0, 1]),
    Case("envelope+zstd", _env_z, messages, lambda e: e.message, lambda a, b: a == b, lambda f: [0, 1]),
    Case(
        "arrow-ipc",
        lambda lim: BatchCodec(limits=lim),
        _column_batches(),
        lambda b: b,
        lambda a, b: a.equals(b),
        lambda f: [0],
    ),
]
IDS = [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_round_trip(case: Case) -> None:
    codec = case.make(Limits())

    @given(case.values)
    def check(value: Any) -> None:
        frames = codec.encode(value)
        assert case.equal(case.unwrap(codec.decode(frames)), value)

    check()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_size_accounting(case: Case) -> None:
    codec = case.make(Limits())

    @given(case.values)
    def check(value: Any) -> None:
        frames = codec.encode(value)
        assert codec.encoded_size(frames) == sum(len(bytes(f)) for f in frames)

    check()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_truncated_input_is_refused(case: Case) -> None:
    codec = case.make(Limits())

    @given(case.values, st.data())
    def check(value: Any, data: st.DataObject) -> None:
        frames = [bytes(f) for f in codec.encode(value)]
        i = data.draw(st.sampled_from(case.truncatable(frames)))
        cut = data.draw(st.integers(min_value=0, max_value=len(frames[i]) - 1))
        broken = [*frames[:i], frames[i][:cut], *frames[i + 1 :]]
        with pytest.raises(DecodeError):
            codec.decode(broken)
        with pytest.raises(DecodeError):
            codec.decode(frames[:-1] if len(frames) > 1 else [])

    check()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_foreign_bytes_are_refused(case: Case) -> None:
    codec = case.make(Limits())

    @given(st.lists(st.binary(max_size=200), min_size=0, max_size=4))
    def check(frames: list[bytes]) -> None:
        try:
            codec.decode(frames)
        except DecodeError:
            return
        # Random bytes that happen to decode must at least decode to a valid value of the codec.
        raise AssertionError(f"{case.name} accepted foreign bytes {frames!r}")

    check()
    # Well-formed msgpack that is not ours.
    with pytest.raises(DecodeError):
        codec.decode([msgpack.packb({"hello": "world"}), msgpack.packb([1, 2, 3])])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_oversized_input_is_refused(case: Case) -> None:
    small = Limits(max_frame_bytes=64, max_message_bytes=128, max_frames=4, max_decompressed_bytes=64)
    codec = case.make(small)
    with pytest.raises(DecodeError, match="limit"):
        codec.decode([b"\x00" * 65])
    with pytest.raises(DecodeError, match="limit"):
        codec.decode([b"\x00" * 60, b"\x00" * 60, b"\x00" * 60])
    with pytest.raises(DecodeError, match="limit"):
        codec.decode([b"\x00"] * 5)
