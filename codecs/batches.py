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
        _check_messages(buf, 8 * limits.max_frame_bytes)
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


def _check_messages(buf: pa.Buffer, max_rows: int) -> None:
    """Read the stream's messages up to its second record batch, checking each one's metadata only.

    The bodies are views of ``buf``: nothing is allocated for them, and nothing is decompressed.

    Raises:
        DecodeError: at a record batch or dictionary message that declares compressed buffers, and at a
            second record batch.
        LimitExceeded: at a record batch or dictionary message that declares more than ``max_rows`` rows
            for itself or for any of its arrays, children included.
    """
    stream = pa.BufferReader(buf)
    end = len(buf) - len(_EOS)  # where the end marker starts (decode_batch has checked it is there)
    batches = 0
    while stream.tell() < end:
        msg = pa.ipc.read_message(stream)
        kind = msg.type
        if kind not in ("record batch", "dictionary"):
            continue  # the schema; anything else the reader refuses
        if kind == "record batch":
            batches += 1
            if batches > 1:
                raise _not_one_batch("more")
        meta = msg.metadata.to_pybytes()
        # Message: version, header type, header (a RecordBatch, or a DictionaryBatch whose ``data`` is one).
        table = _target(meta, _fields(meta, _read(_U32, meta, 0), 3)[2])
        if kind == "dictionary":
            table = _target(meta, _fields(meta, table, 2)[1])
        length, nodes, _, compression = _fields(meta, table, 4)  # a RecordBatch's first four fields
        if compression:
            raise DecodeError(_NAME, "<ipc>", f"{kind} message with compressed buffers (not accepted)")
        rows = max([_read(_I64, meta, length) if length else 0, *_node_lengths(meta, nodes)])
        if rows > max_rows:
            raise LimitExceeded(
                _NAME,
                "<ipc>",
                f"{kind} message declares {rows} rows, limit is {max_rows} (8 x max_frame_bytes)",
            )


def _next_batch(reader: pa.ipc.RecordBatchStreamReader) -> pa.RecordBatch | None:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None


# The few FlatBuffers reads the check needs (Arrow's Message.fbs). Arrow has verified the metadata when it
# read the message; every read is bounds-checked all the same.
_U16, _I32, _U32, _I64 = struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I"), struct.Struct("<q")


def _outside() -> DecodeError:
    return DecodeError(_NAME, "<ipc>", "message metadata points outside itself")


def _read(fmt: struct.Struct, meta: bytes, at: int) -> int:
    if at < 0 or at + fmt.size > len(meta):
        raise _outside()
    value: int = fmt.unpack_from(meta, at)[0]
    return value


def _fields(meta: bytes, table: int, count: int) -> tuple[int, ...]:
    """Where the first ``count`` fields of the table at ``table`` are stored (0 for a field it omits)."""
    vtable = table - _read(_I32, meta, table)
    present = min(count, max(0, _read(_U16, meta, vtable) - 4) // 2)
    if vtable + 4 + 2 * present > len(meta):
        raise _outside()
    offsets = struct.unpack_from(f"<{present}H", meta, vtable + 4)
    return (*(table + o if o else 0 for o in offsets), *(0,) * (count - present))


def _target(meta: bytes, at: int) -> int:
    """What the offset field stored at ``at`` refers to (a table or a vector)."""
    if not at:
        raise DecodeError(_NAME, "<ipc>", "message metadata without a field it needs")
    return at + _read(_U32, meta, at)


def _node_lengths(meta: bytes, at: int) -> tuple[int, ...]:
    """The length of every array of a RecordBatch whose ``nodes`` field is stored at ``at``: one FieldNode
    (two longs, length and null count) for every column and every child of one."""
    if not at:
        return ()
    vector = _target(meta, at)
    count = _read(_U32, meta, vector)
    if vector + 4 + 16 * count > len(meta):
        raise _outside()
    lengths: tuple[int, ...] = struct.unpack_from(f"<{2 * count}q", meta, vector + 4)[::2]
    return lengths


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
