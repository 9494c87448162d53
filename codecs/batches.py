"""Row batches as Arrow record batches, encoded as Arrow IPC streams.

The encoded size is what credit accounting counts: a stream's credit is spent in IPC bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pyarrow as pa

from sparkbus.codecs.compression import Buffer
from sparkbus.codecs.errors import DecodeError, LimitExceeded
from sparkbus.codecs.limits import DEFAULT_LIMITS, Limits, check_frames

_NAME = "RowBatch"
# An IPC stream ends with a continuation marker and a zero length; without the check, a stream cut just
# before its end marker would still read as complete.
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# What Arrow raises on bytes it cannot read: any of its errors (``ArrowException`` is their base; one is
# ``ArrowKeyError``, a KeyError, for a dictionary id the schema does not declare), and OSError or ValueError
# where pyarrow raises Python's own.
_ARROW_ERRORS = (pa.ArrowException, OSError, ValueError)


def encode_batch(batch: pa.RecordBatch) -> pa.Buffer:
    """One record batch as an Arrow IPC stream (schema, batch, end marker), without copying it again."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def decode_batch(data: Buffer | pa.Buffer, *, limits: Limits = DEFAULT_LIMITS) -> pa.RecordBatch:
    """The single record batch of an IPC stream, fully validated.

    Each message's metadata is checked before Arrow reads its body (``_check_messages``): a record batch
    or dictionary whose buffers are compressed is refused there, never inflated. sparkbus never writes
    them, and Arrow would allocate whatever length each buffer declares: a few KiB that fit a stream's
    credit could claim gigabytes. As a second guard, a batch whose buffers take more than its frame or
    ``limits.max_decompressed_bytes`` (the larger) is refused.

    Raises:
        DecodeError: for bytes that are not exactly one valid IPC stream holding one batch.
        LimitExceeded: for a batch that would take more memory than that.
    """
    if len(data) > limits.max_frame_bytes:
        raise DecodeError(_NAME, "<frame>", f"{len(data)} bytes, limit is {limits.max_frame_bytes}")
    if bytes(memoryview(data)[-len(_EOS) :]) != _EOS:
        raise DecodeError(_NAME, "<ipc>", "Arrow IPC stream does not end with its end-of-stream marker")
    buf = pa.py_buffer(data) if not isinstance(data, pa.Buffer) else data
    try:
        _check_messages(buf)
        reader = pa.ipc.open_stream(buf)
        # One batch, then the end: a stream of many batches is refused at its second, never read whole.
        batch = _next_batch(reader)
        more = batch is not None and _next_batch(reader) is not None
    except DecodeError:
        raise
    except pa.ArrowMemoryError as exc:
        raise LimitExceeded(_NAME, "<ipc>", f"does not fit in memory ({exc})") from None
    except _ARROW_ERRORS as exc:
        raise DecodeError(_NAME, "<ipc>", f"not an Arrow IPC stream ({exc})") from None
    if batch is None or more:
        raise _not_one_batch("more" if more else "none")
    try:
        # Arrow trusts IPC buffers it reads; a peer's bytes are validated before anyone computes on them.
        batch.validate(full=True)
    except _ARROW_ERRORS as exc:
        raise DecodeError(_NAME, "<ipc>", f"invalid record batch ({exc})") from None
    held, bound = batch.get_total_buffer_size(), max(len(data), limits.max_decompressed_bytes)
    if held > bound:
        raise LimitExceeded(_NAME, "<ipc>", f"buffers take {held} bytes, limit is {bound}")
    return batch


def _not_one_batch(got: str) -> DecodeError:
    return DecodeError(_NAME, "<ipc>", f"expected exactly one record batch, got {got}")


def _check_messages(buf: pa.Buffer) -> None:
    """Read the stream's messages up to its second record batch, checking each one's metadata only.

    The bodies are views of ``buf``: nothing is allocated for them, and nothing is decompressed.

    Raises:
        DecodeError: at a record batch or dictionary message that declares compressed buffers, and at a
            second record batch.
    """
    stream = pa.BufferReader(buf)
    batches = 0
    while True:
        try:
            msg = pa.ipc.read_message(stream)
        except EOFError:
            return
        kind = msg.type
        if kind not in ("record batch", "dictionary"):
            continue  # the schema; anything else the reader refuses
        if kind == "record batch":
            batches += 1
            if batches > 1:
                raise _not_one_batch("more")
        meta = msg.metadata
        # Message: version, header type, header (a RecordBatch, or a DictionaryBatch whose ``data`` is one).
        table = _table_at(meta, _read(_U32, meta, 0), 2)
        if kind == "dictionary":
            table = _table_at(meta, table, 1)
        # RecordBatch: length, nodes, buffers, compression.
        if _field(meta, table, 3) is not None:
            raise DecodeError(_NAME, "<ipc>", f"{kind} message with compressed buffers (not accepted)")


# The few FlatBuffers reads the check needs (Arrow's Message.fbs); Arrow has verified the metadata when it
# read the message, and every read is still bounds-checked.
_U16, _I32, _U32 = struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I")


def _read(fmt: struct.Struct, meta: pa.Buffer, at: int) -> int:
    if at < 0 or at + fmt.size > len(meta):
        raise DecodeError(_NAME, "<ipc>", "message metadata points outside itself")
    value: int = fmt.unpack_from(meta, at)[0]
    return value


def _field(meta: pa.Buffer, table: int, slot: int) -> int | None:
    """Where field ``slot`` of the table at ``table`` is stored, or None when it is absent."""
    vtable = table - _read(_I32, meta, table)
    entry = 4 + 2 * slot
    if entry + 2 > _read(_U16, meta, vtable):
        return None
    offset = _read(_U16, meta, vtable + entry)
    return table + offset if offset else None


def _table_at(meta: pa.Buffer, table: int, slot: int) -> int:
    """The table that field ``slot`` of the table at ``table`` refers to."""
    at = _field(meta, table, slot)
    if at is None:
        raise DecodeError(_NAME, "<ipc>", "message metadata without a field it needs")
    return at + _read(_U32, meta, at)


def _next_batch(reader: pa.ipc.RecordBatchStreamReader) -> pa.RecordBatch | None:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None


class BatchCodec:
    """Record batches <-> one IPC frame, with the same interface as the envelope for conformance tests."""

    name = "arrow-ipc"

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits

    def encode(self, batch: pa.RecordBatch) -> list[Buffer]:
        return [memoryview(encode_batch(batch))]

    def encoded_size(self, frames: Sequence[Buffer]) -> int:
        return sum(len(f) for f in frames)

    def decode(self, frames: Sequence[Buffer]) -> pa.RecordBatch:
        check_frames(frames, self.limits, _NAME)
        if len(frames) != 1:
            raise DecodeError(_NAME, "<frames>", f"expected 1 frame, got {len(frames)}")
        return decode_batch(frames[0], limits=self.limits)
