"""A call's ``Reply``: the loop thread completes it with the reply as it came, and the thread that asks for
the result decodes an Arrow reply, once; a reply that does not decode is that call's MALFORMED error, from
``result`` and ``exception`` alike. Streamed chunks decode the same way (``chunk_record_batches``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgpack
import pyarrow as pa
import pytest

from sparkbus.bus.messages import ErrorCode
from sparkbus.roles.client import ArrowParts, Chunk, ClientConnectionError, ClientError
from sparkbus.roles.query import table_to_ipc
from sparkbus.topologies.client_reply import Reply, chunk_record_batches

ROWS = pa.table({"n": [1, 2]})


def test_an_arrow_reply_is_decoded_by_the_thread_that_asks_once(monkeypatch: pytest.MonkeyPatch) -> None:
    decoders: list[int] = []

    def table(parts: ArrowParts, decode: Callable[[ArrowParts], pa.Table] = ArrowParts.table) -> pa.Table:
        decoders.append(threading.get_ident())
        return decode(parts)

    monkeypatch.setattr(ArrowParts, "table", table)
    fut = Reply()
    parts = ArrowParts((table_to_ipc(ROWS),))
    completer = threading.Thread(target=fut.set_result, args=(parts,))  # as the loop thread does
    completer.start()
    completer.join(5)
    assert decoders == []  # completing it decodes nothing
    assert fut.undecoded(timeout=0) is parts
    assert fut.exception(timeout=0) is None
    assert fut.result(timeout=0).equals(ROWS)
    assert fut.result().equals(ROWS)
    assert decoders == [threading.get_ident()]


@pytest.mark.parametrize(
    "parts",
    [(b"junk",), (), (table_to_ipc(ROWS), table_to_ipc(pa.table({"s": ["x"]})))],
    ids=["not Arrow IPC", "no chunk", "two schemas"],
)
def test_a_reply_that_does_not_decode_is_that_calls_malformed_error(parts: tuple[bytes, ...]) -> None:
    fut = Reply()
    fut.set_result(ArrowParts(parts))
    exc = fut.exception(timeout=0)
    assert isinstance(exc, ClientError) and exc.code == ErrorCode.MALFORMED, exc
    assert exc.message.startswith("bad result from the node: ")
    with pytest.raises(ClientError) as err:
        fut.result(timeout=0)
    assert err.value is exc


def test_other_replies_and_errors_pass_through() -> None:
    plain = Reply()
    plain.set_result({"node": "n1"})
    assert plain.result(timeout=0) == {"node": "n1"} and plain.exception(timeout=0) is None
    failed = Reply()
    lost = ClientConnectionError("client closed")
    failed.set_exception(lost)
    assert failed.exception(timeout=0) is lost
    with pytest.raises(ClientConnectionError):
        failed.undecoded(timeout=0)
    with pytest.raises(TimeoutError):  # not done: concurrent.futures' own contract (callers convert it)
        Reply().result(timeout=0)


def test_streamed_chunks_decode_as_they_come_and_a_bad_one_is_malformed() -> None:
    good = Chunk(handle=1, index=0, payload=table_to_ipc(ROWS), arrow=True)
    assert [b.num_rows for b in chunk_record_batches([good])] == [2]
    batches = chunk_record_batches([good, Chunk(handle=1, index=1, payload=b"junk", arrow=True)])
    assert next(batches).num_rows == 2  # handed out before the bad chunk arrives
    with pytest.raises(ClientError, match="bad result from the node") as err:
        next(batches)
    assert err.value.code == ErrorCode.MALFORMED
    body = msgpack.packb(table_to_ipc(ROWS))
    pieces = [
        Chunk(handle=2, index=i, payload=body[i * 7 : (i + 1) * 7], arrow=False)
        for i in range(len(body) // 7 + 1)
    ]
    assert pa.Table.from_batches(list(chunk_record_batches(pieces))).equals(ROWS)
    with pytest.raises(ClientError, match="bad result from the node"):
        list(chunk_record_batches([Chunk(handle=3, index=0, payload=b"\xc1", arrow=False)]))
