"""Decoding a thin client's replies, on the thread that asks for them.

The client's loop thread (``sparkbus.topologies.client``) only moves bytes: it completes a call's ``Reply``
with the reply as it came, an Arrow result as its IPC chunks (``ArrowParts``). Decoding them into a table
is left to the thread that asks for the result, so a large result never holds up the loop thread, which
also sends every heartbeat and carries every other call. A reply that does not decode fails its own call
with ``MALFORMED`` "bad result from the node: ..."; the loop thread never sees it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

import msgpack
import pyarrow as pa

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import ArrowParts, Chunk, ClientError
from sparkbus.roles.client.chunks import chunk_batches
from sparkbus.roles.query import QueryError, result_table

#: What decoding raises when a node's reply is not the Arrow IPC (or msgpack) it claims to be.
BAD_RESULT = (pa.ArrowException, ValueError, TypeError, OSError, msgpack.UnpackException, QueryError)


def bad_result(exc: Exception) -> ClientError:
    """The error of a call whose reply does not decode (a bad server reply: that call fails, no other)."""
    return ClientError(ErrorCode.MALFORMED, f"bad result from the node: {exc}")


def as_table(result: Any) -> pa.Table:
    """An Arrow operation's result as a table (chunked results arrive as tables already)."""
    if isinstance(result, pa.Table):
        return result
    try:
        return result_table(result)
    except BAD_RESULT as exc:
        raise bad_result(exc) from None


def chunk_record_batches(chunks: Iterable[Chunk]) -> Iterator[pa.RecordBatch]:
    """The record batches of a streamed result, each Arrow chunk's as it arrives (``sql_batches``)."""
    pieces: list[bytes] = []
    for chunk in chunks:
        if chunk.arrow:
            try:
                batches = list(chunk_batches(chunk.payload))
            except BAD_RESULT as exc:
                raise bad_result(exc) from None
            yield from batches
        else:  # a gateway that did not cut the result into Arrow chunks: msgpack pieces
            pieces.append(chunk.payload)
    if pieces:
        try:
            whole = msgpack.unpackb(b"".join(pieces), raw=False)
        except BAD_RESULT as exc:
            raise bad_result(exc) from None
        yield from as_table(whole).to_batches()


class Reply(Future[Any]):
    """The future of one call (``Client.submit``).

    The loop thread completes it with the reply as it came; ``result`` and ``exception`` decode an Arrow
    reply (``ArrowParts``) on the thread that calls them, once (the first caller decodes, the others get its
    table or its error). A reply that does not decode is this call's ``ClientError`` MALFORMED, from both.
    A done callback runs on the loop thread: one that asks for the result decodes it there.
    """

    def __init__(self) -> None:
        super().__init__()
        self.handle: int | None = None  # the core's handle, once the loop thread has taken the call
        self._decode_lock = threading.Lock()
        self._decoded: tuple[Any, ClientError | None] | None = None

    def undecoded(self, timeout: float | None = None) -> Any:
        """The reply as the loop thread left it (``ArrowParts`` for an Arrow result); raises as ``result``
        does for a call that failed."""
        return super().result(timeout)

    def result(self, timeout: float | None = None) -> Any:
        value, error = self._decode(super().result(timeout))
        if error is not None:
            raise error
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        exc = super().exception(timeout)
        if exc is not None:
            return exc
        return self._decode(super().result())[1]

    def _decode(self, raw: Any) -> tuple[Any, ClientError | None]:
        if not isinstance(raw, ArrowParts):
            return raw, None
        with self._decode_lock:
            if self._decoded is None:
                try:
                    self._decoded = (raw.table(), None)
                except BAD_RESULT as exc:
                    self._decoded = (None, bad_result(exc))
            return self._decoded
