"""Row batches from peers: exactly one valid record batch per IPC stream, or ``DecodeError``."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from sparkbus.codecs import DecodeError, LimitExceeded, Limits, batches, decode_batch, encode_batch

EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def ipc(*batches: pa.RecordBatch, **options: object) -> bytes:
    """``batches`` as one IPC stream, written with ``options`` (``pa.ipc.IpcWriteOptions``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def messages(stream: bytes) -> list[bytes]:
    """The encapsulated messages of an IPC stream, each as its bytes, without the end marker."""
    reader, out = pa.BufferReader(stream), []
    while True:
        start = reader.tell()
        try:
            pa.ipc.read_message(reader)
        except EOFError:
            return out
        out.append(stream[start : reader.tell()])


def test_a_batch_round_trips() -> None:
    batch = pa.record_batch({"k": pa.array([1, 2, 3]), "s": pa.array(["a", None, "c"])})
    assert decode_batch(encode_batch(batch)).equals(batch)


def test_a_stream_without_a_batch_is_refused() -> None:
    schema_only = messages(ipc(pa.record_batch({"k": pa.array([1])})))[0] + EOS
    with pytest.raises(DecodeError, match="exactly one record batch, got none"):
        decode_batch(schema_only)


def test_a_stream_is_refused_at_its_second_batch_whatever_follows() -> None:
    """Reading stops at the second batch: the rest of the stream, here a message Arrow cannot read, is
    never looked at (a frame of many small batches is not read whole before it is refused)."""
    batch = pa.record_batch({"k": pa.array([1])})
    schema, first, second = messages(ipc(batch, batch))
    unreadable = b"\xff\xff\xff\xff" + struct.pack("<i", 8) + bytes(8)
    with pytest.raises(DecodeError, match="exactly one record batch, got more"):
        decode_batch(schema + first + second + unreadable + EOS)


def test_a_dictionary_batch_the_schema_does_not_declare_is_a_decode_error() -> None:
    """Arrow raises ArrowKeyError (a KeyError) for it: the decoder's one error stands in for it."""
    plain = messages(bytes(encode_batch(pa.record_batch({"d": pa.array(["a", "b"])}))))
    coded = messages(bytes(encode_batch(pa.record_batch({"d": pa.array(["a", "b"]).dictionary_encode()}))))
    with pytest.raises(DecodeError, match="not an Arrow IPC stream"):
        decode_batch(plain[0] + coded[1] + coded[2] + EOS)


MiB = 1 << 20


def zeros(size: int) -> pa.RecordBatch:
    """``size`` zero bytes as rows of 1 KiB: a column that compresses about a thousandfold."""
    rows = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(1024), size // 1024, [None, pa.py_buffer(bytes(size))]
    )
    return pa.record_batch([rows], names=["x"])


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_buffers_are_refused_before_they_are_inflated(codec: str) -> None:
    """sparkbus never compresses a batch's buffers, and Arrow inflates each to the length it declares: a
    frame of a few KiB (what a stream's credit counts) could claim gigabytes."""
    frame = ipc(zeros(8 * MiB), compression=codec)
    assert len(frame) < 64 * 1024
    with pytest.raises(DecodeError, match="record batch message with compressed buffers"):
        decode_batch(frame, limits=Limits(max_frame_bytes=MiB, max_decompressed_bytes=MiB))
    small = pa.record_batch({"k": pa.array([1, 2, 3])})
    with pytest.raises(DecodeError, match="compressed buffers"):
        decode_batch(ipc(small, compression=codec))


def test_a_compressed_dictionary_is_refused_before_it_is_inflated() -> None:
    batch = pa.record_batch({"d": pa.array(["a" * 1000, "b" * 1000] * 100).dictionary_encode()})
    with pytest.raises(DecodeError, match="dictionary message with compressed buffers"):
        decode_batch(ipc(batch, compression="zstd"))
    assert decode_batch(ipc(batch)).equals(batch)


def test_a_batch_whose_buffers_outgrow_its_frame_and_the_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second guard, were compressed buffers ever read: what the batch holds is bounded too."""
    monkeypatch.setattr(batches, "_check_messages", lambda *args: None)
    frame = ipc(zeros(4 * MiB), compression="zstd")
    with pytest.raises(LimitExceeded, match="buffers take 4194304 bytes, limit is 1048576"):
        decode_batch(frame, limits=Limits(max_decompressed_bytes=MiB))
    assert decode_batch(frame, limits=Limits(max_decompressed_bytes=4 * MiB)).num_rows == 4096
    plain = ipc(zeros(2 * MiB))
    assert decode_batch(plain, limits=Limits(max_decompressed_bytes=MiB)).num_rows == 2048  # its own frame


def test_an_array_longer_than_its_frame_could_carry_is_refused() -> None:
    """A null column has no buffers, so its length costs nothing to declare: 2**40 rows in 224 bytes."""
    frame = bytes(encode_batch(pa.record_batch([pa.nulls(10)], names=["n"])))
    hostile = frame.replace(struct.pack("<q", 10), struct.pack("<q", 1 << 40))
    with pytest.raises(LimitExceeded, match=r"declares 1099511627776 rows, limit is 536870912"):
        decode_batch(hostile)


def test_the_row_limit_is_as_many_rows_as_the_largest_frame_has_bits() -> None:
    """Any array with a buffer spends at least a bit a row, so no batch that fits a frame holds more rows
    than that: the limit refuses only arrays without buffers past what a frame of data could hold, and
    it bounds children (a list's values) as it bounds columns."""
    limits = Limits(max_frame_bytes=2048)  # 16384 rows
    bits = pa.record_batch({"b": pa.array([True] * 12000)})  # 1500 bytes of bits, and the schema
    assert decode_batch(encode_batch(bits), limits=limits).num_rows == 12000
    nulls = pa.record_batch({"n": pa.nulls(16384)})
    assert decode_batch(encode_batch(nulls), limits=limits).num_rows == 16384
    for batch in (
        pa.record_batch({"n": pa.nulls(16385)}),
        pa.record_batch({"n": pa.nulls(16385)}).select([]),  # no columns at all, 16385 rows
        pa.record_batch({"l": pa.array([[None] * 16385], pa.list_(pa.null()))}),  # one row, 16385 values
        pa.record_batch({"d": pa.DictionaryArray.from_arrays(pa.array([0], pa.int8()), pa.nulls(16385))}),
    ):
        with pytest.raises(LimitExceeded, match="declares 16385 rows, limit is 16384"):
            decode_batch(encode_batch(batch), limits=limits)


def test_batches_without_buffers_from_real_results_are_accepted() -> None:
    """A batch of rows without columns (a scan that reads none) or of null columns (``SELECT NULL``)
    has far more rows than its frame has bits; under the default limits it is decoded as it is."""
    for batch in (
        pa.record_batch({"n": pa.nulls(1 << 20)}),
        pa.record_batch({"n": pa.nulls(1 << 20)}).select([]),
    ):
        frame = encode_batch(batch)
        assert len(frame) < 512
        assert decode_batch(frame).num_rows == 1 << 20
