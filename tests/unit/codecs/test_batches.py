"""Row batches from peers: exactly one valid record batch per IPC stream, or ``DecodeError``."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from sparkbus.codecs import DecodeError, decode_batch, encode_batch

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
