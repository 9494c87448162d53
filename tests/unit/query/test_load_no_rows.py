"""A table of no rows loads: ``table_to_ipc`` writes it as one empty record batch, as the query role's
``load`` takes exactly one a stream, so ``client.load`` of an empty table makes a table of its columns."""

from __future__ import annotations

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.roles.query import QueryRole, table_to_ipc
from sparkbus.roles.query.engine import table_from_ipc

EMPTY = pa.table({"a": pa.array([], pa.int64()), "b": pa.array([], pa.string())})


def _load(role: QueryRole, table: pa.Table) -> c.Reply:
    call = c.LocalCall(call_id=3, name="load", args={"table": "t", "batches": [table_to_ipc(table)]})
    [reply] = role.handle(call, 0.0)
    assert isinstance(reply, c.Reply)
    return reply


def test_a_table_of_no_rows_loads_as_a_table_of_its_columns() -> None:
    role = QueryRole("n", incarnation="x")
    reply = _load(role, EMPTY)
    assert reply.error is None and reply.result == 0
    held = role.store.get("t")
    assert held is not None and held.num_rows == 0 and held.schema.equals(EMPTY.schema)
    # rows loaded later add to it
    reply = _load(role, pa.table({"a": pa.array([1], pa.int64()), "b": ["x"]}))
    assert reply.error is None and reply.result == 1


def test_the_stream_holds_one_record_batch_with_or_without_rows() -> None:
    for table in (EMPTY, EMPTY.slice(0, 0), pa.table({"a": pa.array([1, 2], pa.int64()), "b": ["x", "y"]})):
        stream = pa.ipc.open_stream(table_to_ipc(table))
        assert [b.num_rows for b in stream] == [table.num_rows]
        assert table_from_ipc([table_to_ipc(table)]).equals(table)
