"""Arrow results cut into self-contained chunks, and put back together.

The gateway gets an Arrow result whole (Arrow IPC stream bytes) and cuts it into IPC streams of about
``chunk_bytes`` each, every one carrying the schema: a client can decode and hand out each chunk's batches
as it arrives, without the rest of the result. pyarrow is imported on first use, so the client core stays
importable without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class ArrowParts:
    """An Arrow result as its chunks (each an Arrow IPC stream), in order."""

    parts: tuple[bytes, ...]

    def table(self) -> pa.Table:
        import pyarrow as pa  # noqa: PLC0415 (the client core runs without pyarrow)

        schema: pa.Schema | None = None
        batches: list[pa.RecordBatch] = []
        for part in self.parts:
            reader = pa.ipc.open_stream(pa.py_buffer(part))
            schema = schema or reader.schema
            batches.extend(reader)
        if schema is None:
            raise ValueError("an Arrow result with no chunk")
        return pa.Table.from_batches(batches, schema=schema)


def chunk_batches(payload: bytes) -> Iterator[pa.RecordBatch]:
    """The record batches of one Arrow chunk."""
    import pyarrow as pa  # noqa: PLC0415

    yield from pa.ipc.open_stream(pa.py_buffer(payload))


def split_ipc(body: bytes, chunk_bytes: int) -> list[bytes] | None:
    """``body`` (one Arrow IPC stream) as IPC streams of about ``chunk_bytes`` of batches each (a batch
    larger than that is sliced by rows; one row is never split). None when ``body`` is not Arrow IPC."""
    import pyarrow as pa  # noqa: PLC0415

    try:
        reader = pa.ipc.open_stream(pa.py_buffer(body))
        schema = reader.schema
        batches = list(reader)
    except (pa.ArrowInvalid, OSError):
        return None
    parts: list[bytes] = []
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        for piece in _slices(batch, chunk_bytes):
            nbytes = _nbytes(piece)
            if pending and size + nbytes > chunk_bytes:
                parts.append(_ipc(schema, pending))
                pending, size = [], 0
            pending.append(piece)
            size += nbytes
    if pending or not parts:
        parts.append(_ipc(schema, pending))
    return parts


def _nbytes(batch: Any) -> int:
    return int(batch.nbytes)  # the buffer ranges the batch references (a slice counts its own rows)


def _slices(batch: pa.RecordBatch, chunk_bytes: int) -> Iterator[pa.RecordBatch]:
    total = _nbytes(batch)
    if total <= chunk_bytes or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, batch.num_rows * chunk_bytes // total)
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def _ipc(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    import pyarrow as pa  # noqa: PLC0415

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue())
