"""Row batches as Arrow record batches, encoded as Arrow IPC streams.

The encoded size is what credit accounting counts: a stream's credit is spent in IPC bytes.
"""

from __future__ import annotations

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

    Raises:
        DecodeError: for bytes that are not exactly one valid IPC stream holding one batch.
    """
    if len(data) > limits.max_frame_bytes:
        raise DecodeError(_NAME, "<frame>", f"{len(data)} bytes, limit is {limits.max_frame_bytes}")
    if bytes(memoryview(data)[-len(_EOS) :]) != _EOS:
        raise DecodeError(_NAME, "<ipc>", "Arrow IPC stream does not end with its end-of-stream marker")
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data) if not isinstance(data, pa.Buffer) else data)
        # One batch, then the end: a stream of many batches is refused at its second, never read whole.
        batch = _next_batch(reader)
        more = batch is not None and _next_batch(reader) is not None
    except pa.ArrowMemoryError as exc:
        raise LimitExceeded(_NAME, "<ipc>", f"does not fit in memory ({exc})") from None
    except _ARROW_ERRORS as exc:
        raise DecodeError(_NAME, "<ipc>", f"not an Arrow IPC stream ({exc})") from None
    if batch is None or more:
        got = "more" if more else "none"
        raise DecodeError(_NAME, "<ipc>", f"expected exactly one record batch, got {got}")
    try:
        # Arrow trusts IPC buffers it reads; a peer's bytes are validated before anyone computes on them.
        batch.validate(full=True)
    except _ARROW_ERRORS as exc:
        raise DecodeError(_NAME, "<ipc>", f"invalid record batch ({exc})") from None
    return batch


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
